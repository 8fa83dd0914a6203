"""The trail by group reads in id order from its index (a page deep into one group's events
sorted them all first), and the queue's entries have an index of their own for the dashboard
(its queue depth read the whole trail). The group index is replaced, not added to: a routed
lead still writes the same number of index entries; the queue-entry index is written only for
a lead that enters the queue. The new group index is built before the old one goes.

On PostgreSQL the indexes are built and dropped CONCURRENTLY: a plain CREATE INDEX holds off
every insert into the trail while it reads the whole of it, and every routed lead writes the
trail, so intake would wait out the build (a few seconds on a few million events) and answer
503. Outside a transaction, then: a build that fails leaves an INVALID index, which a re-run
drops and builds again."""

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class WithoutBlocking:
    """CONCURRENTLY on PostgreSQL (the parent operation); the plain operation `plain` elsewhere
    (the embedded SQLite default)."""

    plain: type[migrations.AddIndex | migrations.RemoveIndex]

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        return self.plain.database_forwards(self, app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        return self.plain.database_backwards(self, app_label, schema_editor, from_state, to_state)


class AddIndexWithoutBlocking(WithoutBlocking, AddIndexConcurrently):
    plain = migrations.AddIndex

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            # An INVALID index left by a build that failed: dropped, so the re-run builds it.
            schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {schema_editor.quote_name(self.index.name)}")
        return super().database_forwards(app_label, schema_editor, from_state, to_state)


class RemoveIndexWithoutBlocking(WithoutBlocking, RemoveIndexConcurrently):
    plain = migrations.RemoveIndex


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("audit", "0006_sqlite_append_only"),
    ]

    operations = [
        AddIndexWithoutBlocking(
            model_name="auditevent",
            index=models.Index(fields=["group", "id"], name="audit_group_id_idx"),
        ),
        RemoveIndexWithoutBlocking(
            model_name="auditevent",
            name="audit_group_idx",
        ),
        AddIndexWithoutBlocking(
            model_name="auditevent",
            index=models.Index(
                condition=models.Q(
                    ("rep_id__isnull", True), ("type__in", ["lead.queued", "lead.escalated", "lead.rerouted"])
                ),
                fields=["at"],
                name="audit_queue_entry_at_idx",
            ),
        ),
    ]
