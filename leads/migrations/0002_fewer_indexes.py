"""Drop the single-column indexes a composite index already covers (each is written once per
lead or event). Done by name in SQL: altering the fields would make Django drop every
single-column index on those columns, one_open_assignment (a partial unique index) among
them, and re-validate the foreign keys."""

import django.db.models.deletion
from django.db import migrations, models


DROPPED = [
    "leads_assignment_group_id_b0d1e357",
    "leads_assignment_lead_id_ecf02f34",
    "leads_lead_email_normalized_22ea4700",
    "leads_lead_email_normalized_22ea4700_like",
    "leads_lead_external_id_c72287bc",
    "leads_lead_external_id_c72287bc_like",
    "leads_lead_owner_id_1f4568d0",
]


class Migration(migrations.Migration):
    dependencies = [
        ("leads", "0001_initial"),
        ("rotation", "0002_configversion"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="assignment",
                    name="group",
                    field=models.ForeignKey(
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="assignments",
                        to="rotation.group",
                    ),
                ),
                migrations.AlterField(
                    model_name="assignment",
                    name="lead",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="assignments",
                        to="leads.lead",
                    ),
                ),
                migrations.AlterField(
                    model_name="lead",
                    name="email_normalized",
                    field=models.CharField(max_length=254),
                ),
                migrations.AlterField(
                    model_name="lead",
                    name="external_id",
                    field=models.CharField(blank=True, default="", max_length=255),
                ),
                migrations.AlterField(
                    model_name="lead",
                    name="owner",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="leads",
                        to="rotation.rep",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    [f'DROP INDEX IF EXISTS "{name}"' for name in DROPPED], reverse_sql=migrations.RunSQL.noop
                ),
            ],
        ),
        migrations.AddIndex(
            model_name="lead",
            index=models.Index(fields=["external_id"], name="lead_external_id_idx"),
        ),
    ]
