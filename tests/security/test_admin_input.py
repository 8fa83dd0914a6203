"""What sales ops and managers type into the admin is validated as the API validates it: a
form error, never a 500, and never a saved value that breaks intake or escalation later."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from leads import actions
from leads.models import Assignment, Lead
from rotation.eligibility import DAYS
from rotation.models import Group, Rep, RoutingRule
from security.roles import MANAGERS, SALES_OPS
from tests.conftest import lead_body
from tests.security.test_admin_roles import form_of, staff

pytestmark = pytest.mark.django_db


def post_form(client, url: str, **changes: str):
    data = form_of(client.get(url))
    data.update({name: [value] for name, value in changes.items()})
    return client.post(url, data)


@pytest.mark.parametrize(
    ("hours", "message"),
    [
        ('{"tue": [["xx", "yy"]], "wed": "all day"}', "HH:MM"),
        ('{"mon": [["17:00", "09:00"]]}', "must end after it starts"),
        ('{"mon": [["09:00", NaN]]}', "NaN"),
    ],
)
def test_sales_ops_cannot_save_working_hours_the_api_would_refuse(api, make_group, hours, message):
    _group, (rep,) = make_group(1, slug="emea")
    client = staff(SALES_OPS)
    r = post_form(client, f"/admin/rotation/rep/{rep.pk}/change/", working_hours=hours)
    assert r.status_code == 200 and b"errorlist" in r.content, r.content[:500]
    assert message in r.content.decode()
    assert Rep.objects.get(pk=rep.pk).working_hours is None
    assert api.post("/api/v1/leads/", lead_body(group="emea"), format="json").status_code == 201


def test_a_rule_with_nan_is_a_form_error(make_group):
    make_group(1, slug="emea")
    client = staff(SALES_OPS)
    data = form_of(client.get("/admin/rotation/routingrule/add/"))
    data.update(
        {
            "name": ["nan"],
            "priority": ["1"],
            "group": [str(Group.objects.get().pk)],
            "conditions": ['[{"field": "score", "op": "gte", "value": NaN}]'],
        }
    )
    r = client.post("/admin/rotation/routingrule/add/", data)
    assert r.status_code == 200 and b"errorlist" in r.content
    assert not RoutingRule.objects.exists()


def test_a_bad_time_zone_on_a_group_is_a_form_error_with_the_saved_rotation_shown(make_group):
    group, reps = make_group(2, slug="smb")
    client = staff(SALES_OPS)
    r = post_form(client, f"/admin/rotation/group/{group.pk}/change/", timezone="Mars/Olympus")
    assert r.status_code == 200 and b"errorlist" in r.content
    assert reps[0].name in r.content.decode()  # the rotation panel, as saved
    assert Group.objects.get(pk=group.pk).timezone == "UTC"


def test_an_sla_typed_in_exponent_form_is_audited_as_a_plain_number(make_group):
    group, _ = make_group(1, slug="smb")
    r = post_form(staff(SALES_OPS), f"/admin/rotation/group/{group.pk}/change/", sla_minutes="1e5")
    assert r.status_code == 302
    event = AuditEvent.objects.filter(type="group.changed", group="smb").latest("id")
    assert event.explanation["changes"]["sla_minutes"] == "100000"


def test_a_manager_edits_contact_fields_and_facts_and_the_edit_is_audited_and_deduplicated(api, make_group):
    make_group(2, slug="emea")
    first = api.post("/api/v1/leads/", lead_body(group="emea", country="FR"), format="json").json()
    client = staff(MANAGERS)
    url = f"/admin/leads/lead/{first['id']}/change/"
    r = post_form(client, url, email="  New@Example.COM ", company="New Co", country="US", score="99")
    assert r.status_code == 302, r.content[:1000]
    lead = Lead.objects.get(pk=first["id"])
    assert (lead.email, lead.company, lead.email_normalized) == ("New@Example.COM", "New Co", "new@example.com")
    assert (lead.country, lead.score, lead.group.slug) == ("US", 99, "emea")  # corrected, not moved
    assert lead.external_id == first["external_id"] and lead.attributes == first["attributes"]  # read-only here
    changed = AuditEvent.objects.get(type="lead.changed", lead_id=lead.id)
    assert sorted(changed.explanation["fields"]) == ["company", "country", "email", "score"]
    assert changed.explanation["facts"] == {"country": ["FR", "US"], "score": [None, 99]}  # no contact values
    assert changed.actor.startswith("admin:")
    # Dedup follows the new address, not the old one.
    assert api.post("/api/v1/leads/", {"email": first["email"], "group": "emea"}, format="json").status_code == 201
    again = api.post("/api/v1/leads/", {"email": "new@example.com", "group": "emea"}, format="json")
    assert again.status_code == 200 and again.json()["duplicate_of"] == lead.id


def test_working_hours_written_around_validation_keep_the_rep_out_with_a_reason(api, make_group):
    _group, (broken, fine) = make_group(2, slug="emea")
    # Unreadable whatever day the test runs on: eligibility reads today's spans only.
    hours = {day: [["xx", "yy"]] if i % 2 else "all day" for i, day in enumerate(DAYS)}
    Rep.objects.filter(pk=broken.pk).update(working_hours=hours)
    r = api.post("/api/v1/leads/", lead_body(group="emea"), format="json")
    assert r.status_code == 201 and r.json()["owner"]["id"] == fine.id
    assigned = AuditEvent.objects.get(type="lead.assigned", lead_id=r.json()["id"])
    reasons = {c["rep"]: c["reason"] for c in assigned.explanation["candidates"]}
    assert "working hours unreadable" in reasons[broken.id]


def test_one_assignment_that_fails_to_escalate_does_not_stop_the_sweep(api, make_group, monkeypatch, caplog):
    make_group(2, slug="emea", sla_minutes=1)
    make_group(2, slug="smb", sla_minutes=1)
    ids = [api.post("/api/v1/leads/", lead_body(group=g), format="json").json()["id"] for g in ("emea", "smb")]
    Assignment.objects.filter(lead_id__in=ids).update(due_at=timezone.now() - timedelta(minutes=5))
    first = Assignment.objects.get(lead_id=ids[0])
    real = actions.lead_escalate

    def escalate(*, assignment_id, **kwargs):
        if assignment_id == first.id:
            raise ValueError("cannot escalate this one")
        return real(assignment_id=assignment_id, **kwargs)

    monkeypatch.setattr(actions, "lead_escalate", escalate)
    tally = actions.escalation_sweep()
    assert tally.get("failed") == 1 and sum(tally.values()) == 2
    assert Lead.objects.get(pk=ids[1]).escalations == 1  # the other group's lead went on
    assert "escalation of assignment" in caplog.text


def test_the_lead_page_links_to_its_own_audit_trail(api, make_group):
    make_group(2, slug="emea")
    ids = [api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"] for _ in range(2)]
    client = staff(MANAGERS)
    page = client.get(f"/admin/leads/lead/{ids[0]}/change/").content.decode()
    assert f"/admin/audit/auditevent/?lead_id={ids[0]}" in page
    trail = client.get(f"/admin/audit/auditevent/?lead_id={ids[0]}")
    assert trail.status_code == 200 and "?e=1" not in trail.get("Location", "")
    rows = trail.context["cl"].result_list
    assert {e.lead_id for e in rows} == {ids[0]} and {e.type for e in rows} == {"lead.received", "lead.assigned"}


@pytest.mark.parametrize(
    "url",
    [
        "/admin/audit/auditevent/?actor=%00",
        "/admin/leads/lead/?email__regex=(",
        "/admin/audit/auditevent/?lead_id__range=1",
        "/admin/rotation/group/?sla_minutes=1e999999",
    ],
)
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)  # the database's refusal ends a test's enclosing transaction
def test_a_list_filter_the_database_refuses_is_the_invalid_filter_page(admin_client, url):
    r = admin_client.get(url)
    assert r.status_code == 302 and r["Location"].endswith("?e=1"), (r.status_code, r.get("Location"))
    assert admin_client.get(r["Location"]).status_code == 200


@pytest.mark.postgres
def test_an_old_date_hierarchy_address_at_the_end_of_the_calendar_is_a_page(admin_client):
    """The trail's dates are range filters now (no date hierarchy, whose month after December
    9999 the database refused); an address the hierarchy wrote is an ordinary, empty filter."""
    r = admin_client.get("/admin/audit/auditevent/?at__year=9999&at__month=12")
    assert r.status_code == 200 and list(r.context["cl"].result_list) == []


@pytest.mark.parametrize(
    ("field", "value"),
    [("dedup_days", "800000"), ("max_attempts", "2147483647"), ("max_attempts", "0")],
)
def test_the_admin_keeps_a_groups_numbers_to_the_apis_limits(make_group, field, value):
    group, _ = make_group(1, slug="lim")
    r = post_form(staff(SALES_OPS), f"/admin/rotation/group/{group.pk}/change/", **{field: value})
    assert r.status_code == 200 and "errornote" in r.content.decode()  # the form, with its error
    assert getattr(Group.objects.get(pk=group.pk), field) != int(value)


def test_bulk_deletes_in_the_admin_are_audited(make_group):
    group, (rep,) = make_group(1, slug="bulk")
    rule = RoutingRule.objects.create(
        name="R", priority=1, group=group, conditions=[{"field": "country", "op": "in", "value": ["FR"]}]
    )
    client = staff(SALES_OPS)
    for model, pk in (("routingrule", rule.pk), ("rep", rep.pk), ("group", group.pk)):
        r = client.post(
            f"/admin/rotation/{model}/", {"action": "delete_selected", "_selected_action": [pk], "post": "yes"}
        )
        assert r.status_code == 302, (model, r.status_code)
    actions_by_type = {(e.type, e.explanation.get("action")) for e in AuditEvent.objects.all()}
    assert {
        ("rule.changed", "deleted"),
        ("rep.changed", "deleted"),
        ("membership.changed", "removed"),
    } <= actions_by_type
    assert ("group.changed", "deleted") in actions_by_type
    assert not Rep.objects.filter(pk=rep.pk).exists()


def test_an_account_domain_differing_in_case_is_a_form_error(make_group):
    from rotation.models import Account

    _, (rep,) = make_group(1)
    Account.objects.create(domain="acme.example", owner=rep)
    client = staff(SALES_OPS)
    page = client.get("/admin/rotation/account/add/")
    data = form_of(page)
    data.update({"domain": ["ACME.example"], "name": ["Acme"], "owner": [str(rep.pk)]})
    r = client.post("/admin/rotation/account/add/", data)
    assert r.status_code == 200 and "already exists" in r.content.decode()
    assert Account.objects.count() == 1


@pytest.mark.parametrize("typed", ["acme.example.", "ACME.example."])
def test_an_account_domain_typed_with_a_final_dot_is_the_domain_leads_come_from(make_group, typed):
    """A domain typed as "acme.example." is the same as "acme.example" (DNS's final dot), but no lead's
    address ends with it: kept so, the account would never match a lead, and a second account
    for the same domain would be taken."""
    from rotation.models import Account

    _, (rep,) = make_group(1)
    client = staff(SALES_OPS)
    data = form_of(client.get("/admin/rotation/account/add/"))
    data.update({"domain": [typed], "name": ["Acme"], "owner": [str(rep.pk)]})
    r = client.post("/admin/rotation/account/add/", data)
    assert r.status_code == 302, r.content[:300]
    assert list(Account.objects.values_list("domain", flat=True)) == ["acme.example"]

    data = form_of(client.get("/admin/rotation/account/add/"))
    data.update({"domain": ["acme.example"], "name": ["Acme again"], "owner": [str(rep.pk)]})
    r = client.post("/admin/rotation/account/add/", data)
    assert r.status_code == 200 and "already exists" in r.content.decode()
    assert Account.objects.count() == 1


def test_account_domains_stored_with_a_final_dot_lose_it_unless_taken(api, make_group):
    from importlib import import_module

    from django.apps import apps

    from rotation.models import Account

    group, (first, rep) = make_group(2, slug="accounts")  # the rotation would give `first`
    Account.objects.bulk_create(  # as saved before the dot was dropped (bulk_create skips save())
        [
            Account(domain="acme.example.", owner=rep),
            Account(domain="initech.example.", owner=rep),
            Account(domain="initech.example", owner=rep),
        ]
    )
    import_module("rotation.migrations.0008_account_domains_without_final_dot").forward(apps, None)
    assert sorted(Account.objects.values_list("domain", flat=True)) == [
        "acme.example",
        "initech.example",
        "initech.example.",  # its twin without the dot exists: left for sales ops to remove
    ]
    r = api.post("/api/v1/leads/", lead_body(email="jo@acme.example", group="accounts"), format="json")
    assert r.status_code == 201 and r.json()["owner"]["id"] == rep.id


def test_an_account_domain_of_a_dot_alone_is_a_form_error(make_group):
    from rotation.models import Account

    _, (rep,) = make_group(1)
    client = staff(SALES_OPS)
    data = form_of(client.get("/admin/rotation/account/add/"))
    data.update({"domain": ["."], "name": ["Dot"], "owner": [str(rep.pk)]})
    r = client.post("/admin/rotation/account/add/", data)
    assert r.status_code == 200 and b"errorlist" in r.content
    assert not Account.objects.exists()


def test_an_action_posted_with_a_selection_that_is_no_id_is_a_400(admin_client):
    r = admin_client.post("/admin/leads/queuedlead/", {"action": "assign_to_rep", "_selected_action": ["abc"]})
    assert r.status_code == 400


@pytest.mark.parametrize("owner", ["abc", "1.5", "99999999999999999999"])
def test_an_account_owner_that_is_no_rep_id_is_a_form_error(make_group, owner):
    from rotation.models import Account

    make_group(1)
    client = staff(SALES_OPS)
    data = form_of(client.get("/admin/rotation/account/add/"))
    data.update({"domain": ["acme.example"], "name": ["Acme"], "owner": [owner]})
    r = client.post("/admin/rotation/account/add/", data)
    assert r.status_code == 200 and b"errorlist" in r.content, r.content[:300]
    assert not Account.objects.exists()


def test_a_member_whose_rep_is_no_id_is_a_form_error(make_group):
    group, (rep,) = make_group(1, slug="emea")
    client = staff(SALES_OPS)
    url = f"/admin/rotation/group/{group.pk}/change/"
    data = form_of(client.get(url))
    rep_fields = [name for name in data if name.startswith("memberships-") and name.endswith("-rep")]
    assert rep_fields, sorted(data)
    # An existing row's rep is fixed (ignored when posted); a new row takes the bad id.
    data[rep_fields[0]] = ["abc"]
    total = int(data["memberships-TOTAL_FORMS"][0])
    data["memberships-TOTAL_FORMS"] = [str(total + 1)]
    data.update({f"memberships-{total}-rep": ["abc"], f"memberships-{total}-weight": ["1"]})
    r = client.post(url, data)
    assert r.status_code == 200 and b"errorlist" in r.content, r.content[:300]
    assert group.memberships.get().rep_id == rep.pk


def test_a_reps_email_domain_is_stored_in_ascii_as_the_api_stores_it(api):
    """The API stores `ana@bücher.example` as `ana@xn--bcher-kva.example`; the admin kept the
    Unicode form, so the same mailbox could be two reps (one from each side) and the API
    answered an address that is no schema `email`."""
    made = api.post("/api/v1/reps/", {"name": "Ana", "email": "ana@bücher.example"}, format="json")
    assert made.status_code == 201 and made.json()["email"] == "ana@xn--bcher-kva.example"
    client = staff(SALES_OPS)
    form = {"name": "Ana again", "email": "Ana@Bücher.example", "timezone": "UTC", "active": "on"}
    form.update({"working_hours": "null", "absences-TOTAL_FORMS": "0", "absences-INITIAL_FORMS": "0"})
    r = client.post("/admin/rotation/rep/add/", form)
    assert r.status_code == 200 and "already exists" in r.content.decode()
    assert Rep.objects.count() == 1

    form.update({"name": "Bo", "email": "bo@bücher.example"})
    assert client.post("/admin/rotation/rep/add/", form).status_code == 302
    bo = Rep.objects.get(name="Bo")
    assert bo.email == "bo@xn--bcher-kva.example"
    assert api.get(f"/api/v1/reps/{bo.pk}/").json()["email"] == "bo@xn--bcher-kva.example"
    (event,) = AuditEvent.objects.filter(type="rep.changed", rep_id=bo.pk)
    assert event.explanation["changes"]["email"] == "bo@xn--bcher-kva.example"


def test_a_rule_priority_past_the_apis_limit_is_a_form_error(api, make_group):
    """The admin saved priority 5,000,000, which the API then answered outside its own schema
    (priority at most 1,000,000) and refused when a client sent the rule back unchanged."""
    group, _ = make_group(1, slug="emea")
    client = staff(SALES_OPS)
    form = {"name": "France", "conditions": '[{"field": "country", "op": "in", "value": ["FR"]}]'}
    form.update({"group": str(group.pk), "active": "on"})
    r = client.post("/admin/rotation/routingrule/add/", {**form, "priority": "5000000"})
    assert r.status_code == 200 and "less than or equal to 1000000" in r.content.decode()
    assert not RoutingRule.objects.exists()
    assert client.post("/admin/rotation/routingrule/add/", {**form, "priority": "1000000"}).status_code == 302
    (rule,) = api.get("/api/v1/rules/").json()["results"]
    assert rule["priority"] == 1_000_000
    assert api.patch(f"/api/v1/rules/{rule['id']}/", {"priority": rule["priority"]}, format="json").status_code == 200


@pytest.mark.parametrize("typed", ["-1", "0"])
def test_the_lowest_max_attempts_and_weight_are_said_as_1_whatever_was_typed(make_group, typed):
    """-1 was answered "greater than or equal to 0", and 0 then "greater than or equal to 1":
    a sales ops correcting as told was refused a second time."""
    group, (rep,) = make_group(1, slug="emea")
    client = staff(SALES_OPS)
    url = f"/admin/rotation/group/{group.pk}/change/"
    r = post_form(client, url, **{"max_attempts": typed, "memberships-0-weight": typed})
    page = r.content.decode()
    assert r.status_code == 200
    assert page.count("Ensure this value is greater than or equal to 1.") == 2, page
    assert "greater than or equal to 0" not in page


@pytest.mark.parametrize("debug", [False, True])
@pytest.mark.parametrize("where", ["query", "form"])
def test_an_admin_request_of_too_many_fields_is_a_400_naming_the_limit(admin_client, settings, debug, where):
    """Django refuses to parse more fields than DATA_UPLOAD_MAX_NUMBER_FIELDS; with DEBUG on
    (`make run`) its debug page read them again and answered a 500. A form of many fields
    posts, as before."""
    settings.DEBUG = debug
    limit = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
    fields = {f"f{i}": "x" for i in range(limit + 1)}
    if where == "query":
        r = admin_client.get("/admin/leads/lead/", fields)
    else:
        r = admin_client.post("/admin/leads/lead/", {"action": "delete_selected", **fields})
    assert r.status_code == 400
    assert f"Too many fields in the request (at most {limit})." in r.content.decode()
    assert admin_client.get("/admin/leads/lead/", {"q": "x"}).status_code == 200


def test_an_admin_form_body_over_the_size_limit_is_a_413(admin_client, settings):
    settings.DEBUG = True
    r = admin_client.post("/admin/leads/lead/", {"q": "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)})
    assert r.status_code == 413 and b"over" in r.content


def test_an_admin_save_of_a_group_deleted_meanwhile_is_refused_and_said(make_group, monkeypatch):
    from rotation.admin import GroupAdmin

    group, _ = make_group(0, slug="emea")  # with members, the page finds one gone and says so
    client = staff(SALES_OPS)
    url = f"/admin/rotation/group/{group.pk}/change/"
    data = form_of(client.get(url))
    data["name"] = ["Renamed"]
    save = GroupAdmin.save_model

    def lose_then_save(self, request, obj, form, change):
        Group.objects.filter(pk=obj.pk).delete()  # another user's delete, committed first
        save(self, request, obj, form, change)

    monkeypatch.setattr(GroupAdmin, "save_model", lose_then_save)
    r = client.post(url, data)
    assert r.status_code == 404 and "deleted by another request" in r.content.decode()
    # (The delete here ran in the page's own transaction, rolled back with it; another user's
    # would have committed.) Nothing of the edit was written.
    assert Group.objects.get(pk=group.pk).name == group.name
