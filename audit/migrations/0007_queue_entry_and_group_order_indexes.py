"""The trail by group reads in id order from its index (a page deep into one group's events
sorted them all first), and the queue's entries have an index of their own for the dashboard
(its queue depth read the whole trail). The group index is replaced, not added to: a routed
lead still writes the same number of index entries; the queue-entry index is written only for
a lead that enters the queue. The new group index is built before the old one goes."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0006_sqlite_append_only"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="auditevent",
            index=models.Index(fields=["group", "id"], name="audit_group_id_idx"),
        ),
        migrations.RemoveIndex(
            model_name="auditevent",
            name="audit_group_idx",
        ),
        migrations.AddIndex(
            model_name="auditevent",
            index=models.Index(
                condition=models.Q(("rep_id__isnull", True), ("type__in", ["lead.queued", "lead.escalated", "lead.rerouted"])),
                fields=["at"],
                name="audit_queue_entry_at_idx",
            ),
        ),
    ]
