"""Intake starts on the process's last known configuration and checks its version in the
routing transaction (routing_project/configcache.py: `defer`): a change committed before the
request still decides its answer, never a stale copy, and a request answered again under the
new configuration writes and counts once."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from leads import services
from leads.models import ApiClient, Lead
from rotation.models import Group
from routing_project import configcache
from tests.conftest import lead_body, start_of_a_window
from tests.factories import GroupFactory, api_client_with

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

LEADS = "/api/v1/leads/"


def test_a_token_revoked_after_the_process_cached_it_is_refused_at_intake(api_with, make_group):
    make_group(2, slug="north")
    api = api_with(["intake"])
    assert api.post(LEADS, lead_body(group="north"), format="json").status_code == 201  # cached now
    ApiClient.objects.update(active=False)
    r = api.post(LEADS, lead_body(group="north"), format="json")
    assert r.status_code == 401, r.content
    assert Lead.objects.count() == 1


def test_an_answer_given_before_the_transaction_is_checked_against_the_version(api_with, make_group):
    """A 400 from the cached configuration is given again under the new one: here the token
    was revoked, so it is a 401."""
    make_group(2, slug="north")
    api = api_with(["intake"])
    assert api.post(LEADS, lead_body(group="north"), format="json").status_code == 201
    ApiClient.objects.update(active=False)
    r = api.post(LEADS, {"email": "not an address", "group": "north"}, format="json")
    assert r.status_code == 401, r.content


def test_a_group_created_after_the_process_cached_the_configuration_takes_leads_at_once(api, make_group):
    make_group(2, slug="north")
    assert api.post(LEADS, lead_body(group="north"), format="json").status_code == 201
    assert api.post(LEADS, lead_body(group="south"), format="json").status_code == 400  # unknown: cached
    make_group(2, slug="south")
    r = api.post(LEADS, lead_body(group="south"), format="json")
    assert r.status_code == 201, r.content
    assert r.json()["group"] == "south"


def test_a_deferred_intake_reads_the_version_in_its_transaction_only(api, make_group):
    make_group(2, slug="north")
    assert api.post(LEADS, lead_body(group="north"), format="json").status_code == 201
    with CaptureQueriesContext(connection) as queries:
        assert api.post(LEADS, lead_body(group="north"), format="json").status_code == 201
    reads = [q["sql"] for q in queries.captured_queries if "rotation_configversion" in q["sql"]]
    assert len(reads) == 1 and "pg_advisory_xact_lock" in reads[0], reads


def test_an_intake_answered_again_counts_once_against_the_rate_limit(make_group):
    from rest_framework.test import APIClient

    make_group(2, slug="north")
    client, token = api_client_with(["intake"])
    ApiClient.objects.filter(pk=client.pk).update(rate_limit_per_minute=2)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    start_of_a_window(5)
    assert api.post(LEADS, lead_body(group="north"), format="json").status_code == 201  # 1 of 2
    GroupFactory()  # the configuration moves: the next intake is answered again
    assert api.post(LEADS, lead_body(group="north"), format="json").status_code == 201  # 2 of 2, once
    assert api.post(LEADS, lead_body(group="north"), format="json").status_code == 429


def test_a_batch_routes_its_current_jobs_and_hands_the_stale_ones_back(make_group):
    group, reps = make_group(2, slug="north")
    version = configcache.config_version()
    assert version is not None

    def job(config_version: int) -> services.IntakeJob:
        data = lead_body(group="north")
        return services.IntakeJob(
            data,
            dict(data),
            group,
            services.lead_resolve_group(data=data, requested=group),
            None,
            "test",
            "",
            services.normalize_email(data["email"]),
            config_version=config_version,
        )

    current, stale = job(version), job(version - 1)
    services._intake_batch([current, stale])
    assert current.result is not None and current.result.status_code == 201 and current.config_checked
    assert isinstance(stale.error, configcache.StaleConfiguration) and stale.result is None
    assert not stale.config_checked
    assert list(Lead.objects.values_list("email_normalized", flat=True)) == [current.email_normalized]
    # Alone, a stale job is handed back too, with nothing written.
    lone = job(version - 1)
    services._intake_batch([lone])
    assert isinstance(lone.error, configcache.StaleConfiguration)
    assert Lead.objects.count() == 1
    assert Group.objects.filter(slug="north").exists()
