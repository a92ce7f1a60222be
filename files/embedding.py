"""Issue 29 (R2, R4): a large document's chunks embedded by the worker, so a call chooses the parts it sends by
meaning as well as by words (`chunks.best_chunks`).

The `embed_file` job follows a document's reading (`services.extract_job`) when its text is longer than a call
takes whole and an embedding model is set. It is idempotent (a file with the current model's vectors is left) and
a failed embedding call fails the job, which the worker retries; meanwhile calls choose by words alone. After a
change of embedding model the `embed-files` sweep embeds again what has only the old model's vectors, and a call
that chooses parts of a document with no vectors of the current model (read while no model was set, or its job
given up) queues its job (`vectors_wanted`).
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.db import transaction

from conversations import outbox
from conversations.models import OutboxJob
from files.chunks import chunked
from files.models import FileChunkVector, StoredFile
from search.embedding import vectors_of
from search.vectors import to_bytes

BACKFILL_FILES = 8  # a sweep's share: documents embedded again before the worker looks at its queue

logger = logging.getLogger("arbor.files")


def wants_vectors(text: str) -> bool:
    """Whether a document read as `text` is chosen from by parts, and so gets vectors (a model is set)."""
    return bool(settings.ARBOR_EMBEDDING_MODEL) and len(text) > settings.ARBOR_FILE_WHOLE_CHARS


def embed_file(file_id: int, model: str) -> int:
    """Store the vectors of `model` for each chunk of the file's text in place of any it had (of any model); return
    how many. A file deleted, or not a ready large document, gets none."""
    ready = StoredFile.objects.filter(pk=file_id, status=StoredFile.Status.READY)
    stored = ready.only("pk", "owner_id", "text").first()
    if stored is None or len(stored.text) <= settings.ARBOR_FILE_WHOLE_CHARS:
        return 0
    chunks = chunked(stored.text)
    vectors = vectors_of(model, chunks)  # an LLMError fails the job: the worker tries again
    rows = [FileChunkVector(file_id=file_id, owner_id=stored.owner_id, model=model, chunk=n, vector=to_bytes(vector))
            for n, vector in enumerate(vectors)]
    with transaction.atomic():
        # Locked, the file cannot be deleted before these rows commit (its deletion then takes them with it).
        if not StoredFile.objects.select_for_update().filter(pk=file_id).exists():
            return 0
        FileChunkVector.objects.filter(file_id=file_id).delete()
        FileChunkVector.objects.bulk_create(rows, batch_size=1000)
    return len(rows)


def embed_file_job(payload: dict[str, Any]) -> None:
    """The worker's `embed_file` job."""
    model = settings.ARBOR_EMBEDDING_MODEL
    if model and not FileChunkVector.objects.filter(file_id=payload["file"], model=model).exists():
        embed_file(int(payload["file"]), model)


def vectors_wanted(file_ids: list[int]) -> None:
    """Queue `embed_file` for these documents a call chose parts of without their vectors, unless one waits."""
    waiting = set(OutboxJob.objects.filter(kind="embed_file", status=OutboxJob.Status.PENDING,
                                           payload__file__in=file_ids).values_list("payload__file", flat=True))
    for file_id in file_ids:
        if file_id not in waiting:
            outbox.enqueue(kind="embed_file", payload={"file": file_id})


def backfill() -> bool:
    """After a change of embedding model: embed again a share of the documents whose vectors are another model's
    (which nothing compares any more); True if there was work."""
    model = settings.ARBOR_EMBEDDING_MODEL
    if not model:
        return False
    stale = list(FileChunkVector.objects.exclude(model=model).order_by("file_id").values_list("file_id", flat=True)
                 .distinct()[:BACKFILL_FILES])
    for file_id in stale:
        if not embed_file(file_id, model):  # no longer a large ready document: its old vectors only go
            FileChunkVector.objects.filter(file_id=file_id).exclude(model=model).delete()
    return bool(stale)
