from django.db import migrations


def mark_playbook_conversations(apps, schema_editor):
    """Issue 26: runs and edit conversations made before conversations knew their origin are a playbook's, so the
    sidebar can tell them from a person's chats."""
    Conversation = apps.get_model("conversations", "Conversation")
    Playbook = apps.get_model("playbooks", "Playbook")
    PlaybookRun = apps.get_model("playbooks", "PlaybookRun")
    runs = PlaybookRun.objects.filter(conversation__isnull=False).values("conversation_id")
    edits = Playbook.objects.filter(edit_conversation__isnull=False).values("edit_conversation_id")
    Conversation.objects.filter(pk__in=runs).update(origin="playbook")
    Conversation.objects.filter(pk__in=edits).update(origin="playbook")


class Migration(migrations.Migration):

    dependencies = [
        ("playbooks", "0002_run_playbook_version"),
        ("conversations", "0016_conversation_origin"),
    ]

    operations = [migrations.RunPython(mark_playbook_conversations, migrations.RunPython.noop)]
