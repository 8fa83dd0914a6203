"""Simulate, the rotation view and replay: they agree with routing, and write nothing."""

import io
import json
from datetime import timedelta

import pytest
from django.apps import apps
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from audit.models import AuditEvent
from leads.models import ApiClient
from rotation import services
from rotation.models import Account, Membership, RotationState
from tests.conftest import lead_body

pytestmark = pytest.mark.django_db


def snapshot() -> dict:
    """Row counts of every table, and every rotation row and token's last use."""
    counts = {
        m._meta.label: m._default_manager.count()
        for m in apps.get_models()
        if m._meta.managed and not m._meta.proxy and not m._meta.abstract
    }
    rotations = list(RotationState.objects.order_by("group_id").values("group_id", "pointer", "current_weights"))
    return {"counts": counts, "rotations": rotations}


def post(api, slug=None, **fields):
    body = lead_body(**fields) if slug is None else lead_body(group=slug, **fields)
    r = api.post("/api/v1/leads/", body, format="json")
    assert r.status_code in (200, 201), r.content
    return r.json()


# --- simulate ----------------------------------------------------------------------------------


def test_simulate_returns_the_decision_and_writes_nothing(api, make_group):
    group, (a, b, c) = make_group(3, slug="pool")
    Membership.objects.filter(rep=b).update(active=False)
    post(api, "pool")  # a
    api.get("/api/v1/queue/")  # the token's last use is fresh: the simulate call below writes nothing
    before = snapshot()
    r = api.post("/api/v1/routing/simulate/", lead_body(group="pool", country="FR"), format="json")
    assert r.status_code == 200, r.content
    body = r.json()
    assert snapshot() == before
    assert body["rule"] is None and body["group"] == "pool" and body["strategy"] == "round_robin"
    assert body["rep"] == {"id": c.id, "name": c.name, "email": c.email}
    assert body["reason"] == "rotation" and body["queue_reason"] is None
    assert [(x["rep"]["id"], x["eligible"], x["reason"]) for x in body["candidates"]] == [
        (a.id, True, "not next in rotation"),
        (b.id, False, "paused in this group"),
        (c.id, True, "chosen"),
    ]
    # ... and routing then does exactly that.
    assert post(api, "pool")["owner"]["id"] == c.id


def test_simulate_rule_owner_duplicate_and_queue(api, make_group):
    group, (a, b) = make_group(2, slug="pool")
    make_group(1, slug="off", active=False)
    api.post(
        "/api/v1/rules/",
        {
            "name": "FR",
            "priority": 1,
            "conditions": [{"field": "country", "op": "equals", "value": "FR"}],
            "group": "pool",
        },
        format="json",
    )
    Account.objects.create(domain="acme.example", owner=b)
    sim = api.post("/api/v1/routing/simulate/", {"email": "x@acme.example", "country": "FR"}, format="json").json()
    assert sim["rule"] == "FR" and sim["rep"]["id"] == b.id and sim["reason"] == "owner_match"
    assert sim["account"] == "acme.example" and sim["pointer_before"] == sim["pointer_after"]
    first = post(api, "pool", email="dup@other.example")
    dup = api.post("/api/v1/routing/simulate/", {"email": "DUP@other.example ", "group": "pool"}, format="json").json()
    assert dup["duplicate_of"] == first["id"] and dup["rep"] is None
    none = api.post("/api/v1/routing/simulate/", {"email": "n@x.example"}, format="json").json()
    assert none["group"] is None and "no rule matched" in none["queue_reason"]
    off = api.post("/api/v1/routing/simulate/", {"email": "n@x.example", "group": "off"}, format="json").json()
    assert off["queue_reason"] == "group 'off' is inactive"


def test_simulate_validates_like_intake_and_needs_intake_scope(api, api_with, make_group):
    r = api.post("/api/v1/routing/simulate/", {"email": "nope", "colour": "red", "group": "missing"}, format="json")
    assert r.status_code == 400 and {"email", "colour", "group"} <= set(r.json())
    assert api_with(["read", "manage"]).post("/api/v1/routing/simulate/", lead_body(), format="json").status_code == 403


# --- rotation view -----------------------------------------------------------------------------


def test_a_weighted_rotation_view_reads_as_the_distance_to_each_members_next_turn(api, make_group):
    """`current_weight` is never the stored mark of a member away (negative): it is each
    member's distance to its next turn, and among the eligible the lowest is next."""
    group, reps = make_group(3, slug="pool", strategy="weighted")
    Membership.objects.filter(rep=reps[0]).update(weight=2)
    for i in range(7):
        if i == 3:
            Membership.objects.filter(rep=reps[2]).update(active=False)
        post(api, "pool")
        view = api.get("/api/v1/groups/pool/rotation/").json()
        members = view["members"]
        assert all(isinstance(m["current_weight"], int) and m["current_weight"] >= 0 for m in members), view
        eligible = [m for m in members if m["eligible"]]
        soonest = min(eligible, key=lambda m: (m["current_weight"], m["position"]))
        assert view["next"]["id"] == soonest["rep"]["id"], (i, view)


@pytest.mark.parametrize("strategy", ["round_robin", "weighted", "least_loaded"])
def test_rotation_view_next_is_what_routing_does(api, make_group, strategy):
    group, reps = make_group(4, slug="pool", strategy=strategy)
    Membership.objects.filter(rep=reps[0]).update(weight=3)
    Membership.objects.filter(rep=reps[1]).update(max_per_day=2)
    Membership.objects.filter(rep=reps[2]).update(max_open=1)
    for i in range(14):
        if i == 5:
            Membership.objects.filter(rep=reps[3]).update(active=False)
        if i == 9:
            Membership.objects.filter(rep=reps[3]).update(active=True)
        view = api.get("/api/v1/groups/pool/rotation/").json()
        body = post(api, "pool")
        expected = view["next"]["id"] if view["next"] else None
        assert (body["owner"] or {}).get("id") == expected, (i, view)
    view = api.get("/api/v1/groups/pool/rotation/").json()
    assert {"group", "strategy", "pointer", "next", "members"} <= set(view)
    member = view["members"][0]
    for key in (
        "rep",
        "position",
        "weight",
        "active",
        "eligible",
        "reason",
        "current_weight",
        "open",
        "assigned_today",
        "assigned_week",
        "share",
    ):
        assert key in member
    assert sum(m["assigned_today"] for m in view["members"]) == 14
    assert sum(m["assigned_week"] for m in view["members"]) == 14
    # Weight 3 of 6 is half the turns in a weighted group; elsewhere weights have no say: a quarter.
    assert member["share"] == pytest.approx(3 / 6 if strategy == "weighted" else 1 / 4)
    capped = view["members"][1]
    assert capped["eligible"] is False and capped["reason"] == "at max_per_day cap (2/2)"


@pytest.mark.parametrize("strategy", ["round_robin", "weighted", "least_loaded"])
def test_rotation_view_says_which_lead_each_member_gets_next(api, make_group, strategy):
    """`leads_ahead` is the rotation played out: with nothing changed but the leads, each
    member eligible now gets exactly that lead from now as its first, caps filling on the way;
    and after each lead every other prediction is one lead nearer."""
    group, reps = make_group(5, slug="pool", strategy=strategy)
    Membership.objects.filter(rep=reps[0]).update(weight=3)
    Membership.objects.filter(rep=reps[1]).update(weight=2, max_per_day=1)
    Membership.objects.filter(rep=reps[2]).update(max_open=2)
    Membership.objects.filter(rep=reps[4]).update(active=False)
    for _ in range(4):  # mid-rotation, with open leads on the way
        post(api, "pool")
    view = api.get("/api/v1/groups/pool/rotation/").json()
    ahead = {m["rep"]["id"]: m["leads_ahead"] for m in view["members"]}
    assert ahead[reps[4].id] is None  # paused: no turn while it is
    assert sorted(n for n in ahead.values() if n is not None)[0] == 1
    assert next(rep for rep, n in ahead.items() if n == 1) == view["next"]["id"]
    firsts: dict[int, int] = {}
    for lead in range(1, 11):
        owner = post(api, "pool")["owner"]["id"]
        firsts.setdefault(owner, lead)
        now = {m["rep"]["id"]: m["leads_ahead"] for m in api.get("/api/v1/groups/pool/rotation/").json()["members"]}
        for rep_id, n in ahead.items():
            if n is not None and n > lead:
                assert now[rep_id] == n - lead, (strategy, lead, rep_id, ahead, now)
    predicted = {rep: n for rep, n in ahead.items() if n is not None and n <= 10}
    assert {rep: firsts[rep] for rep in predicted} == predicted, (strategy, ahead, firsts)
    assert reps[4].id not in firsts


def test_group_admin_page_shows_the_rotation(client, django_user_model, make_group, api):
    group, reps = make_group(2, slug="pool", strategy="weighted")
    post(api, "pool")
    client.force_login(django_user_model.objects.create_superuser("ops", "ops@example.com", "pw"))
    page = client.get(f"/admin/rotation/group/{group.pk}/change/").content.decode()
    assert "rotation-view" in page and reps[1].name in page and "Next:" in page


# --- replay ------------------------------------------------------------------------------------


def replay(api, **body):
    now = timezone.now()
    payload = {"since": (now - timedelta(hours=1)).isoformat(), "until": (now + timedelta(minutes=1)).isoformat()}
    payload.update(body)
    r = api.post("/api/v1/routing/replay/", payload, format="json")
    assert r.status_code == 200, r.content
    return r.json()


def test_replay_gives_its_window_in_utc_with_a_z_as_every_time_the_api_writes(api, make_group):
    make_group(1, slug="pool")
    result = replay(api, since="2026-01-05T09:00:00+01:00", until="2026-01-05T10:00:00+01:00")
    assert (result["since"], result["until"]) == ("2026-01-05T08:00:00Z", "2026-01-05T09:00:00Z")


def counts(result, slug):
    (g,) = [g for g in result["groups"] if g["group"] == slug]
    return {r["rep"]["id"]: (r["actual"], r["proposed"]) for r in g["reps"]}, g


@pytest.mark.parametrize("strategy", ["round_robin", "weighted", "least_loaded"])
def test_replay_of_the_live_configuration_reproduces_routing(api, make_group, strategy):
    group, reps = make_group(4, slug="pool", strategy=strategy)
    Membership.objects.filter(rep=reps[0]).update(weight=3)
    Membership.objects.filter(rep=reps[1]).update(weight=2, max_per_day=4)
    Membership.objects.filter(rep=reps[2]).update(max_open=3)
    Account.objects.create(domain="acme.example", owner=reps[3])
    owners = []
    for i in range(30):
        if i == 6:
            api.patch(f"/api/v1/groups/pool/members/{reps[3].id}/", {"active": False}, format="json")
        if i == 12:
            now = timezone.now()
            api.post(
                f"/api/v1/reps/{reps[0].id}/absences/",
                {
                    "starts_at": (now - timedelta(minutes=1)).isoformat(),
                    "ends_at": (now + timedelta(hours=1)).isoformat(),
                },
                format="json",
            )
        if i == 18:
            absence = api.get(f"/api/v1/reps/{reps[0].id}/absences/").json()[0]
            api.delete(f"/api/v1/reps/{reps[0].id}/absences/{absence['id']}/")
            api.patch(f"/api/v1/groups/pool/members/{reps[3].id}/", {"active": True}, format="json")
        email = f"buyer{i}@acme.example" if i % 7 == 3 else None
        body = post(api, "pool", **({"email": email} if email else {}))
        owners.append((body["owner"] or {}).get("id"))
        if i == 20:  # a closed lead frees capacity
            from leads.models import Lead

            first = Lead.objects.filter(owner=reps[2]).order_by("id").first()
            Lead.objects.filter(pk=first.pk).update(status="closed", owner=None, outcome="won")
    before = snapshot()
    result = replay(api, group="pool")
    assert snapshot() == before
    per_rep, g = counts(result, "pool")
    assert result["turns"] == 30 and result["changed"] == 0, result
    assert all(actual == proposed for actual, proposed in per_rep.values()), per_rep
    assert sum(a for a, _ in per_rep.values()) + g["queued"]["actual"] == 30
    assert len(set(owners)) >= 3


def test_replay_of_a_reroute_to_the_account_owner_keeps_the_rotation_where_it_was(api, make_group):
    """A reroute that gives the lead to its account's owner skips the rotation, and its audit
    event says so: a replay of the live configuration then reproduces every turn."""
    group, (a, b, c) = make_group(3, slug="pool")
    lead = post(api, "pool", email="buyer@acme.example")  # a: no account yet
    Account.objects.create(domain="acme.example", owner=c)
    assert api.post(f"/api/v1/leads/{lead['id']}/reroute/", {}, format="json").json()["owner"]["id"] == c.id
    (event,) = [e for e in api.get(f"/api/v1/leads/{lead['id']}/events/").json() if e["type"] == "lead.rerouted"]
    assert event["explanation"]["reason"] == "owner_match"
    assert event["explanation"]["pointer_before"] == event["explanation"]["pointer_after"]
    assert [post(api, "pool")["owner"]["id"] for _ in range(3)] == [b.id, c.id, a.id]
    result = replay(api, group="pool")
    per_rep, _ = counts(result, "pool")
    assert result["turns"] == 5 and result["changed"] == 0, result
    assert per_rep == {a.id: (2, 2), b.id: (1, 1), c.id: (2, 2)}


def test_replay_of_a_reroute_that_leaves_the_lead_with_its_rep_keeps_the_rotation_where_it_was(api, make_group):
    """A reroute whose pick is the rep who holds the lead gives nothing out and leaves the
    pointer: a replay of the live configuration must not take a turn for it either."""
    group, (a, b, c) = make_group(3, slug="pool")
    first = post(api, "pool")
    after_first = timezone.now()
    assert [post(api, "pool")["owner"]["id"] for _ in range(2)] == [b.id, c.id]
    assert api.post(f"/api/v1/leads/{first['id']}/reroute/", {}, format="json").json()["owner"]["id"] == a.id
    (event,) = [e for e in api.get(f"/api/v1/leads/{first['id']}/events/").json() if e["type"] == "lead.rerouted"]
    assert event["explanation"]["unchanged"] is True
    assert [post(api, "pool")["owner"]["id"] for _ in range(3)] == [a.id, b.id, c.id]
    result = replay(api, group="pool")
    per_rep, _ = counts(result, "pool")
    assert result["changed"] == 0, result
    assert all(actual == proposed for actual, proposed in per_rep.values()), per_rep
    # A window that opens after the lead was first routed: its holder is the one the reroute recorded.
    result = replay(api, group="pool", since=after_first.isoformat())
    assert (result["turns"], result["changed"]) == (6, 0), result


def test_replay_of_a_reroute_after_a_manual_reassign_knows_who_holds_the_lead(api, make_group):
    """The rep a manager gave the lead to holds it: a reroute that picks that rep leaves the
    rotation where it was, in the replay as in routing."""
    group, (a, b, c) = make_group(3, slug="pool")
    first = post(api, "pool")
    reassign = {"rep": b.id, "reason": "speaks the customer's language"}
    assert api.post(f"/api/v1/leads/{first['id']}/reassign/", reassign, format="json").status_code == 200
    assert [post(api, "pool")["owner"]["id"] for _ in range(3)] == [b.id, c.id, a.id]
    assert api.post(f"/api/v1/leads/{first['id']}/reroute/", {}, format="json").json()["owner"]["id"] == b.id
    assert [post(api, "pool")["owner"]["id"] for _ in range(3)] == [b.id, c.id, a.id]
    result = replay(api, group="pool")
    per_rep, _ = counts(result, "pool")
    assert result["changed"] == 0, result
    assert all(actual == proposed for actual, proposed in per_rep.values()), per_rep


def test_replay_routes_each_decision_on_the_facts_the_lead_had_then(api, make_group):
    """A lead's country edited after it was routed (PATCH never moves it) is no change of the
    configuration: a replay of the live configuration still sends it where its facts sent it
    then, and a reroute after the edit where the new facts send it."""
    emea, (e1, e2) = make_group(2, slug="emea", is_default=True)
    fr, (f1, f2) = make_group(2, slug="france")
    rule = {"name": "FR", "priority": 1, "conditions": [{"field": "country", "op": "in", "value": ["FR"]}]}
    assert api.post("/api/v1/rules/", {**rule, "group": "france"}, format="json").status_code == 201
    moved = post(api, country="FR")
    stays = post(api, country="FR")
    assert moved["group"] == stays["group"] == "france"
    for lead in (moved, stays):
        assert api.patch(f"/api/v1/leads/{lead['id']}/", {"country": "DE"}, format="json").status_code == 200
    assert api.post(f"/api/v1/leads/{moved['id']}/reroute/", {}, format="json").json()["group"] == "emea"
    assert api.patch(f"/api/v1/leads/{moved['id']}/", {"country": "BE"}, format="json").status_code == 200
    for country in ("FR", "DE", "FR"):
        post(api, country=country)
    result = replay(api)
    assert result["changed"] == 0, result
    assert counts(result, "france")[0] == {f1.id: (2, 2), f2.id: (2, 2)}
    assert counts(result, "emea")[0] == {e1.id: (1, 1), e2.id: (1, 1)}


def test_replay_with_a_changed_weight(api, make_group):
    group, (a, b) = make_group(2, slug="pool", strategy="weighted")
    for _ in range(20):
        post(api, "pool")
    result = replay(api, group="pool", config={"members": {str(b.id): {"weight": 3}}})
    per_rep, g = counts(result, "pool")
    assert per_rep == {a.id: (10, 5), b.id: (10, 15)}
    assert g["strategy"] == g["proposed_strategy"] == "weighted"
    assert [r["proposed_weight"] for r in g["reps"]] == [1, 3]
    assert result["changed"] >= 5  # turns given to another rep than routing did
    # Other proposals: a strategy, a pause, a cap.
    per_rep, _ = counts(replay(api, group="pool", config={"members": {str(a.id): {"active": False}}}), "pool")
    assert per_rep == {a.id: (10, 0), b.id: (10, 20)}
    per_rep, g = counts(replay(api, group="pool", config={"members": {str(a.id): {"max_per_day": 3}}}), "pool")
    assert per_rep == {a.id: (10, 3), b.id: (10, 17)}


def test_the_schema_describes_the_per_rep_counts_of_a_replay(api, make_group):
    """A client reads the counts from `groups[].reps[]`: /api/schema/ describes each group's
    and each rep's entry key by key, as a real answer has them."""
    _group, (_a, b) = make_group(2, slug="pool", strategy="weighted")
    post(api, "pool")
    result = replay(api, group="pool", config={"members": {str(b.id): {"weight": 3}}})
    schemas = Client().get("/api/schema/?format=json").json()["components"]["schemas"]

    def resolve(node: dict) -> dict:
        ref = node.get("$ref") or (node.get("allOf") or [{}])[0].get("$ref")
        return schemas[ref.rsplit("/", 1)[1]] if ref else node

    group_schema = resolve(schemas["Replay"]["properties"]["groups"]["items"])
    (g,) = result["groups"]
    assert set(group_schema["properties"]) == set(group_schema["required"]) == set(g)
    rep_schema = resolve(group_schema["properties"]["reps"]["items"])
    assert set(rep_schema["properties"]) == set(rep_schema["required"]) == set(g["reps"][0])
    queued_schema = resolve(group_schema["properties"]["queued"])
    assert set(queued_schema["properties"]) == set(g["queued"]) == {"actual", "proposed"}


def test_replay_gives_an_account_lead_to_its_owner_only_where_the_proposal_lets_it_take_it(api, make_group):
    """The account's owner takes its leads (no rotation turn) while it may: a proposal that
    pauses or caps it sends them through the rotation, as routing would; a proposed rule that
    moves them to another group where the owner is a member gives them to the owner there."""
    group, (a, b, c) = make_group(3, slug="pool")
    other, (d,) = make_group(1, slug="other")
    services.membership_add(group=other, rep=c, actor="test")
    Account.objects.create(domain="acme.example", owner=c)
    emails = [{"email": f"buyer{i}@acme.example"} if i % 2 else {} for i in range(6)]
    owners = [post(api, "pool", **email)["owner"]["id"] for email in emails]
    assert owners == [a.id, c.id, b.id, c.id, c.id, c.id]  # the rotation's turns: a, b, c
    per_rep, _ = counts(replay(api, group="pool"), "pool")
    assert per_rep == {a.id: (1, 1), b.id: (1, 1), c.id: (4, 4)}
    for proposal in ({"active": False}, {"max_open": 0}):
        result = replay(api, group="pool", config={"members": {str(c.id): proposal}})
        per_rep, _ = counts(result, "pool")
        assert per_rep == {a.id: (1, 3), b.id: (1, 3), c.id: (4, 0)}, (proposal, per_rep)
    rules = [
        {
            "name": "acme",
            "priority": 1,
            "conditions": [{"field": "email_domain", "op": "equals", "value": "acme.example"}],
            "group": "other",
        }
    ]
    other_counts, _ = counts(replay(api, config={"rules": rules}), "other")
    assert other_counts == {d.id: (0, 0), c.id: (0, 3)}


def test_replay_reads_the_open_leads_of_an_owner_its_group_kept_a_lead_for(api, make_group):
    """A group that keeps account leads for their owner queued one because the owner was at its
    cap: replay judges that cap from the count routing read then, not from leads still open now."""
    group, (a, b) = make_group(2, slug="pool", owner_match_fallback_to_rotation=False)
    Membership.objects.filter(rep=b).update(max_open=1)
    Account.objects.create(domain="acme.example", owner=b)
    before_window = post(api, "pool", email="one@acme.example")
    assert before_window["owner"]["id"] == b.id
    since = timezone.now()
    kept = post(api, "pool", email="two@acme.example")
    assert kept["status"] == "queued"
    # The lead that kept the owner at its cap is closed inside the window.
    assert api.post(f"/api/v1/leads/{before_window['id']}/close/", {"outcome": "won"}, format="json").status_code == 200
    result = replay(api, since=since.isoformat(), group="pool")
    per_rep, g = counts(result, "pool")
    assert result["changed"] == 0 and g["queued"] == {"actual": 1, "proposed": 1}, result


@pytest.mark.parametrize("fallback", [True, False])
def test_a_weighted_window_opening_on_an_account_lead_starts_from_the_weights_then(api, make_group, fallback):
    """An account lead leaves the weighted rotation where it was, and its audit event says
    where that was: a replay whose window opens on it starts from those weights."""
    group, (a, b, c) = make_group(3, slug="pool", strategy="weighted", owner_match_fallback_to_rotation=fallback)
    Membership.objects.filter(rep=a).update(weight=3)
    Membership.objects.filter(rep=b).update(weight=2)
    Account.objects.create(domain="acme.example", owner=c)
    for _ in range(4):
        post(api, "pool")
    weights = RotationState.objects.get(group=group).current_weights
    since = timezone.now()
    if not fallback:  # the owner cannot take it: the group keeps it for the owner
        Membership.objects.filter(rep=c).update(max_open=0)
    lead = post(api, "pool", email="buyer@acme.example")
    assert (lead["owner"] or {}).get("id") == (c.id if fallback else None)
    (event,) = [e for e in api.get(f"/api/v1/leads/{lead['id']}/events/").json() if e["type"] != "lead.received"]
    assert event["explanation"]["current_weights_before"] == event["explanation"]["current_weights_after"] == weights
    for _ in range(6):
        post(api, "pool")
    result = replay(api, since=since.isoformat(), group="pool")
    assert result["turns"] == 7 and result["changed"] == 0, result


def test_replay_reads_the_open_leads_the_account_owner_had_when_it_took_one(api, make_group):
    """Under a cap, whether the owner could take a lead is judged from the count routing read
    then (a lead closed inside the window freed the capacity it used)."""
    group, (a, b) = make_group(2, slug="pool")
    Membership.objects.filter(rep=b).update(max_open=2)
    Account.objects.create(domain="acme.example", owner=b)
    first = post(api, "pool", email="one@acme.example")
    assert api.post(f"/api/v1/leads/{first['id']}/close/", {"outcome": "won"}, format="json").status_code == 200
    assert [post(api, "pool", email=f"buyer{i}@acme.example")["owner"]["id"] for i in range(2)] == [b.id, b.id]
    result = replay(api, group="pool")
    per_rep, _ = counts(result, "pool")
    assert result["changed"] == 0 and per_rep == {a.id: (0, 0), b.id: (3, 3)}, result


def test_a_lead_the_proposal_assigns_at_intake_is_not_drained_from_the_queue_again(api, make_group):
    """Leads queued while the group was paused and drained afterwards: under a proposal that
    keeps a member in, they are assigned on arrival, never queued, so the drain's turns do not
    give them a second rep."""
    from leads import actions

    group, (a, b) = make_group(2, slug="pool")
    Membership.objects.filter(group=group).update(active=False)
    post(api, "pool")
    post(api, "pool")
    Membership.objects.filter(group=group).update(active=True)
    assert actions.queue_drain(group_id=group.id) == 2
    per_rep, g = counts(replay(api, group="pool"), "pool")
    assert per_rep == {a.id: (1, 1), b.id: (1, 1)} and g["queued"] == {"actual": 2, "proposed": 2}
    result = replay(api, group="pool", config={"members": {str(a.id): {"active": True}}})
    per_rep, g = counts(result, "pool")
    assert per_rep == {a.id: (1, 2), b.id: (1, 0)}, per_rep
    assert g["queued"] == {"actual": 2, "proposed": 0} and g["proposed_total"] == 2


def test_replay_with_proposed_rules_moves_leads_between_groups(api, make_group):
    emea, (e1,) = make_group(1, slug="emea", is_default=True)
    fr, (f1, f2) = make_group(2, slug="france")
    for i in range(6):
        post(api, country="FR" if i % 2 else "DE")
    rules = [
        {
            "name": "FR",
            "priority": 1,
            "conditions": [{"field": "country", "op": "in", "value": ["FR"]}],
            "group": "france",
        }
    ]
    before = snapshot()
    result = replay(api, config={"rules": rules})
    assert snapshot() == before
    emea_counts, _ = counts(result, "emea")
    fr_counts, _ = counts(result, "france")
    assert emea_counts[e1.id] == (6, 3)
    assert fr_counts == {f1.id: (0, 2), f2.id: (0, 1)}


def test_the_rules_as_listed_can_be_proposed_back_and_an_inactive_one_routes_nothing(api, make_group):
    """What if this rule were switched off? The list GET /api/v1/rules/ gives, with `active`
    unticked on one, is a proposal: that rule is left out, as routing would leave it out."""
    emea, (e1,) = make_group(1, slug="emea", is_default=True)
    fr, (f1, f2) = make_group(2, slug="france")
    rule = {
        "name": "FR",
        "priority": 1,
        "conditions": [{"field": "country", "op": "in", "value": ["FR"]}],
        "group": "france",
    }
    assert api.post("/api/v1/rules/", rule, format="json").status_code == 201
    for i in range(4):
        post(api, country="FR" if i % 2 else "DE")
    listed = api.get("/api/v1/rules/").json()["results"]
    assert [r["active"] for r in listed] == [True]
    result = replay(api, config={"rules": listed})
    assert counts(result, "france")[0] == {f1.id: (1, 1), f2.id: (1, 1)} and result["changed"] == 0
    result = replay(api, config={"rules": [{**listed[0], "active": False}]})
    assert counts(result, "emea")[0] == {e1.id: (2, 4)}
    assert counts(result, "france")[0] == {f1.id: (1, 0), f2.id: (1, 0)}
    assert result["changed"] == 2


def test_proposed_rules_of_one_priority_are_tried_in_the_order_listed(api, make_group):
    """Routing breaks a priority tie by the rule saved first, the order GET /api/v1/rules/
    lists them in: the list proposed back ties the same way, so the replay changes nothing."""
    make_group(1, slug="emea", is_default=True)
    fr, (f1,) = make_group(1, slug="france")
    be, (b1,) = make_group(1, slug="benelux")
    for name, group in (("France", "france"), ("Francophone", "benelux")):
        rule = {"name": name, "priority": 5, "conditions": [{"field": "country", "op": "in", "value": ["FR"]}]}
        assert api.post("/api/v1/rules/", {**rule, "group": group}, format="json").status_code == 201
    assert post(api, country="FR")["group"] == "france"
    listed = api.get("/api/v1/rules/").json()["results"]
    assert [r["name"] for r in listed] == ["France", "Francophone"]
    result = replay(api, config={"rules": listed})
    assert result["changed"] == 0, result
    assert counts(result, "france")[0] == {f1.id: (1, 1)}


def test_replay_of_the_current_configuration_runs_the_current_rules(api, make_group):
    """A rule added after the window is part of the current configuration: a replay without a
    proposal sends the window's leads where that rule sends them, also when it names a group."""
    emea, (e1,) = make_group(1, slug="emea", is_default=True)
    fr, (f1, f2) = make_group(2, slug="france")
    for i in range(4):
        post(api, country="FR" if i % 2 else "DE")  # no rule yet: all to emea
    rule = {
        "name": "FR",
        "priority": 1,
        "conditions": [{"field": "country", "op": "in", "value": ["FR"]}],
        "group": "france",
    }
    assert api.post("/api/v1/rules/", rule, format="json").status_code == 201
    before = snapshot()
    result = replay(api)
    assert snapshot() == before
    assert counts(result, "emea")[0] == {e1.id: (4, 2)}
    assert counts(result, "france")[0] == {f1.id: (0, 1), f2.id: (0, 1)}
    assert result["changed"] == 2
    # One group's replay counts the decisions taken there, or that the rules now take there.
    result = replay(api, group="france")
    assert counts(result, "france")[0] == {f1.id: (0, 1), f2.id: (0, 1)}
    assert (result["turns"], result["changed"]) == (2, 2)
    result = replay(api, group="emea")
    assert (result["turns"], result["changed"]) == (4, 2)
    post(api, "france")
    assert replay(api, group="emea")["turns"] == 4


def test_a_proposed_rule_into_a_group_idle_in_the_window_starts_from_its_rotation_now(api, make_group):
    """France routed a lead before the window (its next turn is its second rep's) and none in
    it; a proposed rule sending the window's French lead there continues France's rotation from
    the row as it is now, not from the start."""
    make_group(1, slug="emea", is_default=True)
    fr, (f1, f2) = make_group(2, slug="france")
    post(api, "france")  # before the window: f1's turn, so the next one is f2's
    since = timezone.now()
    post(api, country="FR")  # no rule yet: to emea
    rules = [
        {
            "name": "FR",
            "priority": 1,
            "conditions": [{"field": "country", "op": "in", "value": ["FR"]}],
            "group": "france",
        }
    ]
    before = snapshot()
    result = replay(api, since=since.isoformat(), config={"rules": rules})
    assert snapshot() == before
    fr_counts, _ = counts(result, "france")
    assert fr_counts.get(f2.id) == (0, 1)
    assert fr_counts.get(f1.id, (0, 0)) == (0, 0)
    assert RotationState.objects.get(group=fr).pointer == Membership.objects.get(group=fr, rep=f2).position


def test_a_replay_says_why_it_queues_and_where_the_rules_now_send_each_groups_decisions(api, make_group):
    """Proposed rules sending a window's leads to a team made after it: every lead came back
    queued with no reason (its members were not members then), and a group's totals did not
    reconcile with the leads moved to another group."""
    make_group(2, slug="emea", is_default=True)
    since = timezone.now()
    for _ in range(3):
        post(api, country="FR")
    post(api, country="DE")
    make_group(2, slug="france")  # made after the window's decisions
    rules = [
        {
            "name": "FR",
            "priority": 1,
            "conditions": [{"field": "country", "op": "in", "value": ["FR"]}],
            "group": "france",
        }
    ]
    result = replay(api, since=since.isoformat(), config={"rules": rules})
    groups = {g["group"]: g for g in result["groups"]}
    emea, france = groups["emea"], groups["france"]
    assert (emea["actual_total"], emea["proposed_total"], emea["moved_to"]) == (4, 1, {"france": 3})
    assert (france["actual_total"], france["proposed_total"], france["moved_from"]) == (0, 3, {"emea": 3})
    assert france["queued"] == {"actual": 0, "proposed": 3}
    assert france["proposed_queued_because"] == {"no member then (its members joined after the decision)": 3}
    assert emea["proposed_queued_because"] == {} and emea["moved_from"] == {} and france["moved_to"] == {}
    out = io.StringIO()  # the command says the same
    call_command("replay_routing", "--since", since.isoformat(), "--config", json.dumps({"rules": rules}), stdout=out)
    assert "3 sent to france by the proposal" in out.getvalue() and "3 brought from emea" in out.getvalue()
    assert "queued in the replay: 3 (no member then (its members joined after the decision))" in out.getvalue()


def test_a_group_busy_in_the_window_starts_from_its_rotation_before_the_window(api, make_group):
    """A lead a proposed rule moves into a group that routed leads of its own later in the
    window takes that group's rotation from where it stood when the window began, not from
    where it stands now."""
    make_group(1, slug="emea", is_default=True)
    fr, (f1, f2, f3) = make_group(3, slug="france")
    since = timezone.now()
    post(api, country="FR")  # no rule yet: to emea
    assert post(api, "france")["owner"]["id"] == f1.id  # france's first turn in the window
    rules = [
        {
            "name": "FR",
            "priority": 1,
            "conditions": [{"field": "country", "op": "in", "value": ["FR"]}],
            "group": "france",
        }
    ]
    result = replay(api, since=since.isoformat(), config={"rules": rules})
    fr_counts, _ = counts(result, "france")
    # Under the rule: the French lead is france's first turn (f1), the next one f2's.
    assert fr_counts == {f1.id: (1, 1), f2.id: (0, 1), f3.id: (0, 0)}


def test_replay_keeps_out_a_rep_whose_working_hours_cannot_be_read(api, make_group):
    """Hours written around validation keep the rep out of routing with a reason; replay keeps
    it out too, where routing recorded it and where it did not (a lead a rule now sends in)."""
    from rotation.eligibility import DAYS
    from rotation.models import Rep

    make_group(1, slug="emea", is_default=True)
    group, (broken, fine) = make_group(2, slug="pool")
    hours = {day: [["xx", "yy"]] if i % 2 else "all day" for i, day in enumerate(DAYS)}
    Rep.objects.filter(pk=broken.pk).update(working_hours=hours)
    assert [post(api, "pool")["owner"]["id"] for _ in range(2)] == [fine.id, fine.id]
    post(api, country="FR")  # to emea
    per_rep, _ = counts(replay(api, group="pool"), "pool")
    assert per_rep == {broken.id: (0, 0), fine.id: (2, 2)}
    rules = [
        {
            "name": "FR",
            "priority": 1,
            "conditions": [{"field": "country", "op": "equals", "value": "FR"}],
            "group": "pool",
        }
    ]
    per_rep, _ = counts(replay(api, config={"rules": rules}), "pool")
    assert per_rep == {broken.id: (0, 0), fine.id: (2, 3)}


RULE_IN_POOL = {"name": "x", "conditions": [{"field": "country", "op": "equals", "value": "FR"}], "group": "pool"}


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"config": {"colour": 1}}, "config", "unknown key 'colour'"),
        ({"config": {"members": {"1": {"weight": 2}}}}, "config", "name it in 'group'"),
        ({"group": "pool", "config": {"strategy": "random"}}, "config", "strategy: one of"),
        ({"group": "pool", "config": {"members": {"999999": {"weight": 2}}}}, "config", "not a member"),
        ({"group": "pool", "config": {"members": {" {a}": {"weight": 2}}}}, "config", "is not a rep id"),
        ({"group": "pool", "config": {"members": {"\u0661": {"weight": 2}}}}, "config", "is not a rep id"),
        ({"group": "pool", "config": {"members": {"{a}": {"weight": 0}}}}, "config", "weight must be"),
        ({"group": "pool", "config": {"members": {"{a}": {"speed": 1}}}}, "config", "unknown key 'speed'"),
        (
            {"config": {"rules": [{"name": "x", "conditions": [{"field": "colour"}], "group": "pool"}]}},
            "config",
            "field",
        ),
        ({"config": {"rules": [{"name": "x", "conditions": [], "group": "nope"}]}}, "config", "no group"),
        # A proposed rule is one that could be saved: the API refuses these.
        ({"config": {"rules": [{"name": "x", "conditions": [], "group": "pool"}]}}, "config", "at least one"),
        ({"config": {"rules": [{**RULE_IN_POOL, "priority": -1}]}}, "config", "from 0 to 1000000"),
        ({"config": {"rules": [{**RULE_IN_POOL, "active": "no"}]}}, "config", "active must be"),
        ({"config": {"rules": [{**RULE_IN_POOL, "enabled": False}]}}, "config", "unknown key 'enabled'"),
        ({"group": "nope"}, "group", "No group"),
        ({"config": [1]}, "config", "Must be an object"),
        ({"until": "2020-01-01T00:00:00Z"}, "until", "after since"),
        ({"since": "yesterday"}, "since", ""),
    ],
)
def test_bad_replay_is_400_naming_the_problem(api, make_group, body, field, message):
    group, (a,) = make_group(1, slug="pool")
    text = json.dumps(body).replace("{a}", str(a.id))
    now = timezone.now()
    payload = {"since": (now - timedelta(hours=1)).isoformat(), "until": now.isoformat(), **json.loads(text)}
    r = api.post("/api/v1/routing/replay/", payload, format="json")
    assert r.status_code == 400, r.content
    assert message in json.dumps(r.json()[field])


def test_a_bad_replay_names_every_bad_field_at_once(api, make_group):
    """The group and the configuration were checked only once the window was valid, and the
    configuration only once the group was: each 400 named the first problem found."""
    make_group(1, slug="pool")
    window = {"since": "2020-01-01T00:00:00Z", "until": "2100-01-01T00:00:00Z"}
    both = api.post(
        "/api/v1/routing/replay/", {**window, "group": "nope", "config": {"colour": 1}}, format="json"
    ).json()
    assert set(both) == {"group", "config"} and "unknown key 'colour'" in both["config"][0]
    bad_window = {"since": "yesterday", "until": window["until"]}
    r = api.post("/api/v1/routing/replay/", {**bad_window, "group": "nope", "config": [1]}, format="json")
    assert r.status_code == 400 and set(r.json()) == {"since", "group", "config"}, r.content
    r = api.post("/api/v1/routing/replay/", {**bad_window, "group": "pool", "config": {}}, format="json")
    assert r.status_code == 400 and set(r.json()) == {"since"}


def test_a_bad_proposed_member_or_rule_is_named_with_each_of_its_problems(api, make_group):
    """Each member's and each rule's first problem was named alone: a weight and an `active`
    both wrong took two tries to learn."""
    _, (a,) = make_group(1, slug="pool")
    window = {"since": "2020-01-01T00:00:00Z", "until": "2100-01-01T00:00:00Z"}
    member = {"weight": 0, "max_open": -1, "active": "yes", "speed": 1}
    r = api.post(
        "/api/v1/routing/replay/",
        {**window, "group": "pool", "config": {"members": {str(a.id): member}}},
        format="json",
    )
    assert r.status_code == 400
    problems = " ".join(r.json()["config"])
    for said in ("unknown key 'speed'", "weight must be", "max_open must be", "active must be"):
        assert said in problems, (said, problems)
    rule = {"name": ["x"], "priority": -1, "active": "no", "conditions": [], "group": "nope", "enabled": True}
    r = api.post("/api/v1/routing/replay/", {**window, "config": {"rules": [rule]}}, format="json")
    assert r.status_code == 400
    problems = " ".join(r.json()["config"])
    for said in ("unknown key 'enabled'", "name must be", "no group", "priority must be", "active must be", "at least"):
        assert said in problems, (said, problems)


def test_a_proposed_weight_is_one_a_member_could_be_saved_with(api, make_group):
    """A member's weight is at most 1000 (the model, the API): a proposal of 5000 was replayed
    as if the group could be configured so."""
    _, (a,) = make_group(1, slug="pool")
    window = {"since": "2020-01-01T00:00:00Z", "until": "2100-01-01T00:00:00Z"}
    body = {**window, "group": "pool", "config": {"members": {str(a.id): {"weight": 5000}}}}
    r = api.post("/api/v1/routing/replay/", body, format="json")
    assert r.status_code == 400 and "weight must be an integer from 1 to 1000" in r.json()["config"][0]
    assert api.patch(f"/api/v1/groups/pool/members/{a.id}/", {"weight": 5000}, format="json").status_code == 400
    body["config"]["members"][str(a.id)]["weight"] = 1000
    assert api.post("/api/v1/routing/replay/", body, format="json").status_code == 200


def test_replay_needs_manage_scope(api_with):
    r = api_with(["intake", "read"]).post("/api/v1/routing/replay/", {}, format="json")
    assert r.status_code == 403


def test_replay_command_prints_counts_and_writes_nothing(api, make_group):
    group, (a, b) = make_group(2, slug="pool", strategy="weighted")
    for _ in range(8):
        post(api, "pool")
    before = snapshot()
    out = io.StringIO()
    since = (timezone.now() - timedelta(hours=1)).isoformat()
    call_command(
        "replay_routing",
        "--since",
        since,
        "--group",
        "pool",
        "--config",
        json.dumps({"members": {str(a.id): {"weight": 3}}}),
        stdout=out,
    )
    assert snapshot() == before
    text = out.getvalue()
    assert "8 routing decisions" in text and a.name in text and "1->3" in text
    out = io.StringIO()
    call_command("replay_routing", "--since", since, "--json", stdout=out)
    assert json.loads(out.getvalue())["changed"] == 0
    assert AuditEvent.objects.filter(type="lead.assigned").count() == 8
    assert ApiClient.objects.count() >= 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--since", "2026-02-30T00:00:00Z"], "not an ISO 8601"),
        (["--since", "2026-13-01T00:00:00Z"], "not an ISO 8601"),
        (["--since", "yesterday"], "not an ISO 8601"),
        (["--since", "2026-01-01T00:00:00Z", "--config", "@/nonexistent/proposal.json"], "cannot read it"),
        (["--since", "2026-01-01T00:00:00Z", "--config", "{"], "not JSON"),
    ],
)
def test_replay_command_names_a_bad_argument(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("replay_routing", *args)


def test_replay_over_too_many_decisions_is_refused_by_the_api(api, make_group, monkeypatch):
    from leads.api import routing_views

    make_group(1, slug="pool")
    for _ in range(3):
        post(api, "pool")
    monkeypatch.setattr(routing_views, "MAX_REPLAY_TURNS", 2)
    now = timezone.now()
    r = api.post(
        "/api/v1/routing/replay/",
        {"since": (now - timedelta(hours=1)).isoformat(), "until": (now + timedelta(minutes=1)).isoformat()},
        format="json",
    )
    assert r.status_code == 400 and "more than 2 routing decisions" in r.json()["since"][0]


def test_a_replay_of_one_group_refuses_a_proposal_for_another(api, make_group):
    """Its figures are not in the answer: taken without a word, the proposal read as "no
    change" though it was never looked at."""
    make_group(1, slug="pool")
    make_group(1, slug="other")
    now = timezone.now()
    payload = {"since": (now - timedelta(hours=1)).isoformat(), "until": now.isoformat(), "group": "pool"}
    proposal = {"groups": {"other": {"strategy": "weighted"}}}
    r = api.post("/api/v1/routing/replay/", {**payload, "config": proposal}, format="json")
    assert r.status_code == 400 and "groups.other: the replay covers group 'pool' only" in r.json()["config"][0]
    # For the replayed group itself, or with no group named, it is taken.
    own = {**payload, "config": {"groups": {"pool": {"strategy": "weighted"}}}}
    every = {"since": payload["since"], "until": payload["until"], "config": proposal}
    for body in [own, every]:
        assert api.post("/api/v1/routing/replay/", body, format="json").status_code == 200


@pytest.mark.postgres
def test_one_replay_runs_at_a_time_another_is_a_429_to_retry(api, make_group):
    """A replay holds a web process for seconds; eight at once held intake's answers at up to
    two seconds. The one running holds the lock (here: another session, as another process)."""
    import threading

    from django.db import connections

    make_group(1, slug="pool")
    now = timezone.now()
    body = {"since": (now - timedelta(hours=1)).isoformat(), "until": now.isoformat(), "group": "pool"}
    taken, release, done = threading.Event(), threading.Event(), threading.Event()

    def running_replay() -> None:
        try:
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT pg_advisory_lock(hashtextextended('leads.replay', 0))")
                taken.set()
                release.wait(30)
                cursor.execute("SELECT pg_advisory_unlock(hashtextextended('leads.replay', 0))")
        finally:
            connections["default"].close()
            done.set()

    threading.Thread(target=running_replay).start()
    assert taken.wait(10)
    try:
        r = api.post("/api/v1/routing/replay/", body, format="json")
        assert r.status_code == 429 and r["Retry-After"] == "5", r.content
        assert "Another replay is running" in r.json()["detail"]
    finally:
        release.set()
        assert done.wait(10)
    assert api.post("/api/v1/routing/replay/", body, format="json").status_code == 200
    # And it let go of the lock (a session's lock is its own again: asked from another one).
    free: list[bool] = []

    def another_process() -> None:
        try:
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT pg_try_advisory_lock(hashtextextended('leads.replay', 0))")
                free.append(cursor.fetchone()[0])
        finally:
            connections["default"].close()

    checker = threading.Thread(target=another_process)
    checker.start()
    checker.join(10)
    assert free == [True]
