"""The POST /api/v1/leads/ contract of SPEC 6, response by response."""

import hashlib
import json
import os
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from leads.models import Assignment, IdempotencyRecord, Lead
from rotation.models import Absence, Membership, RotationState
from tests.conftest import lead_body

pytestmark = pytest.mark.django_db


def counts() -> tuple[int, int, int]:
    return Lead.objects.count(), Assignment.objects.count(), AuditEvent.objects.filter(lead_id__isnull=False).count()


def test_created_lead_is_routed_and_described(api, make_group):
    group, reps = make_group(3, slug="emea")
    r = api.post("/api/v1/leads/", lead_body(group="emea", first_name="Jane", country="fr"), format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["status"] == "assigned"
    assert body["group"] == "emea"
    assert body["owner"] == {"id": reps[0].id, "name": reps[0].name, "email": reps[0].email}
    assert body["assigned_at"] and body["queue_reason"] is None and body["duplicate_of"] is None
    assert body["sla_due_at"] is None  # the group has no SLA
    assert body["country"] == "FR"
    assert r["Location"] == f"/api/v1/leads/{body['id']}/"
    for key in ("id", "created_at", "accepted_at", "escalations", "email", "first_name", "company", "phone"):
        assert key in body


def test_sla_due_time_is_set_from_the_group(api, make_group):
    make_group(1, slug="fast", sla_minutes="0.5")
    body = api.post("/api/v1/leads/", lead_body(group="fast"), format="json").json()
    assert body["sla_due_at"] is not None
    lead = Lead.objects.get(pk=body["id"])
    assert (lead.sla_due_at - lead.assigned_at).total_seconds() == pytest.approx(30)
    assert Assignment.objects.get(lead=lead).due_at == lead.sla_due_at


def test_rotation_runs_in_order_and_explains_itself(api, make_group):
    group, reps = make_group(3, slug="emea")
    owners = [
        api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["owner"]["id"] for _ in range(7)
    ]
    ids = [r.id for r in reps]
    assert owners == ids + ids + ids[:1]
    lead_id = Lead.objects.order_by("id").first().id
    events = api.get(f"/api/v1/leads/{lead_id}/events/").json()
    assert [e["type"] for e in events] == ["lead.received", "lead.assigned"]
    assigned = events[1]
    assert assigned["rep"] == ids[0] and assigned["lead"] == lead_id and assigned["group"] == "emea"
    assert assigned["actor"].startswith("api:") and assigned["request_id"]
    ex = assigned["explanation"]
    assert ex["strategy"] == "round_robin" and ex["pointer_before"] == 0 and ex["pointer_after"] == 1
    assert ex["group_source"] == "requested" and ex["rule"] is None
    assert [c["rep"] for c in ex["candidates"]] == ids
    assert ex["candidates"][0]["reason"] == "chosen"


def test_a_weighted_decision_names_each_members_weight(api, make_group):
    """Over a weighted group, "not next in rotation" is explained by the weights: each
    candidate carries its member's weight, and the trail says it in words."""
    from audit.summary import event_summary

    group, reps = make_group(2, slug="na", strategy="weighted")
    Membership.objects.filter(group=group, rep=reps[0]).update(weight=3)
    lead = api.post("/api/v1/leads/", lead_body(group="na"), format="json").json()
    (event,) = AuditEvent.objects.filter(lead_id=lead["id"], type="lead.assigned")
    weights = {c["rep"]: c["weight"] for c in event.explanation["candidates"]}
    assert weights == {reps[0].id: 3, reps[1].id: 1}
    text = event_summary(type=event.type, explanation=event.explanation, rep_id=event.rep_id, names={})
    assert f"Given to {reps[0].name} (#{reps[0].id}) (rotation, weight 3)" in text, text
    assert f"Not chosen: {reps[1].name}: not next in rotation (weight 1)." in text, text


def test_no_eligible_rep_queues_with_reason(api, make_group):
    group, reps = make_group(2, slug="emea")
    group.memberships.update(active=False)
    r = api.post("/api/v1/leads/", lead_body(group="emea"), format="json")
    assert r.status_code == 201
    body = r.json()
    assert body["status"] == "queued" and body["owner"] is None and "no eligible rep" in body["queue_reason"]
    queue = api.get("/api/v1/queue/").json()
    assert [item["id"] for item in queue["results"]] == [body["id"]]
    assert queue["results"][0]["queue_reason"] == body["queue_reason"]
    types = [e["type"] for e in api.get(f"/api/v1/leads/{body['id']}/events/").json()]
    assert types == ["lead.received", "lead.queued"]
    explanation = AuditEvent.objects.get(type="lead.queued").explanation
    assert all(c["reason"] == "paused in this group" for c in explanation["candidates"])
    assert RotationState.objects.get(group=group).pointer == 0


def test_a_queued_leads_reason_counts_what_keeps_each_member_out(api, make_group):
    """ "No eligible rep" alone sent the manager working the queue to read each lead's
    candidates to learn whether to unpause someone, raise a cap or wait for the morning."""
    group, reps = make_group(4, slug="emea")
    Membership.objects.filter(group=group, rep__in=reps[:2]).update(active=False, paused_reason="training")
    Membership.objects.filter(group=group, rep=reps[2]).update(max_open=0)
    now = timezone.now()
    Absence.objects.create(rep=reps[3], starts_at=now - timedelta(hours=1), ends_at=now + timedelta(days=2))
    body = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()
    reason = "no eligible rep in group 'emea' (2 paused in this group, 1 at max_open cap, 1 out of office)"
    assert (body["status"], body["queue_reason"]) == ("queued", reason)
    # The particulars stay in the explanation: whose cap, why paused, back when.
    explanation = AuditEvent.objects.get(type="lead.queued", lead_id=body["id"]).explanation
    by_rep = {c["rep"]: c["reason"] for c in explanation["candidates"]}
    assert by_rep[reps[0].id] == "paused in this group (training)"
    assert by_rep[reps[2].id] == "at max_open cap (0/0)"
    assert by_rep[reps[3].id].startswith("out of office until ")
    simulated = api.post("/api/v1/routing/simulate/", lead_body(group="emea"), format="json").json()
    assert simulated["queue_reason"] == reason


def test_inactive_group_queues_never_errors(api, make_group):
    make_group(2, slug="closed", active=False)
    r = api.post("/api/v1/leads/", lead_body(group="closed"), format="json")
    assert r.status_code == 201 and r.json()["status"] == "queued"
    assert "inactive" in r.json()["queue_reason"]


def test_no_group_and_no_default_queues(api):
    r = api.post("/api/v1/leads/", lead_body(), format="json")
    assert r.status_code == 201
    assert r.json()["status"] == "queued" and r.json()["group"] is None


def test_default_group_takes_unmatched_leads(api, make_group):
    make_group(1, slug="catch-all", is_default=True)
    assert api.post("/api/v1/leads/", lead_body(), format="json").json()["group"] == "catch-all"


# --- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, fields",
    [
        ({}, {"email"}),
        ({"email": "not-an-email"}, {"email"}),
        ({"email": "a@b.example", "surprise": 1}, {"surprise"}),
        ({"email": "a@b.example", "score": 101}, {"score"}),
        ({"email": "a@b.example", "score": -1}, {"score"}),
        ({"email": "a@b.example", "score": "high"}, {"score"}),
        ({"email": "a@b.example", "score": 5.5}, {"score"}),
        ({"email": "a@b.example", "company_size": True}, {"company_size"}),
        ({"email": "a@b.example", "country": "XX"}, {"country"}),
        ({"email": "a@b.example", "country": "FRA"}, {"country"}),
        # Letters that upper() turns into ASCII: the dotless i and the long s.
        ({"email": "a@b.example", "country": "\u0131t"}, {"country"}),
        ({"email": "a@b.example", "country": "\u017fe"}, {"country"}),
        ({"email": "a@b.example", "first_name": "Ja\x00ne"}, {"first_name"}),
        ({"email": "a@b.example", "company": "x" * 201}, {"company"}),
        ({"email": "a@b.example", "attributes": {"nested": {"a": 1}}}, {"attributes"}),
        ({"email": "a@b.example", "attributes": ["a"]}, {"attributes"}),
        ({"email": "a@b.example", "attributes": {"k": None}}, {"attributes"}),
        ({"email": "a@b.example", "group": "no-such-group"}, {"group"}),
        # JSON types as the schema documents them: no silent coercion either way.
        ({"email": "a@b.example", "first_name": 12}, {"first_name"}),
        ({"email": "a@b.example", "phone": 5551234}, {"phone"}),
        ({"email": "a@b.example", "score": "50"}, {"score"}),
        ({"email": "a@b.example", "company_size": 12.0}, {"company_size"}),
        ({"email": 42}, {"email"}),
        (
            {"email": "bad", "score": 500, "country": "ZZ", "extra": 1, "phone": "1" * 41},
            {"email", "score", "country", "extra", "phone"},
        ),
    ],
)
def test_bad_input_is_a_400_naming_every_bad_field(api, body, fields):
    before = counts()
    r = api.post("/api/v1/leads/", body, format="json")
    if not fields:
        assert r.status_code == 201
        return
    assert r.status_code == 400, r.content
    assert set(r.json()) == fields
    assert all(isinstance(v, list) and v for v in r.json().values())
    assert counts() == before


def test_null_is_taken_as_a_field_not_given(api, make_group):
    """A form service or a client's serializer sends a field left empty as null: every
    optional field takes it as not given (text as "", the group as none, attributes as {});
    only the one required field, email, refuses it."""
    make_group(1, slug="catch-all", is_default=True)
    optional = ("first_name", "last_name", "company", "phone", "country", "region", "source", "product")
    body = {
        "email": "jane@acme.example",
        **dict.fromkeys(optional),
        "score": None,
        "company_size": None,
        "group": None,
        "external_id": None,
        "attributes": None,
    }
    r = api.post("/api/v1/leads/", body, format="json")
    assert r.status_code == 201, r.content
    lead = r.json()
    assert lead["status"] == "assigned" and lead["group"] == "catch-all"
    assert all(lead[name] == "" for name in optional) and lead["external_id"] == ""
    assert (lead["score"], lead["company_size"], lead["attributes"]) == (None, None, {})
    simulated = api.post("/api/v1/routing/simulate/", {**body, "email": "john@acme.example"}, format="json")
    assert simulated.status_code == 200 and simulated.json()["group"] == "catch-all"
    before = counts()
    r = api.post("/api/v1/leads/", {"email": None, "company": None}, format="json")
    assert r.status_code == 400 and set(r.json()) == {"email"}
    assert counts() == before


@pytest.mark.parametrize("payload", [b"[]", b"42", b'"text"', b"null", b"{bad json", b"\xff\xfe"])
def test_malformed_json_is_a_400(api, payload):
    r = api.post("/api/v1/leads/", payload, content_type="application/json")
    assert r.status_code == 400
    assert Lead.objects.count() == 0


def test_not_json_is_a_415(api):
    r = api.post("/api/v1/leads/", "email=a@b.example", content_type="application/x-www-form-urlencoded")
    assert r.status_code == 415
    r = api.post("/api/v1/leads/", "hello", content_type="text/plain")
    assert r.status_code == 415


@pytest.mark.parametrize("media", ["application/vnd.api+json", "application/merge-patch+json; charset=utf-8"])
def test_a_structured_json_type_is_read_as_json(api, make_group, media):
    make_group(1, slug="emea")
    r = api.post("/api/v1/leads/", json.dumps(lead_body(group="emea")), content_type=media)
    assert r.status_code == 201, r.content
    assert r.json()["status"] == "assigned"


def test_json_patch_is_a_415(api, make_group):
    make_group(1, slug="emea")
    body = json.dumps([{"op": "add", "path": "/email", "value": "a@b.example"}])
    r = api.post("/api/v1/leads/", body, content_type="application/json-patch+json")
    assert r.status_code == 415
    assert "json-patch" in r.json()["detail"]
    assert Lead.objects.count() == 0


def test_body_over_64_kib_is_a_413(api):
    body = json.dumps({"email": "a@b.example", "company": "x" * (65 * 1024)})
    r = api.post("/api/v1/leads/", body, content_type="application/json")
    assert r.status_code == 413
    assert Lead.objects.count() == 0


def test_authentication_and_scopes(api_with, db):
    from rest_framework.test import APIClient

    anonymous = APIClient()
    assert anonymous.post("/api/v1/leads/", lead_body(), format="json").status_code == 401
    assert anonymous.get("/api/v1/leads/").status_code == 401
    assert "Bearer" in anonymous.get("/api/v1/leads/")["WWW-Authenticate"]
    wrong = APIClient()
    wrong.credentials(HTTP_AUTHORIZATION="Bearer not-a-token")
    assert wrong.post("/api/v1/leads/", lead_body(), format="json").status_code == 401
    basic = APIClient()
    basic.credentials(HTTP_AUTHORIZATION="Basic YTpi")
    assert basic.get("/api/v1/leads/").status_code == 401
    reader = api_with(["read"])
    assert reader.post("/api/v1/leads/", lead_body(), format="json").status_code == 403
    assert reader.get("/api/v1/leads/").status_code == 200
    assert reader.get("/api/v1/groups/").status_code == 403
    intake = api_with(["intake"])
    assert intake.get("/api/v1/leads/").status_code == 403
    assert intake.get("/api/v1/queue/").status_code == 403
    assert intake.post("/api/v1/leads/", lead_body(), format="json").status_code == 201


def test_revoked_token_is_refused(db):
    from rest_framework.test import APIClient

    from leads.models import ApiClient
    from tests.factories import api_client_with

    client, token = api_client_with(["read"])
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert api.get("/api/v1/leads/").status_code == 200
    ApiClient.objects.filter(pk=client.pk).update(active=False)
    assert api.get("/api/v1/leads/").status_code == 401
    assert client.token_hash != token and token not in str(ApiClient.objects.values_list())
    # Its SHA-256, which cannot be turned back into the token (not merely another spelling of it).
    assert client.token_hash == hashlib.sha256(token.encode()).hexdigest()


# --- idempotency ------------------------------------------------------------------------------


def test_idempotent_replay_is_byte_for_byte_and_writes_nothing(api, make_group):
    make_group(2, slug="emea")
    body = lead_body(group="emea")
    first = api.post("/api/v1/leads/", body, format="json", headers={"Idempotency-Key": "order-1"})
    assert first.status_code == 201
    before = counts()
    pointer = RotationState.objects.get(group__slug="emea").pointer
    again = api.post("/api/v1/leads/", body, format="json", headers={"Idempotency-Key": "order-1"})
    assert again.status_code == 200
    assert again["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    assert counts() == before
    assert RotationState.objects.get(group__slug="emea").pointer == pointer
    assert "Idempotent-Replayed" not in first


def test_a_duplicates_answer_is_replayed_as_it_was_and_audited_once(api_with, make_group):
    make_group(2, slug="emea")
    form = api_with(["intake"])  # a web form's token: the duplicate's answer holds no contact details
    first = form.post("/api/v1/leads/", {"email": "twice@acme.example", "group": "emea"}, format="json")
    dup = {"email": "TWICE@acme.example", "group": "emea", "first_name": "Other"}
    answer = form.post("/api/v1/leads/", dup, format="json", headers={"Idempotency-Key": "dup-1"})
    assert answer.status_code == 200 and answer.json()["duplicate_of"] == first.json()["id"]
    assert "Idempotent-Replayed" not in answer
    Lead.objects.filter(pk=first.json()["id"]).update(status="closed", outcome="won")  # changes nothing below
    before = counts()
    again = form.post("/api/v1/leads/", dup, format="json", headers={"Idempotency-Key": "dup-1"})
    assert (again.status_code, again["Idempotent-Replayed"], again.content) == (200, "true", answer.content)
    assert again["Location"] == answer["Location"] == f"/api/v1/leads/{first.json()['id']}/"
    assert counts() == before
    assert AuditEvent.objects.filter(type="lead.duplicate").count() == 1


def test_a_retry_is_replayed_even_after_its_requested_group_was_deleted(api, make_group):
    make_group(1, slug="emea", is_default=True)
    make_group(0, slug="gone")
    api.post(
        "/api/v1/rules/",
        {
            "name": "All FR",
            "priority": 1,
            "group": "emea",
            "conditions": [{"field": "country", "op": "in", "value": ["FR"]}],
        },
        format="json",
    )
    body = lead_body(group="gone", country="FR")  # a rule sends it to emea
    first = api.post("/api/v1/leads/", body, format="json", headers={"Idempotency-Key": "retry-1"})
    assert first.status_code == 201 and first.json()["group"] == "emea"
    assert api.delete("/api/v1/groups/gone/").status_code == 204
    again = api.post("/api/v1/leads/", body, format="json", headers={"Idempotency-Key": "retry-1"})
    assert again.status_code == 200 and again.content == first.content, again.content
    # A body refused as it stands now does not use the key up: corrected, it goes through.
    refused = api.post("/api/v1/leads/", lead_body(group="gone"), format="json", headers={"Idempotency-Key": "k2"})
    assert refused.status_code == 400
    fixed = api.post("/api/v1/leads/", lead_body(group="emea"), format="json", headers={"Idempotency-Key": "k2"})
    assert fixed.status_code == 201


def test_same_key_different_body_is_a_422(api, make_group):
    make_group(1, slug="emea")
    api.post("/api/v1/leads/", lead_body(group="emea"), format="json", headers={"Idempotency-Key": "k"})
    before = counts()
    r = api.post("/api/v1/leads/", lead_body(group="emea"), format="json", headers={"Idempotency-Key": "k"})
    assert r.status_code == 422
    assert r.json() == {"detail": "This Idempotency-Key was used with a different request body."}
    assert counts() == before


def test_a_retry_serialised_again_is_the_same_body(api, make_group):
    """The same body is the same JSON document, not the same bytes: a client library that
    serialises the retry again (another key order, whitespace, escapes, and whole numbers as
    JavaScript writes them) gets the replay, not a 422."""
    make_group(1, slug="emea")

    def post(text: str, key: str):
        return api.post("/api/v1/leads/", text, content_type="application/json", headers={"Idempotency-Key": key})

    first = post(
        '{"email": "same@acme.example", "group": "emea", "first_name": "Ren\\u00e9",'
        ' "attributes": {"budget": 1000.0, "ratio": 0.5, "seats": 1e1, "trial": true}}',
        "again-1",
    )
    assert first.status_code == 201, first.content
    before = counts()
    for text in (
        '{"attributes":{"trial":true,"seats":10,"ratio":0.5,"budget":1000},"first_name":"René",'
        '"group":"emea","email":"same@acme.example"}',
        '{ "email" : "same@acme.example" , "group" : "emea" , "first_name" : "René" ,\n'
        '  "attributes" : { "budget" : 1E3 , "ratio" : 5e-1 , "seats" : 10.0 , "trial" : true } }',
    ):
        again = post(text, "again-1")
        assert (again.status_code, again["Idempotent-Replayed"]) == (200, "true"), again.content
        assert again.content == first.content
    assert counts() == before
    # A different value is a different body, numbers included.
    for changed in ("1000.5", "1001", '"1000"', "true"):
        text = (
            '{"email": "same@acme.example", "group": "emea", "first_name": "René",'
            f' "attributes": {{"budget": {changed}, "ratio": 0.5, "seats": 10, "trial": true}}}}'
        )
        assert post(text, "again-1").status_code == 422, changed
    assert counts() == before


def test_same_key_in_flight_is_a_409(api, make_group):
    from leads.models import ApiClient
    from leads.services import request_fingerprint

    make_group(1, slug="emea")
    body = lead_body(group="emea")
    client = ApiClient.objects.get()
    from django.utils import timezone

    IdempotencyRecord.objects.create(
        client=client, key="busy", request_hash=request_fingerprint(body), created_at=timezone.now()
    )
    r = api.post("/api/v1/leads/", body, format="json", headers={"Idempotency-Key": "busy"})
    assert r.status_code == 409 and r["Retry-After"] == "1"  # when its answer is likely stored
    assert r.json() == {"detail": "A request with this Idempotency-Key is still in flight."}
    assert Lead.objects.count() == 0


def test_abandoned_in_flight_key_is_taken_over(api, make_group):
    from datetime import timedelta

    from django.utils import timezone

    from leads.models import ApiClient
    from leads.services import request_fingerprint

    make_group(1, slug="emea")
    body = lead_body(group="emea")
    IdempotencyRecord.objects.create(
        client=ApiClient.objects.get(),
        key="dead",
        request_hash=request_fingerprint(body),
        created_at=timezone.now() - timedelta(minutes=10),
    )
    r = api.post("/api/v1/leads/", body, format="json", headers={"Idempotency-Key": "dead"})
    assert r.status_code == 201


@pytest.mark.postgres
def test_a_key_claimed_by_a_connection_that_has_ended_is_taken_over_at_once(api, make_group):
    """The worker of the claiming request was killed: its connection, and its backend, ended
    with it. A retry takes the key over without waiting for the claim to go stale (60 s of 409s
    that said to retry in 1 s); a claim whose backend lives on is still in flight."""
    import psycopg
    from django.db import connection
    from django.utils import timezone

    from leads.models import ApiClient
    from leads.services import request_fingerprint

    make_group(1, slug="emea")
    body = lead_body(group="emea")
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    killed = psycopg.connect(**params)
    pid = killed.info.backend_pid
    record = IdempotencyRecord.objects.create(
        client=ApiClient.objects.get(),
        key="killed",
        request_hash=request_fingerprint(body),
        created_at=timezone.now(),
        claimed_by_pid=pid,
    )
    r = api.post("/api/v1/leads/", body, format="json", headers={"Idempotency-Key": "killed"})
    assert r.status_code == 409  # its backend lives: still in flight
    killed.close()
    with connection.cursor() as cursor:  # the backend ends a moment after its client goes
        for _ in range(100):
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid])
            if cursor.fetchone() is None:
                break
            time.sleep(0.02)
    r = api.post("/api/v1/leads/", body, format="json", headers={"Idempotency-Key": "killed"})
    assert r.status_code == 201, r.content
    record.refresh_from_db()
    assert record.state == IdempotencyRecord.State.DONE and record.claimed_by_pid != pid
    assert Lead.objects.count() == 1


def test_a_request_whose_key_was_taken_over_writes_nothing(api, make_group):
    # A request slower than IDEMPOTENCY_IN_FLIGHT_TIMEOUT_S has its key taken over by a retry;
    # when it reaches its routing transaction after all, it once wrote a second lead for the
    # same key (and overwrote the retry's stored answer).
    from datetime import timedelta

    from django.utils import timezone

    from leads import services
    from leads.api.views import render_lead
    from leads.models import ApiClient

    group, _reps = make_group(2, slug="emea")
    client = ApiClient.objects.get()
    body = lead_body(group="emea")
    fingerprint = services.request_fingerprint(body)
    slow = services.idempotency_claim(client=client, key="slow", fingerprint=fingerprint)
    IdempotencyRecord.objects.filter(pk=slow.pk).update(created_at=timezone.now() - timedelta(minutes=5))
    slow.created_at = timezone.now() - timedelta(minutes=5)
    retry = api.post("/api/v1/leads/", body, format="json", headers={"Idempotency-Key": "slow"})
    assert retry.status_code == 201
    data = {"email": body["email"]}
    with pytest.raises(services.IdempotencyConflict):
        services.lead_intake(
            data=data, requested=group, client=client, actor="api:test", render=render_lead, idempotency=slow
        )
    services.idempotency_release(slow)  # as the view does: it must not free the retry's key
    assert Lead.objects.count() == 1
    replay = api.post("/api/v1/leads/", body, format="json", headers={"Idempotency-Key": "slow"})
    assert replay.status_code == 200 and replay.content == retry.content


def test_a_batch_with_a_request_whose_key_was_taken_over_routes_the_others_alone(api, make_group):
    from datetime import timedelta

    from django.utils import timezone

    from leads import services
    from leads.api.views import render_lead
    from leads.models import ApiClient

    group, _reps = make_group(2, slug="emea")
    client = ApiClient.objects.get()
    jobs = []
    for key in ("fine", "slow"):
        data = lead_body()
        claim = services.idempotency_claim(client=client, key=key, fingerprint=services.request_fingerprint(data))
        jobs.append(
            services.IntakeJob(
                data,
                data,
                group,
                services.lead_resolve_group(data=data, requested=group),
                client,
                "api:test",
                "",
                services.normalize_email(data["email"]),
                idempotency=claim,
                render=render_lead,
            )
        )
    slow = jobs[1].idempotency
    earlier = timezone.now() - timedelta(minutes=5)
    IdempotencyRecord.objects.filter(pk=slow.pk).update(created_at=earlier)
    slow.created_at = earlier
    taken = services.idempotency_claim(client=client, key="slow", fingerprint=slow.request_hash)  # a retry's
    assert isinstance(taken, IdempotencyRecord)
    services._intake_batch(jobs)
    assert isinstance(jobs[1].error, services.IdempotencyConflict) and jobs[1].result is None
    assert jobs[0].error is None and jobs[0].result.status_code == 201
    assert list(Lead.objects.values_list("email", flat=True)) == [jobs[0].data["email"]]
    fine = IdempotencyRecord.objects.get(key="fine")
    assert fine.state == IdempotencyRecord.State.DONE and fine.lead_id == jobs[0].result.lead.id
    assert IdempotencyRecord.objects.get(key="slow").state == IdempotencyRecord.State.IN_FLIGHT


def test_a_request_outlived_by_its_claim_is_a_409(api, make_group, monkeypatch):
    from leads import services

    make_group(1, slug="emea")

    def taken_over(**kwargs):
        raise services.IdempotencyConflict()

    monkeypatch.setattr(services, "lead_intake", taken_over)
    r = api.post("/api/v1/leads/", lead_body(group="emea"), format="json", headers={"Idempotency-Key": "late"})
    assert r.status_code == 409 and "in flight" in r.json()["detail"]


def test_keys_are_scoped_per_client(api_with, make_group):
    make_group(2, slug="emea")
    one, two = api_with(["intake"]), api_with(["intake"])
    a = one.post("/api/v1/leads/", lead_body(group="emea"), format="json", headers={"Idempotency-Key": "same"})
    b = two.post("/api/v1/leads/", lead_body(group="emea"), format="json", headers={"Idempotency-Key": "same"})
    assert a.status_code == b.status_code == 201
    assert a.json()["id"] != b.json()["id"]


@pytest.mark.parametrize("key", ["", "x" * 256, "tab\there", "caf\u00e9"])
def test_bad_idempotency_key_is_a_400(api, key):
    r = api.post("/api/v1/leads/", lead_body(), format="json", headers={"Idempotency-Key": key})
    assert r.status_code == 400
    assert "Idempotency-Key" in r.json()


def test_a_bad_idempotency_key_is_named_with_the_bad_fields_of_the_body(api):
    """The key was refused before the body was read: a 400 naming the key alone, and the
    client's next try, with a good key, a second 400 for the fields."""
    r = api.post("/api/v1/leads/", {"email": "nope", "colour": "red"}, format="json", headers={"Idempotency-Key": ""})
    assert r.status_code == 400
    assert set(r.json()) == {"Idempotency-Key", "email", "colour"}
    assert not Lead.objects.exists()


def test_failed_request_releases_its_key(api, make_group):
    make_group(1, slug="emea")
    body = lead_body(group="emea")
    assert (
        api.post(
            "/api/v1/leads/", {**body, "score": 900}, format="json", headers={"Idempotency-Key": "retry-me"}
        ).status_code
        == 400
    )
    assert api.post("/api/v1/leads/", body, format="json", headers={"Idempotency-Key": "retry-me"}).status_code == 201


# --- dedup ------------------------------------------------------------------------------------


def test_duplicate_email_returns_the_open_lead_without_a_rotation_turn(api, make_group):
    group, reps = make_group(2, slug="emea")
    first = api.post("/api/v1/leads/", {"email": "Jane@Acme.example", "group": "emea"}, format="json").json()
    pointer = RotationState.objects.get(group=group).pointer
    r = api.post("/api/v1/leads/", {"email": "  jane@ACME.example ", "group": "emea"}, format="json")
    assert r.status_code == 200
    assert r.json()["duplicate_of"] == first["id"] and r.json()["id"] == first["id"]
    assert Lead.objects.count() == 1 and Assignment.objects.count() == 1
    assert RotationState.objects.get(group=group).pointer == pointer
    assert AuditEvent.objects.filter(type="lead.duplicate", lead_id=first["id"]).count() == 1


def test_dedup_window_is_the_groups(api, make_group):
    from datetime import timedelta

    make_group(2, slug="emea", dedup_days=1)
    first = api.post("/api/v1/leads/", {"email": "old@acme.example", "group": "emea"}, format="json").json()
    Lead.objects.filter(pk=first["id"]).update(
        created_at=Lead.objects.get(pk=first["id"]).created_at - timedelta(days=2)
    )
    r = api.post("/api/v1/leads/", {"email": "old@acme.example", "group": "emea"}, format="json")
    assert r.status_code == 201 and r.json()["id"] != first["id"]


def test_a_group_without_a_window_finds_no_lead_taken_while_the_post_waited(api, make_group):
    """dedup_days 0: a lead of the address committed while the post waited for the address's
    lock (created after the post's clock was read, shown here by a later created_at) was found
    inside a window of length 0, and the post answered as a duplicate."""
    make_group(2, slug="zero", dedup_days=0)
    first = api.post("/api/v1/leads/", {"email": "z@acme.example", "group": "zero"}, format="json").json()
    Lead.objects.filter(pk=first["id"]).update(created_at=timezone.now() + timedelta(seconds=5))
    r = api.post("/api/v1/leads/", {"email": "z@acme.example", "group": "zero"}, format="json")
    assert r.status_code == 201 and r.json()["duplicate_of"] is None and r.json()["id"] != first["id"]
    simulated = api.post("/api/v1/routing/simulate/", {"email": "z@acme.example", "group": "zero"}, format="json")
    assert simulated.status_code == 200 and simulated.json().get("duplicate_of") is None
    assert not AuditEvent.objects.filter(type="lead.duplicate").exists()


def test_the_new_leads_group_window_decides_across_groups(api, make_group):
    """An open lead in one group is a duplicate for a submission that resolves to another
    group only within that other group's window; dedup_days 0 keeps no window at all."""
    make_group(1, slug="emea")
    make_group(1, slug="zero", dedup_days=0)
    make_group(1, slug="one", dedup_days=1)
    first = api.post("/api/v1/leads/", {"email": "w@acme.example", "group": "emea"}, format="json").json()
    Lead.objects.filter(pk=first["id"]).update(created_at=timezone.now() - timedelta(hours=30))
    for slug in ("zero", "one"):
        r = api.post("/api/v1/leads/", {"email": "W@acme.example", "group": slug}, format="json")
        assert r.status_code == 201 and r.json()["group"] == slug and r.json()["duplicate_of"] is None
        Lead.objects.filter(pk=r.json()["id"]).update(created_at=timezone.now() - timedelta(hours=30))
    newest = Lead.objects.order_by("-id").first()
    assert newest.group.slug == "one"
    # The 30-day window of emea finds the newest open lead of the address, in another group.
    r = api.post("/api/v1/leads/", {"email": "w@acme.example", "group": "emea"}, format="json")
    assert r.status_code == 200 and r.json()["duplicate_of"] == newest.id and r.json()["group"] == "one"
    # A closed lead is no duplicate: the next open one is found instead.
    Lead.objects.filter(pk=newest.id).update(status="closed", outcome="lost")
    r = api.post("/api/v1/leads/", {"email": "w@acme.example", "group": "emea"}, format="json")
    assert r.status_code == 200 and r.json()["duplicate_of"] != newest.id
    assert Lead.objects.count() == 3
    assert AuditEvent.objects.filter(type="lead.duplicate").count() == 2


def test_a_duplicate_says_whose_dedup_window_found_it(api, make_group):
    """The window is the one of the group the new submission resolves to, which need not be
    the open lead's: the audit names that group and the rule that chose it."""
    make_group(1, slug="emea")
    make_group(1, slug="france", dedup_days=7)
    api.post(
        "/api/v1/rules/",
        {
            "name": "FR",
            "priority": 1,
            "conditions": [{"field": "country", "op": "equals", "value": "FR"}],
            "group": "france",
        },
        format="json",
    )
    first = api.post("/api/v1/leads/", {"email": "d@acme.example", "group": "emea"}, format="json").json()
    r = api.post("/api/v1/leads/", {"email": "d@acme.example", "country": "FR"}, format="json")
    assert r.status_code == 200 and r.json()["duplicate_of"] == first["id"]
    (event,) = [e for e in api.get(f"/api/v1/leads/{first['id']}/events/").json() if e["type"] == "lead.duplicate"]
    assert event["group"] == "emea"  # the open lead's
    explanation = event["explanation"]
    assert explanation["dedup_days"] == 7 and explanation["dedup_group"] == "france"
    assert explanation["rule"] == "FR" and explanation["rules_tried"] == ["FR"]
    # No routing decision was taken: a replay of the window has the first lead's turn only.
    now = timezone.now()
    window = {"since": (now - timedelta(hours=1)).isoformat(), "until": (now + timedelta(minutes=1)).isoformat()}
    assert api.post("/api/v1/routing/replay/", window, format="json").json()["turns"] == 1


def test_closed_lead_is_not_a_duplicate(api, make_group):
    make_group(1, slug="emea")
    first = api.post("/api/v1/leads/", {"email": "c@acme.example", "group": "emea"}, format="json").json()
    Lead.objects.filter(pk=first["id"]).update(status="closed", outcome="lost")
    assert api.post("/api/v1/leads/", {"email": "c@acme.example", "group": "emea"}, format="json").status_code == 201


# --- reads ------------------------------------------------------------------------------------


def test_list_filters_and_pagination(api, make_group):
    group, reps = make_group(2, slug="emea")
    make_group(0, slug="empty")
    for _ in range(5):
        api.post("/api/v1/leads/", lead_body(group="emea"), format="json")
    api.post("/api/v1/leads/", lead_body(group="empty"), format="json")
    page = api.get("/api/v1/leads/?page_size=2").json()
    assert page["count"] == 6 and len(page["results"]) == 2 and page["next"]
    assert api.get("/api/v1/leads/?status=queued").json()["count"] == 1
    assert api.get("/api/v1/leads/?group=emea").json()["count"] == 5
    assert api.get(f"/api/v1/leads/?owner={reps[0].id}").json()["count"] == 3
    assert api.get("/api/v1/leads/?created_after=2000-01-01T00:00:00Z").json()["count"] == 6
    assert api.get("/api/v1/leads/?created_after=2999-01-01T00:00:00Z").json()["count"] == 0
    # Strictly after: a lead's own created_at lists the leads that came in after it.
    third = api.get("/api/v1/leads/?page_size=10").json()["results"][3]  # newest first: the third posted
    later = api.get("/api/v1/leads/", {"created_after": third["created_at"]}).json()
    assert third["id"] not in [lead["id"] for lead in later["results"]]
    assert later["count"] == Lead.objects.filter(created_at__gt=Lead.objects.get(pk=third["id"]).created_at).count()
    assert api.get("/api/v1/leads/?status=bogus").status_code == 400
    assert api.get("/api/v1/leads/?created_after=yesterday").status_code == 400
    assert api.get("/api/v1/leads/?owner=abc").status_code == 400
    for odd in ("3.9", "1e3", str(2**63)):  # a rep id is a whole number in range, never rounded
        r = api.get(f"/api/v1/leads/?owner={odd}")
        assert r.status_code == 400 and "owner" in r.json(), (odd, r.content)
    assert api.get("/api/v1/leads/?page=99").status_code == 404


def test_get_one_and_missing(api, make_group):
    make_group(1, slug="emea")
    lead = api.post("/api/v1/leads/", lead_body(group="emea", company="Acme"), format="json").json()
    got = api.get(f"/api/v1/leads/{lead['id']}/").json()
    assert got["company"] == "Acme" and got["status"] == "assigned" and got["escalations"] == 0
    assert api.get("/api/v1/leads/999999/").status_code == 404
    assert api.get("/api/v1/leads/999999/events/").status_code == 404
    assert api.get("/api/v1/leads/abc/").status_code == 404


def test_schema_docs_and_health(client, db):
    assert client.get("/api/schema/").status_code == 200
    assert b"/api/v1/leads/" in client.get("/api/schema/").content
    assert client.get("/api/docs/").status_code == 200
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["database"] == "ok"


def test_idempotency_keys_are_kept_for_their_retention_then_purged(api, make_group, settings):
    from datetime import timedelta

    from django.utils import timezone

    from leads.services import idempotency_purge

    settings.IDEMPOTENCY_TTL_HOURS = 24
    make_group(1, slug="emea")
    body = lead_body(group="emea")
    first = api.post("/api/v1/leads/", body, format="json", headers={"Idempotency-Key": "keep"})
    assert idempotency_purge(now=timezone.now() + timedelta(hours=23)) == 0
    again = api.post("/api/v1/leads/", body, format="json", headers={"Idempotency-Key": "keep"})
    assert again.status_code == 200 and again.content == first.content
    assert idempotency_purge(now=timezone.now() + timedelta(hours=25)) == 1
    assert not IdempotencyRecord.objects.exists()


def test_a_retention_of_idempotency_keys_under_24_hours_is_refused_at_start():
    import subprocess
    import sys

    env = {**os.environ, "IDEMPOTENCY_TTL_HOURS": "12", "DJANGO_SETTINGS_MODULE": "routing_project.settings.base"}
    done = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode != 0
    assert "IDEMPOTENCY_TTL_HOURS is 12: keys are kept at least 24 hours." in done.stderr


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("ROUTING_LOCK_TIMEOUT_MS", "0", "ROUTING_LOCK_TIMEOUT_MS is 0: give at least 1 (ms)."),
        ("ROUTING_LOCK_TIMEOUT_MS", "-5", "ROUTING_LOCK_TIMEOUT_MS is -5: give at least 1 (ms)."),
        ("ROUTING_MAX_RETRIES", "-1", "ROUTING_MAX_RETRIES is -1: give 0 or more."),
        ("IDEMPOTENCY_IN_FLIGHT_TIMEOUT_S", "0", "IDEMPOTENCY_IN_FLIGHT_TIMEOUT_S is 0: give at least 1 (s)."),
        ("IDEMPOTENCY_IN_FLIGHT_TIMEOUT_S", "-60", "IDEMPOTENCY_IN_FLIGHT_TIMEOUT_S is -60: give at least 1 (s)."),
    ],
)
def test_a_routing_setting_that_would_hang_or_skip_intake_is_refused_at_start(name, value, message):
    # A lock_timeout of 0 is PostgreSQL's "wait for ever" (a held rotation row would hang
    # intake instead of answering 503), fewer than 0 retries would never route at all, and an
    # in-flight timeout of 0 would let every retry take a running request's key over.
    import subprocess
    import sys

    env = {**os.environ, name: value, "DJANGO_SETTINGS_MODULE": "routing_project.settings.base"}
    done = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode != 0
    assert message in done.stderr


def test_a_lead_posted_to_a_group_deleted_meanwhile_is_a_400_naming_the_group(api, make_group, monkeypatch):
    """The slug was a group's when the request read it; the group (and its rotation row) was
    deleted before the request took the lock: a 400 on `group`, as for a slug naming no
    group, not a 404 about an internal rotation row, and nothing written."""
    from leads import services
    from rotation.models import Group

    make_group(1, slug="going")
    resolve = services.lead_resolve_group

    def resolve_then_lose(**kwargs):
        resolution = resolve(**kwargs)
        Group.objects.filter(slug="going").delete()  # another request's delete, committed first
        return resolution

    monkeypatch.setattr(services, "lead_resolve_group", resolve_then_lose)
    r = api.post("/api/v1/leads/", lead_body(group="going"), format="json", headers={"Idempotency-Key": "k-going"})
    assert r.status_code == 400, r.content
    # Met under the lock, or (when the process's configuration snapshot was confirmed first)
    # answered again under the new configuration, where the slug names no group.
    assert r.json()["group"][0] in (
        "The group was deleted while this lead was being taken in.",
        "No group with slug 'going'.",
    )
    assert set(r.json()) == {"group"}
    assert not Lead.objects.exists() and not AuditEvent.objects.filter(type__startswith="lead.").exists()
    monkeypatch.setattr(services, "lead_resolve_group", resolve)
    again = api.post("/api/v1/leads/", lead_body(group="going"), format="json", headers={"Idempotency-Key": "k-going"})
    assert again.status_code == 400 and "going" in again.json()["group"][0]  # the key was not used up


def test_the_rotation_lock_of_a_deleted_group_names_the_group(make_group):
    from django.core.exceptions import ValidationError

    from leads import routing
    from rotation.models import Group

    group, _ = make_group(1, slug="going")
    Group.objects.filter(pk=group.pk).delete()
    with pytest.raises(ValidationError) as refused:
        routing.lock_rotation(group.pk)
    assert refused.value.message_dict == {"group": ["The group was deleted while this lead was being taken in."]}
