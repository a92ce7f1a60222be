"""Issue 34: nodes and bubbles name their owner (the column a database sharded by owner routes by). Existing rows
get their conversation's owner; a node whose conversation was deleted (T11: kept while another conversation's path
passes through it) gets the owner of a node linked to it (its parent, a child, its original), a step at a time."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


NODE = "conversations_node"
# A node's link to a node of the same person's tree: its parent, a child, its compaction original or root.
_LINKED = f"""SELECT linked.owner_id FROM {NODE} linked WHERE linked.owner_id IS NOT NULL
    AND (linked.id = {NODE}.parent_id OR linked.parent_id = {NODE}.id
         OR linked.id = {NODE}.compacted_from_id OR linked.compacted_from_id = {NODE}.id)"""


def owners(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"""UPDATE {NODE} SET owner_id = (SELECT c.owner_id FROM conversations_conversation c
                           WHERE c.id = {NODE}.conversation_id) WHERE conversation_id IS NOT NULL""")
        while True:  # each pass reaches one step further from a node that has its owner
            cursor.execute(f"""UPDATE {NODE} SET owner_id = ({_LINKED} LIMIT 1)
                               WHERE owner_id IS NULL AND EXISTS ({_LINKED})""")
            if cursor.rowcount == 0:
                break
        cursor.execute(f"""UPDATE conversations_bubble SET owner_id = (SELECT n.owner_id FROM {NODE} n
                           WHERE n.id = conversations_bubble.node_id)""")


class Migration(migrations.Migration):

    dependencies = [
        ('conversations', '0025_node_first_round'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='bubble',
            name='owner',
            field=models.ForeignKey(blank=True, db_constraint=False, db_index=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to=settings.AUTH_USER_MODEL),
        ),
        migrations.AddField(
            model_name='node',
            name='owner',
            field=models.ForeignKey(blank=True, db_constraint=False, db_index=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to=settings.AUTH_USER_MODEL),
        ),
        migrations.RunPython(owners, migrations.RunPython.noop, elidable=True),
    ]
