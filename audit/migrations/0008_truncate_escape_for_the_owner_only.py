"""The test suite's escape from the TRUNCATE guard (0004), `leadrouter.allow_audit_truncate`,
is a setting any role may set on its own session: a role granted TRUNCATE on the audit table
(but not owning it) could empty the trail by setting it first. The escape now also needs the
table's owner (or a member of its role): who could drop the trigger anyway."""

from django.db import migrations

FORWARD = """
CREATE OR REPLACE FUNCTION audit_event_no_truncate() RETURNS trigger AS $$
BEGIN
    IF coalesce(current_setting('leadrouter.allow_audit_truncate', true), '') = 'on'
       AND pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = TG_RELID), 'MEMBER') THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION 'audit events are append-only (TRUNCATE rejected)'
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
"""

# As 0004 made it.
BACKWARD = """
CREATE OR REPLACE FUNCTION audit_event_no_truncate() RETURNS trigger AS $$
BEGIN
    IF coalesce(current_setting('leadrouter.allow_audit_truncate', true), '') = 'on' THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION 'audit events are append-only (TRUNCATE rejected)'
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORWARD, params=None)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKWARD, params=None)


class Migration(migrations.Migration):
    dependencies = [("audit", "0007_queue_entry_and_group_order_indexes")]
    operations = [migrations.RunPython(forward, backward)]
