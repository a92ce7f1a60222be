"""Exact scoring in memory (issue 18): the scorer where the database has no vector index (SQLite; PostgreSQL
without pgvector).

Each process keeps an owner's vectors of one model as one float32 matrix and scores a query against all of them
with one matrix product (100,000 chunks of 384 dimensions: 154 MB, milliseconds; `manage.py bench_retrieval`).
The copy is current while the owner's `VectorVersion` has not changed; when it has, only the rows that came or
went are read. Copies beyond ARBOR_VECTOR_CACHE_MB are dropped, least recently used first, and read again
when asked.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from django.conf import settings
from django.db import connection

from search.models import ChunkVector

_DTYPE = np.dtype("<f4")
_LOAD_BATCH = 5000


@dataclass
class _Matrix:
    """One owner's vectors of one model, as loaded at `version`."""

    version: int
    keys: list[tuple[int, int]]  # (chunk id, nonce) a row
    conversations: np.ndarray
    vectors: np.ndarray  # len(keys) x dimensions

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


def _rows(keys: list[tuple[int, int]], dimensions: int | None) -> tuple[list[tuple[int, int]], list[int],
                                                                         list[bytes]]:
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
    with _lock:
        _cache.clear()


def ranked(*, owner_id: int, model: str, target: np.ndarray, take: int,
           exclude_conversation: int | None) -> list[tuple[int, float]]:
    """The `take` chunks nearest to `target` (length 1), best first, as (chunk id, cosine similarity)."""
    matrix = _matrix(owner_id, model)
    if not matrix.keys or matrix.vectors.shape[1] != len(target):
        return []
    scores = matrix.vectors @ target
    if exclude_conversation is not None:
        scores[matrix.conversations == exclude_conversation] = -np.inf
    take = min(take, len(scores))
    best = np.argpartition(-scores, take - 1)[:take] if take < len(scores) else np.arange(len(scores))
    best = best[np.argsort(-scores[best], kind="stable")]
    best = best[np.isfinite(scores[best])]
    return [(matrix.keys[i][0], float(scores[i])) for i in best.tolist()]
