"""Each index entry carries its owner (copied from the bubble's conversation), so a search asks the index for the
caller's entries only. PostgreSQL: one GIN index over (owner, tsvector) with btree_gin in place of the tsvector's
own, so a word's matches are looked up, counted and ranked among the caller's messages, never every person's;
a role that may not create btree_gin keeps the tsvector index and the owner's btree (the planner ANDs them).
The fill and the index are built in the migration's transaction: search and indexing wait while they run."""

import logging

import django.db.models.deletion
from django.conf import settings
from django.db import DatabaseError, migrations, models, transaction

logger = logging.getLogger("arbor.migrations")

_FILL_POSTGRES = """UPDATE search_bubbledocument d SET owner_id = c.owner_id
FROM conversations_bubble b JOIN conversations_conversation c ON c.id = b.conversation_id WHERE b.id = d.bubble_id"""
_FILL_SQLITE = """UPDATE search_bubbledocument SET owner_id = (
    SELECT c.owner_id FROM conversations_bubble b JOIN conversations_conversation c ON c.id = b.conversation_id
    WHERE b.id = search_bubbledocument.bubble_id)"""


def _owner_first(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        schema_editor.execute(_FILL_SQLITE)
        return
    schema_editor.execute(_FILL_POSTGRES)
    try:
        with transaction.atomic(using=connection.alias):  # a savepoint: the migration goes on without it
            _create_btree_gin(schema_editor)
    except DatabaseError as error:
        logger.warning("search: btree_gin could not be created (%s); full-text search keeps the tsvector index "
                       "and the owner's btree. A role that may create it can run: CREATE EXTENSION btree_gin; "
                       "then `manage.py migrate search 0004 && manage.py migrate search`.", error)
        return
    schema_editor.execute("CREATE INDEX search_owner_vector_gin ON search_bubbledocument USING gin (owner_id, vector)")
    schema_editor.execute("DROP INDEX IF EXISTS search_bubble_vector_gin")


def _create_btree_gin(schema_editor):
    schema_editor.execute("CREATE EXTENSION IF NOT EXISTS btree_gin")


def _vector_only(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP INDEX IF EXISTS search_owner_vector_gin")
        schema_editor.execute("CREATE INDEX IF NOT EXISTS search_bubble_vector_gin ON search_bubbledocument "
                              "USING gin (vector)")


class Migration(migrations.Migration):

    dependencies = [
        ("search", "0004_pgvector"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="bubbledocument",
            name="owner",
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.CASCADE, related_name="+",
                                    to=settings.AUTH_USER_MODEL),
        ),
        migrations.RunPython(_owner_first, _vector_only),
    ]
