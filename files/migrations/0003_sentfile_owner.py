"""Issue 34: a file a call sent names the node's owner (the column a database sharded by owner routes by)."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def owners(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("""UPDATE files_sentfile SET owner_id = (SELECT n.owner_id FROM conversations_node n
                          WHERE n.id = files_sentfile.node_id) WHERE owner_id IS NULL""")


class Migration(migrations.Migration):

    dependencies = [
        ('files', '0002_file_chunk_vectors'),
        ('conversations', '0026_node_and_bubble_owner'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='sentfile',
            name='owner',
            field=models.ForeignKey(blank=True, db_constraint=False, db_index=False, null=True,
                                    on_delete=django.db.models.deletion.DO_NOTHING, related_name='+',
                                    to=settings.AUTH_USER_MODEL),
        ),
        migrations.RunPython(owners, migrations.RunPython.noop, elidable=True),
    ]
