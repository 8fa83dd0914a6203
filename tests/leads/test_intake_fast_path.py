"""The intake fast path stays the same product: its answer is what LeadSerializer gives, and
the configuration it keeps in memory follows every change at the next request."""

import pytest
from django.utils import timezone
from rest_framework.renderers import JSONRenderer

from leads.api.serializers import LeadSerializer, lead_document
from leads.api.views import render_lead
from leads.models import ApiClient, Lead
from rotation import services as rotation_services
from rotation.models import Account, Group, RoutingRule
from routing_project import configcache
from tests.conftest import lead_body
from tests.factories import RepFactory

pytestmark = pytest.mark.django_db


def serializer_bytes(lead: Lead, duplicate_of: int | None = None) -> bytes:
    return JSONRenderer().render(LeadSerializer(lead, context={"duplicate_of": duplicate_of}).data)


def test_intake_answer_equals_the_serializer_for_every_state(api, make_group):
    group, _reps = make_group(2, slug="docs", sla_minutes=15)
    assigned = api.post(
        "/api/v1/leads/",
        lead_body(
            group="docs", first_name="Zoë", company="Ünïcode\u2028Ltd", score=7, attributes={"a": 1.5, "b": True}
        ),
        format="json",
    )
    assert assigned.status_code == 201
    lead = Lead.objects.select_related("group", "owner").get(pk=assigned.json()["id"])
    assert assigned.content == serializer_bytes(lead)

    duplicate = api.post("/api/v1/leads/", {"email": lead.email, "group": "docs"}, format="json")
    assert duplicate.status_code == 200
    assert duplicate.content == serializer_bytes(lead, duplicate_of=lead.id)

    Group.objects.filter(pk=group.pk).update(active=False)
    queued = api.post("/api/v1/leads/", lead_body(group="docs"), format="json")
    assert queued.json()["status"] == "queued"
    queued_lead = Lead.objects.select_related("group", "owner").get(pk=queued.json()["id"])
    assert queued.content == serializer_bytes(queued_lead)

    # Accepted and closed with an outcome; no group and no owner.
    lead.accepted_at = timezone.now()
    lead.closed_at = timezone.now()
    lead.outcome = "won"
    lead.status = "closed"
    assert render_lead(lead, None) == serializer_bytes(lead)
    bare = Lead(email="x@y.example", status="queued", queue_reason="", created_at=timezone.now())
    assert lead_document(bare) == LeadSerializer(bare, context={}).data
    assert render_lead(bare, None) == serializer_bytes(bare)


@pytest.mark.postgres
def test_configuration_changes_are_seen_by_the_next_request(api, make_group):
    north, north_reps = make_group(1, slug="north")
    south, south_reps = make_group(1, slug="south")
    configcache.clear()

    def post(**fields):
        r = api.post("/api/v1/leads/", lead_body(**fields), format="json")
        assert r.status_code in (200, 201), r.content
        return r.json()

    assert post(group="north")["group"] == "north"
    version = configcache.config_version()
    # A rule: the next lead follows it.
    RoutingRule.objects.create(
        name="fr", priority=1, conditions=[{"field": "country", "op": "in", "value": ["FR"]}], group=south
    )
    assert configcache.config_version() != version
    assert post(group="north", country="FR")["group"] == "south"
    # The rule switched off, in bulk (a statement, not a save).
    RoutingRule.objects.update(active=False)
    assert post(group="north", country="FR")["group"] == "north"
    # An account: its owner takes the lead when a member of the group.
    rotation_services.membership_add(group=north, rep=south_reps[0], actor="test")
    Account.objects.create(domain="acme.example", owner=south_reps[0])
    assert post(group="north", email="a@acme.example")["owner"]["id"] == south_reps[0].id
    # The owner deactivated: the account no longer counts.
    type(south_reps[0]).objects.filter(pk=south_reps[0].pk).update(active=False)
    assert post(group="north", email="b@acme.example")["owner"]["id"] == north_reps[0].id
    # A group renamed: the old slug is unknown at once.
    Group.objects.filter(pk=north.pk).update(slug="north-2")
    r = api.post("/api/v1/leads/", lead_body(group="north"), format="json")
    assert r.status_code == 400 and "group" in r.json()


@pytest.mark.postgres
def test_a_revoked_token_is_refused_at_the_next_request(api_with):
    client = api_with(["intake", "read"])
    assert client.get("/api/v1/leads/").status_code == 200
    ApiClient.objects.update(active=False)
    assert client.get("/api/v1/leads/").status_code == 401


@pytest.mark.postgres
def test_the_version_moves_on_every_configuration_write_and_not_on_last_use():
    v0 = configcache.config_version()
    rep = RepFactory()
    v1 = configcache.config_version()
    assert v1 != v0
    type(rep).objects.filter(pk=rep.pk).update(name="Renamed")  # not read before a lock
    assert configcache.config_version() == v1
    ApiClient.objects.update(last_used_at=timezone.now())
    assert configcache.config_version() == v1
    type(rep).objects.filter(pk=rep.pk).update(active=False)
    assert configcache.config_version() != v1


def test_values_past_64_bits_are_stored_as_sent(api, make_group):
    make_group(1, slug="big")
    r = api.post("/api/v1/leads/", lead_body(group="big", attributes={"n": 2**70, "x": -(2**65)}), format="json")
    assert r.status_code == 201, r.content
    assert Lead.objects.get(pk=r.json()["id"]).attributes == {"n": 2**70, "x": -(2**65)}
