"""Admin roles with real admin requests: what Sales ops, Managers and Auditors may see and do,
field by field where it matters; credentials shown once; login throttled."""

from __future__ import annotations

import json
import random
import re
import threading
import uuid
from html.parser import HTMLParser

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.contrib.auth.models import Group as AuthGroup
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import connections
from django.test import Client

from audit.models import AuditEvent
from hooks import services as hook_services
from hooks.models import IntakeSource
from leads.models import ApiClient, Lead
from leads.tokens import api_client_create, api_client_update
from rotation.models import Account, Group
from security.roles import AUDITORS, MANAGERS, SALES_OPS
from tests.conftest import lead_body

pytestmark = pytest.mark.django_db


class FormFields(HTMLParser):
    """The fields the admin's change form would submit, as a browser would."""

    def __init__(self) -> None:
        super().__init__()
        self.data: dict[str, list[str]] = {}
        self._select: str | None = None
        self._textarea: str | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        name = a.get("name")
        if tag == "input" and name and a.get("type") not in ("submit", "button", "file"):
            if a.get("type") in ("checkbox", "radio") and "checked" not in a:
                return
            self.data.setdefault(name, []).append(a.get("value") or ("on" if a.get("type") == "checkbox" else ""))
        elif tag == "select" and name:
            self._select = name
            self.data.setdefault(name, [])
        elif tag == "option" and self._select and "selected" in a:
            self.data[self._select].append(a.get("value") or "")
        elif tag == "textarea" and name:
            self._textarea = name
            self.data[name] = [""]

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self._select = None
        elif tag == "textarea":
            self._textarea = None

    def handle_data(self, data: str) -> None:
        if self._textarea:
            self.data[self._textarea][-1] += data


def form_of(page) -> dict[str, list[str]]:
    parser = FormFields()
    parser.feed(page.content.decode())
    return parser.data


def staff(role: str | None) -> Client:
    user = User.objects.create_user(f"u-{uuid.uuid4().hex[:8]}", password="pw-for-tests-only", is_staff=True)
    if role:
        user.groups.add(AuthGroup.objects.get(name=role))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def lead(api, make_group):
    make_group(2, slug="emea", is_default=True)
    body = api.post("/api/v1/leads/", lead_body(first_name="Ada", phone="+33 6 12 34 56 78"), format="json").json()
    return Lead.objects.get(pk=body["id"])


@pytest.mark.parametrize(
    ("role", "links"),
    [
        (None, []),
        ("Auditors", ["Routing dashboard"]),
        ("Managers", ["Routing dashboard"]),
        ("Sales ops", ["Routing dashboard", "Import leads (CSV)"]),
    ],
)
def test_the_operations_box_shows_what_the_role_may_open_and_nothing_when_nothing(role, links):
    html = staff(role).get("/admin/").content.decode()
    assert ('id="ops-links"' in html) is bool(links)
    for name in ["Routing dashboard", "Import leads (CSV)"]:
        assert (f">{name}</a>" in html) is (name in links), (role, name)


def test_the_index_lists_the_admin_roles_apart_from_the_routing_groups():
    root = User.objects.create_superuser("root-index", password="pw-for-tests-only")
    client = Client()
    client.force_login(root)
    for path in ["/admin/", "/admin/auth/"]:
        names = re.findall(
            r'<th scope="row"[^>]*>\s*<a href="[^"]+"[^>]*>([^<]+)</a>', client.get(path).content.decode()
        )
        assert "User roles" in names, (path, names)
        assert names.count("Groups") == (1 if path == "/admin/" else 0), (path, names)


def test_the_migration_created_the_three_roles():
    perms = {
        g.name: set(g.permissions.values_list("content_type__app_label", "codename"))
        for g in AuthGroup.objects.filter(name__in=[SALES_OPS, MANAGERS, AUDITORS])
    }
    assert set(perms) == {SALES_OPS, MANAGERS, AUDITORS}
    for model in ("group", "rep", "membership", "absence", "routingrule", "account"):
        assert {("rotation", f"{a}_{model}") for a in ("add", "change", "delete", "view")} <= perms[SALES_OPS]
        assert ("rotation", f"change_{model}") not in perms[MANAGERS] | perms[AUDITORS]
        assert ("rotation", f"view_{model}") in perms[MANAGERS] & perms[AUDITORS]
    assert ("leads", "change_lead") in perms[MANAGERS] and ("leads", "change_queuedlead") in perms[MANAGERS]
    assert ("leads", "change_lead") not in perms[SALES_OPS] | perms[AUDITORS]
    assert all(code.startswith("view_") for _, code in perms[AUDITORS])
    for role_perms in perms.values():
        assert not {
            code
            for app, code in role_perms
            if (app, code.split("_", 1)[1])
            in {("leads", "apiclient"), ("hooks", "intakesource"), ("hooks", "hookdelivery")}
        }


@pytest.mark.parametrize(
    ("role", "status"),
    [(SALES_OPS, 302), (MANAGERS, 403), (AUDITORS, 403), (None, 403)],
)
def test_only_sales_ops_edit_configuration(role, status, make_group):
    _, reps = make_group(1, slug="emea")
    client = staff(role)
    r = client.post("/admin/rotation/account/add/", {"domain": "acme.example", "name": "Acme", "owner": reps[0].id})
    assert r.status_code == status
    assert Account.objects.filter(domain="acme.example").exists() == (status == 302)
    group = Group.objects.get(slug="emea")
    page = client.get(f"/admin/rotation/group/{group.pk}/change/")
    assert page.status_code == (200 if role else 403)
    if role and role != SALES_OPS:
        assert b'name="_save"' not in page.content  # read-only for them


@pytest.mark.parametrize(
    ("role", "can_read", "can_change"),
    [(SALES_OPS, True, False), (MANAGERS, True, True), (AUDITORS, True, False), (None, False, False)],
)
def test_leads_queue_and_audit_by_role(role, can_read, can_change, lead):
    client = staff(role)
    for url in ("/admin/leads/lead/", "/admin/leads/queuedlead/", "/admin/audit/auditevent/"):
        assert client.get(url).status_code == (200 if can_read else 403), url
    page = client.get(f"/admin/leads/lead/{lead.pk}/change/")
    assert page.status_code == (200 if can_read else 403)
    if not can_read:
        return
    data = form_of(page)
    assert (b'name="_save"' in page.content) == can_change
    data.update({"company": ["Changed Inc"], "status": ["closed"], "owner": [""], "queue_reason": ["forged"]})
    r = client.post(f"/admin/leads/lead/{lead.pk}/change/", data)
    lead_after = Lead.objects.get(pk=lead.pk)
    if can_change:
        assert r.status_code == 302, r.content[:2000]
        assert lead_after.company == "Changed Inc"
    else:
        assert r.status_code == 403
        assert lead_after.company == lead.company
    # Field level: the routing fields are read-only for everyone; only intake, actions and
    # reroute move a lead.
    assert (lead_after.status, lead_after.owner_id, lead_after.queue_reason) == (
        lead.status,
        lead.owner_id,
        lead.queue_reason,
    )


@pytest.mark.parametrize("role", [SALES_OPS, MANAGERS, AUDITORS])
def test_credentials_are_for_superusers_only(role):
    client = staff(role)
    for url in ("/admin/leads/apiclient/", "/admin/hooks/intakesource/", "/admin/leads/apiclient/add/"):
        assert client.get(url).status_code == 403


def test_credentials_stay_with_superusers_whatever_a_staff_user_was_granted(make_group):
    """A staff user given the credential models' permissions by hand (say every permission
    ticked in the user's page) still cannot mint a token, read or rotate a secret, or point a
    webhook, with the group's leads' contact data, at an address of their own."""
    from django.contrib.auth.models import Permission

    group, _ = make_group(1, slug="emea")
    user = User.objects.create_user(f"u-{uuid.uuid4().hex[:8]}", password="pw-for-tests-only", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label__in=("leads", "hooks", "notifications"),
            content_type__model__in=("apiclient", "intakesource", "webhookendpoint"),
        )
    )
    client = Client()
    client.force_login(user)
    for url in (
        "/admin/leads/apiclient/",
        "/admin/leads/apiclient/add/",
        "/admin/hooks/intakesource/",
        "/admin/hooks/intakesource/add/",
        "/admin/notifications/webhookendpoint/",
        "/admin/notifications/webhookendpoint/add/",
    ):
        assert client.get(url).status_code == 403, url
    r = client.post("/admin/leads/apiclient/add/", {"name": "mine", "scopes": ["manage"], "active": "on"})
    assert r.status_code == 403 and not ApiClient.objects.filter(name="mine").exists()
    r = client.post(
        "/admin/notifications/webhookendpoint/add/",
        {"group": group.pk, "url": "https://collector.example/leads", "active": "on"},
    )
    assert r.status_code == 403 and not group.webhook_endpoints.exists()
    index = client.get("/admin/")
    assert b"/admin/leads/apiclient/" not in index.content
    assert b"/admin/hooks/intakesource/" not in index.content


@pytest.fixture
def root() -> Client:
    user = User.objects.create_superuser(f"root-{uuid.uuid4().hex[:6]}", "root@example.com", "pw-for-tests-only")
    client = Client()
    client.force_login(user)
    return client


def test_an_api_token_created_in_the_admin_is_shown_once_and_works(root):
    r = root.post("/admin/leads/apiclient/add/", {"name": "crm", "scopes": ["read"], "active": "on"})
    assert r.status_code == 200 and "no-store" in r["Cache-Control"]
    token = re.search(rb"lr_[A-Za-z0-9_\-]{20,}", r.content).group().decode()
    client = ApiClient.objects.get(name="crm")
    assert client.token_hash == ApiClient.hash_token(token) and client.scopes == ["read"]
    assert b'<td class="field-scope_list">read</td>' in root.get("/admin/leads/apiclient/").content
    change = root.get(f"/admin/leads/apiclient/{client.pk}/change/")
    assert token.encode() not in change.content and client.token_hash.encode() not in change.content
    api = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert api.get("/api/v1/queue/").status_code == 200
    r = root.post("/admin/leads/apiclient/", {"action": "revoke", "_selected_action": [client.pk]})
    assert r.status_code == 302
    assert api.get("/api/v1/queue/").status_code == 401
    # For good: the page shows when, and ticking "active" again cannot bring the token back.
    change = root.get(f"/admin/leads/apiclient/{client.pk}/change/")
    assert b'name="active"' not in change.content and b"Revoked at" in change.content
    r = root.post(f"/admin/leads/apiclient/{client.pk}/change/", {"name": "crm", "scopes": ["read"], "active": "on"})
    assert r.status_code == 302
    client.refresh_from_db()
    assert not client.active and client.revoked_at is not None
    assert api.get("/api/v1/queue/").status_code == 401
    client.active = True
    with pytest.raises(ValidationError, match="revoked for good"):
        api_client_update(client=client, fields=["active"], actor="test")
    assert api.get("/api/v1/queue/").status_code == 401


def test_a_client_switched_off_can_be_switched_on_and_a_rate_limit_is_at_least_one(root):
    client, token = api_client_create(name="paused", scopes=["read"])
    api = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    url = f"/admin/leads/apiclient/{client.pk}/change/"
    assert root.post(url, {"name": "paused", "scopes": ["read"]}).status_code == 302  # "active" unticked
    assert api.get("/api/v1/queue/").status_code == 401
    assert root.post(url, {"name": "paused", "scopes": ["read"], "active": "on"}).status_code == 302
    assert api.get("/api/v1/queue/").status_code == 200
    r = root.post(url, {"name": "paused", "scopes": ["read"], "active": "on", "rate_limit_per_minute": 0})
    assert r.status_code == 200 and b"greater than or equal to 1" in r.content
    client.refresh_from_db()
    assert client.rate_limit_per_minute is None


def test_an_intake_secret_is_shown_once_and_rotation_shows_the_new_one(root):
    r = root.post(
        "/admin/hooks/intakesource/add/",
        {"slug": "site", "name": "Site", "field_map": '{"mail": "email"}', "active": "on", "rate_limit_per_minute": 60},
    )
    assert r.status_code == 200, r.content[:1500]
    secret = re.search(rb"whsec_[A-Za-z0-9_\-]{20,}", r.content).group().decode()
    source = IntakeSource.objects.get(slug="site")
    assert source.secret == secret
    assert secret.encode() not in root.get(f"/admin/hooks/intakesource/{source.pk}/change/").content
    r = root.post("/admin/hooks/intakesource/", {"action": "rotate_secret", "_selected_action": [source.pk]})
    new = re.search(rb"whsec_[A-Za-z0-9_\-]{20,}", r.content).group().decode()
    source.refresh_from_db()
    assert new != secret and source.secret == new and source.previous_secret == secret
    bad = root.post(
        "/admin/hooks/intakesource/add/",
        {"slug": "bad", "name": "Bad", "field_map": '{"mail": "password"}', "rate_limit_per_minute": 60},
    )
    assert bad.status_code == 200 and b"not a lead field" in bad.content
    assert not IntakeSource.objects.filter(slug="bad").exists()
    again = root.post(
        "/admin/hooks/intakesource/add/",
        {"slug": "Site", "name": "Site again", "field_map": "{}", "active": "on", "rate_limit_per_minute": 60},
    )
    assert again.status_code == 200 and b"already exists in another case (&#x27;site&#x27;)" in again.content
    assert list(IntakeSource.objects.values_list("slug", flat=True)) == ["site"]
    kept = root.post(
        f"/admin/hooks/intakesource/{source.pk}/change/",
        {"slug": "site", "name": "Site renamed", "field_map": "{}", "active": "on", "rate_limit_per_minute": 60},
    )
    assert kept.status_code == 302  # its own slug is no conflict


def test_admin_login_is_throttled_against_guessing(settings):
    settings.LOGIN_FAILURES_PER_USER = 3
    name = f"ops-{uuid.uuid4().hex[:8]}"
    User.objects.create_user(name, password="the-right-password", is_staff=True)
    address = f"10.{random.randint(0, 255)}.{random.randint(0, 255)}.{random.randint(1, 254)}"

    def login(password: str, user: str = name, addr: str = address) -> bool:
        client = Client(REMOTE_ADDR=addr)
        client.post("/admin/login/?next=/admin/", {"username": user, "password": password})
        return "_auth_user_id" in client.session

    assert login("the-right-password")
    for _ in range(3):
        assert not login("guess")
    # Locked for this user from this address, even with the right password, and the page says
    # so (not "enter the correct username and password", which the right one is) ...
    assert not login("the-right-password")
    page = Client(REMOTE_ADDR=address).post("/admin/login/?next=/admin/", {"username": name, "password": "x"})
    assert b"Too many failed logins" in page.content and b"correct username and password" not in page.content
    # ... while the same user from elsewhere is not.
    assert login("the-right-password", addr="10.255.255.254")


def test_the_login_throttle_holds_while_redis_is_down_and_says_which_lock(settings):
    """With Redis unreachable every guess was checked (the throttle failed open as the intake
    limits do); and the page said "logins from your address are refused" when only this
    username was locked there."""
    from security import ratelimit

    settings.RATE_LIMIT_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    settings.LOGIN_FAILURES_PER_USER, settings.LOGIN_FAILURES_PER_ADDRESS = 3, 5
    ratelimit._state.down_until = 0.0
    name, other = (f"ops-{uuid.uuid4().hex[:8]}" for _ in range(2))
    for user in (name, other):
        User.objects.create_user(user, password="the-right-password", is_staff=True)
    address = f"10.{random.randint(0, 255)}.{random.randint(0, 255)}.{random.randint(1, 254)}"

    def login(password: str, user: str = name) -> str:
        client = Client(REMOTE_ADDR=address)
        page = client.post("/admin/login/?next=/admin/", {"username": user, "password": password})
        return "in" if "_auth_user_id" in client.session else page.content.decode()

    try:
        assert all("correct username and password" in login("guess") for _ in range(3))
        refused = login("the-right-password")
        assert "Too many failed logins for this username from your address" in refused
        assert login("the-right-password", user=other) == "in"  # the address is not locked
        assert "correct username and password" in login("guess", user=other)
        assert "correct username and password" in login("guess", user=other)
        refused = login("the-right-password", user=other)  # 5 failures from the address
        assert "every login from it is refused" in refused
    finally:
        ratelimit._state.down_until = ratelimit._state.last_warning = 0.0
        ratelimit._local.clear()


class CountingHasher(PBKDF2PasswordHasher):
    checked = 0

    def verify(self, password: str, encoded: str) -> bool:
        CountingHasher.checked += 1
        return super().verify(password, encoded)


@pytest.mark.django_db(transaction=True)
def test_concurrent_guesses_cannot_outrun_the_login_throttle(settings):
    # A burst of guesses sent together: each is counted before its password is checked, so no
    # more than the limit are checked, however many arrive before the first one fails.
    settings.LOGIN_FAILURES_PER_USER = 3
    settings.PASSWORD_HASHERS = [f"{__name__}.CountingHasher"]  # PBKDF2: slow, as in production
    CountingHasher.checked = 0
    name = f"ops-{uuid.uuid4().hex[:8]}"
    User.objects.create_user(name, password="the-right-password", is_staff=True)
    address = f"10.{random.randint(0, 255)}.{random.randint(0, 255)}.{random.randint(1, 254)}"
    barrier = threading.Barrier(8)
    answered: list[bytes] = []

    def guess(i: int) -> None:
        try:
            barrier.wait()
            page = Client(REMOTE_ADDR=address).post(
                "/admin/login/?next=/admin/", {"username": name, "password": f"guess-{i}"}
            )
            answered.append(page.content)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=guess, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert CountingHasher.checked <= 3
    # Those refused are told the login is locked, not to check a password nobody checked.
    assert sum(b"Too many failed logins" in page for page in answered) >= 8 - CountingHasher.checked
    # A login that succeeds gives its place back: it does not count against the address.
    settings.LOGIN_FAILURES_PER_ADDRESS = 2
    for _ in range(3):
        client = Client(REMOTE_ADDR="10.255.255.253")
        client.post("/admin/login/?next=/admin/", {"username": name, "password": "the-right-password"})
        assert "_auth_user_id" in client.session


@pytest.mark.parametrize(("role", "allowed"), [(MANAGERS, True), (SALES_OPS, False), (AUDITORS, False)])
def test_only_managers_reassign_and_work_the_queue(role, allowed, lead):
    from leads.models import Assignment

    client = staff(role)
    other = Assignment.objects.exclude(rep_id=lead.owner_id).values_list("rep_id", flat=True).first()
    rep_id = other or lead.group.memberships.exclude(rep_id=lead.owner_id).values_list("rep_id", flat=True).first()
    assert client.get(f"/admin/leads/lead/{lead.pk}/reassign/").status_code == (200 if allowed else 403)
    r = client.post(f"/admin/leads/lead/{lead.pk}/reassign/", {"rep": rep_id, "reason": "customer asked"})
    assert r.status_code == (302 if allowed else 403)
    assert (Lead.objects.get(pk=lead.pk).owner_id == rep_id) == allowed
    # The bulk actions are offered to managers only; a forged POST of one does nothing.
    before = Lead.objects.get(pk=lead.pk).owner_id
    client.post("/admin/leads/lead/", {"action": "close_lost", "_selected_action": [lead.pk], "apply": "1"})
    after = Lead.objects.get(pk=lead.pk)
    assert (after.status == "closed") == allowed
    if not allowed:
        assert after.owner_id == before


def test_credentials_edited_in_the_admin_are_audited(root):
    """Granting a token a scope, switching it off, loosening an intake source's limit: each is
    a `client.changed` event naming who did it and what changed, as creating a token, revoking
    it with the action or rotating a secret already are. Nothing secret in the event."""
    r = root.post("/admin/leads/apiclient/add/", {"name": "crm", "scopes": ["read"], "active": "on"})
    token = re.search(rb"lr_[A-Za-z0-9_\-]{20,}", r.content).group().decode()
    client = ApiClient.objects.get(name="crm")
    (created,) = AuditEvent.objects.filter(type="client.changed", explanation__api_client="crm")
    assert created.explanation["change"] == "created" and created.explanation["scopes"] == ["read"]
    assert created.actor.startswith("admin:root-")

    change = f"/admin/leads/apiclient/{client.pk}/change/"
    assert root.post(change, {"name": "crm", "scopes": ["read", "manage"], "active": "on"}).status_code == 302
    assert root.post(change, {"name": "crm", "scopes": ["read", "manage"]}).status_code == 302
    edits = [e.explanation for e in AuditEvent.objects.filter(type="client.changed", explanation__change="edited")]
    assert edits == [
        {"api_client": "crm", "change": "edited", "fields": {"scopes": ["manage", "read"]}},
        {"api_client": "crm", "change": "edited", "fields": {"active": False}},
    ]

    source, secret = hook_services.source_create(slug="site", name="Site", actor="test")
    r = root.post(
        f"/admin/hooks/intakesource/{source.pk}/change/",
        {"slug": "site", "name": "Site", "field_map": '{"mail": "email"}', "rate_limit_per_minute": 100000},
    )
    assert r.status_code == 302
    (edited,) = AuditEvent.objects.filter(type="client.changed", explanation__intake_source="site").exclude(
        explanation__change="created"
    )
    assert edited.explanation == {
        "intake_source": "site",
        "change": "edited",
        "fields": {"field_map": {"mail": "email"}, "active": False, "rate_limit_per_minute": 100000},
    }
    text = json.dumps([e.explanation for e in AuditEvent.objects.all()])
    assert token not in text and secret not in text and client.token_hash not in text


def test_credentials_deleted_in_the_admin_are_audited(root, make_group):
    """Creating, editing and revoking a token, a web-form source or a webhook endpoint were
    audited, but deleting one (from its page or with "Delete selected") left no trace of who
    removed a way into the API or where the group's leads had been sent."""
    from notifications.models import WebhookEndpoint

    make_group(1, slug="emea")
    r = root.post("/admin/leads/apiclient/add/", {"name": "crm", "scopes": ["read"], "active": "on"})
    assert r.status_code == 200
    root.post("/admin/leads/apiclient/add/", {"name": "erp", "scopes": ["read"], "active": "on"})
    source, _ = hook_services.source_create(slug="site", name="Site", actor="test")
    group = Group.objects.get(slug="emea")
    endpoint = WebhookEndpoint.objects.create(group=group, url="https://crm.example/hook")

    crm, erp = ApiClient.objects.get(name="crm"), ApiClient.objects.get(name="erp")
    assert root.post(f"/admin/leads/apiclient/{crm.pk}/delete/", {"post": "yes"}).status_code == 302
    bulk = {"action": "delete_selected", "_selected_action": [erp.pk], "post": "yes"}
    assert root.post("/admin/leads/apiclient/", bulk).status_code == 302
    assert root.post(f"/admin/hooks/intakesource/{source.pk}/delete/", {"post": "yes"}).status_code == 302
    bulk = {"action": "delete_selected", "_selected_action": [endpoint.pk], "post": "yes"}
    assert root.post("/admin/notifications/webhookendpoint/", bulk).status_code == 302
    assert not ApiClient.objects.exists() and not IntakeSource.objects.exists()
    assert not WebhookEndpoint.objects.exists()

    deleted = [
        (e.actor.startswith("admin:root-"), e.group, e.explanation)
        for e in AuditEvent.objects.filter(type="client.changed", explanation__change="deleted").order_by("id")
    ]
    assert deleted == [
        (True, "", {"api_client": "crm", "change": "deleted"}),
        (True, "", {"api_client": "erp", "change": "deleted"}),
        (True, "", {"intake_source": "site", "change": "deleted"}),
        (
            True,
            "emea",
            {"webhook_endpoint": endpoint.pk, "change": "deleted", "url": "https://crm.example/hook"},
        ),
    ]
    assert root.get("/admin/audit/auditevent/?type=client.changed").status_code == 200


def test_sales_ops_link_a_rep_to_a_login_by_its_username_with_no_lookup_they_may_not_open():
    """The rep's user was a raw id with a lookup into the user list, which only superusers may
    read: sales ops clicking it got a 403 in the popup, and the box held a bare number."""
    from tests.factories import RepFactory

    rep = RepFactory()
    login = User.objects.create_user("ada.l", password="pw-for-tests-only")
    ops = staff(SALES_OPS)
    url = f"/admin/rotation/rep/{rep.pk}/change/"
    page = ops.get(url)
    assert page.status_code == 200
    assert "/admin/auth/user/" not in page.content.decode()
    assert ops.get("/admin/auth/user/?_to_field=id&_popup=1").status_code == 403  # why there is no lookup
    data = {**{k: v[0] for k, v in form_of(page).items()}, "user": "ada.l", "_continue": "1"}
    assert ops.post(url, data).status_code == 302
    rep.refresh_from_db()
    assert rep.user_id == login.pk
    # Shown back by its username, and an unknown one is said as such.
    assert 'value="ada.l"' in ops.get(url).content.decode()
    refused = ops.post(url, {**data, "user": "nobody"})
    assert refused.status_code == 200 and "No user with that username." in refused.content.decode()
