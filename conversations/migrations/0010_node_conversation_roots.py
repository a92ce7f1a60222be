"""Issue 13: a partial index on each conversation's parentless nodes (first questions, compaction roots), so the
screen's branch places cost what a page shows, not the number of conversations in the table."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('conversations', '0009_turn_runs'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='node',
            index=models.Index(condition=models.Q(('parent__isnull', True)), fields=['conversation'],
                               name='node_conversation_roots'),
        ),
    ]
