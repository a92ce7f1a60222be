"""Issues 29 and 30 (R2, R4): the chunks of a document a call chooses parts of, embedded by the worker, so the call
chooses by meaning as well as by words: a large document's parts (`chunks.best_chunks`) and a project's knowledge
passages (`knowledge`), both compared with the question by `closeness`.

The `embed_file` job follows a document's reading (`services.extract_job`) when an embedding model is set and its
text is longer than a call takes whole or it is a project's knowledge file (and follows a file's joining a project,
`services.project_files_set`). It is idempotent (a file with the current model's vectors is left) and
a failed embedding call fails the job, which the worker retries; meanwhile calls choose by words alone. After a
change of embedding model the `embed-files` sweep embeds again what has only the old model's vectors, and a call
that chooses parts of a document with no vectors of the current model (read while no model was set, or its job
given up) queues its job (`vectors_wanted`).
"""

from __future__ import annotations

import functools
import logging
from datetime import timedelta
from typing import Any

import numpy as np
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from conversations import llm, outbox
from conversations.models import OutboxJob
from files.chunks import chunked
from files.models import FileChunkVector, StoredFile
from search.chunks import CHUNK_CHARS
from search.embedding import vectors_of
from search.similar import QUERY_TIMEOUT_SECONDS, query_vector
from search.vectors import to_bytes

BACKFILL_FILES = 8  # a sweep's share: documents embedded again before the worker looks at its queue
GIVEN_UP_WAIT = timedelta(hours=1)  # after the worker gives a file's embedding up, calls ask for it again

logger = logging.getLogger("arbor.files")


def chosen_by_parts(text: str, project_id: int | None) -> bool:
    """Whether a call chooses parts of a document read as `text`: a large one, or any of a project's knowledge."""
    return len(text) > settings.ARBOR_FILE_WHOLE_CHARS or project_id is not None


def wants_vectors(text: str, project_id: int | None) -> bool:
    """Whether a document read as `text` gets vectors now: it is chosen from by parts and a model is set."""
    return bool(settings.ARBOR_EMBEDDING_MODEL) and chosen_by_parts(text, project_id)


def embed_file(file_id: int, model: str) -> int:
    """Store the vectors of `model` for each chunk of the file's text in place of any it had (of any model); return
    how many. A file deleted, or not a ready document a call chooses parts of, gets none."""
    ready = StoredFile.objects.filter(pk=file_id, status=StoredFile.Status.READY)
    stored = ready.only("pk", "owner_id", "project_id", "text").first()
    if stored is None or not chosen_by_parts(stored.text, stored.project_id):
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
    """Queue `embed_file` for these documents a call chose parts of without their vectors, unless one waits or
    the worker gave one up lately (a provider that refuses a file is not asked again on every question)."""
    lately = timezone.now() - GIVEN_UP_WAIT
    jobs = OutboxJob.objects.filter(Q(status=OutboxJob.Status.PENDING)
                                    | Q(status=OutboxJob.Status.FAILED, created_at__gte=lately),
                                    kind="embed_file", payload__file__in=file_ids)
    waiting = set(jobs.values_list("payload__file", flat=True))
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
        if not embed_file(file_id, model):  # no longer chosen from by parts: its old vectors only go
            FileChunkVector.objects.filter(file_id=file_id).exclude(model=model).delete()
    return bool(stale)


@functools.lru_cache(maxsize=64)
def _question_vector(model: str, question: str) -> tuple[float, ...] | None:
    """The question's vector, asked of the provider once for every round of a turn (a failure is not kept)."""
    vector = query_vector(question, timeout=QUERY_TIMEOUT_SECONDS)
    return None if vector is None else tuple(vector)


def closeness(texts: dict[int, str], question: str, *, owner: int) -> dict[int, list[float]]:
    """Each document's chunks' cosine similarity to `question`, by file id, for those of `texts` (their text) the
    worker has embedded whole with the current model; none when none is, or when the question's embedding call
    fails (words alone choose). One without them is queued for the worker (`vectors_wanted`)."""
    model = settings.ARBOR_EMBEDDING_MODEL
    if not model or not texts or not question.strip():
        return {}
    stored: dict[int, list[bytes]] = {}
    rows = FileChunkVector.objects.filter(owner_id=owner, file_id__in=texts, model=model).order_by("file_id", "chunk")
    for file_id, vector in rows.values_list("file_id", "vector"):
        stored.setdefault(file_id, []).append(bytes(vector))
    whole = {file_id: vectors for file_id, vectors in stored.items() if len(vectors) == len(chunked(texts[file_id]))}
    if len(whole) < len(texts):  # read while no model was set, its job given up, or another model's: embed it now
        vectors_wanted([file_id for file_id in texts if file_id not in whole])
    if not whole:
        return {}
    try:
        asked = _question_vector(model, question[:CHUNK_CHARS])  # all an embedding of it reads
    except llm.LLMError as error:
        logger.warning("choosing passages by words alone: the question's embedding failed: %s", error)
        return {}
    query = np.frombuffer(to_bytes(asked or []), dtype="<f4")
    return {file_id: [float(np.frombuffer(vector, dtype="<f4") @ query) if len(vector) == query.nbytes else 0.0
                      for vector in vectors] for file_id, vectors in whole.items()}
