"""Issue 34: nodes and bubbles name their owner (the column a database sharded by owner routes by). Existing rows
get their conversation's owner. A node whose conversation was deleted (T11: kept while something still rests on it)
gets the owner of what rests on it: a conversation's head, a playbook's or its version's nodes, a share, or a node
of its own tree that has its owner (below it, or a compaction root it is the original of), walked up through such
nodes in one recursive query."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

NODE = "conversations_node"
# What rests on a node, with its owner: heads, playbooks' nodes (PROTECT), shares, and owned nodes' links.
_SEEDS = f"""
SELECT c.head_id AS id, c.owner_id AS owner FROM conversations_conversation c WHERE c.head_id IS NOT NULL
UNION SELECT p.source_head_id, p.owner_id FROM playbooks_playbook p
UNION SELECT p.conversion_node_id, p.owner_id FROM playbooks_playbook p
UNION SELECT v.head_id, p.owner_id FROM playbooks_playbookversion v JOIN playbooks_playbook p ON p.id = v.playbook_id
UNION SELECT v.conversion_node_id, p.owner_id FROM playbooks_playbookversion v
      JOIN playbooks_playbook p ON p.id = v.playbook_id
UNION SELECT s.node_id, c.owner_id FROM shares_share s JOIN conversations_conversation c ON c.id = s.conversation_id
UNION SELECT n.parent_id, n.owner_id FROM {NODE} n WHERE n.owner_id IS NOT NULL AND n.parent_id IS NOT NULL
UNION SELECT n.compacted_from_id, n.owner_id FROM {NODE} n WHERE n.owner_id IS NOT NULL
      AND n.compacted_from_id IS NOT NULL
UNION SELECT n.summary_call_id, n.owner_id FROM {NODE} n WHERE n.owner_id IS NOT NULL AND n.summary_call_id IS NOT NULL
"""
# Up from each seed through nodes without an owner (UNION: a corrupt loop ends).
_ORPHANS = f"""
WITH RECURSIVE seed(id, owner) AS ({_SEEDS}),
walk(id, owner) AS (
    SELECT n.id, seed.owner FROM seed JOIN {NODE} n ON n.id = seed.id WHERE n.owner_id IS NULL
    UNION
    SELECT n.id, walk.owner FROM walk JOIN {NODE} here ON here.id = walk.id
    JOIN {NODE} n ON n.id IN (here.parent_id, here.compacted_from_id, here.summary_call_id)
    WHERE n.owner_id IS NULL
)
SELECT id, MIN(owner) FROM walk GROUP BY id"""


def owners(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"""UPDATE {NODE} SET owner_id = (SELECT c.owner_id FROM conversations_conversation c
                           WHERE c.id = {NODE}.conversation_id) WHERE conversation_id IS NOT NULL""")
        cursor.execute(_ORPHANS)
        by_owner: dict[int, list[int]] = {}
        for node_id, owner in cursor.fetchall():
            by_owner.setdefault(owner, []).append(node_id)
        for owner, ids in by_owner.items():
            for start in range(0, len(ids), 500):
                chunk = ids[start:start + 500]
                cursor.execute(f"UPDATE {NODE} SET owner_id = %s WHERE id IN ({', '.join(['%s'] * len(chunk))})",
                               [owner, *chunk])
        cursor.execute(f"""UPDATE conversations_bubble SET owner_id = (SELECT n.owner_id FROM {NODE} n
                           WHERE n.id = conversations_bubble.node_id)""")


class Migration(migrations.Migration):

    dependencies = [
        ('conversations', '0025_node_first_round'),
        ('playbooks', '0003_playbook_conversations_origin'),
        ('shares', '0001_initial'),
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
