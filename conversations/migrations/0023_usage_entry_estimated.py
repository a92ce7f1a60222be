# Issue 31: the ledger's estimated rows (a call stopped or broken off after output had arrived); the calls that
# failed so before this migration get theirs, so `usage_check` agrees from the start.

from django.db import migrations, models


def backfill(apps, schema_editor):
    from conversations.turns.records import charged_partly, estimated_usage

    Node, UsageEntry = apps.get_model("conversations", "Node"), apps.get_model("conversations", "UsageEntry")
    charged = set(UsageEntry.objects.values_list("node_id", flat=True))
    failed = (Node.objects.filter(status="failed", kind="turn", call_settings__isnull=False).exclude(provider="client")
              .select_related("conversation"))
    for node in failed.iterator(chunk_size=500):
        if node.pk in charged or not charged_partly(node.received):
            continue
        usage = estimated_usage(node)
        Node.objects.filter(pk=node.pk).update(usage=usage)
        UsageEntry.objects.create(
            node_id=node.pk, owner_id=node.conversation.owner_id, conversation_id=node.conversation_id,
            project_id=node.conversation.project_id, model=node.model, provider=node.provider,
            input_tokens=usage["prompt_tokens"], output_tokens=usage["completion_tokens"],
            cost_usd=usage.get("cost_usd") or 0.0, day=(node.finished_at or node.created_at).date(), estimated=True)


class Migration(migrations.Migration):

    dependencies = [
        ('conversations', '0022_conversation_turn_weight'),
    ]

    operations = [
        migrations.AddField(
            model_name='usageentry',
            name='estimated',
            field=models.BooleanField(default=False),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
