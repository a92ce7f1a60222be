"""Issue 34: a person's words are looked up among their own entries only. 0005's GIN index over (owner, tsvector)
keeps the two columns' entries apart: a word's (or a prefix's) entries are everyone's, read whole and then
intersected with the owner's, so a search grew with other people's messages. This index holds each lexeme with its
owner in front ("7:revenue"), so a word or a prefix of one person is one narrow range of the index whatever anyone
else wrote. search_owned_words keeps positions and weights (phrases, `<->`, match as before); a lexeme of more than
1,000 bytes (no query word is that long: search.query.MAX_QUERY_CHARS) is left out, so an owner's prefix never makes
a lexeme too long. btree_gin is no longer needed. The index is built in the migration's transaction."""

import logging

from django.db import DatabaseError, migrations, transaction

logger = logging.getLogger("arbor.migrations")

_LEXEME = r"""$r$'((?:''|\\\\|[^'\\])*)'$r$"""  # a quoted lexeme of tsvector's or tsquery's text form
_FUNCTIONS = (f"""
CREATE OR REPLACE FUNCTION search_owned_words(owner integer, vector tsvector) RETURNS tsvector
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $f$
SELECT regexp_replace(
    ts_delete(vector, ARRAY(SELECT u.lexeme FROM unnest(vector) AS u WHERE octet_length(u.lexeme) > 1000))::text,
    {_LEXEME}, '''' || owner || ':\\1''', 'g')::tsvector $f$""", f"""
CREATE OR REPLACE FUNCTION search_owned_query(owner integer, query tsquery) RETURNS tsquery
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $f$
SELECT regexp_replace(query::text, {_LEXEME}, '''' || owner || ':\\1''', 'g')::tsquery $f$""")


def _owned(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for function in _FUNCTIONS:
        schema_editor.execute(function)
    schema_editor.execute("CREATE INDEX search_owned_words_gin ON search_bubbledocument "
                          "USING gin (search_owned_words(owner_id, vector))")
    schema_editor.execute("DROP INDEX IF EXISTS search_owner_vector_gin")
    schema_editor.execute("DROP INDEX IF EXISTS search_bubble_vector_gin")


def _as_0005(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    schema_editor.execute("DROP INDEX IF EXISTS search_owned_words_gin")
    schema_editor.execute("DROP FUNCTION IF EXISTS search_owned_words(integer, tsvector)")
    schema_editor.execute("DROP FUNCTION IF EXISTS search_owned_query(integer, tsquery)")
    try:
        with transaction.atomic(using=connection.alias):
            schema_editor.execute("CREATE EXTENSION IF NOT EXISTS btree_gin")
            schema_editor.execute("CREATE INDEX search_owner_vector_gin ON search_bubbledocument "
                                  "USING gin (owner_id, vector)")
    except DatabaseError as error:
        logger.warning("search: btree_gin could not be created (%s); the tsvector index is made instead.", error)
        schema_editor.execute("CREATE INDEX IF NOT EXISTS search_bubble_vector_gin ON search_bubbledocument "
                              "USING gin (vector)")


class Migration(migrations.Migration):

    dependencies = [("search", "0005_document_owner")]

    operations = [migrations.RunPython(_owned, _as_0005)]
