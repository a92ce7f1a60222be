"""Stored vectors and the nearest ones to a query, by exact scoring (issue 18).

Each process keeps an owner's vectors of one model as one float32 matrix in memory and scores a query against
all of them with one matrix product (100,000 chunks of 256 dimensions: 100 MB, a few milliseconds; see
`manage.py bench_retrieval`). The copy is current while the owner's `VectorVersion` has not moved; when it
has, only the rows that came or went are read. What it finds is checked against the database before it is
returned, so a deleted or cleared conversation's vectors, still in a copy, never come out (T11).

Works the same on PostgreSQL and SQLite: no database extension is needed.
"""

from __future__ import annotations

import secrets
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.db.models.functions import Substr

from search.models import ChunkVector

_DTYPE = np.dtype("<f4")
_LOAD_BATCH = 5000


def to_bytes(vector: Iterable[float]) -> bytes:
    """The stored form: float32, scaled to length 1 (so a dot product is the cosine)."""
    array = np.asarray(list(vector), dtype=_DTYPE)
    norm = float(np.linalg.norm(array))
    return (array / norm if norm else array).astype(_DTYPE).tobytes()


@transaction.atomic
def replace(*, bubble_ids: list[int], model: str, rows: list[ChunkVector]) -> None:
    """Store the bubbles' vectors of `model` in place of any they had, and move their owners' versions."""
    ChunkVector.objects.filter(bubble_id__in=bubble_ids, model=model).delete()
    ChunkVector.objects.bulk_create(rows, batch_size=1000)
    bump(sorted({row.owner_id for row in rows}))


def bump(owner_ids: list[int]) -> None:
    """Move the owners' versions (inside the transaction that wrote their vectors)."""
    if not owner_ids:
        return
    with connection.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO search_vectorversion (owner_id, version) VALUES (%s, %s) "
            "ON CONFLICT (owner_id) DO UPDATE SET version = EXCLUDED.version",
            [[owner, secrets.randbits(62)] for owner in owner_ids])


@dataclass
class _Matrix:
    """One owner's vectors of one model, as loaded at `version`."""

    version: int
    keys: list[tuple[int, int]]  # (chunk id, nonce) a row
    conversations: np.ndarray
    vectors: np.ndarray  # len(keys) x dimensions

    @property
    def ids(self) -> np.ndarray:
        return np.fromiter((pk for pk, _ in self.keys), dtype=np.int64, count=len(self.keys))

    @property
    def nbytes(self) -> int:
        return self.vectors.nbytes + self.conversations.nbytes + len(self.keys) * 100


_cache: OrderedDict[tuple[int, str], _Matrix] = OrderedDict()
_lock = threading.Lock()


def _version(owner_id: int) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT version FROM search_vectorversion WHERE owner_id = %s", [owner_id])
        row = cursor.fetchone()
    return row[0] if row else 0


def _rows(keys: list[tuple[int, int]], dimensions: int | None) -> tuple[list[tuple[int, int]], list[int], list[bytes]]:
    """The rows' conversations and vectors (of `dimensions`; the first row's when None), in `keys`' order."""
    found: dict[int, tuple[int, int, bytes]] = {}
    for start in range(0, len(keys), _LOAD_BATCH):
        batch = [pk for pk, _ in keys[start:start + _LOAD_BATCH]]
        for pk, nonce, conversation, blob in ChunkVector.objects.filter(pk__in=batch).values_list(
                "pk", "nonce", "conversation_id", "vector"):
            found[pk] = (nonce, conversation, bytes(blob))
    kept, conversations, blobs = [], [], []
    for pk, nonce in keys:
        row = found.get(pk)
        if row is None or row[0] != nonce or not row[2]:
            continue  # gone since the keys were read, or a text with no word (an empty vector)
        dimensions = dimensions or len(row[2]) // _DTYPE.itemsize
        if len(row[2]) == dimensions * _DTYPE.itemsize:
            kept.append((pk, nonce))
            conversations.append(row[1])
            blobs.append(row[2])
    return kept, conversations, blobs


def _load(owner_id: int, model: str, cached: _Matrix | None) -> _Matrix:
    """The owner's vectors now: the cached copy, less the rows gone and with the rows new since, or all anew."""
    version = _version(owner_id)  # read before the rows: a write after it shows as a newer version next time
    if cached is not None and cached.version == version:
        return cached
    present = set(ChunkVector.objects.filter(owner_id=owner_id, model=model).values_list("pk", "nonce")
                  .iterator(chunk_size=_LOAD_BATCH))
    if cached is not None and cached.keys:
        keep = np.fromiter((key in present for key in cached.keys), dtype=bool, count=len(cached.keys))
        known = set(cached.keys)
        dimensions = cached.vectors.shape[1]
    else:
        keep, known, dimensions = None, set(), None
    keys, conversations, blobs = _rows(sorted(present - known), dimensions)
    dimensions = dimensions or (len(blobs[0]) // _DTYPE.itemsize if blobs else 0)
    fresh = np.frombuffer(b"".join(blobs), dtype=_DTYPE).reshape(len(blobs), dimensions)
    if keep is None:
        return _Matrix(version, keys, np.asarray(conversations, dtype=np.int64), fresh)
    return _Matrix(version, [key for key, kept in zip(cached.keys, keep, strict=True) if kept] + keys,
                   np.concatenate([cached.conversations[keep], np.asarray(conversations, dtype=np.int64)]),
                   np.concatenate([cached.vectors[keep], fresh]))


def _matrix(owner_id: int, model: str) -> _Matrix:
    key = (owner_id, model)
    with _lock:
        matrix = _load(owner_id, model, _cache.get(key))
        _cache[key] = matrix
        _cache.move_to_end(key)
        budget = settings.ARBOR_VECTOR_CACHE_MB * 1024 * 1024
        while len(_cache) > 1 and sum(m.nbytes for m in _cache.values()) > budget:
            _cache.popitem(last=False)  # the least recently used owner is read again when asked
        return matrix


def forget() -> None:
    """Drop every in-memory copy (tests, benchmarks)."""
    with _lock:
        _cache.clear()


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
    matrix = _matrix(owner_id, model)
    target = np.frombuffer(to_bytes(query), dtype=_DTYPE)
    if not matrix.keys or matrix.vectors.shape[1] != len(target):
        return []
    scores = matrix.vectors @ target
    if exclude_conversation is not None:
        scores[matrix.conversations == exclude_conversation] = -np.inf
    wanted = limit * 4
    while True:
        take = min(len(scores), wanted)
        best = np.argpartition(-scores, take - 1)[:take] if take < len(scores) else np.arange(len(scores))
        best = best[np.argsort(-scores[best], kind="stable")]
        best = best[scores[best] >= min_similarity]
        found = _live(owner_id, [matrix.keys[i][0] for i in best.tolist()], scores[best].tolist(), limit)
        if len(found) >= limit or take >= len(scores) or len(best) < take:
            return found
        wanted *= 4  # many of the nearest were gone (deleted since this copy was read) or of one bubble


def _live(owner_id: int, chunk_ids: list[int], scores: list[float], limit: int) -> list[Near]:
    """The chunks, best first, whose bubble is still shown in the owner's conversation; one a bubble."""
    rows = {row["pk"]: row for row in ChunkVector.objects.filter(
        pk__in=chunk_ids, conversation__owner_id=owner_id, bubble__conversation_id=F("conversation_id"),
    ).annotate(text=Substr("bubble__content", F("start") + 1, SNIPPET_CHARS)).values(
        "pk", "bubble_id", "bubble__node_id", "bubble__role", "conversation_id", "conversation__title", "start",
        "end", "text")}
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
