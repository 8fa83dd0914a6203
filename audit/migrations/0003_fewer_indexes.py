"""Drop the single-column indexes a composite index already covers (each is written once per
lead or event). Done by name in SQL: altering the fields would make Django drop every
single-column index on those columns, one_open_assignment (a partial unique index) among
them, and re-validate the foreign keys."""

from django.db import migrations, models


DROPPED = [
    "audit_auditevent_group_75315f31",
    "audit_auditevent_group_75315f31_like",
    "audit_auditevent_lead_id_263860a0",
]


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0002_append_only_trigger"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="auditevent",
                    name="group",
                    field=models.CharField(blank=True, default="", max_length=64),
                ),
                migrations.AlterField(
                    model_name="auditevent",
                    name="lead_id",
                    field=models.BigIntegerField(blank=True, null=True),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    [f'DROP INDEX IF EXISTS "{name}"' for name in DROPPED], reverse_sql=migrations.RunSQL.noop
                ),
            ],
        ),
        migrations.AddIndex(
            model_name="auditevent",
            index=models.Index(fields=["group"], name="audit_group_idx"),
        ),
    ]
