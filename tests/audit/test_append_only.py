"""Nobody changes or deletes an audit event: the database refuses (triggers, on PostgreSQL and
on the embedded SQLite), the admin offers nothing, no role holds the permission."""

import uuid

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.db import DatabaseError, connection, transaction

from audit.models import AuditEvent
from audit.services import audit_record
from security.roles import ROLES

pytestmark = pytest.mark.django_db


@pytest.fixture
def event(db):
    return audit_record(type="group.changed", actor="test", group="emea", explanation={"k": "v"})


def rejected(fn) -> str:
    with pytest.raises(DatabaseError) as info, transaction.atomic():
        fn()
    return str(info.value)


@pytest.fixture
def no_flush(settings):
    # Under the test settings SQLite's trigger lets Django's flush between tests DELETE
    # (audit/migrations/0006_sqlite_append_only.py); the application never may.
    settings.AUDIT_FLUSH_ALLOWED = False


def test_orm_update_and_delete_are_rejected_by_the_database(event, no_flush):
    event.actor = "someone else"
    assert "append-only" in rejected(event.save)
    assert "UPDATE" in rejected(lambda: AuditEvent.objects.filter(pk=event.pk).update(actor="x"))
    assert "DELETE" in rejected(event.delete)
    assert "DELETE" in rejected(lambda: AuditEvent.objects.all().delete())
    event.refresh_from_db()
    assert event.actor == "test" and AuditEvent.objects.filter(pk=event.pk).exists()


def test_raw_sql_update_and_delete_are_rejected_by_the_database(event, no_flush):
    def raw(sql: str):
        def run():
            with connection.cursor() as cursor:
                cursor.execute(sql, [event.pk])

        return run

    assert "append-only" in rejected(raw("UPDATE audit_auditevent SET actor = 'x' WHERE id = %s"))
    assert "append-only" in rejected(raw("UPDATE audit_auditevent SET explanation = '{}' WHERE id = %s"))
    assert "append-only" in rejected(raw("DELETE FROM audit_auditevent WHERE id = %s"))
    assert AuditEvent.objects.get(pk=event.pk).explanation == {"k": "v"}


@pytest.mark.postgres
def test_truncate_is_rejected_by_postgresql(event):
    # The suite's own connections may TRUNCATE (Django's flush between tests); a connection
    # without that setting, as the application's, may not.
    def truncate():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL leadrouter.allow_audit_truncate = off")
            cursor.execute("TRUNCATE audit_auditevent CASCADE")

    assert "TRUNCATE rejected" in rejected(truncate)
    assert AuditEvent.objects.filter(pk=event.pk).exists()


@pytest.mark.postgres
def test_the_suites_truncate_escape_is_the_tables_owners_alone(event):
    # Any role may set a custom setting on its own session: a role granted TRUNCATE on the
    # trail, not owning it, emptied it by setting the escape first.
    role = f"audit_truncater_{uuid.uuid4().hex[:8]}"

    def truncate():
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE ROLE {role} NOLOGIN")  # rolled back with the test
            cursor.execute(f"GRANT TRUNCATE, SELECT ON audit_auditevent TO {role}")
            cursor.execute(f"SET LOCAL ROLE {role}")
            cursor.execute("SET LOCAL leadrouter.allow_audit_truncate = on")
            cursor.execute("TRUNCATE audit_auditevent")

    assert "TRUNCATE rejected" in rejected(truncate)
    assert AuditEvent.objects.filter(pk=event.pk).exists()


def test_inserting_still_works(event):
    audit_record(type="rule.changed", actor="test")
    assert AuditEvent.objects.count() == 2


@pytest.fixture
def superuser(client, db):
    user = User.objects.create_superuser("root", "root@example.com", "pw-for-tests-only")
    client.force_login(user)
    return user


def test_the_admin_offers_no_add_change_or_delete_even_to_a_superuser(client, superuser, event):
    base = "/admin/audit/auditevent/"
    assert client.get(base).status_code == 200
    assert client.get(f"{base}add/").status_code == 403
    assert client.post(f"{base}add/", {"type": "x", "actor": "y"}).status_code == 403
    page = client.get(f"{base}{event.pk}/change/")
    assert page.status_code == 200  # read-only view
    assert b'name="_save"' not in page.content and b"deletelink" not in page.content
    assert client.post(f"{base}{event.pk}/change/", {"actor": "forged"}).status_code == 403
    assert client.get(f"{base}{event.pk}/delete/").status_code == 403
    assert client.post(f"{base}{event.pk}/delete/", {"post": "yes"}).status_code == 403
    bulk = client.post(base, {"action": "delete_selected", "_selected_action": [event.pk], "post": "yes"})
    assert bulk.status_code in (200, 302)
    assert AuditEvent.objects.filter(pk=event.pk, actor="test").exists()


def test_no_role_may_change_or_delete_audit_events():
    for role in ROLES:
        perms = set(Group.objects.get(name=role).permissions.values_list("codename", flat=True))
        assert "view_auditevent" in perms
        assert not perms & {"add_auditevent", "change_auditevent", "delete_auditevent"}
    assert Permission.objects.filter(codename="change_auditevent").exists()


def test_a_digit_that_is_no_number_in_the_search_or_the_address_is_no_500(client, superuser, event):
    """'²' and '①' are digits to str.isdigit() but no number to int(): searching the trail for
    one, or a rep page at such an address, is an ordinary search and a 'not found'."""
    r = client.get("/admin/audit/auditevent/", {"q": "²"})
    assert r.status_code == 200 and r.context["cl"].result_count == 0
    assert client.get("/admin/rotation/rep/²/change/", follow=True).status_code in (200, 404)
    assert client.get("/admin/rotation/rep/①/change/", follow=True).status_code in (200, 404)
