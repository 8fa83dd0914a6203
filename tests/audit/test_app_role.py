"""`manage.py grant_app_role ROLE`: the application's own database role reads and writes every
table but only reads and adds to the audit trail, so even raw SQL as that role cannot edit,
delete, truncate or unprotect it (docker-compose.yml connects the app so)."""

import uuid
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from audit.services import audit_record

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


def _privilege(role: str, table: str, privilege: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT has_table_privilege(%s, %s, %s)", [role, table, privilege])
        return cursor.fetchone()[0]


def test_the_app_role_may_read_and_add_audit_events_and_nothing_more():
    event = audit_record(type="group.changed", actor="test", group="emea")
    role = f"leadrouter_app_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {role} NOLOGIN")  # rolled back with the test
    out = StringIO()
    call_command("grant_app_role", role, stdout=out)
    assert "the audit trail read and added to only" in out.getvalue()
    assert _privilege(role, "audit_auditevent", "SELECT") and _privilege(role, "audit_auditevent", "INSERT")
    for privilege in ("UPDATE", "DELETE", "TRUNCATE"):
        assert not _privilege(role, "audit_auditevent", privilege), privilege
    for table in ("leads_lead", "leads_assignment", "rotation_rotationstate", "django_session"):
        for privilege in ("SELECT", "INSERT", "UPDATE", "DELETE"):
            assert _privilege(role, table, privilege), (table, privilege)
        assert not _privilege(role, table, "TRUNCATE")

    def as_role(sql: str, params=()) -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL ROLE {role}")
            cursor.execute("SET LOCAL leadrouter.allow_audit_truncate = on")
            cursor.execute(sql, params)

    # The app's own work, as that role: an event added (its id from the sequence), a lead read.
    as_role(
        'INSERT INTO audit_auditevent (type, at, actor, "group", explanation, request_id) '
        "VALUES ('group.changed', now(), 'test', 'emea', '{}', '')"
    )
    as_role("SELECT count(*) FROM leads_lead")
    for sql in (
        "UPDATE audit_auditevent SET actor = 'x' WHERE id = %s",
        "DELETE FROM audit_auditevent WHERE id = %s",
        "TRUNCATE audit_auditevent",
        "ALTER TABLE audit_auditevent DISABLE TRIGGER ALL",
    ):
        with pytest.raises(DatabaseError, match="permission denied|must be owner"):
            as_role(sql, [event.pk] if "%s" in sql else ())


def test_a_superuser_or_missing_role_is_refused_by_name():
    with pytest.raises(CommandError, match="No database role 'no_such_role_x'"):
        call_command("grant_app_role", "no_such_role_x")
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_user")
        (me,) = cursor.fetchone()
    with pytest.raises(CommandError, match="superuser"):
        call_command("grant_app_role", me)
