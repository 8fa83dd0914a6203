"""Every 201 says where the created resource lives (Location), as intake's does, and the
address it gives is the one that resource answers at."""

import json
import time

import pytest
from django.test import Client

from hooks import services as hook_services

pytestmark = pytest.mark.django_db


def test_each_configuration_resource_created_answers_with_its_location(api, make_group):
    _group, (rep,) = make_group(1, slug="north")

    group = api.post("/api/v1/groups/", {"slug": "south", "name": "South"}, format="json")
    assert group.status_code == 201 and group["Location"] == "/api/v1/groups/south/"
    assert api.get(group["Location"]).json()["slug"] == "south"

    new_rep = api.post("/api/v1/reps/", {"name": "Ada", "email": "ada@reps.example"}, format="json")
    rep_id = new_rep.json()["id"]
    assert new_rep.status_code == 201 and new_rep["Location"] == f"/api/v1/reps/{rep_id}/"
    assert api.get(new_rep["Location"]).json()["email"] == "ada@reps.example"

    member = api.post("/api/v1/groups/south/members/", {"rep": rep_id}, format="json")
    assert member.status_code == 201 and member["Location"] == f"/api/v1/groups/south/members/{rep_id}/"
    assert api.get(member["Location"]).json()["rep"] == rep_id
    assert api.patch(member["Location"], {"weight": 2}, format="json").json()["weight"] == 2
    assert api.get(member["Location"]).json()["weight"] == 2

    rule = api.post(
        "/api/v1/rules/",
        {"name": "France", "conditions": [{"field": "country", "op": "equals", "value": "FR"}], "group": "south"},
        format="json",
    )
    assert rule.status_code == 201 and rule["Location"] == f"/api/v1/rules/{rule.json()['id']}/"
    assert api.get(rule["Location"]).json()["name"] == "France"

    absence = api.post(
        f"/api/v1/reps/{rep.pk}/absences/",
        {"starts_at": "2030-01-01T00:00:00Z", "ends_at": "2030-01-02T00:00:00Z"},
        format="json",
    )
    assert absence.status_code == 201
    assert absence["Location"] == f"/api/v1/reps/{rep.pk}/absences/{absence.json()['id']}/"
    assert api.get(absence["Location"]).json() == absence.json()
    assert api.delete(absence["Location"]).status_code == 204
    assert api.get(absence["Location"]).status_code == 404


def test_a_member_or_absence_is_read_only_under_its_own_group_or_rep(api, make_group):
    make_group(1, slug="north")
    _south, (stranger,) = make_group(1, slug="south")
    assert api.get(f"/api/v1/groups/north/members/{stranger.pk}/").status_code == 404
    assert api.get(f"/api/v1/groups/nowhere/members/{stranger.pk}/").status_code == 404
    absence = api.post(
        f"/api/v1/reps/{stranger.pk}/absences/",
        {"starts_at": "2030-01-01T00:00:00Z", "ends_at": "2030-01-02T00:00:00Z"},
        format="json",
    ).json()
    other = api.post("/api/v1/reps/", {"name": "Bo", "email": "bo@reps.example"}, format="json").json()
    assert api.get(f"/api/v1/reps/{other['id']}/absences/{absence['id']}/").status_code == 404


def test_a_lead_taken_in_by_the_signed_hook_answers_with_its_location(make_group):
    make_group(1, slug="north", is_default=True)
    _source, secret = hook_services.source_create(slug="form", name="Form", actor="test", field_map={})
    body = json.dumps({"email": "hooked@customer.example"}).encode()
    signature = hook_services.sign(secret=secret, body=body, timestamp=int(time.time()))
    r = Client().post("/api/v1/hooks/form/", body, content_type="application/json", headers={"X-Signature": signature})
    assert r.status_code == 201 and r["Location"] == f"/api/v1/leads/{r.json()['id']}/"


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/groups/",
        "/api/v1/reps/",
        "/api/v1/rules/",
        "/api/v1/groups/{group_slug}/members/",
        "/api/v1/reps/{rep_id}/absences/",
        "/api/v1/hooks/{source}/",
    ],
)
def test_the_schema_documents_the_location_of_each_201(path):
    operation = Client().get("/api/schema/?format=json").json()["paths"][path]["post"]
    assert operation["responses"]["201"]["headers"]["Location"]["required"] is True
