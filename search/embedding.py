"""The `embed` job (R4, issue 18): after a turn or an import commits, the worker embeds its new questions and
answers with ARBOR_EMBEDDING_MODEL, long ones in pieces (chunks.py), through the one litellm seam.

At least once and idempotent: a bubble counts as embedded for a model once it has rows of that model, and
rows are replaced, never added twice. A failed embedding call fails the job, which the worker retries.
`backfill` (a worker sweep) embeds whatever has no vector of the current model — bubbles written before
embedding was on, jobs that ran out of attempts, everything after a change of model — and then drops the
vectors of other models, which nothing compares any more, and those of bubbles a cleared conversation let go.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.models import Exists, F, OuterRef, Q

from conversations import jobs, llm
from conversations.models import Bubble
from search.chunks import chunk_spans
from search.index import INDEXED_ROLES
from search.models import ChunkVector
from search.vectors import replace, to_bytes

BACKFILL_BUBBLES = 512  # a sweep's share of work before the worker looks at its queue again
JOB_BUBBLES = 1024  # a job's share: a big import goes on in a follow-up job, well inside the worker's lease


def _unembedded(model: str):
    embedded = ChunkVector.objects.filter(bubble=OuterRef("pk"), model=model)
    return Bubble.objects.filter(role__in=INDEXED_ROLES, conversation__isnull=False).exclude(Exists(embedded))


def embed_bubbles(bubbles: list[tuple[int, str, int, int]], model: str) -> int:
    """Embed (bubble id, text, conversation id, owner id) tuples with `model`; return how many chunks."""
    pieces = [(bubble, n, start, end, text[start:end])
              for bubble, text, _, _ in bubbles for n, (start, end) in enumerate(chunk_spans(text))]
    vectors: list[list[float]] = []
    for first in range(0, len(pieces), settings.ARBOR_EMBEDDING_BATCH):
        vectors += llm.embed(model, [p[4] for p in pieces[first:first + settings.ARBOR_EMBEDDING_BATCH]])
    where = {bubble: (conversation, owner) for bubble, _, conversation, owner in bubbles}
    rows = [ChunkVector(bubble_id=bubble, conversation_id=where[bubble][0], owner_id=where[bubble][1], model=model,
                        chunk=n, start=start, end=end, vector=to_bytes(vector))
            for (bubble, n, start, end, _), vector in zip(pieces, vectors, strict=True)]
    # A text with no word to embed still gets a row, empty, so it is not looked at again.
    rows += [ChunkVector(bubble_id=bubble, conversation_id=conversation, owner_id=owner, model=model, chunk=0,
                         start=0, end=0, vector=b"")
             for bubble, text, conversation, owner in bubbles if not chunk_spans(text)]
    replace(bubble_ids=list(where), model=model, rows=rows)
    return len(pieces)


def _batch(bubbles) -> list[tuple[int, str, int, int]]:
    return list(bubbles.order_by("id").values_list("id", "content", "conversation_id", "conversation__owner_id")
                [:settings.ARBOR_EMBEDDING_BATCH])


def embed_conversation(conversation_id: int, *, most: int | None = None) -> int:
    """Embed the bubbles of the conversation that have no vector of the current model (at most `most` of
    them); return how many bubbles were embedded."""
    model = settings.ARBOR_EMBEDDING_MODEL
    done = 0
    while model and (most is None or done < most) and (
            batch := _batch(_unembedded(model).filter(conversation_id=conversation_id))):
        embed_bubbles(batch, model)
        done += len(batch)
    return done


def run(payload: dict[str, Any]) -> None:
    """The `embed` job. A conversation with more to embed than a job's share (a large import) gets a follow-up
    job, so no job outlives its lease and is run twice at once."""
    conversation = int(payload["conversation"])
    model = settings.ARBOR_EMBEDDING_MODEL
    if embed_conversation(conversation, most=JOB_BUBBLES) >= JOB_BUBBLES and \
            _unembedded(model).filter(conversation_id=conversation).exists():
        jobs.enqueue(kind="embed", payload=payload)


def backfill() -> bool:
    """One share of background embedding; True if there was work (the worker then comes back at once)."""
    model = settings.ARBOR_EMBEDDING_MODEL
    if not model:
        return False
    done = 0
    while done < BACKFILL_BUBBLES and (batch := _batch(_unembedded(model))):
        embed_bubbles(batch, model)
        done += len(batch)
    if done:
        return True
    # Every bubble has the current model's vectors: the old model's are never read again; nor are those of a
    # bubble a cleared conversation let go (T11; kept for another conversation's screen, P3).
    stale = list(ChunkVector.objects.exclude(model=model).values_list("pk", flat=True)[:5000])
    stale += ChunkVector.objects.filter(Q(bubble__conversation__isnull=True) | ~Q(
        bubble__conversation_id=F("conversation_id"))).values_list("pk", flat=True)[:5000]
    if stale:
        ChunkVector.objects.filter(pk__in=stale).delete()
    return bool(stale)
