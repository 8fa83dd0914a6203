"""The lead actions over the API (SPEC 6): accept, reassign, reroute, close, PATCH."""

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from leads.models import Assignment, Lead
from rotation.models import Membership, RotationState, RoutingRule
from tests.conftest import lead_body
from tests.factories import GroupFactory, RepFactory

pytestmark = pytest.mark.django_db


def post(api, **fields) -> dict:
    r = api.post("/api/v1/leads/", lead_body(**fields), format="json")
    assert r.status_code == 201, r.content
    return r.json()


def events(lead_id: int, type_: str | None = None) -> list[AuditEvent]:
    qs = AuditEvent.objects.filter(lead_id=lead_id).order_by("id")
    return list(qs.filter(type=type_) if type_ else qs)


def pointer(group) -> int:
    return RotationState.objects.get(group=group).pointer


# --- accept ----------------------------------------------------------------------------------


def test_accept_by_the_owner_stops_escalation(api, make_group):
    group, reps = make_group(2, slug="emea", sla_minutes="10")
    lead = post(api, group="emea")
    r = api.post(f"/api/v1/leads/{lead['id']}/accept/", {"rep": reps[0].id}, format="json")
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["status"] == "accepted" and body["accepted_at"] and body["owner"]["id"] == reps[0].id
    assignment = Assignment.objects.get(lead_id=lead["id"])
    assert assignment.accepted_at is not None and assignment.ended_at is None
    (event,) = events(lead["id"], "lead.accepted")
    assert event.rep_id == reps[0].id and event.actor.startswith("api:")
    assert event.explanation["attempt"] == 1 and event.explanation["seconds_before_due"] > 0
    # Accepting again is a no-op, not a second event.
    assert api.post(f"/api/v1/leads/{lead['id']}/accept/", {"rep": reps[0].id}, format="json").status_code == 200
    assert len(events(lead["id"], "lead.accepted")) == 1


def test_accept_by_someone_else_is_a_conflict(api, make_group):
    group, reps = make_group(2, slug="emea")
    lead = post(api, group="emea")
    r = api.post(f"/api/v1/leads/{lead['id']}/accept/", {"rep": reps[1].id}, format="json")
    assert r.status_code == 409
    assert r.json()["detail"] == (
        f"Rep {reps[1].id} is not the current owner of lead {lead['id']} (status 'assigned'): the rep never held it."
    )
    assert Lead.objects.get(pk=lead["id"]).status == "assigned"
    assert not events(lead["id"], "lead.accepted")


def test_accept_by_the_rep_a_lead_escalated_from_says_it_escalated(api, make_group):
    """ "Not the current owner" alone: the rep could not tell an escalation from a mistake."""
    from leads import actions

    group, reps = make_group(2, slug="emea", sla_minutes="30")
    lead = post(api, group="emea")
    Assignment.objects.filter(lead_id=lead["id"]).update(due_at=timezone.now() - timedelta(seconds=1))
    actions.escalation_sweep()
    r = api.post(f"/api/v1/leads/{lead['id']}/accept/", {"rep": reps[0].id}, format="json")
    assert r.status_code == 409
    assert "(status 'assigned'): it escalated when the SLA was missed at " in r.json()["detail"], r.json()


def test_accept_a_queued_lead_is_a_conflict(api, make_group):
    group, reps = make_group(1, slug="emea")
    group.memberships.update(active=False)
    lead = post(api, group="emea")
    r = api.post(f"/api/v1/leads/{lead['id']}/accept/", {"rep": reps[0].id}, format="json")
    assert r.status_code == 409


def test_accept_of_a_closed_lead_says_it_is_closed(api, make_group):
    """A closed lead keeps the rep who worked it as its owner: refusing that rep's accept as
    "not the current owner" contradicted the lead the same client reads."""
    group, reps = make_group(1, slug="emea")
    lead = post(api, group="emea")
    assert api.post(f"/api/v1/leads/{lead['id']}/close/", {"outcome": "won"}, format="json").status_code == 200
    assert api.get(f"/api/v1/leads/{lead['id']}/").json()["owner"]["id"] == reps[0].id
    r = api.post(f"/api/v1/leads/{lead['id']}/accept/", {"rep": reps[0].id}, format="json")
    assert r.status_code == 409
    assert r.json()["detail"] == f"Lead {lead['id']} is closed (won): there is nothing to accept."
    assert not events(lead["id"], "lead.accepted")


@pytest.mark.parametrize(
    ("body", "field"),
    [({}, "rep"), ({"rep": 999999}, "rep"), ({"rep": "x"}, "rep"), ({"rep": 1, "extra": 1}, "extra")],
)
def test_accept_bad_bodies_are_400_naming_the_field(api, make_group, body, field):
    group, reps = make_group(1, slug="emea")
    lead = post(api, group="emea")
    if body.get("rep") == 1:
        body["rep"] = reps[0].id
    r = api.post(f"/api/v1/leads/{lead['id']}/accept/", body, format="json")
    assert r.status_code == 400, r.content
    assert field in r.json()


def test_actions_need_the_manage_scope_and_an_existing_lead(api, api_with, make_group):
    group, reps = make_group(1, slug="emea")
    lead = post(api, group="emea")
    reader = api_with(["read", "intake"])
    for path, body in [
        ("accept/", {"rep": reps[0].id}),
        ("reassign/", {"rep": reps[0].id, "reason": "x"}),
        ("reroute/", {}),
        ("close/", {"outcome": "won"}),
    ]:
        assert reader.post(f"/api/v1/leads/{lead['id']}/{path}", body, format="json").status_code == 403
        assert api.post(f"/api/v1/leads/987654321/{path}", body, format="json").status_code == 404
    assert reader.patch(f"/api/v1/leads/{lead['id']}/", {"first_name": "X"}, format="json").status_code == 403
    assert api.patch("/api/v1/leads/987654321/", {"first_name": "X"}, format="json").status_code == 404


# --- reassign --------------------------------------------------------------------------------


def test_manual_reassign_does_not_move_the_pointer_and_counts_today(api, make_group):
    group, reps = make_group(3, slug="emea", sla_minutes="5")
    lead = post(api, group="emea")
    assert pointer(group) == 1
    r = api.post(f"/api/v1/leads/{lead['id']}/reassign/", {"rep": reps[2].id, "reason": "speaks French"}, format="json")
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["owner"]["id"] == reps[2].id and body["status"] == "assigned" and body["sla_due_at"]
    assert pointer(group) == 1
    first, second = Assignment.objects.filter(lead_id=lead["id"]).order_by("attempt")
    assert first.ended_at is not None and first.end_reason == "reassigned"
    assert second.reason == "manual" and second.ended_at is None and second.over_cap is False
    (event,) = events(lead["id"], "lead.reassigned")
    ex = event.explanation
    assert ex["reason"] == "speaks French" and ex["from_rep"] == reps[0].id and ex["to_rep"] == reps[2].id
    assert ex["pointer_moved"] is False and ex["over_cap"] is False
    view = api.get("/api/v1/groups/emea/rotation/").json()
    today = {m["rep"]["id"]: m["assigned_today"] for m in view["members"]}
    assert today[reps[2].id] == 1  # the manual assignment counts toward the daily count
    # The next lead still goes to the rep the pointer names.
    assert post(api, group="emea")["owner"]["id"] == reps[1].id


def test_manual_reassign_may_exceed_a_cap_and_says_so(api, make_group):
    group, reps = make_group(2, slug="emea")
    Membership.objects.filter(group=group, rep=reps[1]).update(max_open=1)
    post(api, group="emea")  # reps[0]
    post(api, group="emea")  # reps[1]: now at its cap
    third = post(api, group="emea")
    assert third["owner"]["id"] == reps[0].id
    r = api.post(f"/api/v1/leads/{third['id']}/reassign/", {"rep": reps[1].id, "reason": "VIP"}, format="json")
    assert r.status_code == 200, r.content
    assignment = Assignment.objects.get(lead_id=third["id"], ended_at__isnull=True)
    assert assignment.rep_id == reps[1].id and assignment.over_cap is True
    ex = events(third["id"], "lead.reassigned")[0].explanation
    assert ex["over_cap"] is True and ex["caps"]["exceeded"] == ["max_open"] and ex["caps"]["open"] == 1


def test_reassign_rejects_bad_requests(api, make_group):
    group, reps = make_group(2, slug="emea")
    lead = post(api, group="emea")
    url = f"/api/v1/leads/{lead['id']}/reassign/"
    assert "reason" in api.post(url, {"rep": reps[1].id}, format="json").json()
    assert "reason" in api.post(url, {"rep": reps[1].id, "reason": "   "}, format="json").json()
    assert "rep" in api.post(url, {"rep": 999999, "reason": "x"}, format="json").json()
    reps[1].active = False
    reps[1].save()
    r = api.post(url, {"rep": reps[1].id, "reason": "x"}, format="json")
    assert r.status_code == 400 and "inactive" in r.json()["rep"][0]
    assert api.post(url, {"rep": reps[0].id, "reason": "x"}, format="json").status_code == 409  # already owns it
    assert len(events(lead["id"])) == 2  # received, assigned: nothing half-written


def test_reassign_a_queued_lead_assigns_it(api, make_group):
    group, reps = make_group(1, slug="emea")
    group.memberships.update(active=False)
    lead = post(api, group="emea")
    r = api.post(f"/api/v1/leads/{lead['id']}/reassign/", {"rep": reps[0].id, "reason": "by hand"}, format="json")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "assigned" and body["queue_reason"] is None and body["owner"]["id"] == reps[0].id
    ex = events(lead["id"], "lead.reassigned")[0].explanation
    assert ex["from_rep"] is None and ex["eligible_now"] is False and "paused" in ex["not_eligible_because"]


# --- reroute ---------------------------------------------------------------------------------


def test_reroute_runs_rules_and_rotation_again(api, make_group):
    emea, emea_reps = make_group(2, slug="emea")
    france, france_reps = make_group(2, slug="france")
    lead = post(api, group="emea", country="FR")
    assert lead["group"] == "emea"
    RoutingRule.objects.create(
        name="France", priority=1, group=france, conditions=[{"field": "country", "op": "in", "value": ["FR"]}]
    )
    r = api.post(f"/api/v1/leads/{lead['id']}/reroute/", {}, format="json")
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["group"] == "france" and body["owner"]["id"] == france_reps[0].id
    assert pointer(france) == 1 and pointer(emea) == 1
    old, new = Assignment.objects.filter(lead_id=lead["id"]).order_by("attempt")
    assert old.end_reason == "rerouted" and new.reason == "reroute" and new.group == france
    (event,) = events(lead["id"], "lead.rerouted")
    ex = event.explanation
    assert ex["rule"] == "France" and ex["from_group"] == "emea" and ex["from_rep"] == emea_reps[0].id
    assert ex["to_rep"] == france_reps[0].id and ex["pointer_before"] == 0 and ex["pointer_after"] == 1
    assert api.post(f"/api/v1/leads/{lead['id']}/reroute/", {"x": 1}, format="json").status_code == 400


@pytest.mark.parametrize("payload", [b"null", b"[]", b'"again"', b"42", b"true"])
def test_reroute_with_a_body_that_is_not_an_object_is_a_400_and_moves_nothing(api, make_group, payload):
    """Reroute takes an empty object or no body at all; JSON `null` is no more an object than
    `[]` is, and moved the lead as if nothing had been sent."""
    make_group(2, slug="emea")
    lead = post(api, group="emea")
    r = api.post(f"/api/v1/leads/{lead['id']}/reroute/", payload, content_type="application/json")
    assert r.status_code == 400, r.content
    assert r.json()["non_field_errors"]
    assert Assignment.objects.filter(lead_id=lead["id"]).count() == 1
    assert not events(lead["id"], "lead.rerouted")
    # No body at all is still the way to ask for it.
    assert api.post(f"/api/v1/leads/{lead['id']}/reroute/").status_code == 200
    assert len(events(lead["id"], "lead.rerouted")) == 1


def test_reroute_that_lands_an_accepted_lead_with_its_owner_keeps_it_accepted(api, make_group):
    """Routed again to the account owner who already holds and accepted it, the lead was given
    to them afresh: no longer accepted, its SLA clock running again, and escalated away from
    them when they did not accept it a second time. Its assignment now stands."""
    from leads import actions
    from rotation.models import Account

    group, reps = make_group(3, slug="emea", sla_minutes="30")
    Account.objects.create(domain="bigco.example", owner=reps[1])
    lead = post(api, group="emea", email="buyer@bigco.example")
    assert lead["owner"]["id"] == reps[1].id
    accepted = api.post(f"/api/v1/leads/{lead['id']}/accept/", {"rep": reps[1].id}, format="json").json()
    before = pointer(group)
    r = api.post(f"/api/v1/leads/{lead['id']}/reroute/", {}, format="json")
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["status"] == "accepted" and body["owner"]["id"] == reps[1].id
    assert body["accepted_at"] == accepted["accepted_at"] and body["sla_due_at"] == accepted["sla_due_at"]
    (assignment,) = Assignment.objects.filter(lead_id=lead["id"])
    assert assignment.ended_at is None and assignment.accepted_at is not None
    assert pointer(group) == before
    (event,) = events(lead["id"], "lead.rerouted")
    ex = event.explanation
    assert ex["unchanged"] is True and ex["from_rep"] == ex["to_rep"] == reps[1].id and ex["attempt"] == 1
    from audit.summary import event_summary

    text = event_summary(type=event.type, explanation=ex, rep_id=event.rep_id, names={})
    assert text.startswith("Kept by") and "already had it" in text, text
    # Past its old due time nothing escalates it: it was accepted.
    Assignment.objects.filter(pk=assignment.pk).update(due_at=timezone.now() - timedelta(seconds=1))
    assert actions.lead_escalate(assignment_id=assignment.pk).outcome == "done"
    assert Lead.objects.get(pk=lead["id"]).owner_id == reps[1].id


def test_reroute_does_not_count_the_lead_against_the_cap_of_the_rep_who_holds_it(api, make_group):
    """An account owner at their max_open cap with this very lead was found over the cap by
    its own count, and the reroute took the accepted lead from them to the rotation."""
    from rotation.models import Account

    group, reps = make_group(3, slug="emea", sla_minutes="30")
    Membership.objects.filter(group=group, rep=reps[1]).update(max_open=1, max_per_day=1)
    Account.objects.create(domain="bigco.example", owner=reps[1])
    lead = post(api, group="emea", email="buyer@bigco.example")
    assert lead["owner"]["id"] == reps[1].id
    assert api.post(f"/api/v1/leads/{lead['id']}/accept/", {"rep": reps[1].id}, format="json").status_code == 200
    body = api.post(f"/api/v1/leads/{lead['id']}/reroute/", {}, format="json").json()
    assert body["owner"]["id"] == reps[1].id and body["status"] == "accepted"
    assert events(lead["id"], "lead.rerouted")[0].explanation["unchanged"] is True
    # Another lead of the account still finds the owner at the cap, and goes to the rotation.
    other = post(api, group="emea", email="cto@bigco.example")
    assert other["owner"]["id"] != reps[1].id


def test_reroute_that_the_rotation_gives_back_to_its_owner_leaves_the_rotation_as_it_was(api, make_group):
    group, reps = make_group(1, slug="emea", sla_minutes="30")
    lead = post(api, group="emea")
    due = lead["sla_due_at"]
    before = RotationState.objects.get(group=group)
    r = api.post(f"/api/v1/leads/{lead['id']}/reroute/", {}, format="json")
    assert r.status_code == 200, r.content
    assert r.json()["owner"]["id"] == reps[0].id and r.json()["sla_due_at"] == due  # no extra time
    after = RotationState.objects.get(group=group)
    assert (after.pointer, after.turns) == (before.pointer, before.turns)
    assert Assignment.objects.filter(lead_id=lead["id"]).count() == 1
    ex = events(lead["id"], "lead.rerouted")[0].explanation
    assert ex["unchanged"] is True and ex["pointer_after"] == ex["pointer_before"] == before.pointer


def test_reroute_with_no_eligible_rep_queues(api, make_group):
    emea, _ = make_group(1, slug="emea")
    lead = post(api, group="emea")
    emea.memberships.update(active=False)
    body = api.post(f"/api/v1/leads/{lead['id']}/reroute/", {}, format="json").json()
    assert body["status"] == "queued" and body["owner"] is None and "no eligible rep" in body["queue_reason"]


def test_reroute_into_a_group_with_no_members_queues_with_intakes_reason(api, make_group):
    emea, _ = make_group(1, slug="emea")
    lead = post(api, group="emea")
    emea.memberships.all().delete()
    body = api.post(f"/api/v1/leads/{lead['id']}/reroute/", {}, format="json").json()
    assert body["status"] == "queued" and body["queue_reason"] == "group 'emea' has no members"
    fresh = post(api, group="emea")  # as intake words it
    assert fresh["queue_reason"] == body["queue_reason"]


def test_reroute_into_an_inactive_group_names_the_group_in_the_trail(api, make_group):
    """The trail of a lead rerouted into an inactive group said "no group" while the lead stood
    in that group, queued."""
    from audit.summary import event_summary

    emea, _ = make_group(1, slug="emea")
    lead = post(api, group="emea")
    emea.active = False
    emea.save(update_fields=["active"])
    api.post(f"/api/v1/leads/{lead['id']}/reroute/", {}, format="json")
    (event,) = events(lead["id"], "lead.rerouted")
    assert (event.explanation["group"], event.explanation["strategy"]) == ("emea", emea.strategy)
    text = event_summary(type=event.type, explanation=event.explanation, rep_id=event.rep_id, names={})
    assert f"group emea ({emea.strategy})" in text, text


# --- close -----------------------------------------------------------------------------------


def test_close_frees_capacity(api, make_group):
    group, reps = make_group(1, slug="emea")
    Membership.objects.filter(group=group).update(max_open=1)
    first = post(api, group="emea")
    assert post(api, group="emea")["status"] == "queued"
    r = api.post(f"/api/v1/leads/{first['id']}/close/", {"outcome": "won"}, format="json")
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["status"] == "closed" and body["outcome"] == "won" and body["closed_at"]
    assert Assignment.objects.get(lead_id=first["id"]).end_reason == "closed"
    (event,) = events(first["id"], "lead.closed")
    assert event.explanation["outcome"] == "won" and event.explanation["from_status"] == "assigned"
    assert post(api, group="emea")["status"] == "assigned"  # the cap has room again
    again = api.post(f"/api/v1/leads/{first['id']}/close/", {"outcome": "lost"}, format="json")
    assert again.status_code == 409
    assert api.post(f"/api/v1/leads/{first['id']}/close/", {"outcome": "maybe"}, format="json").status_code == 400


# --- PATCH -----------------------------------------------------------------------------------


def test_patch_edits_contact_fields_and_never_moves_the_lead(api, make_group):
    group, reps = make_group(2, slug="emea")
    lead = post(api, group="emea", first_name="Jane")
    r = api.patch(
        f"/api/v1/leads/{lead['id']}/", {"first_name": "Janet", "email": " Janet@Acme.example "}, format="json"
    )
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["first_name"] == "Janet" and body["email"] == "Janet@Acme.example"
    assert body["owner"]["id"] == reps[0].id and body["status"] == "assigned" and body["group"] == "emea"
    stored = Lead.objects.get(pk=lead["id"])
    assert stored.email_normalized == "janet@acme.example"
    assert Assignment.objects.filter(lead_id=lead["id"]).count() == 1
    (event,) = events(lead["id"], "lead.changed")
    assert event.explanation == {"fields": ["email", "first_name"], "moved": False}


def test_patch_of_the_routing_facts_never_moves_the_lead_until_a_reroute(api, make_group):
    """SPEC 4: a lead whose territory changes is only moved by an explicit reroute."""
    emea, (emea_rep,) = make_group(1, slug="emea")
    _us, (us_rep,) = make_group(1, slug="us")
    RoutingRule.objects.create(
        name="US", priority=1, conditions=[{"field": "country", "op": "equals", "value": "US"}], group=_us
    )
    lead = post(api, group="emea", country="FR", score=10)
    assert lead["owner"]["id"] == emea_rep.id
    body = {"country": "us", "region": "West", "score": 80, "company_size": 500, "attributes": {"plan": "pro"}}
    r = api.patch(f"/api/v1/leads/{lead['id']}/", body, format="json")
    assert r.status_code == 200, r.content
    changed = r.json()
    assert (changed["country"], changed["region"], changed["score"]) == ("US", "West", 80)
    assert changed["company_size"] == 500 and changed["attributes"] == {"plan": "pro"}
    assert changed["group"] == "emea" and changed["owner"]["id"] == emea_rep.id and changed["status"] == "assigned"
    assert Assignment.objects.filter(lead_id=lead["id"]).count() == 1
    (event,) = events(lead["id"], "lead.changed")
    assert event.explanation["moved"] is False
    assert event.explanation["fields"] == ["attributes", "company_size", "country", "region", "score"]
    assert event.explanation["facts"] == {
        "company_size": [None, 500],
        "country": ["FR", "US"],
        "region": ["", "West"],
        "score": [10, 80],
    }
    # The reroute reads the facts as they are now.
    r = api.post(f"/api/v1/leads/{lead['id']}/reroute/", {}, format="json")
    assert r.status_code == 200, r.content
    assert r.json()["group"] == "us" and r.json()["owner"]["id"] == us_rep.id
    (rerouted,) = events(lead["id"], "lead.rerouted")
    assert rerouted.explanation["rule"] == "US"


def test_patch_with_null_clears_an_optional_field(api, make_group):
    """A merge patch's null: the field is emptied (text to "", attributes to {}); the
    email, which every lead has, cannot be."""
    make_group(1, slug="emea")
    lead = post(api, group="emea", first_name="Jane", company="Acme", score=40, attributes={"plan": "pro"})
    body = {"company": None, "score": None, "attributes": None}
    r = api.patch(f"/api/v1/leads/{lead['id']}/", body, format="json")
    assert r.status_code == 200, r.content
    changed = r.json()
    assert (changed["first_name"], changed["company"], changed["score"], changed["attributes"]) == (
        "Jane",
        "",
        None,
        {},
    )
    stored = Lead.objects.get(pk=lead["id"])
    assert (stored.company, stored.score, stored.attributes) == ("", None, {})
    r = api.patch(f"/api/v1/leads/{lead['id']}/", {"email": None}, format="json")
    assert r.status_code == 400 and set(r.json()) == {"email"}


def test_patch_as_a_json_merge_patch(api, make_group):
    make_group(1, slug="emea")
    lead = post(api, group="emea", first_name="Jane")
    body = json.dumps({"first_name": "Janet"})
    r = api.patch(f"/api/v1/leads/{lead['id']}/", body, content_type="application/merge-patch+json")
    assert r.status_code == 200, r.content
    assert r.json()["first_name"] == "Janet"


def test_patch_to_the_address_of_another_open_lead_is_a_conflict(api, make_group):
    """One open lead per address, as intake keeps it: an edit that would make two is refused,
    naming the other lead; the same edit is fine once that lead is closed."""
    make_group(2, slug="emea")
    first = post(api, group="emea", email="jane@acme.example")
    second = post(api, group="emea", email="john@acme.example")
    r = api.patch(f"/api/v1/leads/{second['id']}/", {"email": " JANE@acme.example", "phone": "+331"}, format="json")
    assert r.status_code == 409, r.content
    assert f"Lead {first['id']} is open with this email address" in r.json()["detail"]
    stored = Lead.objects.get(pk=second["id"])
    assert (stored.email, stored.phone) == ("john@acme.example", "")  # nothing half-written
    assert not events(second["id"], "lead.changed")
    # Its own address again, in other case: not a duplicate of itself.
    assert api.patch(f"/api/v1/leads/{second['id']}/", {"email": "John@Acme.example"}, format="json").status_code == 200
    assert api.post(f"/api/v1/leads/{first['id']}/close/", {"outcome": "lost"}, format="json").status_code == 200
    assert api.patch(f"/api/v1/leads/{second['id']}/", {"email": "jane@acme.example"}, format="json").status_code == 200
    # A closed lead may take the address of an open one: dedup is about open leads.
    third = post(api, group="emea", email="jim@acme.example")
    assert api.post(f"/api/v1/leads/{third['id']}/close/", {"outcome": "won"}, format="json").status_code == 200
    assert api.patch(f"/api/v1/leads/{third['id']}/", {"email": "jane@acme.example"}, format="json").status_code == 200


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"status": "closed"}, "status"),
        ({"group": "emea"}, "group"),
        ({"owner": 1}, "owner"),
        ({"email": "not-an-email"}, "email"),
        ({"country": "XX"}, "country"),
        ({"country": "ıt"}, "country"),
        ({"score": 101}, "score"),
        ({"company_size": "12"}, "company_size"),
        ({"attributes": {"nested": {"a": 1}}}, "attributes"),
        ({"region": "North\u0000"}, "region"),
    ],
)
def test_patch_rejects_everything_but_contact_fields_and_routing_facts(api, make_group, body, field):
    make_group(1, slug="emea")
    lead = post(api, group="emea")
    r = api.patch(f"/api/v1/leads/{lead['id']}/", body, format="json")
    assert r.status_code == 400 and field in r.json()
    assert not events(lead["id"], "lead.changed")


def test_an_empty_patch_changes_nothing_and_answers_the_lead(api, make_group):
    """`{}` (or no body) is a merge patch with nothing in it: a 200 with the lead as it is,
    as a group, rep, member or rule answers one; no event."""
    make_group(1, slug="emea")
    lead = post(api, group="emea", first_name="Jane")
    for body in ({}, None):
        r = api.patch(f"/api/v1/leads/{lead['id']}/", body, format="json" if body is not None else None)
        assert r.status_code == 200, r.content
        assert r.json()["first_name"] == "Jane" and r.json()["id"] == lead["id"]
    assert not events(lead["id"], "lead.changed")


def test_put_is_not_allowed(api, make_group):
    make_group(1, slug="emea")
    lead = post(api, group="emea")
    assert api.put(f"/api/v1/leads/{lead['id']}/", {"first_name": "x"}, format="json").status_code == 405


def test_reassign_to_a_rep_outside_the_group_is_allowed_and_said(api, make_group):
    group, reps = make_group(1, slug="emea")
    outsider = RepFactory()
    GroupFactory(slug="other")
    lead = post(api, group="emea")
    r = api.post(f"/api/v1/leads/{lead['id']}/reassign/", {"rep": outsider.id, "reason": "x"}, format="json")
    assert r.status_code == 200
    assert events(lead["id"], "lead.reassigned")[0].explanation["member_of_group"] is False


def test_reroute_gives_the_lead_to_its_account_owner(api, make_group):
    from rotation.models import Account

    group, reps = make_group(3, slug="emea")
    lead = post(api, group="emea", email="buyer@bigco.example")
    assert lead["owner"]["id"] == reps[0].id
    Account.objects.create(domain="bigco.example", owner=reps[2])
    body = api.post(f"/api/v1/leads/{lead['id']}/reroute/", {}, format="json").json()
    assert body["owner"]["id"] == reps[2].id
    assert Assignment.objects.get(lead_id=lead["id"], ended_at__isnull=True).reason == "owner_match"
    assert pointer(group) == 1  # an owner match does not move the rotation


def test_reassign_to_an_outsider_who_is_away_says_so(api, make_group):
    from rotation.models import Absence

    make_group(1, slug="emea")
    outsider = RepFactory()
    now = timezone.now()
    Absence.objects.create(rep=outsider, starts_at=now - timedelta(hours=1), ends_at=now + timedelta(days=1))
    lead = post(api, group="emea")
    r = api.post(f"/api/v1/leads/{lead['id']}/reassign/", {"rep": outsider.id, "reason": "x"}, format="json")
    assert r.status_code == 200
    explanation = events(lead["id"], "lead.reassigned")[0].explanation
    assert explanation["member_of_group"] is False and explanation["eligible_now"] is False
    assert "out of office" in explanation["not_eligible_because"]


def test_escalation_past_max_attempts_counts_a_move_by_hand_and_says_how_many_missed(api, make_group):
    from leads import actions

    group, reps = make_group(3, slug="emea", sla_minutes="30", max_attempts=2)
    lead = post(api, group="emea")
    api.post(f"/api/v1/leads/{lead['id']}/reassign/", {"rep": reps[1].id, "reason": "x"}, format="json")
    current = Assignment.objects.get(lead_id=lead["id"], ended_at__isnull=True)
    Assignment.objects.filter(pk=current.pk).update(due_at=timezone.now() - timedelta(seconds=1))
    assert actions.lead_escalate(assignment_id=current.pk).outcome == "queued"
    stored = Lead.objects.get(pk=lead["id"])
    assert stored.queue_reason.startswith("SLA missed once; max_attempts (2) reached in 'emea'"), stored.queue_reason
    assert "(2 assignments there)" in stored.queue_reason
    escalated = events(lead["id"], "lead.escalated")[0].explanation
    assert escalated["attempts_in_group"] == 2 and escalated["sla_misses_in_group"] == 1


def test_a_lead_queued_in_a_weighted_group_leaves_the_weights_as_they_were(api, make_group):
    group, reps = make_group(2, slug="emea", strategy="weighted")
    post(api, group="emea")
    Membership.objects.filter(group=group).update(active=False)
    lead = post(api, group="emea")
    assert lead["status"] == "queued"
    queued = events(lead["id"], "lead.queued")[0].explanation
    assert queued["current_weights_after"] == queued["current_weights_before"]
    assert RotationState.objects.get(group=group).current_weights == queued["current_weights_before"]


def test_a_reassign_to_an_inactive_rep_names_the_rep_with_the_other_bad_fields(api, make_group):
    """The service refused the inactive rep only after the body validated: with a blank reason
    too, the 400 named the reason alone."""
    group, reps = make_group(2, slug="emea")
    lead = post(api, group="emea")
    reps[1].active = False
    reps[1].save()
    r = api.post(f"/api/v1/leads/{lead['id']}/reassign/", {"rep": reps[1].id, "reason": " "}, format="json")
    assert r.status_code == 400 and set(r.json()) == {"rep", "reason"}, r.content
    assert "inactive" in r.json()["rep"][0]
    assert len(events(lead["id"])) == 2  # received, assigned: nothing written


def test_a_lead_patch_names_an_email_that_cannot_be_ascii_with_the_other_bad_fields(api, make_group):
    make_group(1, slug="emea")
    lead = post(api, group="emea")
    r = api.patch(f"/api/v1/leads/{lead['id']}/", {"email": "jos\u0130@example.com", "score": 101}, format="json")
    assert r.status_code == 400 and set(r.json()) == {"email", "score"}, r.content
