"""A person's files (X1): the bytes once, in Django's storage; a node that sent one keeps a reference row."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from conversations.models import NodeOwned


class StoredFile(models.Model):
    class Status(models.TextChoices):
        PROCESSING = "processing"  # its text is being read (the worker's `extract` job)
        READY = "ready"
        FAILED = "failed"  # `error` says why, in words a person reads

    class Kind(models.TextChoices):
        IMAGE = "image"  # sent as an image part, to a model that can see
        DOCUMENT = "document"  # sent as its extracted text

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="files")
    project = models.ForeignKey("conversations.Project", null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="files")
    name = models.CharField(max_length=255)
    content_type = models.CharField(max_length=100)  # sniffed from the bytes, never taken from the name
    kind = models.CharField(max_length=10, choices=Kind.choices)
    size = models.PositiveBigIntegerField()
    sha256 = models.CharField(max_length=64)
    blob = models.FileField(upload_to="files/", max_length=300)
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.PROCESSING)
    error = models.CharField(max_length=500, blank=True, default="")
    text = models.TextField(blank=True, default="")  # the extracted text, bounded by ARBOR_FILE_TEXT_MAX_CHARS
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["owner", "-created_at"])]

    def __str__(self) -> str:
        return self.name


class SentFile(NodeOwned):
    """The node whose call sent `file` (X1): the tree's reference. A file a node sent cannot be deleted while
    that node exists (PROTECT); the node's going (T11) lets it go."""

    node = models.ForeignKey("conversations.Node", on_delete=models.CASCADE, related_name="sent_files")
    file = models.ForeignKey(StoredFile, on_delete=models.PROTECT, related_name="sent_by")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "file"], name="sent_file_once")]

    def __str__(self) -> str:
        return f"file {self.file_id} sent by node {self.node_id}"


class FileChunkVector(models.Model):
    """One chunk of a large document (`chunks.chunked`) as an embedding model saw it (issue 29, R2): written by the
    worker's `embed_file` job, read when a call chooses the document's parts for its question. `owner` is the
    file's, the key a sharded database distributes it by (issue 34). A vector is float32, length 1
    (`search.vectors.to_bytes`), compared only with vectors of its own `model`."""

    file = models.ForeignKey(StoredFile, on_delete=models.CASCADE, related_name="vectors")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+", db_index=False)
    model = models.CharField(max_length=200)
    chunk = models.PositiveIntegerField()  # its place among the document's chunks
    vector = models.BinaryField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["file", "model", "chunk"], name="file_chunk_vector_once")]

    def __str__(self) -> str:
        return f"{self.model} vector of file {self.file_id} chunk {self.chunk}"
