"""The embedded default (SQLite) keeps the audit trail append-only in the database too, as
PostgreSQL does (0002, 0004): triggers reject any UPDATE or DELETE of an audit event, whoever
issues it. SQLite has no TRUNCATE; Django's flush between the suite's transactional tests
DELETEs every row instead, so the DELETE trigger asks `leadrouter_audit_flush_allowed()`, a
function each connection gets from audit/apps.py, true only under the test settings. A
connection without it (the sqlite3 shell) cannot delete either: the function is missing."""

from django.db import migrations

FORWARD = [
    """
    CREATE TRIGGER audit_event_no_update BEFORE UPDATE ON audit_auditevent
    BEGIN SELECT RAISE(ABORT, 'audit events are append-only (UPDATE rejected)'); END
    """,
    """
    CREATE TRIGGER audit_event_no_delete BEFORE DELETE ON audit_auditevent
    WHEN NOT leadrouter_audit_flush_allowed()
    BEGIN SELECT RAISE(ABORT, 'audit events are append-only (DELETE rejected)'); END
    """,
]

BACKWARD = ["DROP TRIGGER IF EXISTS audit_event_no_update", "DROP TRIGGER IF EXISTS audit_event_no_delete"]


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        for sql in FORWARD:
            schema_editor.execute(sql, params=None)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        for sql in BACKWARD:
            schema_editor.execute(sql, params=None)


class Migration(migrations.Migration):
    dependencies = [("audit", "0005_duplicate_external_id_index")]
    operations = [migrations.RunPython(forward, backward)]
