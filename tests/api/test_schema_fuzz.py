"""Schemathesis against /api/schema/ (SPEC 10): every operation, positive and negative data,
schemathesis' default checks: no 5xx, status codes documented, responses and headers conform
to the schema, bad input rejected with a 4xx. Runs in-process against the WSGI app on a seeded
PostgreSQL database, with a token holding every scope; bounded so it takes about a minute."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, Phase, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from hooks import services as hook_services
from leads.models import ApiClient
from rotation.models import RoutingRule
from tests.conftest import api_for, lead_body
from tests.factories import api_client_with

MAX_EXAMPLES = 25
SUMMARY = Path(__file__).resolve().parents[2] / "var" / "schemathesis-summary.json"

pytestmark = [pytest.mark.xdist_group("schemathesis"), pytest.mark.slow]

RAN: dict[str, Counter] = defaultdict(Counter)


@pytest.fixture
def seeded(db, make_group):
    """Groups, reps, memberships, a rule, leads (assigned and queued) and an intake source, so
    the fuzzer's ids and slugs sometimes hit real objects."""
    group, reps = make_group(3, slug="emea", is_default=True, sla_minutes="30")
    make_group(1, slug="apac")
    RoutingRule.objects.create(
        name="france", priority=1, conditions=[{"field": "country", "op": "in", "value": ["FR"]}], group=group
    )
    api = api_for(["intake", "read", "manage"])
    for i in range(3):
        api.post("/api/v1/leads/", lead_body(country="FR", first_name=f"Seed{i}"), format="json")
    hook_services.source_create(slug="webform", name="Web form", actor="test")
    client, token = api_client_with(["intake", "read", "manage"], name="fuzzer")
    ApiClient.objects.filter(pk=client.pk).update(rate_limit_per_minute=1_000_000)
    return token


@pytest.fixture
def token(seeded):
    """The real WSGI handler closes the connection around each request (Django's test client
    avoids that the same way, and reconnects it after each of its requests: so after seeding);
    the test's transaction must survive every request."""
    for signal in (request_started, request_finished):
        signal.disconnect(close_old_connections)
    yield seeded
    for signal in (request_started, request_finished):
        signal.connect(close_old_connections)


@pytest.fixture(scope="module", autouse=True)
def _summary():
    yield
    if RAN:
        SUMMARY.parent.mkdir(exist_ok=True)
        SUMMARY.write_text(
            json.dumps(
                {
                    "operations": len(RAN),
                    "cases": sum(sum(c.values()) for c in RAN.values()),
                    "by_operation": {op: dict(sorted(c.items())) for op, c in sorted(RAN.items())},
                },
                indent=2,
            )
        )


def _load_schema() -> schemathesis.schemas.BaseSchema:
    # Loaded at collection (no database needed to render the schema), so every operation is a
    # test of its own. (schemathesis' lazy `from_fixture` does not work with pytest 9.)
    from routing_project.wsgi import application

    loaded = schemathesis.openapi.from_wsgi("/api/schema/?format=json", application)
    loaded.config.generation.update(
        modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
        max_examples=MAX_EXAMPLES,
        allow_x00=True,
        # Unknown query parameters are ignored on purpose (cache busters, tracking tags), as
        # HTTP APIs do; unknown body fields are rejected, tested in tests/leads.
        allow_extra_parameters=False,
    )
    return loaded


schema = _load_schema()


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.generate],
    derandomize=True,
    database=None,
)
def test_api_conforms_to_its_schema(case, token):
    response = case.call_and_validate(
        headers={"Authorization": f"Bearer {token}"}, excluded_checks=[positive_data_acceptance]
    )
    sent = "" if case.method.upper() == case.operation.method.upper() else f"{case.method.upper()} "
    RAN[f"{case.operation.method.upper()} {case.operation.path}"][f"{sent}{response.status_code}"] += 1
