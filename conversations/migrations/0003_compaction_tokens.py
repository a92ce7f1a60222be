"""C1, C2, C3: token counts on nodes, the compaction root's summarising call, and the two shapes of a
compaction node (a parentless root with an original, or the summarising call below the old head).

Existing nodes get an estimate (about four characters a token, what arbor/echo counts) so their
conversations' budget checks start from a sensible figure; new nodes are counted with litellm.
"""

import json

import django.db.models.deletion
from django.db import migrations, models


def estimate_tokens(apps, schema_editor):
    Node = apps.get_model("conversations", "Node")
    path_tokens: dict[int, int] = {}
    batch = []
    # A parent is always written before its children, so id order meets every parent first.
    for node in Node.objects.order_by("id").only("id", "parent_id", "status", "sent", "received").iterator():
        items = list(node.sent) + (list(node.received) if node.status == "succeeded" else [])
        node.tokens = len(json.dumps(items, ensure_ascii=False)) // 4 if items else 0
        node.path_tokens = node.tokens + (path_tokens.get(node.parent_id, 0) if node.parent_id else 0)
        path_tokens[node.id] = node.path_tokens
        batch.append(node)
        if len(batch) >= 1000:
            Node.objects.bulk_update(batch, ["tokens", "path_tokens"])
            batch = []
    if batch:
        Node.objects.bulk_update(batch, ["tokens", "path_tokens"])


class Migration(migrations.Migration):

    dependencies = [
        ('conversations', '0002_node_instructions_preferences'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='node',
            name='node_compaction_has_no_parent',
        ),
        migrations.AddField(
            model_name='node',
            name='path_tokens',
            field=models.PositiveBigIntegerField(default=0),
        ),
        migrations.AddField(
            model_name='node',
            name='summary_call',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='conversations.node'),
        ),
        migrations.AddField(
            model_name='node',
            name='tokens',
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddConstraint(
            model_name='node',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('kind', 'compaction'), _negated=True), models.Q(('compacted_from__isnull', False), ('parent__isnull', True)), models.Q(('compacted_from__isnull', True), ('parent__isnull', False)), _connector='OR'), name='node_compaction_root_or_summarising_call'),
        ),
        migrations.AddConstraint(
            model_name='node',
            constraint=models.CheckConstraint(condition=models.Q(('summary_call__isnull', True), ('compacted_from__isnull', False), _connector='OR'), name='node_summary_call_only_on_compaction_root'),
        ),
        migrations.RunPython(estimate_tokens, migrations.RunPython.noop, elidable=True),
    ]
