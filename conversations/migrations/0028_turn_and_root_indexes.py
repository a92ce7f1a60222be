"""Issue 34: indexes a turn needs so its work does not grow with the person's other conversations (the lock's count
of running turns, a resent list's match by first question). Built CONCURRENTLY on PostgreSQL: turns keep writing
nodes while the index over them builds (a plain CREATE INDEX would hold their writes for as long). Not in a
transaction, so a build that fails leaves the indexes before it, and PostgreSQL an INVALID one to drop by hand
(`DROP INDEX CONCURRENTLY <name>`) before the migration runs again."""

import django.db.models.fields.json
import django.db.models.functions.text
from django.conf import settings
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class AddIndexOnline(AddIndexConcurrently):
    """CREATE INDEX CONCURRENTLY on PostgreSQL, a plain one elsewhere (SQLite has one writer anyway)."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        return migrations.AddIndex.database_forwards(self, app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        return migrations.AddIndex.database_backwards(self, app_label, schema_editor, from_state, to_state)


class Migration(migrations.Migration):
    atomic = False  # CONCURRENTLY cannot run inside a transaction

    dependencies = [
        ('conversations', '0027_approval_and_run_owner'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        AddIndexOnline(
            model_name='conversation',
            index=models.Index(condition=models.Q(('turn_token__isnull', False)), fields=['owner'],
                               name='conversation_turns_held'),
        ),
        AddIndexOnline(
            model_name='conversation',
            index=models.Index(condition=models.Q(('retrieval', True)), fields=['owner'],
                               name='conversation_with_retrieval'),
        ),
        AddIndexOnline(
            model_name='node',
            index=models.Index(models.F('owner'), django.db.models.functions.text.Left(
                django.db.models.fields.json.KeyTextTransform('text', django.db.models.fields.json.KeyTextTransform(
                    '0', 'sent')), 200), condition=models.Q(('parent__isnull', True)), name='node_roots_by_question'),
        ),
    ]
