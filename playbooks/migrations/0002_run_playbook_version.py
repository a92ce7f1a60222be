import django.db.models.deletion
from django.db import migrations, models


def link_runs(apps, schema_editor):
    """Existing runs point at the version row their number names (N1)."""
    PlaybookRun = apps.get_model("playbooks", "PlaybookRun")
    PlaybookVersion = apps.get_model("playbooks", "PlaybookVersion")
    for run in PlaybookRun.objects.filter(playbook_version__isnull=True).iterator():
        version = PlaybookVersion.objects.filter(playbook_id=run.playbook_id, number=run.version).first()
        if version is not None:
            PlaybookRun.objects.filter(pk=run.pk).update(playbook_version=version)


class Migration(migrations.Migration):

    dependencies = [
        ("playbooks", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="playbookrun",
            name="playbook_version",
            field=models.ForeignKey(
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="runs",
                to="playbooks.playbookversion",
            ),
        ),
        migrations.RunPython(link_runs, migrations.RunPython.noop),
    ]
