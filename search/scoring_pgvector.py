"""pgvector's HNSW index (issue 18): the scorer where PostgreSQL has the `vector` extension.

Migration 0004 creates the extension where the server offers it and adds `embedding vector` to
search_chunkvector; each stored row's vector is written there too. An HNSW index (cosine) is made for each
embedding model and size the first time one is written: partial, `WHERE model = … AND vector_dims(embedding) = …`,
so vectors of two models never share an index or a comparison.

Vectors of more than 2000 dimensions (pgvector's HNSW limit for `vector`) get no index and are ranked exactly.

An HNSW scan finds the nearest rows of every owner and filters them afterwards: an owner with few vectors
among many owners' can get fewer rows than asked for. pgvector 0.8+ scans on until it has them
(`hnsw.iterative_scan`); before 0.8, a short answer is asked again of the owner's rows in exact order (their
btree index, every distance computed): correct, and slower only for an owner whose rows are few.
"""

from __future__ import annotations

import hashlib
import re

import numpy as np
from django.conf import settings
from django.db import connection, transaction

from search.models import ChunkVector

EF_SEARCH = 200  # candidates an HNSW scan keeps (pgvector's default is 40; its most is 1000)
HNSW_MAX_DIMENSIONS = 2000  # pgvector's HNSW indexes `vector` up to this; larger vectors are ranked exactly
_MODEL_NAME = re.compile(r"[A-Za-z0-9._:/@+\-]{1,200}")


def in_use() -> bool:
    """Is this connection's database PostgreSQL with pgvector and the `embedding` column, and not set aside by
    ARBOR_VECTOR_SCORER=exact? (Asked once a connection object; the extension does not come and go under a
    running process.)"""
    if connection.vendor != "postgresql" or settings.ARBOR_VECTOR_SCORER == "exact":
        return False
    known = getattr(connection, "_arbor_pgvector", None)
    if known is None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT (SELECT extversion FROM pg_extension WHERE extname = 'vector'), EXISTS ("
                "SELECT 1 FROM information_schema.columns WHERE table_name = 'search_chunkvector' "
                "AND column_name = 'embedding' AND table_schema = current_schema())")
            version, column = cursor.fetchone()
        known = (version, column) if version and column else False
        connection._arbor_pgvector = known
    return bool(known)


def _iterative() -> bool:
    version = connection._arbor_pgvector[0]
    return tuple(int(part) for part in version.split(".")[:2]) >= (0, 8)


def _literal(model: str) -> str:
    """A model name as a string constant, for DDL and for a predicate the planner must see. Names are litellm's
    `provider/model` strings from the settings; anything else is refused rather than quoted."""
    if not _MODEL_NAME.fullmatch(model):
        raise ValueError(f"embedding model name {model!r}: only letters, digits and . _ : / @ + - are allowed")
    return f"'{model}'"


def _text(vector: np.ndarray) -> str:
    return "[" + ",".join(repr(float(v)) for v in vector) + "]"


def _predicate(model: str, dimensions: int) -> str:
    return f"model = {_literal(model)} AND vector_dims(embedding) = {int(dimensions)}"


_indexed: set[tuple[str, str, int]] = set()


def ensure_index(model: str, dimensions: int) -> None:
    """The HNSW index for this model and size, made the first time a process writes or reads them (while it is
    built, writers of vectors wait: once per model, or after pgvector came to a database with vectors). Not
    inside a transaction that has written rows with foreign keys: PostgreSQL refuses while their checks wait."""
    key = (connection.settings_dict["NAME"], model, dimensions)
    if key in _indexed or dimensions > HNSW_MAX_DIMENSIONS:
        return
    name = "search_chunk_hnsw_" + hashlib.sha256(f"{model}|{dimensions}".encode()).hexdigest()[:16]
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_class WHERE relname = %s", [name])
        if cursor.fetchone():  # made already: no CREATE INDEX, which would take a lock on the table to find out
            _indexed.add(key)
            return
        cursor.execute(f"CREATE INDEX IF NOT EXISTS {name} ON search_chunkvector USING hnsw "
                       f"((embedding::vector({int(dimensions)})) vector_cosine_ops) "
                       f"WHERE {_predicate(model, dimensions)}")
    transaction.on_commit(lambda: _indexed.add(key))  # a rolled-back index was never made


def write(rows: list[ChunkVector]) -> None:
    """Copy the rows' vectors (already stored as bytes) into `embedding`, inside the caller's transaction
    (`ensure_index` was called before it began)."""
    ids, texts = [], []
    for row in rows:
        vector = np.frombuffer(bytes(row.vector), dtype="<f4")
        if len(vector):
            ids.append(row.pk)
            texts.append(_text(vector))
    if ids:
        with connection.cursor() as cursor:
            cursor.execute("UPDATE search_chunkvector AS c SET embedding = v.e::vector "
                           "FROM unnest(%s::bigint[], %s::text[]) AS v(id, e) WHERE c.id = v.id", [ids, texts])


def ranked(*, owner_id: int, model: str, target: np.ndarray, take: int,
           exclude_conversation: int | None) -> list[tuple[int, float]]:
    """The `take` chunks nearest to `target`, best first, as (chunk id, cosine similarity)."""
    dimensions = len(target)
    ensure_index(model, dimensions)
    cast = f"embedding::vector({dimensions})"
    query = (f"SELECT id, 1 - ({cast} <=> %s::vector({dimensions})) FROM search_chunkvector "
             f"WHERE {_predicate(model, dimensions)} AND owner_id = %s AND conversation_id IS DISTINCT FROM %s "
             f"ORDER BY {{order}} LIMIT %s")
    params = [_text(target), owner_id, exclude_conversation]
    distance = f"{cast} <=> %s::vector({dimensions})"
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL hnsw.ef_search = {min(1000, max(EF_SEARCH, take))}")
        if _iterative():
            cursor.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
        rows = []
        if dimensions <= HNSW_MAX_DIMENSIONS:
            cursor.execute(query.format(order=distance), [*params, _text(target), take])
            rows = cursor.fetchall()
        if len(rows) < take:  # the scan's candidates were mostly other owners': rank this owner's rows exactly
            cursor.execute(query.format(order=f"({distance}) + 0"), [*params, _text(target), take])
            rows = cursor.fetchall()
    # relaxed_order may hand rows back a little out of order
    return sorted(((pk, float(similarity)) for pk, similarity in rows), key=lambda row: -row[1])
