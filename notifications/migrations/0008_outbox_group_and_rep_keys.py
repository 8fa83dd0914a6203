import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    """group_id and rep_id become keys (group, rep) over the same columns: no constraint, no
    index, so the table is unchanged and nothing is rewritten; only the models' state moves."""

    dependencies = [
        ('notifications', '0007_endpoint_unreachable_help'),
        ('rotation', '0010_labels_default_group_and_time_zone'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.RemoveField(
                    model_name='outboxmessage',
                    name='group_id',
                ),
                migrations.RemoveField(
                    model_name='outboxmessage',
                    name='rep_id',
                ),
                migrations.AddField(
                    model_name='outboxmessage',
                    name='group',
                    field=models.ForeignKey(blank=True, db_constraint=False, db_index=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='rotation.group'),
                ),
                migrations.AddField(
                    model_name='outboxmessage',
                    name='rep',
                    field=models.ForeignKey(blank=True, db_constraint=False, db_index=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='rotation.rep'),
                ),
            ],
        ),
    ]
