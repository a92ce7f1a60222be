"""Jobs queued as `turn_committed` by an earlier version become one job per kind (`index`, `title`)."""

from django.db import migrations


def split_turn_committed(apps, schema_editor):
    OutboxJob = apps.get_model("conversations", "OutboxJob")
    for job in OutboxJob.objects.filter(kind="turn_committed", status="pending").iterator():
        OutboxJob.objects.bulk_create([OutboxJob(kind=kind, payload=job.payload, run_after=job.run_after)
                                       for kind in ("index", "title")])
        job.delete()


class Migration(migrations.Migration):
    dependencies = [("conversations", "0007_node_window_root")]
    operations = [migrations.RunPython(split_turn_committed, migrations.RunPython.noop)]
