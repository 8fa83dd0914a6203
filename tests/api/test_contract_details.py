"""Small parts of the contract a client or an operator meets: a replay carries the first
answer's Location, probes answer only reads, and a drain for a deleted group is a no-op."""

import pytest
from django.test import Client

from leads import actions
from rotation.models import Group
from tests.conftest import lead_body

pytestmark = pytest.mark.django_db


def test_an_idempotent_replay_carries_the_location_of_the_first_answer(api, make_group):
    make_group(2, slug="north")
    body = lead_body(group="north")
    first = api.post("/api/v1/leads/", body, format="json", headers={"Idempotency-Key": "loc-1"})
    again = api.post("/api/v1/leads/", body, format="json", headers={"Idempotency-Key": "loc-1"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert again["Idempotent-Replayed"] == "true"
    assert again["Location"] == first["Location"] == f"/api/v1/leads/{first.json()['id']}/"


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics"])
def test_probes_answer_get_and_head_and_refuse_writes_with_a_405(path):
    client = Client()
    assert client.get(path).status_code == 200
    assert client.head(path).status_code == 200
    for method in ("post", "put", "delete"):
        r = getattr(client, method)(path)
        assert r.status_code == 405 and "GET" in r["Allow"]


def test_a_queue_drain_for_a_deleted_group_routes_nothing_and_raises_nothing(make_group):
    group, _reps = make_group(1)
    group_id = group.pk
    Group.objects.filter(pk=group_id).delete()
    assert actions.queue_drain(group_id=group_id) == 0


@pytest.mark.parametrize("spelled", [lambda pk: pk + 0.5, float, str])
def test_a_member_is_named_by_an_integer_id_only(api, make_group, spelled):
    group, _none = make_group(0, slug="north")
    _other, (rep,) = make_group(1)
    r = api.post("/api/v1/groups/north/members/", {"rep": spelled(rep.pk)}, format="json")
    assert r.status_code == 400 and "rep" in r.json(), r.content
    assert not group.memberships.exists()
    assert api.post("/api/v1/groups/north/members/", {"rep": rep.pk}, format="json").status_code == 201


def test_a_patch_naming_a_field_it_cannot_change_says_read_only_not_unknown(api, make_group):
    make_group(1, slug="north")
    lead_id = api.post("/api/v1/leads/", lead_body(group="north"), format="json").json()["id"]
    r = api.patch(f"/api/v1/leads/{lead_id}/", {"country": "DE", "score": 3, "colour": "red"}, format="json")
    assert r.status_code == 400
    assert r.json() == {
        "country": ["This field is read-only."],
        "score": ["This field is read-only."],
        "colour": ["Unknown field."],
    }
