"""Stored vectors and the nearest ones to a query (issue 18).

Vectors are stored as float32 bytes, whatever the database (the one truth), and ranked by one of two scorers:
pgvector's HNSW index where PostgreSQL has the extension (scoring_pgvector.py), else an exact matrix product
over an in-memory copy of the owner's vectors (scoring_memory.py; SQLite, and PostgreSQL without pgvector).
Whatever a scorer ranks is checked against the database before it is returned, so a deleted or cleared
conversation's vectors never come out (T11), and a bubble comes out once, by its best chunk.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from django.db import connection, transaction
from django.db.models import F
from django.db.models.functions import Substr

from conversations.models import Bubble
from search import scoring_memory, scoring_pgvector
from search.models import ChunkVector

_DTYPE = np.dtype("<f4")


def to_bytes(vector: Iterable[float]) -> bytes:
    """The stored form: float32, scaled to length 1 (so a dot product is the cosine)."""
    array = np.asarray(list(vector), dtype=_DTYPE)
    norm = float(np.linalg.norm(array))
    return (array / norm if norm else array).astype(_DTYPE).tobytes()


def replace(*, bubble_ids: list[int], model: str, rows: list[ChunkVector]) -> None:
    """Store the bubbles' vectors of `model` in place of any they had, and move their owners' versions."""
    pgvector = scoring_pgvector.in_use()
    if pgvector:  # before the writes: PostgreSQL builds no index in a transaction with pending trigger events
        for size in {len(row.vector) // _DTYPE.itemsize for row in rows if row.vector}:
            scoring_pgvector.ensure_index(model, size)
    with transaction.atomic():
        # First: the version rows' locks make two workers embedding one owner's bubbles take turns, so the
        # second replaces the first's rows instead of colliding with them.
        owners: dict[int, int] = {}
        for row in rows:
            owners[row.owner_id] = owners.get(row.owner_id, 0) + 1
        bump(model, owners)
        # A bubble deleted or let go (T11) since it was read gets no vector: locked here, it cannot go before
        # this commits (its deletion then takes the vectors with it).
        where = dict(Bubble.objects.select_for_update().filter(pk__in=bubble_ids).values_list("pk", "conversation_id"))
        rows = [row for row in rows if where.get(row.bubble_id) == row.conversation_id]
        ChunkVector.objects.filter(bubble_id__in=bubble_ids, model=model).delete()
        ChunkVector.objects.bulk_create(rows, batch_size=1000)
        if pgvector:
            scoring_pgvector.write(rows)


def bump(model: str, inserted: dict[int, int]) -> None:
    """Change the owners' versions of `model` and count the rows inserted for each (inside the transaction
    that writes them, before it writes: its lock on the version row orders the writers)."""
    with connection.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO search_vectorversion (owner_id, model, version, inserted, epoch) VALUES (%s, %s, %s, %s, %s) "
            "ON CONFLICT (owner_id, model) DO UPDATE SET version = EXCLUDED.version, "
            "inserted = search_vectorversion.inserted + EXCLUDED.inserted",
            [[owner, model, secrets.randbits(62), count, secrets.randbits(62)]
             for owner, count in sorted(inserted.items())])


def backend() -> str:
    """How vectors are scored here (the benchmark prints it)."""
    return "pgvector, HNSW" if scoring_pgvector.in_use() else "exact, in memory"


def forget() -> None:
    """Drop every in-memory copy (tests, benchmarks)."""
    scoring_memory.forget()


@dataclass(frozen=True)
class Near:
    chunk: int
    bubble: int
    node: int
    role: str
    conversation: int
    conversation_title: str
    similarity: float
    start: int  # where the chunk starts in the bubble's text
    text: str  # the chunk's text, its first SNIPPET_CHARS characters


SNIPPET_CHARS = 300


def nearest(*, owner_id: int, model: str, query: list[float], limit: int, min_similarity: float = -1.0,
            exclude_conversation: int | None = None) -> list[Near]:
    """The owner's bubbles closest to `query` (best chunk a bubble), best first, in conversations the owner
    still has, every branch; never `exclude_conversation`'s."""
    target = np.frombuffer(to_bytes(query), dtype=_DTYPE)
    ranked_by = scoring_pgvector.ranked if scoring_pgvector.in_use() else scoring_memory.ranked
    wanted = limit * 4
    while True:
        ranked = ranked_by(owner_id=owner_id, model=model, target=target, take=wanted,
                           exclude_conversation=exclude_conversation)
        kept = [(chunk, score) for chunk, score in ranked if score >= min_similarity]
        found = _live(owner_id, [chunk for chunk, _ in kept], [score for _, score in kept], limit)
        if len(found) >= limit or len(kept) < wanted:
            return found
        wanted *= 4  # many of the nearest were gone (deleted since a copy was read) or of one bubble


def similarities(*, owner_id: int, model: str, query: list[float], bubble_ids: list[int]) -> dict[int, float]:
    """Each of these bubbles' cosine similarity to `query` (its best chunk's), for those the owner has vectors of
    (read from the database: a handful of rows, whichever scorer is in use)."""
    target = np.frombuffer(to_bytes(query), dtype=_DTYPE)
    best: dict[int, float] = {}
    rows = ChunkVector.objects.filter(bubble_id__in=bubble_ids, model=model)  # the owner checked below (see _live)
    for bubble, owner, blob in rows.values_list("bubble_id", "owner_id", "vector"):
        vector = np.frombuffer(bytes(blob), dtype=_DTYPE)
        if owner == owner_id and len(vector) == len(target):
            best[bubble] = max(best.get(bubble, -1.0), float(vector @ target))
    return best


def _live(owner_id: int, chunk_ids: list[int], scores: list[float], limit: int) -> list[Near]:
    """The chunks, best first, whose bubble is still shown in the owner's conversation; one a bubble."""
    # By id only, the owner checked on the rows found: a filter on the owner tempts SQLite's planner into reading
    # all of the owner's rows through their index instead of the few asked for.
    rows = {row["pk"]: row for row in ChunkVector.objects.filter(
        pk__in=chunk_ids, bubble__conversation_id=F("conversation_id"),
    ).annotate(text=Substr("bubble__content", F("start") + 1, SNIPPET_CHARS)).values(
        "pk", "owner_id", "bubble_id", "bubble__node_id", "bubble__role", "conversation_id", "conversation__title",
        "start", "end", "text") if row["owner_id"] == owner_id}
    found: list[Near] = []
    seen: set[int] = set()
    for pk, score in zip(chunk_ids, scores, strict=True):
        row = rows.get(pk)
        if row is None or row["bubble_id"] in seen:
            continue
        seen.add(row["bubble_id"])
        found.append(Near(chunk=pk, bubble=row["bubble_id"], node=row["bubble__node_id"], role=row["bubble__role"],
                          conversation=row["conversation_id"],
                          conversation_title=row["conversation__title"] or f"Conversation {row['conversation_id']}",
                          similarity=float(score), start=row["start"], text=row["text"][: row["end"] - row["start"]]))
        if len(found) == limit:
            break
    return found
