"""The `embed` job (R4, issue 18): after a turn or an import commits, the worker embeds its new questions and
answers with ARBOR_EMBEDDING_MODEL, long ones in pieces (chunks.py), through the one litellm seam.

At least once and idempotent: a bubble counts as embedded for a model once it has rows of that model, and
rows are replaced, never added twice. A failed embedding call fails the job, which the worker retries.
`backfill` (a worker sweep) embeds whatever has no vector of the current model — bubbles written before
embedding was on, jobs that ran out of attempts, everything after a change of model — and then drops the
vectors of other models, which nothing compares any more, and those of bubbles a cleared conversation let go.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.conf import settings
from django.db.models import Exists, F, OuterRef, Q

from conversations import llm, outbox
from conversations.models import Bubble
from search.chunks import chunk_spans
from search.index import INDEXED_ROLES
from search.models import ChunkVector
from search.vectors import replace, to_bytes

BACKFILL_BUBBLES = 512  # a sweep's share of work before the worker looks at its queue again
BATCH_PIECES_FACTOR = 4  # a unit of work: bubbles until their pieces fill this many embedding calls
# A job's share of time: a big import goes on in a follow-up job, well inside the worker's lease.
JOB_SECONDS_SHARE_OF_LEASE = 0.2

logger = logging.getLogger("arbor.embedding")

Work = list[tuple[int, str, int, int]]  # (bubble id, text, conversation id, owner id)


def _unembedded(model: str):
    embedded = ChunkVector.objects.filter(bubble=OuterRef("pk"), model=model)
    return Bubble.objects.filter(role__in=INDEXED_ROLES, conversation__isnull=False).exclude(Exists(embedded))


def _pieces(bubbles: Work) -> list[tuple[int, int, int, int, str]]:
    return [(bubble, n, start, end, text[start:end])
            for bubble, text, _, _ in bubbles for n, (start, end) in enumerate(chunk_spans(text))]


def vectors_of(model: str, texts: list[str]) -> list[list[float]]:
    """`texts` embedded with `model`, ARBOR_EMBEDDING_BATCH a call."""
    vectors: list[list[float]] = []
    for first in range(0, len(texts), settings.ARBOR_EMBEDDING_BATCH):
        vectors += llm.embed(model, texts[first:first + settings.ARBOR_EMBEDDING_BATCH])
    return vectors


def embed_bubbles(bubbles: Work, model: str) -> int:
    """Embed the bubbles with `model` and store their vectors; return how many pieces were embedded.

    When the call for all of them fails, each bubble is tried alone: one the provider refuses while it takes the
    others (a text it will never take) is stored with no vector and a warning, so it blocks nothing behind it.
    When every one fails, the provider is down: the error goes to the caller (the worker retries).
    """
    pieces = _pieces(bubbles)
    try:
        vectors = vectors_of(model, [p[4] for p in pieces])
    except llm.LLMError:
        if len(bubbles) == 1:
            raise
        return _embed_one_by_one(bubbles, model)
    where = {bubble: (conversation, owner) for bubble, _, conversation, owner in bubbles}
    rows = [ChunkVector(bubble_id=bubble, conversation_id=where[bubble][0], owner_id=where[bubble][1], model=model,
                        chunk=n, start=start, end=end, vector=to_bytes(vector))
            for (bubble, n, start, end, _), vector in zip(pieces, vectors, strict=True)]
    # A bubble with no text to embed (white space only) still gets a row, empty, so it is not looked at again.
    rows += [_empty(bubble, conversation, owner, model)
             for bubble, text, conversation, owner in bubbles if not chunk_spans(text)]
    replace(bubble_ids=list(where), model=model, rows=rows)
    return len(pieces)


def _empty(bubble: int, conversation: int, owner: int, model: str) -> ChunkVector:
    return ChunkVector(bubble_id=bubble, conversation_id=conversation, owner_id=owner, model=model, chunk=0, start=0,
                       end=0, vector=b"")


def _embed_one_by_one(bubbles: Work, model: str) -> int:
    refused: list[tuple[tuple[int, str, int, int], llm.LLMError]] = []
    done = 0
    for bubble in bubbles:
        try:
            done += embed_bubbles([bubble], model)
        except llm.LLMError as error:
            refused.append((bubble, error))
    if len(refused) == len(bubbles):
        raise refused[-1][1]
    for (bubble, _, conversation, owner), error in refused:
        logger.warning("%s refused bubble %s while it took others; it is kept with no vector: %s", model, bubble,
                       error.message)
        replace(bubble_ids=[bubble], model=model, rows=[_empty(bubble, conversation, owner, model)])
    return done


def _batch(bubbles) -> Work:
    """The next unit of work: bubbles in id order until their pieces fill BATCH_PIECES_FACTOR embedding calls."""
    found: Work = []
    pieces = 0
    rows = bubbles.order_by("id").values_list("id", "content", "conversation_id", "conversation__owner_id")
    for row in rows[:settings.ARBOR_EMBEDDING_BATCH]:
        found.append(row)
        pieces += len(chunk_spans(row[1]))
        if pieces >= settings.ARBOR_EMBEDDING_BATCH * BATCH_PIECES_FACTOR:
            break
    return found


def _of_conversation(model: str, conversation_id: int, nodes: list[int] | None):
    bubbles = _unembedded(model).filter(conversation_id=conversation_id)
    return bubbles if nodes is None else bubbles.filter(node_id__in=nodes)


def embed_conversation(conversation_id: int, *, nodes: list[int] | None = None, seconds: float | None = None) -> int:
    """Embed the bubbles of the conversation (of `nodes` only: what a turn wrote) that have no vector of the
    current model, for at most about `seconds` (one unit of work more); return how many bubbles were embedded."""
    model = settings.ARBOR_EMBEDDING_MODEL
    started = time.monotonic()
    done = 0
    while model and (seconds is None or not done or time.monotonic() - started < seconds) and (
            batch := _batch(_of_conversation(model, conversation_id, nodes))):
        embed_bubbles(batch, model)
        done += len(batch)
    return done


def run(payload: dict[str, Any]) -> None:
    """The `embed` job: the bubbles of the turn's nodes (a job after each turn looked at the whole conversation,
    O(turns²) over its life; `backfill` finds what a job that gave up left), or of the whole conversation (an
    import). One with more to embed than a job's share of time (a large import) gets a follow-up job: a job stays
    well inside its lease, so it is not claimed again while it runs."""
    conversation, nodes = int(payload["conversation"]), outbox.payload_nodes(payload)
    model = settings.ARBOR_EMBEDDING_MODEL
    embed_conversation(conversation, nodes=nodes,
                       seconds=settings.ARBOR_WORKER_LEASE_SECONDS * JOB_SECONDS_SHARE_OF_LEASE)
    if model and _of_conversation(model, conversation, nodes).exists():
        outbox.enqueue(kind="embed", payload=payload)


def backfill() -> bool:
    """One share of background embedding; True if there was work (the worker then comes back at once)."""
    model = settings.ARBOR_EMBEDDING_MODEL
    if not model:
        return False
    done, after = 0, 0
    # Each batch looks on from the last one's ids: from the start each time, a batch read past every bubble
    # embedded before it (half the sweep's time with another person's 100,000 pieces, bench_retrieval --others).
    while done < BACKFILL_BUBBLES and (batch := _batch(_unembedded(model).filter(pk__gt=after))):
        embed_bubbles(batch, model)
        done, after = done + len(batch), batch[-1][0]
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
