"""Exact scoring in memory (issue 18): the scorer where the database has no vector index (SQLite; PostgreSQL
without pgvector).

Each process keeps an owner's vectors of one model as one float32 matrix and scores a query against all of them
with one matrix product (100,000 chunks of 384 dimensions: 154 MB, milliseconds; `manage.py bench_retrieval`).
The copy is current while the owner's `VectorVersion` has not changed; when it has, only the rows written since
are read (see `_load`). Copies beyond ARBOR_VECTOR_CACHE_MB are dropped, least recently used first, and read again
when asked.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from django.conf import settings
from django.db import connection, transaction

from search.models import ChunkVector, VectorVersion

_DTYPE = np.dtype("<f4")
_LOAD_BATCH = 5000
MAX_BLOCKS = 16


@dataclass
class _Matrix:
    """One owner's vectors of one model as read at `version`, when `inserted` rows had ever been written."""

    version: int
    epoch: int
    inserted: int
    last_id: int  # the highest row id read: rows written later have higher ones (see _load)
    ids: np.ndarray  # chunk ids
    conversations: np.ndarray
    # len(ids) x dimensions, in blocks: rows written since are a block of their own, so a write costs its rows,
    # not a copy of all (MAX_BLOCKS joins them again)
    blocks: list[np.ndarray]

    @property
    def dimensions(self) -> int | None:
        return self.blocks[0].shape[1] if self.blocks else None

    @property
    def nbytes(self) -> int:
        return sum(block.nbytes for block in self.blocks) + self.ids.nbytes + self.conversations.nbytes

    def scores(self, target: np.ndarray) -> np.ndarray:
        return np.concatenate([block @ target for block in self.blocks])


_cache: OrderedDict[tuple[int, str], _Matrix] = OrderedDict()
_lock = threading.Lock()  # the cache's own order and size
_owner_locks: dict[tuple[int, str], threading.Lock] = {}  # one reading of an owner's rows at a time


def _read(owner_id: int, model: str, after: int, dimensions: int | None) -> tuple[int, int, list, list, list]:
    """(rows read, highest id, ids, conversations, vectors) of the owner's rows of `model` after id `after`;
    rows with no vector, or of another size than `dimensions` (the first vector's when None), are not kept."""
    count, last, ids, conversations, blobs = 0, after, [], [], []
    rows = (ChunkVector.objects.filter(owner_id=owner_id, model=model, pk__gt=after).order_by("pk")
            .values_list("pk", "conversation_id", "vector").iterator(chunk_size=_LOAD_BATCH))
    for pk, conversation, blob in rows:
        count, last, blob = count + 1, pk, bytes(blob)
        dimensions = dimensions or len(blob) // _DTYPE.itemsize
        if blob and len(blob) == dimensions * _DTYPE.itemsize:
            ids.append(pk)
            conversations.append(conversation)
            blobs.append(blob)
    return count, last, ids, conversations, blobs


def _load(owner_id: int, model: str, cached: _Matrix | None) -> _Matrix:
    """The owner's vectors now: the cached copy, with the rows written since if that is all that changed, or
    all of them read anew.

    Writers of one owner's vectors take turns on the version row and take their ids after they have it, so
    rows written since a copy was read have higher ids than any it read (PostgreSQL's sequence, SQLite's
    AUTOINCREMENT). When the rows after the copy's last one are fewer than the count says were written since,
    some were deleted already: read anew; so too when the version row was made anew (its `epoch`: a rolled-back
    transaction gives its ids again, as tests' do).
    Rows deleted from under a copy stay in it and are dropped by `vectors._live`; a reading anew forgets them.
    """
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if outermost and connection.vendor == "postgresql":
            with connection.cursor() as cursor:  # the version and the rows as of one moment
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        version, epoch, inserted = VectorVersion.objects.filter(owner_id=owner_id, model=model).values_list(
            "version", "epoch", "inserted").first() or (0, 0, 0)
        if cached is not None and cached.version == version:
            return cached
        if cached is not None and cached.epoch == epoch:
            count, last, ids, conversations, blobs = _read(owner_id, model, cached.last_id, cached.dimensions)
            if cached.inserted + count == inserted:
                blocks = [*cached.blocks, _matrix_of(blobs, cached.dimensions)] if blobs else cached.blocks
                if len(blocks) > MAX_BLOCKS:
                    blocks = [np.concatenate(blocks)]
                return _Matrix(version, epoch, inserted, last,
                               np.concatenate([cached.ids, np.asarray(ids, dtype=np.int64)]),
                               np.concatenate([cached.conversations, np.asarray(conversations, dtype=np.int64)]),
                               blocks)
        _, last, ids, conversations, blobs = _read(owner_id, model, 0, None)
        return _Matrix(version, epoch, inserted, last, np.asarray(ids, dtype=np.int64),
                       np.asarray(conversations, dtype=np.int64), [_matrix_of(blobs, None)] if blobs else [])


def _matrix_of(blobs: list[bytes], dimensions: int | None) -> np.ndarray:
    size = dimensions or (len(blobs[0]) // _DTYPE.itemsize if blobs else 0)
    return np.frombuffer(b"".join(blobs), dtype=_DTYPE).reshape(len(blobs), size)


def _matrix(owner_id: int, model: str) -> _Matrix:
    """The owner's copy, current. One owner's reading anew does not hold up another owner's queries."""
    key = (owner_id, model)
    with _lock:
        owner_lock = _owner_locks.setdefault(key, threading.Lock())
    with owner_lock:
        matrix = _load(owner_id, model, _cache.get(key))
    with _lock:
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
    if not len(matrix.ids) or matrix.dimensions != len(target):
        return []
    scores = matrix.scores(target)
    if exclude_conversation is not None:
        scores[matrix.conversations == exclude_conversation] = -np.inf
    take = min(take, len(scores))
    best = np.argpartition(-scores, take - 1)[:take] if take < len(scores) else np.arange(len(scores))
    best = best[np.argsort(-scores[best], kind="stable")]
    best = best[np.isfinite(scores[best])]
    return [(int(matrix.ids[i]), float(scores[i])) for i in best.tolist()]
