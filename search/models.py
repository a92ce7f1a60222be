"""The search index over bubbles: what a person saw, in every branch (issue 7).

PostgreSQL keeps a tsvector per bubble with a GIN index; SQLite keeps the text in an FTS5 table
(`search_fts`, rowid = bubble id) made by the migration. Either way a row here says "indexed", so the
worker's job is idempotent. Rows are written by the post-commit worker (R4), never by the turn itself.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.search import SearchVectorField
from django.db import models

from conversations.models import Bubble, Conversation


class BubbleDocument(models.Model):
    """`owner` is copied from the bubble's conversation (whose owner never changes) so a search asks the index for
    the caller's entries only: on PostgreSQL one GIN index of each lexeme keyed by its owner (migration 0006, issue
    34; 0005's over (owner, tsvector) read everyone's entries of a word), where another person's messages decide
    nothing. SQLite's FTS5 table has no owner (search.query)."""

    bubble = models.OneToOneField(Bubble, on_delete=models.CASCADE, primary_key=True, related_name="document")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+", null=True)
    vector = SearchVectorField(null=True)  # PostgreSQL only; SQLite keeps the text in search_fts
    indexed_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"index of bubble {self.bubble_id}"


class ChunkVector(models.Model):
    """One piece of a bubble's text as an embedding model saw it (issue 18, R4): a row a chunk and model.

    `vector` is float32, little-endian, length 1 (empty for a text with no word: the row still says "embedded").
    `owner` and `conversation` are copied from the bubble so one owner's vectors load with one indexed read;
    deleting the conversation deletes them. A vector is only ever compared with vectors of its own `model`.
    """

    bubble = models.ForeignKey(Bubble, on_delete=models.CASCADE, related_name="vectors")
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="+")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+", db_index=False)
    model = models.CharField(max_length=200)
    chunk = models.PositiveIntegerField()  # its place in the bubble
    start = models.PositiveIntegerField()  # where in the bubble's text it starts and ends (characters)
    end = models.PositiveIntegerField()
    vector = models.BinaryField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["bubble", "model", "chunk"], name="chunk_vector_unique")]
        indexes = [models.Index(fields=["owner", "model", "id"], name="chunk_vector_owner_model")]

    def __str__(self) -> str:
        return f"{self.model} vector of bubble {self.bubble_id} chunk {self.chunk}"


class VectorVersion(models.Model):
    """What has been written of an owner's vectors of one model, changed in the transaction that writes them
    (whose lock on this row makes writers of one owner and model take turns). `version` is drawn anew each
    time, so a row made again (a rolled-back test, an owner's id given again) never repeats an old one;
    `inserted` counts every row inserted since the row was made (`epoch`). A process's in-memory copy is
    current while `version` has not changed, and reads only the rows after its last one while the count adds
    up (search.scoring_memory)."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+",
                              db_index=False)
    model = models.CharField(max_length=200)
    version = models.BigIntegerField(default=0)
    inserted = models.BigIntegerField(default=0)
    epoch = models.BigIntegerField(default=0)  # drawn when the row is made, never changed

    class Meta:
        constraints = [models.UniqueConstraint(fields=["owner", "model"], name="vector_version_unique")]

    def __str__(self) -> str:
        return f"{self.model} vectors of user {self.owner_id}: version {self.version}"
