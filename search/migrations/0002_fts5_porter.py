"""SQLite: the FTS5 index stems English words (Porter) so word forms match ("subscriptions" finds "subscription",
issue 16); the index is rebuilt from the bubbles already indexed. PostgreSQL is untouched (its stemming is
ARBOR_SEARCH_CONFIG's)."""

from django.db import migrations

_REFILL = ("INSERT INTO search_fts (rowid, content) SELECT b.id, b.content FROM conversations_bubble b "
           "JOIN search_bubbledocument d ON d.bubble_id = b.id")


def _rebuild(tokenize: str):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor != "sqlite":
            return
        schema_editor.execute("DROP TABLE IF EXISTS search_fts")
        schema_editor.execute(f"CREATE VIRTUAL TABLE search_fts USING fts5(content, tokenize = '{tokenize}')")
        schema_editor.execute(_REFILL)
    return run


class Migration(migrations.Migration):

    dependencies = [("search", "0001_bubble_document")]

    operations = [migrations.RunPython(_rebuild("porter unicode61"), _rebuild("unicode61"))]
