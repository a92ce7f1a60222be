"""The search index over bubbles: what a person saw, in every branch (issue 7).

PostgreSQL keeps a tsvector per bubble with a GIN index; SQLite keeps the text in an FTS5 table
(`search_fts`, rowid = bubble id) made by the migration. Either way a row here says "indexed", so the
worker's job is idempotent. Rows are written by the post-commit worker (R4), never by the turn itself.
"""

from __future__ import annotations

from django.contrib.postgres.search import SearchVectorField
from django.db import models

from conversations.models import Bubble


class BubbleDocument(models.Model):
    bubble = models.OneToOneField(Bubble, on_delete=models.CASCADE, primary_key=True, related_name="document")
    vector = SearchVectorField(null=True)  # PostgreSQL only; SQLite keeps the text in search_fts
    indexed_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"index of bubble {self.bubble_id}"
