"""Groups, reps and memberships over the API (manage scope), each change audited."""

import pytest
from django.db import transaction

from audit.models import AuditEvent
from notifications.models import WebhookEndpoint
from rotation import services
from rotation.models import Group, Membership, Rep, RotationState
from tests.conftest import lead_body
from tests.factories import RepFactory

pytestmark = pytest.mark.django_db


def test_group_lifecycle(api):
    r = api.post(
        "/api/v1/groups/",
        {"slug": "emea", "name": "EMEA", "strategy": "round_robin", "sla_minutes": 0.5, "timezone": "Europe/Paris"},
        format="json",
    )
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["sla_minutes"] == 0.5 and body["max_attempts"] == 3 and body["dedup_days"] == 30
    assert body["active"] is True and body["is_default"] is False
    assert RotationState.objects.filter(group__slug="emea").exists()
    assert api.get("/api/v1/groups/emea/").json()["name"] == "EMEA"
    assert api.get("/api/v1/groups/").json()["count"] == 1
    r = api.patch("/api/v1/groups/emea/", {"strategy": "weighted", "active": False}, format="json")
    assert r.status_code == 200 and r.json()["strategy"] == "weighted"
    assert api.patch("/api/v1/groups/emea/", {"slug": "other"}, format="json").status_code == 400
    changes = AuditEvent.objects.filter(type="group.changed", group="emea").order_by("id")
    assert [e.explanation["action"] for e in changes] == ["created", "changed"]
    assert changes[1].explanation["changes"] == {"strategy": "weighted", "active": False}
    assert changes[1].actor.startswith("api:")
    assert api.delete("/api/v1/groups/emea/").status_code == 204
    assert AuditEvent.objects.filter(type="group.changed", group="emea").last().explanation["action"] == "deleted"
    assert api.get("/api/v1/groups/emea/").status_code == 404


@pytest.mark.parametrize(
    "body, field",
    [
        ({"slug": "bad slug", "name": "x"}, "slug"),
        ({"slug": "ok", "name": "x", "strategy": "random"}, "strategy"),
        ({"slug": "ok", "name": "x", "timezone": "Mars/Olympus"}, "timezone"),
        ({"slug": "ok", "name": "x", "sla_minutes": -1}, "sla_minutes"),
        ({"slug": "ok", "name": "x", "max_attempts": 0}, "max_attempts"),
        ({"slug": "ok", "name": "x", "colour": "red"}, "colour"),
        ({"slug": "ok"}, "name"),
    ],
)
def test_group_validation(api, body, field):
    r = api.post("/api/v1/groups/", body, format="json")
    assert r.status_code == 400 and field in r.json()
    assert not Group.objects.exists()


def test_a_slug_taken_in_another_case_is_refused(api, client, django_user_model):
    """Integrations post leads to a slug and the trail is filed under it: "EMEA" beside "emea"
    would be two territories no one tells apart, each with half the leads."""
    assert api.post("/api/v1/groups/", {"slug": "emea", "name": "EMEA"}, format="json").status_code == 201
    r = api.post("/api/v1/groups/", {"slug": "EMEA", "name": "EMEA again"}, format="json")
    assert r.status_code == 400 and "emea" in r.json()["slug"][0], r.content
    client.force_login(django_user_model.objects.create_superuser("ops", "ops@example.com", "pw"))
    form = {"slug": "Emea", "name": "x", "strategy": "round_robin", "timezone": "UTC", "max_attempts": "3"}
    form.update({"dedup_days": "30", "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0"})
    page = client.post("/admin/rotation/group/add/", form)
    assert page.status_code == 200 and "already exists" in page.content.decode()
    assert list(Group.objects.values_list("slug", flat=True)) == ["emea"]
    assert AuditEvent.objects.filter(type="group.changed").count() == 1
    # A group already saved keeps working, whatever else exists.
    assert api.patch("/api/v1/groups/emea/", {"name": "Europe"}, format="json").status_code == 200


def test_a_slug_taken_after_the_request_was_checked_is_a_409_not_a_constraints_name(api, monkeypatch):
    """Two posts of one slug at once: the loser, checked before the winner committed, reached
    the service after it, whose full_clean answered 400 {"__all__": ["Constraint
    “group_slug_unique_without_case” is violated."]}. The database refuses it: a 409."""
    from rotation.api.serializers import GroupSerializer

    api.post("/api/v1/groups/", {"slug": "wave", "name": "Wave"}, format="json")
    # As if checked before the winner committed: the serializer's uniqueness checks pass.
    monkeypatch.setattr(GroupSerializer, "get_validators", lambda self: [])
    fields = GroupSerializer.get_fields

    def unchecked_slug(self):
        got = fields(self)
        got["slug"].validators = [v for v in got["slug"].validators if "Unique" not in type(v).__name__]
        return got

    monkeypatch.setattr(GroupSerializer, "get_fields", unchecked_slug)
    monkeypatch.setattr("rotation.api.serializers.group_slug_taken_in_another_case", lambda slug: None)
    for slug in ["wave", "WAVE"]:
        with transaction.atomic():
            r = api.post("/api/v1/groups/", {"slug": slug, "name": "Wave again"}, format="json")
        if slug == "wave":
            assert r.status_code == 409 and "at the same time" in r.json()["detail"], r.content
        else:  # the model's own check names the group it clashes with
            assert r.status_code == 400 and "'wave'" in r.json()["slug"][0], r.content
    assert list(Group.objects.values_list("slug", flat=True)) == ["wave"]


def test_one_default_group_moves(api):
    api.post("/api/v1/groups/", {"slug": "a", "name": "A", "is_default": True}, format="json")
    api.post("/api/v1/groups/", {"slug": "b", "name": "B", "is_default": True}, format="json")
    assert list(Group.objects.filter(is_default=True).values_list("slug", flat=True)) == ["b"]


def test_group_with_leads_cannot_be_deleted(api, make_group):
    make_group(1, slug="busy")
    api.post("/api/v1/leads/", lead_body(group="busy"), format="json")
    r = api.delete("/api/v1/groups/busy/")
    assert r.status_code == 409 and "deactivate" in r.json()["detail"]


def test_a_group_kept_by_a_rule_says_so(api, make_group):
    make_group(1, slug="ruled")
    rule = {"name": "r", "conditions": [{"field": "country", "op": "equals", "value": "FR"}], "group": "ruled"}
    assert api.post("/api/v1/rules/", rule, format="json").status_code == 201
    r = api.delete("/api/v1/groups/ruled/")
    assert r.status_code == 409
    assert r.json()["detail"] == "The group has routing rules; deactivate it instead (active: false)."
    assert Group.objects.filter(slug="ruled").exists()


def test_reps(api):
    r = api.post(
        "/api/v1/reps/", {"name": "Ada", "email": "ada@sales.example", "timezone": "Europe/London"}, format="json"
    )
    assert r.status_code == 201, r.content
    rep_id = r.json()["id"]
    assert r.json()["working_hours"] is None and r.json()["active"] is True
    assert api.post("/api/v1/reps/", {"name": "Twin", "email": "ada@sales.example"}, format="json").status_code == 400
    r = api.patch(f"/api/v1/reps/{rep_id}/", {"working_hours": {"mon": [["09:00", "17:30"]]}}, format="json")
    assert r.status_code == 200 and r.json()["working_hours"] == {"mon": [["09:00", "17:30"]]}
    bad = api.patch(f"/api/v1/reps/{rep_id}/", {"working_hours": {"monday": [["9", "5"]]}}, format="json")
    assert bad.status_code == 400 and "working_hours" in bad.json()
    assert api.delete(f"/api/v1/reps/{rep_id}/").status_code == 405
    types = list(AuditEvent.objects.filter(rep_id=rep_id).values_list("type", flat=True))
    assert types == ["rep.changed", "rep.changed"]


def test_memberships(api, make_group):
    group, _ = make_group(0, slug="g")
    a, b, c = RepFactory(), RepFactory(), RepFactory()
    assert api.post("/api/v1/groups/g/members/", {"rep": a.id}, format="json").json()["position"] == 0
    r = api.post("/api/v1/groups/g/members/", {"rep": b.id, "weight": 3, "max_open": 5}, format="json")
    assert r.status_code == 201 and r.json()["position"] == 1 and r.json()["weight"] == 3
    assert api.post("/api/v1/groups/g/members/", {"rep": b.id}, format="json").status_code == 400
    taken = api.post("/api/v1/groups/g/members/", {"rep": c.id, "position": 1}, format="json")
    assert taken.status_code == 400 and "position" in taken.json()
    unknown = api.post("/api/v1/groups/g/members/", {"rep": 99999}, format="json")
    assert unknown.status_code == 400 and unknown.json() == {"rep": ["No rep with id 99999."]}
    assert api.post("/api/v1/groups/g/members/", {"rep": c.id, "weight": 0}, format="json").status_code == 400
    listed = api.get("/api/v1/groups/g/members/").json()
    assert [m["rep"] for m in listed] == [a.id, b.id]
    r = api.patch(f"/api/v1/groups/g/members/{b.id}/", {"active": False, "max_per_day": 0}, format="json")
    assert r.status_code == 200 and r.json()["active"] is False
    assert api.patch(f"/api/v1/groups/g/members/{b.id}/", {"rep": a.id}, format="json").status_code == 400
    assert api.patch(f"/api/v1/groups/g/members/{c.id}/", {"active": False}, format="json").status_code == 404
    assert api.delete(f"/api/v1/groups/g/members/{a.id}/").status_code == 204
    assert list(Membership.objects.filter(group=group).values_list("rep_id", flat=True)) == [b.id]
    assert api.get("/api/v1/groups/nope/members/").status_code == 404
    actions = list(
        AuditEvent.objects.filter(type="membership.changed", group="g").values_list("explanation__action", flat=True)
    )
    assert actions == ["joined", "joined", "changed", "removed"]


def test_rotation_view(api, make_group):
    group, (a, b, c) = make_group(3, slug="g")
    Membership.objects.filter(rep=c).update(active=False)
    api.post("/api/v1/leads/", lead_body(group="g"), format="json")
    view = api.get("/api/v1/groups/g/rotation/").json()
    assert view["group"] == "g" and view["strategy"] == "round_robin" and view["pointer"] == 1
    assert view["next"]["id"] == b.id
    members = {m["rep"]["id"]: m for m in view["members"]}
    assert members[a.id]["assigned_today"] == 1 and members[a.id]["open"] == 1 and members[a.id]["eligible"]
    assert members[c.id]["eligible"] is False and members[c.id]["reason"] == "paused in this group"
    for key in ("position", "weight", "active", "current_weight", "assigned_week", "share"):
        assert key in members[a.id]
    assert api.get("/api/v1/groups/missing/rotation/").status_code == 404


def test_a_patch_that_changes_nothing_writes_no_event(api, make_group):
    group, reps = make_group(1, slug="quiet")
    rule = api.post(
        "/api/v1/rules/",
        {
            "name": "Q",
            "priority": 1,
            "conditions": [{"field": "country", "op": "in", "value": ["FR"]}],
            "group": "quiet",
        },
        format="json",
    ).json()
    (member,) = api.get("/api/v1/groups/quiet/members/").json()
    stored = {
        "/api/v1/groups/quiet/": api.get("/api/v1/groups/quiet/").json(),
        f"/api/v1/reps/{reps[0].pk}/": api.get(f"/api/v1/reps/{reps[0].pk}/").json(),
        f"/api/v1/rules/{rule['id']}/": rule,
        f"/api/v1/groups/quiet/members/{reps[0].pk}/": member,
    }
    fields = {
        "groups": ("name", "strategy", "sla_minutes", "dedup_days"),
        "reps": ("name", "email", "working_hours", "timezone"),
        "rules": ("name", "priority", "conditions", "group"),
        "members": ("weight", "active", "max_open"),
    }
    before = AuditEvent.objects.count()
    for path, current in stored.items():
        assert api.patch(path, {}, format="json").status_code == 200, path
        # Sending back what is stored changes nothing either.
        kind = "members" if "/members/" in path else path.split("/")[3]
        same = {k: current[k] for k in fields[kind]}
        assert len(same) >= 2 and api.patch(path, same, format="json").status_code == 200, (path, same)
    assert AuditEvent.objects.count() == before
    old_name = group.name
    api.patch("/api/v1/groups/quiet/", {"name": "Quieter", "strategy": group.strategy}, format="json")
    event = AuditEvent.objects.filter(type="group.changed").latest("id")
    assert event.explanation["changes"] == {"name": "Quieter"}
    assert event.explanation["before"] == {"name": old_name}


def test_rep_emails_are_unique_without_case(api):
    body = {"name": "Ada", "email": "ada@sales.example"}
    assert api.post("/api/v1/reps/", body, format="json").status_code == 201
    r = api.post("/api/v1/reps/", {**body, "email": "ADA@Sales.example"}, format="json")
    assert r.status_code == 400 and "without case" in r.json()["email"][0]
    other = api.post("/api/v1/reps/", {"name": "Bo", "email": "bo@sales.example"}, format="json").json()
    r = api.patch(f"/api/v1/reps/{other['id']}/", {"email": "Ada@sales.example"}, format="json")
    assert r.status_code == 400 and "email" in r.json()


def test_a_rep_email_taken_at_the_same_time_is_a_409(api, monkeypatch):
    clean = Rep.clean

    def clean_then_taken(self):
        clean(self)
        # Another request saves the address, in another case, just after this one checked it.
        Rep.objects.create(name="Other", email=self.email.upper())

    monkeypatch.setattr(Rep, "clean", clean_then_taken)
    r = api.post("/api/v1/reps/", {"name": "Ada", "email": "ada@sales.example"}, format="json")
    assert r.status_code == 409 and "at the same time" in r.json()["detail"], r.content
    assert not Rep.objects.filter(email__iexact="ada@sales.example").exists()
    assert not AuditEvent.objects.filter(type="rep.changed").exists()


def test_deleting_a_group_ends_each_members_trail(api, make_group):
    group, reps = make_group(2, slug="gone")
    assert api.delete("/api/v1/groups/gone/").status_code == 204
    removed = AuditEvent.objects.filter(type="membership.changed", group="gone", explanation__action="removed")
    assert sorted(e.rep_id for e in removed) == sorted(r.pk for r in reps)


def test_deleting_a_group_ends_its_webhook_endpoints_trail(api, make_group):
    """The group's webhook endpoints go with it: where its leads were sent stops being a
    receiver, and the trail says so (and from where), as when an endpoint is deleted by hand."""
    group, _ = make_group(1, slug="gone")
    endpoint = WebhookEndpoint.objects.create(group=group, url="https://crm.example/hook")
    assert api.delete("/api/v1/groups/gone/").status_code == 204
    assert not WebhookEndpoint.objects.filter(pk=endpoint.pk).exists()
    event = AuditEvent.objects.get(type="client.changed", group="gone")
    assert event.actor.startswith("api:")
    assert event.explanation == {
        "webhook_endpoint": endpoint.pk,
        "change": "deleted",
        "url": "https://crm.example/hook",
        "because": "group deleted",
    }


@pytest.mark.parametrize(
    ("given", "stored"),
    # A JSON number is a float: more places than two are rounded, half up (the schema's number
    # form has no step); text is exact (its pattern allows two places).
    [(0.05, 0.05), ("0.05", 0.05), ("12.5", 12.5), (None, None), (1.234, 1.23), (0.015, 0.02), (999999.99, 999999.99)],
)
def test_sla_minutes_take_a_number_or_a_decimal_as_text(api, given, stored):
    r = api.post("/api/v1/groups/", {"slug": "s", "name": "S", "sla_minutes": given}, format="json")
    assert r.status_code == 201 and r.json()["sla_minutes"] == stored, r.content


@pytest.mark.parametrize("given", ["soon", "0.001", "1.234", "1e400", True, 0.004, 0.0, 999999.994, 1e300, -1.5])
def test_sla_minutes_that_are_no_decimal_are_a_400(api, given):
    r = api.post("/api/v1/groups/", {"slug": "s", "name": "S", "sla_minutes": given}, format="json")
    assert r.status_code == 400 and "sla_minutes" in r.json(), r.content


# Python's Decimal reads all of these; the schema's pattern (digits, a point, digits) none.
@pytest.mark.parametrize(
    "given", ["1e3", "1E+2", " 7 ", "1_000", "\u0661\u0662", "+5", ".5", "5.", "-5", "", "0x10", "NaN"]
)
def test_sla_minutes_as_text_are_plain_digits_as_the_schema_says(api, make_group, given):
    make_group(1, slug="smb")
    before = api.get("/api/v1/groups/smb/").json()["sla_minutes"]
    r = api.patch("/api/v1/groups/smb/", {"sla_minutes": given}, format="json")
    assert r.status_code == 400, r.content
    assert "digits 0-9" in r.json()["sla_minutes"][0]
    assert api.get("/api/v1/groups/smb/").json()["sla_minutes"] == before
    assert api.patch("/api/v1/groups/smb/", {"sla_minutes": "7"}, format="json").json()["sla_minutes"] == 7


def test_config_events_say_what_a_value_was_before_and_a_moved_rule_shows_in_both_groups(api, make_group):
    make_group(1, slug="emea")
    _, (rep,) = make_group(1, slug="apac")
    rule = api.post(
        "/api/v1/rules/",
        {
            "name": "FR",
            "priority": 1,
            "conditions": [{"field": "country", "op": "equals", "value": "FR"}],
            "group": "emea",
        },
        format="json",
    ).json()
    old_email = rep.email
    assert api.patch(f"/api/v1/reps/{rep.pk}/", {"email": "new@sales.example"}, format="json").status_code == 200
    event = AuditEvent.objects.filter(type="rep.changed", rep_id=rep.pk).latest("id")
    assert event.explanation["changes"] == {"email": "new@sales.example"}
    assert event.explanation["before"] == {"email": old_email}

    assert api.patch(f"/api/v1/rules/{rule['id']}/", {"group": "apac"}, format="json").status_code == 200
    moved = AuditEvent.objects.filter(type="rule.changed").order_by("-id")[:2]
    assert {e.group for e in moved} == {"emea", "apac"}
    assert all(e.explanation["before"]["group_id"] != e.explanation["changes"]["group_id"] for e in moved)
    # Named as the API names groups, not only by their ids.
    assert all((e.explanation["before"]["group"], e.explanation["changes"]["group"]) == ("emea", "apac") for e in moved)
    created = AuditEvent.objects.filter(type="rule.changed", explanation__action="created").get()
    assert created.explanation["changes"]["group"] == "emea"

    assert api.delete(f"/api/v1/rules/{rule['id']}/").status_code == 204
    deleted = AuditEvent.objects.filter(type="rule.changed").latest("id")
    assert deleted.explanation["action"] == "deleted"
    assert deleted.explanation["before"]["conditions"] == rule["conditions"]
    assert deleted.explanation["before"]["group"] == "apac"


def test_patching_an_active_member_active_again_keeps_its_sla_miss_streak(api, make_group):
    group, (rep,) = make_group(1, slug="emea")
    Membership.objects.filter(group=group).update(consecutive_misses=2)
    r = api.patch(f"/api/v1/groups/emea/members/{rep.pk}/", {"active": True, "max_open": 5}, format="json")
    assert r.status_code == 200
    member = Membership.objects.get(group=group)
    assert member.consecutive_misses == 2 and member.max_open == 5
    event = AuditEvent.objects.filter(type="membership.changed").latest("id")
    assert event.explanation["changes"] == {"max_open": 5} and event.explanation["before"] == {"max_open": None}


def test_a_member_patch_writes_only_the_fields_it_changes(make_group):
    """A PATCH reads the member, then writes it: an SLA miss counted, or an auto-pause, that
    commits in between (escalation's own locked write) is kept, not reverted unaudited."""
    group, (rep,) = make_group(1, slug="emea")
    member = Membership.objects.get(group=group)  # as the PATCH read it
    paused = "auto-paused after 3 consecutive SLA misses"
    Membership.objects.filter(pk=member.pk).update(active=False, paused_reason=paused, consecutive_misses=3)
    member.weight = 2
    answered = services.membership_update(membership=member, actor="test", changed=["weight"])
    assert (answered.active, answered.paused_reason) == (False, paused)
    stored = Membership.objects.get(pk=member.pk)
    assert (stored.weight, stored.active, stored.paused_reason, stored.consecutive_misses) == (2, False, paused, 3)
    # Un-paused by hand, the streak starts again.
    stored.active = True
    services.membership_update(membership=stored, actor="test", changed=["active"])
    stored = Membership.objects.get(pk=member.pk)
    assert (stored.active, stored.paused_reason, stored.consecutive_misses) == (True, "", 0)
    # The audit names the pause that was lifted, not only "active".
    event = AuditEvent.objects.filter(type="membership.changed", rep_id=rep.pk).latest("id")
    assert event.explanation["before"] == {"active": False, "paused_reason": paused}
    assert event.explanation["changes"] == {"active": True, "paused_reason": ""}
    # Removed meanwhile: the edit writes nothing back (a 404 over the API).
    Membership.objects.filter(pk=member.pk).delete()
    with pytest.raises(Membership.DoesNotExist):
        services.membership_update(membership=stored, actor="test", changed=["weight"])
    assert not Membership.objects.filter(pk=member.pk).exists()


def test_a_weighted_member_removed_and_added_back_before_the_next_lead_is_a_new_joiner(api, make_group):
    group, reps = make_group(3, slug="emea", strategy="weighted")
    for rep, weight in zip(reps, (2, 1, 1), strict=True):
        Membership.objects.filter(group=group, rep=rep).update(weight=weight)
    api.post("/api/v1/leads/", lead_body(group="emea"), format="json")
    b = reps[1]
    assert str(b.pk) in RotationState.objects.get(group=group).current_weights
    assert api.delete(f"/api/v1/groups/emea/members/{b.pk}/").status_code == 204
    assert api.post("/api/v1/groups/emea/members/", {"rep": b.pk}, format="json").status_code == 201
    (member,) = [m for m in api.get("/api/v1/groups/emea/rotation/").json()["members"] if m["rep"]["id"] == b.pk]
    assert member["current_weight"] is None  # as a rep that never was a member
    assert RotationState.objects.get(group=group).pointer > 0  # the pointer is untouched


def test_a_weighted_member_added_back_with_another_weight_is_a_new_joiner(api, make_group):
    """The weight it had before its removal stayed in the rotation's record: added back with
    another one, the group read it as a change of weights and placed everyone again, so the
    rep who had just taken a lead took the next one too, and the joiner waited."""
    group, (a, b, c) = make_group(3, slug="emea", strategy="weighted")
    for rep, weight in ((a, 1), (b, 2), (c, 2)):
        Membership.objects.filter(group=group, rep=rep).update(weight=weight)

    def route(n: int) -> list[int]:
        return [
            api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["owner"]["id"] for _ in range(n)
        ]

    assert route(2) == [b.pk, c.pk]
    assert api.delete(f"/api/v1/groups/emea/members/{a.pk}/").status_code == 204
    assert f"w:{a.pk}" not in RotationState.objects.get(group=group).current_weights
    assert api.post("/api/v1/groups/emea/members/", {"rep": a.pk, "weight": 2}, format="json").status_code == 201
    assert route(6) == [a.pk, b.pk, c.pk] * 2


def test_a_member_posted_with_a_null_position_is_appended(api, make_group):
    """A position left empty (null, as a form or a client library sends an unset field) was a
    400, where the admin appends the member: appended too; and a member's position emptied
    by a PATCH moves it to the end, as the admin's position left empty does."""
    group, (a, b) = make_group(2, slug="pool")
    c = RepFactory()
    r = api.post("/api/v1/groups/pool/members/", {"rep": c.id, "position": None}, format="json")
    assert r.status_code == 201 and r.json()["position"] == 2, r.content
    r = api.patch(f"/api/v1/groups/pool/members/{a.id}/", {"position": None, "weight": 2}, format="json")
    assert r.status_code == 200 and r.json()["position"] == 3 and r.json()["weight"] == 2, r.content
    order = list(Membership.objects.filter(group=group).order_by("position").values_list("rep_id", flat=True))
    assert order == [b.id, c.id, a.id]
    event = AuditEvent.objects.filter(type="membership.changed").latest("id")
    assert event.explanation["changes"] == {"position": 3, "weight": 2}, event.explanation


def test_a_member_given_the_highest_position_still_lets_joiners_be_appended(api, make_group):
    """A member given the highest position a client could give (1,000,000, the most appending
    could reach) left every later joiner without a place: each got a 400. A client gives at
    most 100,000; appending goes on past it."""
    from rotation.services import MAX_GIVEN_POSITION, MAX_POSITION
    from tests.factories import RepFactory

    group, (a,) = make_group(1, slug="pool")
    r = api.patch(f"/api/v1/groups/pool/members/{a.id}/", {"position": MAX_GIVEN_POSITION + 1}, format="json")
    assert r.status_code == 400 and "100000" in r.json()["position"][0], r.content
    # One bound said, whatever was sent: past the column's bound too (it said 1000000 there).
    for position in [MAX_POSITION, MAX_POSITION + 1, 2**31]:
        again = api.patch(f"/api/v1/groups/pool/members/{a.id}/", {"position": position}, format="json")
        assert again.status_code == 400 and again.json() == r.json(), again.content
    r = api.patch(f"/api/v1/groups/pool/members/{a.id}/", {"position": MAX_GIVEN_POSITION}, format="json")
    assert r.status_code == 200, r.content
    b = RepFactory()
    r = api.post("/api/v1/groups/pool/members/", {"rep": b.id}, format="json")
    assert (r.status_code, r.json()["position"]) == (201, MAX_GIVEN_POSITION + 1), r.content
    # The member appended there is edited with its position sent back as read.
    r = api.patch(
        f"/api/v1/groups/pool/members/{b.id}/", {"position": MAX_GIVEN_POSITION + 1, "weight": 2}, format="json"
    )
    assert (r.status_code, r.json()["weight"]) == (200, 2), r.content
    # Appending can still run out, in a group renumbered past it by hand: a 400 naming it.
    Membership.objects.filter(group=group, rep=b).update(position=MAX_POSITION)
    c = RepFactory()
    r = api.post("/api/v1/groups/pool/members/", {"rep": c.id}, format="json")
    assert r.status_code == 400 and "highest" in r.json()["position"][0], r.content
    assert not group.memberships.filter(rep=c).exists()
    r = api.post("/api/v1/groups/pool/members/", {"rep": c.id, "position": 3}, format="json")
    assert r.status_code == 201, r.content


def test_in_an_inactive_group_no_member_is_eligible_and_the_view_says_why(api, make_group):
    """An inactive group routes nothing (its leads are queued): the rotation view says so for
    every member, as its `next` does, instead of calling them eligible."""
    group, (a, b) = make_group(2, slug="closed")
    Membership.objects.filter(group=group, rep=b).update(active=False)
    assert api.patch("/api/v1/groups/closed/", {"active": False}, format="json").status_code == 200
    view = api.get("/api/v1/groups/closed/rotation/").json()
    assert view["active"] is False and view["next"] is None
    assert [(m["rep"]["id"], m["eligible"], m["reason"]) for m in view["members"]] == [
        (a.id, False, "group inactive"),
        (b.id, False, "group inactive"),
    ]
    assert api.patch("/api/v1/groups/closed/", {"active": True}, format="json").status_code == 200
    members = api.get("/api/v1/groups/closed/rotation/").json()["members"]
    assert [(m["eligible"], m["reason"]) for m in members] == [(True, None), (False, "paused in this group")]


@pytest.mark.parametrize("tz", ["localtime", "posixrules"])
def test_a_time_zone_is_an_iana_name_not_the_servers_clock(api, make_group, tz):
    """`localtime` is a file beside the zones on many servers (a link to the machine's own
    clock), not an IANA name: a group or rep on it would follow whichever server reads it."""
    _, (rep,) = make_group(1, slug="emea")
    r = api.post("/api/v1/groups/", {"slug": "x", "name": "X", "timezone": tz}, format="json")
    assert r.status_code == 400 and "timezone" in r.json(), r.content
    r = api.patch("/api/v1/groups/emea/", {"timezone": tz}, format="json")
    assert r.status_code == 400 and "timezone" in r.json(), r.content
    r = api.patch(f"/api/v1/reps/{rep.pk}/", {"timezone": tz}, format="json")
    assert r.status_code == 400 and "timezone" in r.json(), r.content
    assert Group.objects.get(slug="emea").timezone == "UTC" and not Group.objects.filter(slug="x").exists()


@pytest.mark.parametrize("spelled", ["7_0", "+7", "%207", "7%20", "%EF%BC%97"])
def test_a_rep_is_named_by_its_id_in_ascii_digits_only(api, spelled):
    """`int()` reads "7_0" as 70 and "+7", " 7" or a full-width "７" as 7: a rep URL spelled
    so must not read, or edit, a rep it does not name."""
    RepFactory(id=7)
    RepFactory(id=70)
    for r in (api.get(f"/api/v1/reps/{spelled}/"), api.patch(f"/api/v1/reps/{spelled}/", {"name": "X"}, format="json")):
        assert r.status_code == 404 and r.json() == {"detail": "Not found."}, r.content
    assert not Rep.objects.filter(name="X").exists()
    assert api.patch("/api/v1/reps/70/", {"name": "X"}, format="json").status_code == 200


def test_a_removed_member_leaves_a_snapshot_of_its_settings(api, make_group):
    """As a deleted group, rep or rule does: the trail says what the member's weight, caps and
    pause were, so that it can be put back as it was."""
    group, (a, b) = make_group(2, slug="g")
    body = {"weight": 3, "max_open": 5, "max_per_day": 2, "active": False}
    assert api.patch(f"/api/v1/groups/g/members/{a.id}/", body, format="json").status_code == 200
    assert api.delete(f"/api/v1/groups/g/members/{a.id}/").status_code == 204
    assert api.delete("/api/v1/groups/g/").status_code == 204  # b goes with the group
    removed = {
        e.rep_id: e.explanation
        for e in AuditEvent.objects.filter(type="membership.changed", group="g", explanation__action="removed")
    }
    assert removed[a.id]["position"] == 0
    assert {k: removed[a.id]["before"][k] for k in ("weight", "max_open", "max_per_day", "active", "position")} == {
        "weight": 3,
        "max_open": 5,
        "max_per_day": 2,
        "active": False,
        "position": 0,
    }
    assert removed[b.id]["because"] == "group deleted" and removed[b.id]["before"]["weight"] == 1


def test_a_400_names_a_member_already_in_the_group_or_a_taken_position_with_the_other_bad_fields(api, make_group):
    """Those checks ran in validate(), which DRF runs only once every field is valid: a body with
    a bad weight too was answered naming the weight alone."""
    _, (a, _b) = make_group(2, slug="g")
    newcomer = RepFactory()
    again = api.post("/api/v1/groups/g/members/", {"rep": a.id, "weight": 0}, format="json")
    assert again.status_code == 400
    assert set(again.json()) == {"rep", "weight"} and "already a member" in again.json()["rep"][0]
    taken = api.post("/api/v1/groups/g/members/", {"rep": newcomer.id, "position": 0, "weight": 0}, format="json")
    assert taken.status_code == 400
    assert set(taken.json()) == {"position", "weight"} and "is taken" in taken.json()["position"][0]
    moved = api.patch(f"/api/v1/groups/g/members/{a.id}/", {"position": 1, "max_open": -1}, format="json")
    assert moved.status_code == 400 and set(moved.json()) == {"position", "max_open"}
    emptied = api.patch(f"/api/v1/groups/g/members/{a.id}/", {"position": None, "weight": 0}, format="json")
    assert emptied.status_code == 400 and set(emptied.json()) == {"weight"}  # emptied: moved to the end
    appended = api.post("/api/v1/groups/g/members/", {"rep": newcomer.id, "position": None}, format="json")
    assert appended.status_code == 201 and appended.json()["position"] == 2


def test_a_400_names_a_slug_or_an_email_taken_in_another_case_with_the_other_bad_fields(api, make_group):
    """Checked by the model's clean() in the service, after the serializer: a body with another
    bad field was answered naming that field alone."""
    make_group(0, slug="emea")
    RepFactory(email="ann@example.com")
    other = RepFactory()
    group = api.post("/api/v1/groups/", {"slug": "EMEA", "name": "x", "timezone": "Mars/Olympus"}, format="json")
    assert group.status_code == 400 and set(group.json()) == {"slug", "timezone"}
    assert "another case" in group.json()["slug"][0]
    rep = api.post("/api/v1/reps/", {"name": "", "email": "ANN@example.com"}, format="json")
    assert rep.status_code == 400 and set(rep.json()) == {"name", "email"}
    patched = api.patch(f"/api/v1/reps/{other.id}/", {"email": "Ann@Example.com", "timezone": "Nope"}, format="json")
    assert patched.status_code == 400 and set(patched.json()) == {"email", "timezone"}
    assert "without case" in patched.json()["email"][0]
    # A rep's own address in another case is no conflict.
    mine = api.patch(f"/api/v1/reps/{other.id}/", {"email": other.email.upper()}, format="json")
    assert mine.status_code == 200, mine.content


@pytest.mark.parametrize("what", ["group", "rep", "rule"])
def test_an_edit_of_an_object_deleted_meanwhile_is_a_404_and_does_not_bring_it_back(api, make_group, monkeypatch, what):
    """Read by the PATCH, then deleted by another request before the PATCH saves it: Django's
    save would insert the row its update did not find, bringing back a group without its
    members or trail. The edit is refused instead."""
    from rotation.api import rules, views
    from rotation.models import Rep, RoutingRule

    group, (rep,) = make_group(1, slug="emea")
    if what == "group":
        viewset, obj, url = views.GroupViewSet, group, "/api/v1/groups/emea/"
    elif what == "rep":
        viewset, obj, url = views.RepViewSet, rep, f"/api/v1/reps/{rep.pk}/"
    else:
        conditions = [{"field": "country", "op": "equals", "value": "FR"}]
        rule = services.rule_save(
            rule=RoutingRule(name="FR", priority=1, conditions=conditions, group=group), actor="t"
        )
        viewset, obj, url = rules.RuleViewSet, rule, f"/api/v1/rules/{rule.pk}/"
    body = {"name": "Renamed"}
    read = viewset.get_object

    def read_then_lose(self):
        found = read(self)
        type(found).objects.filter(pk=found.pk).delete()  # the other request's delete
        return found

    monkeypatch.setattr(viewset, "get_object", read_then_lose)
    r = api.patch(url, body, format="json")
    assert r.status_code == 404 and "deleted by another request" in r.json()["detail"], r.content
    model = type(obj)
    assert not model.objects.filter(pk=obj.pk).exists()
    assert model in (Group, Rep, RoutingRule)


def test_groups_reps_and_rules_are_listed_by_the_filters_a_client_would_try(api, make_group):
    """`?active=false` used to be ignored (every rep came back, all active), and a rules list
    `?group=apac` held every group's rules."""
    emea, (ada, bob) = make_group(2, slug="emea", is_default=True)
    apac, _ = make_group(1, slug="apac", active=False)
    assert api.patch(f"/api/v1/reps/{bob.id}/", {"active": False}, format="json").status_code == 200
    for slug, group in (("DE", emea), ("JP", apac)):
        api.post(
            "/api/v1/rules/",
            {
                "name": slug,
                "priority": 1,
                "group": group.slug,
                "conditions": [{"field": "country", "op": "in", "value": [slug]}],
            },
            format="json",
        )

    def listed(path: str, key: str) -> list:
        r = api.get(path)
        assert r.status_code == 200, r.content
        return [row[key] for row in r.json()["results"]]

    assert listed("/api/v1/reps/?active=false", "id") == [bob.id]
    assert ada.id in listed("/api/v1/reps/?active=true", "id") and bob.id not in listed(
        "/api/v1/reps/?active=true", "id"
    )
    assert listed("/api/v1/groups/?active=false", "slug") == ["apac"]
    assert listed("/api/v1/groups/?is_default=true", "slug") == ["emea"]
    assert listed("/api/v1/rules/?group=apac", "name") == ["JP"]
    assert listed("/api/v1/rules/?group=emea&active=true", "name") == ["DE"]
    assert listed("/api/v1/rules/?group=nowhere", "name") == []
    # A value that is not one, given empty or twice: a 400 naming it, never the whole list.
    for path, name in [
        ("/api/v1/reps/?active=no", "active"),
        ("/api/v1/reps/?active=", "active"),
        ("/api/v1/groups/?active=true&active=false", "active"),
        ("/api/v1/rules/?group=", "group"),
    ]:
        r = api.get(path)
        assert r.status_code == 400 and name in r.json(), (path, r.content)


def test_a_rules_conditions_read_back_in_the_order_they_were_saved(api, make_group):
    """PostgreSQL's jsonb orders an object's keys by length: a rule read back listed `op`
    before `field`, unlike the answer to its POST."""
    make_group(1, slug="emea")
    body = {"name": "FR", "group": "emea", "conditions": [{"field": "country", "op": "in", "value": ["FR"]}]}
    created = api.post("/api/v1/rules/", body, format="json")
    assert created.status_code == 201, created.content
    read = api.get(f"/api/v1/rules/{created.json()['id']}/")
    listed = api.get("/api/v1/rules/").json()["results"][0]
    for answer in (created.json(), read.json(), listed):
        assert [list(c) for c in answer["conditions"]] == [["field", "op", "value"]], answer


def test_a_member_paused_by_hand_may_say_why_and_the_reason_goes_with_the_pause(api, admin_client, make_group):
    # Only an auto-pause said why: "parental leave" had nowhere to go, and the dashboard and
    # the rotation view said "paused" for every hand pause alike.
    group, (a, b) = make_group(2, slug="emea")
    url = f"/api/v1/groups/emea/members/{b.pk}/"
    refused = api.patch(url, {"paused_reason": "parental leave"}, format="json")
    assert refused.status_code == 400 and "paused_reason" in refused.json()
    paused = api.patch(url, {"active": False, "paused_reason": " parental leave "}, format="json")
    assert paused.status_code == 200 and paused.json()["paused_reason"] == "parental leave"
    rotation = api.get("/api/v1/groups/emea/rotation/").json()
    [member] = [m for m in rotation["members"] if m["rep"]["id"] == b.pk]
    assert member["reason"] == "paused in this group (parental leave)"
    event = AuditEvent.objects.filter(type="membership.changed", rep_id=b.pk).latest("id")
    assert event.explanation["changes"] == {"active": False, "paused_reason": "parental leave"}
    html = admin_client.get("/admin/dashboard/?group=emea").content.decode()
    assert f"<td>{b.name} <small>(paused in this group: parental leave)</small></td>" in html
    back = api.patch(url, {"active": True}, format="json")
    assert back.status_code == 200 and back.json()["paused_reason"] == ""
    added = api.post(
        "/api/v1/groups/emea/members/",
        {"rep": RepFactory().pk, "active": False, "paused_reason": "training"},
        format="json",
    )
    assert added.status_code == 201 and added.json()["paused_reason"] == "training"


@pytest.mark.parametrize(
    "bad", ["Ada\u0007", "Ada\nLovelace", "Ada\tL", "\u202eecalevol", "Ada\u2066x\u2069", "A\u200bda"]
)
def test_a_name_is_one_line_without_hidden_characters(api, make_group, bad):
    """A rep's, a group's or a rule's name, a pause's or an absence's reason: what sales ops
    read in the admin, the trail and e-mails, where a right-to-left override or a line break
    would show something else than what is stored. Refused over the API as in the admin."""
    group, (rep,) = make_group(1, slug="emea")
    refused = [
        api.post("/api/v1/reps/", {"name": bad, "email": "x@acme.example"}, format="json"),
        api.patch(f"/api/v1/reps/{rep.id}/", {"name": bad}, format="json"),
        api.post("/api/v1/groups/", {"slug": "apac", "name": bad}, format="json"),
        api.post(
            "/api/v1/rules/",
            {
                "name": bad,
                "priority": 1,
                "conditions": [{"field": "country", "op": "equals", "value": "FR"}],
                "group": "emea",
            },
            format="json",
        ),
    ]
    for r in refused:
        assert r.status_code == 400 and "name" in r.json(), r.content
        assert "Control characters" in r.json()["name"][0]
    r = api.patch(f"/api/v1/groups/emea/members/{rep.id}/", {"active": False, "paused_reason": bad}, format="json")
    assert r.status_code == 400 and "paused_reason" in r.json(), r.content
    r = api.post(
        f"/api/v1/reps/{rep.id}/absences/",
        {"starts_at": "2030-01-01T00:00:00Z", "ends_at": "2030-01-02T00:00:00Z", "reason": bad},
        format="json",
    )
    assert r.status_code == 400 and "reason" in r.json(), r.content
    # Named beside the other problems of the same request, not once they are mended.
    r = api.post(
        f"/api/v1/reps/{rep.id}/absences/",
        {"starts_at": "2030-01-01T00:00:00Z", "ends_at": "soon", "reason": bad},
        format="json",
    )
    assert r.status_code == 400 and {"ends_at", "reason"} <= set(r.json()), r.content
    assert not Group.objects.filter(slug="apac").exists() and Rep.objects.count() == 1
    assert Rep.objects.get(pk=rep.id).name == rep.name and Membership.objects.get(rep=rep).active


def test_the_marks_a_names_script_needs_are_kept(api):
    """Persian words hold the zero-width non-joiner; a name mixing scripts may hold a
    right-to-left mark; an emoji family is joined by the zero-width joiner."""
    for name in (
        "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",
        "Ada \u200f\u05e9\u05dc\u05d5\u05dd",
        "Team \U0001f468\u200d\U0001f469",
    ):
        r = api.post("/api/v1/reps/", {"name": name, "email": f"r{len(name.encode())}@acme.example"}, format="json")
        assert r.status_code == 201 and r.json()["name"] == name, r.content


def test_the_admin_refuses_a_name_with_a_line_break(client, django_user_model, make_group):
    client.force_login(django_user_model.objects.create_superuser("ops", "ops@example.com", "pw-ops-123"))
    r = client.post(
        "/admin/rotation/rep/add/",
        {"name": "Ada\r\nLovelace", "email": "ada@acme.example", "timezone": "UTC", "active": "on"},
    )
    assert r.status_code == 200 and "Control characters" in r.content.decode()
    assert not Rep.objects.filter(email="ada@acme.example").exists()
