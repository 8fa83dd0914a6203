"""TRUNCATE empties a table without touching its rows one by one, so the row trigger of 0002
never sees it: a statement trigger rejects it too. The test suite's flush between tests
(Django's TRUNCATE of every table) sets `leadrouter.allow_audit_truncate` on its own
connections (routing_project/settings/test.py); nothing else does."""

from django.db import migrations

FORWARD = """
CREATE OR REPLACE FUNCTION audit_event_no_truncate() RETURNS trigger AS $$
BEGIN
    IF coalesce(current_setting('leadrouter.allow_audit_truncate', true), '') = 'on' THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION 'audit events are append-only (TRUNCATE rejected)'
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER audit_event_no_truncate
    BEFORE TRUNCATE ON audit_auditevent
    FOR EACH STATEMENT EXECUTE FUNCTION audit_event_no_truncate();
"""

BACKWARD = """
DROP TRIGGER IF EXISTS audit_event_no_truncate ON audit_auditevent;
DROP FUNCTION IF EXISTS audit_event_no_truncate();
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORWARD, params=None)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKWARD, params=None)


class Migration(migrations.Migration):
    dependencies = [("audit", "0003_fewer_indexes")]
    operations = [migrations.RunPython(forward, backward)]
