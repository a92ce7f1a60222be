"""Issue 34: the rows that hang off a node or a conversation name their owner too (the column a database sharded by
owner routes by): a decision on a tool call its node's, a turn run its conversation's, a run's log entries the run's.
Existing rows are given them here; new ones are written with them."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

_FILLS = [
    """UPDATE conversations_toolapproval SET owner_id = (SELECT n.owner_id FROM conversations_node n
       WHERE n.id = conversations_toolapproval.node_id) WHERE owner_id IS NULL""",
    """UPDATE conversations_turnrun SET owner_id = (SELECT c.owner_id FROM conversations_conversation c
       WHERE c.id = conversations_turnrun.conversation_id) WHERE owner_id IS NULL""",
    """UPDATE conversations_turnlogentry SET owner_id = (SELECT r.owner_id FROM conversations_turnrun r
       WHERE r.id = conversations_turnlogentry.run_id) WHERE owner_id IS NULL""",
]


def owners(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        for fill in _FILLS:
            cursor.execute(fill)


def _owner():
    return models.ForeignKey(blank=True, db_constraint=False, db_index=False, null=True,
                             on_delete=django.db.models.deletion.DO_NOTHING, related_name='+',
                             to=settings.AUTH_USER_MODEL)


class Migration(migrations.Migration):

    dependencies = [
        ('conversations', '0026_node_and_bubble_owner'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(model_name='toolapproval', name='owner', field=_owner()),
        migrations.AddField(model_name='turnlogentry', name='owner', field=_owner()),
        migrations.AddField(model_name='turnrun', name='owner', field=_owner()),
        migrations.RunPython(owners, migrations.RunPython.noop, elidable=True),
    ]
