"""PostgreSQL with pgvector offered by the server: create the extension and an `embedding vector` column on
search_chunkvector (search.scoring_pgvector). Elsewhere nothing changes: SQLite, and PostgreSQL without pgvector,
score in memory. A server given pgvector later: `manage.py migrate search 0003 && manage.py migrate search`."""

import struct

from django.db import migrations, transaction


def _add(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'")
        if cursor.fetchone() is None:
            return
        try:
            with transaction.atomic(using=connection.alias):  # a role that may not create it: go without
                cursor.execute("CREATE EXTENSION IF NOT EXISTS vector")
        except Exception:
            return
        cursor.execute("ALTER TABLE search_chunkvector ADD COLUMN IF NOT EXISTS embedding vector")
        _fill(cursor)
    connection.__dict__.pop("_arbor_pgvector", None)


def _fill(cursor) -> None:
    """Vectors stored before the column was there: copied from their bytes (float32, little-endian)."""
    last = 0
    while True:
        cursor.execute("SELECT id, vector FROM search_chunkvector WHERE id > %s AND length(vector) > 0 "
                       "ORDER BY id LIMIT 2000", [last])
        rows = cursor.fetchall()
        if not rows:
            return
        texts = []
        for _, blob in rows:
            blob = bytes(blob)
            texts.append("[" + ",".join(repr(v) for v in struct.unpack(f"<{len(blob) // 4}f", blob)) + "]")
        cursor.execute("UPDATE search_chunkvector AS c SET embedding = v.e::vector "
                       "FROM unnest(%s::bigint[], %s::text[]) AS v(id, e) WHERE c.id = v.id",
                       [[pk for pk, _ in rows], texts])
        last = rows[-1][0]


def _drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE search_chunkvector DROP COLUMN IF EXISTS embedding")


class Migration(migrations.Migration):

    dependencies = [("search", "0003_chunk_vectors")]

    operations = [migrations.RunPython(_add, _drop)]
