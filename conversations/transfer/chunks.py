"""What the exports share (issue 13): a tree read a chunk of nodes at a time inside one consistent snapshot, and
its text handed on in parts as it is made, so an export's memory follows a chunk, never the conversation."""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connection, transaction

NODES_PER_QUERY = 100  # a node holds at most ARBOR_NODE_MAX_BYTES of items: a chunk stays small
PART_CHARS = 64 * 1024  # the size of a part of the body handed to the server


def id_chunks(ids: array, size: int = NODES_PER_QUERY) -> Iterator[list[int]]:
    for start in range(0, len(ids), size):
        yield ids[start:start + size].tolist()


@contextmanager
def snapshot() -> Iterator[None]:
    """One consistent view of the tree for a whole export, which reads it in many queries: on PostgreSQL a
    read-only repeatable-read transaction. SQLite has one writer at a time and Django opens its transactions
    IMMEDIATE (taking the write lock a turn needs), so there the export reads as it goes. Inside a transaction
    already (a test), that one serves."""
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        yield
        return
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield


def joined(pieces: Iterable[str], *, separator: str = ", ") -> Iterator[str]:
    """`separator.join(pieces)`, handed on in parts of about PART_CHARS characters."""
    batch: list[str] = []
    size = 0
    first = True
    for piece in pieces:
        batch.append(piece)
        size += len(piece)
        if size >= PART_CHARS:
            yield ("" if first else separator) + separator.join(batch)
            first, batch, size = False, [], 0
    if batch:
        yield ("" if first else separator) + separator.join(batch)


def json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def json_array(items: Iterable[Any]) -> Iterator[str]:
    """A JSON array's text, in parts."""
    yield "["
    yield from joined(json_text(item) for item in items)
    yield "]"


def json_object_start(fields: dict[str, Any], key: str) -> str:
    """`{...fields, "key": ` : the opening of an object whose last member's value is streamed after it."""
    head = json_text(fields)
    return f"{head[:-1]}{', ' if fields else ''}{json_text(key)}: "
