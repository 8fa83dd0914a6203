"""The trail in the admin (SPEC 3.5): each event's sentence says what its explanation says."""

from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from audit.summary import event_summary, rep_ids
from leads import actions
from leads.models import Assignment, Lead
from leads.tokens import api_client_audit_created, api_client_create
from rotation.models import Account, Membership, Rep, RoutingRule
from tests.conftest import lead_body

pytestmark = pytest.mark.django_db


def post(api, **fields) -> dict:
    r = api.post("/api/v1/leads/", lead_body(**fields), format="json")
    assert r.status_code == 201, r.content
    return r.json()


def summary(event: AuditEvent) -> str:
    ids = rep_ids(event.explanation, event.rep_id)
    names = dict(Rep.objects.filter(pk__in=ids).values_list("pk", "name"))
    return event_summary(type=event.type, explanation=event.explanation, rep_id=event.rep_id, names=names)


def escalate(lead_id: int) -> AuditEvent:
    assignment = Assignment.objects.get(lead_id=lead_id, ended_at__isnull=True)
    Assignment.objects.filter(pk=assignment.pk).update(due_at=timezone.now() - timedelta(seconds=3))
    actions.lead_escalate(assignment_id=assignment.pk)
    return AuditEvent.objects.filter(lead_id=lead_id, type="lead.escalated").latest("id")


def test_an_escalation_says_whose_sla_ran_out_and_who_has_the_lead_now(api, make_group):
    group, reps = make_group(2, slug="emea", sla_minutes="30")
    lead = post(api, group="emea")
    text = summary(escalate(lead["id"]))
    assert f"SLA of {reps[0].name} (#{reps[0].id}) missed (attempt 1, 3." in text, text
    assert f"Given to {reps[1].name} (#{reps[1].id}) (escalation)" in text, text
    assert "no rule matched" not in text and "(rotation)" not in text, text
    assert f"Not chosen: {reps[0].name}: already had this lead." in text, text


def test_a_lead_no_rule_and_no_default_group_takes_says_so_once(api):
    r = api.post("/api/v1/leads/", lead_body(), format="json")
    assert r.status_code == 201 and r.json()["status"] == "queued", r.content
    text = summary(AuditEvent.objects.get(type="lead.queued"))
    assert text == "Sent to the fallback queue: no rule matched and there is no default group.", text


def test_an_escalation_into_the_queue_reads_as_queued_not_as_given_to_nobody(api, make_group):
    group, reps = make_group(2, slug="emea", sla_minutes="30", max_attempts=5)
    Membership.objects.filter(group=group, rep=reps[1]).update(max_open=0)
    lead = post(api, group="emea")
    event = escalate(lead["id"])
    assert event.explanation["chosen"] is None and event.explanation["queued"] is True
    text = summary(event)
    assert "nobody" not in text and "Given to" not in text, text
    assert f"SLA of {reps[0].name} (#{reps[0].id}) missed (attempt 1" in text, text
    # What keeps out the rep who did not have it, not only that none was left (read as "all tried").
    reason = "SLA missed; no eligible rep in 'emea' who has not had this lead (the others: 1 at max_open cap)"
    assert f"Sent to the fallback queue: {reason}" in text, text
    assert Lead.objects.get(pk=lead["id"]).queue_reason == reason
    assert "no rule matched" not in text and "group from" not in text, text
    assert f"{reps[1].name}: at max_open cap (0/0)" in text, text


def test_an_escalation_at_max_attempts_reads_as_queued(api, make_group):
    group, reps = make_group(2, slug="emea", sla_minutes="30", max_attempts=1)
    lead = post(api, group="emea")
    text = summary(escalate(lead["id"]))
    assert text.startswith(f"SLA of {reps[0].name} (#{reps[0].id}) missed"), text
    assert "Sent to the fallback queue: SLA missed once; max_attempts (1) reached in 'emea'" in text, text
    assert "group from" not in text, text


def test_the_account_owner_is_named_as_chosen_not_as_passed_over(api, make_group):
    group, reps = make_group(3, slug="emea")
    Account.objects.create(domain="bigco.example", owner=reps[2])
    lead = post(api, group="emea", email="cto@bigco.example")
    (event,) = AuditEvent.objects.filter(lead_id=lead["id"], type="lead.assigned")
    text = summary(event)
    assert f"Given to {reps[2].name} (#{reps[2].id}) (owner_match)" in text, text
    assert "account owner of bigco.example" in text, text
    assert "Not chosen" not in text, text


def test_an_account_owner_passed_over_is_named_with_why(api, make_group):
    group, reps = make_group(2, slug="emea")
    outsider = Rep.objects.create(name="Olga Outside", email="olga@example.com")
    Account.objects.create(domain="bigco.example", owner=outsider)
    lead = post(api, group="emea", email="cto@bigco.example")
    (event,) = AuditEvent.objects.filter(lead_id=lead["id"], type="lead.assigned")
    text = summary(event)
    assert event.explanation["owner_match"]["owner"] == outsider.id
    assert f"account owner Olga Outside (#{outsider.id}) of bigco.example passed over: not a member of group" in text


def test_the_group_source_is_said_in_words(api, make_group):
    make_group(1, slug="emea", is_default=True)
    make_group(1, slug="smb")
    own = post(api, group="smb")
    default = post(api)
    (own_event,) = AuditEvent.objects.filter(lead_id=own["id"], type="lead.assigned")
    (default_event,) = AuditEvent.objects.filter(lead_id=default["id"], type="lead.assigned")
    assert "no rule matched, group smb (round_robin) as the group the lead asked for" in summary(own_event)
    assert "no rule matched, group emea (round_robin) as the default group" in summary(default_event)


def test_a_lead_given_from_the_queue_says_so(api, make_group, django_capture_on_commit_callbacks):
    group, reps = make_group(1, slug="emea")
    Membership.objects.filter(group=group).update(max_open=0)
    lead = post(api, group="emea")
    assert lead["status"] == "queued"
    with django_capture_on_commit_callbacks(execute=True):  # the drain runs once committed
        r = api.patch(f"/api/v1/groups/emea/members/{reps[0].id}/", {"max_open": 1}, format="json")
    assert r.status_code == 200, r.content
    (event,) = AuditEvent.objects.filter(lead_id=lead["id"], type="lead.assigned")
    assert event.explanation["trigger"] == "queue_drain"
    text = summary(event)
    assert text.startswith(f"Given to {reps[0].name} (#{reps[0].id}) (rotation) from the fallback queue")
    assert f"(queued because: {lead['queue_reason']})" in text, text
    assert f", when rep {reps[0].id}'s membership of group 'emea' changed: max_open 0 → 1 (" in text, text


def test_an_api_client_change_is_said_in_words(db):
    client, _ = api_client_create(name="forms", scopes=["intake"])
    api_client_audit_created(client=client, actor="admin:ops")
    (event,) = AuditEvent.objects.filter(type="client.changed", explanation__api_client="forms")
    text = summary(event)
    assert text == "API client “forms” created (scopes intake).", text


def test_an_account_change_names_the_account(db):
    from rotation import services

    owner = Rep.objects.create(name="Olga Owner", email="olga@example.com")
    account = services.account_save(account=Account(domain="bigco.example", name="BigCo", owner=owner), actor="t")
    account.name = "BigCo Inc"
    services.account_save(account=account, actor="t", changed=["name"])
    services.account_delete(account=account, actor="t")
    texts = [summary(e) for e in AuditEvent.objects.filter(type="account.changed").order_by("id")]
    assert texts == [
        "Created account bigco.example.",
        'Changed account bigco.example: name "BigCo" → "BigCo Inc".',
        "Deleted account bigco.example.",
    ], texts


def test_a_reroute_says_where_the_lead_was_before(api, make_group):
    emea, _ = make_group(1, slug="emea")
    make_group(1, slug="smb")
    first = Membership.objects.get(group__slug="smb").rep
    lead = post(api, group="smb", country="FR")
    RoutingRule.objects.create(
        name="France", priority=1, conditions=[{"field": "country", "op": "equals", "value": "FR"}], group=emea
    )
    assert api.post(f"/api/v1/leads/{lead['id']}/reroute/", {}, format="json").status_code == 200
    (event,) = AuditEvent.objects.filter(lead_id=lead["id"], type="lead.rerouted")
    assert event.explanation["from_group"] == "smb" and event.explanation["group"] == "emea"
    text = summary(event)
    assert text.startswith(f"Rerouted from {first.name} (#{first.id}) in group smb (was assigned). Given to "), text
    assert 'rule “France” matched (country "FR" = "FR"), group emea' in text, text


def test_a_rep_out_of_office_is_said_back_at_a_time_to_the_minute(api, make_group):
    """ "out of office until 2027-01-05T08:30:15.123456+00:00" in a sentence: said to the minute."""
    from datetime import UTC, datetime

    from rotation.models import Absence

    group, reps = make_group(2, slug="emea")
    back = datetime(timezone.now().year + 1, 1, 5, 8, 30, 15, 123456, tzinfo=UTC)
    Absence.objects.create(rep=reps[0], starts_at=timezone.now() - timedelta(hours=1), ends_at=back)
    lead = post(api, group="emea")
    text = summary(AuditEvent.objects.get(lead_id=lead["id"], type="lead.assigned"))
    assert f"{reps[0].name}: out of office until {back.year}-01-05 08:30 UTC" in text, text
    actions.lead_reassign(lead_id=lead["id"], rep_id=reps[0].id, reason="cover", actor="admin:maria")
    text = summary(AuditEvent.objects.get(lead_id=lead["id"], type="lead.reassigned"))
    assert f"(out of office until {back.year}-01-05 08:30 UTC)" in text, text
    assert back.isoformat() not in text


def test_a_rule_match_is_explained_by_its_conditions_as_they_were(api, make_group):
    """Why this group: each condition of the rule and what the lead had there, kept in the
    event, so the trail still explains the lead after the rule is edited."""
    emea, _ = make_group(1, slug="emea")
    rule = RoutingRule.objects.create(
        name="EMEA enterprise",
        priority=1,
        conditions=[
            {"field": "country", "op": "in", "value": ["FR", "BE"]},
            {"field": "score", "op": "gte", "value": 50},
            {"field": "attributes.plan", "op": "exists", "value": True},
        ],
        group=emea,
    )
    lead = post(api, country="BE", score=80, attributes={"plan": "pro"})
    event = AuditEvent.objects.get(lead_id=lead["id"], type="lead.assigned")
    assert event.explanation["matched_on"] == [
        {"field": "country", "op": "in", "value": ["FR", "BE"], "lead": "BE"},
        {"field": "score", "op": "gte", "value": 50, "lead": 80},
        {"field": "attributes.plan", "op": "exists", "value": True, "lead": "pro"},
    ]
    expected = 'rule “EMEA enterprise” matched (country "BE" in ["FR", "BE"]; score 80 ≥ 50; attributes.plan present)'
    assert expected in summary(event), summary(event)

    rule.conditions = [{"field": "country", "op": "equals", "value": "DE"}]
    rule.save()
    event.refresh_from_db()
    assert expected in summary(event)


def test_a_lead_no_rule_took_carries_no_conditions(api, make_group):
    make_group(1, slug="emea")
    lead = post(api, group="emea")
    event = AuditEvent.objects.get(lead_id=lead["id"], type="lead.assigned")
    assert "matched_on" not in event.explanation
    assert "no rule matched, group emea (round_robin) as the group the lead asked for" in summary(event)


@pytest.mark.django_db
def test_a_member_joining_reads_with_the_terms_it_joined_on(api, make_group):
    """ "Membership changed: Joined." said nothing of the weight, caps or pause a member was
    added with, which the trail's explanation holds."""
    group, _ = make_group(0, slug="emea")
    rep = Rep.objects.create(name="Ada", email="ada@sales.example")
    body = {"rep": rep.id, "weight": 3, "max_open": 5, "active": False, "paused_reason": "training"}
    assert api.post("/api/v1/groups/emea/members/", body, format="json").status_code == 201, body
    event = AuditEvent.objects.get(type="membership.changed")
    text = event_summary(type=event.type, explanation=event.explanation, rep_id=event.rep_id, names={})
    assert "Joined at position 0, weight 3, max_open 5, paused (training)." in text, text
