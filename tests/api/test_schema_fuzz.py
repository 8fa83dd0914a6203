"""Schemathesis against /api/schema/ (SPEC 10): every operation, positive and negative data,
schemathesis' default checks: no 5xx, status codes documented, responses and headers conform
to the schema, bad input rejected with a 4xx. Runs in-process against the WSGI app on a seeded
PostgreSQL database, with a token holding every scope; bounded so it takes about a minute."""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from datetime import timedelta
from pathlib import Path

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.utils import timezone
from hypothesis import HealthCheck, Phase, settings
from schemathesis import GenerationMode
from schemathesis.generation.feedback import FeedbackSources
from schemathesis.pytest._test_builder import build_operation_test  # pinned version: see requirements-dev
from schemathesis.specs.openapi.checks import positive_data_acceptance

from hooks import services as hook_services
from leads.models import ApiClient, Lead
from rotation.models import Absence, RoutingRule
from tests.conftest import api_for, lead_body
from tests.factories import api_client_with

MAX_EXAMPLES = int(os.environ.get("FUZZ_MAX_EXAMPLES", "25"))
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
    now = timezone.now()
    absence = Absence.objects.create(rep=reps[0], starts_at=now + timedelta(days=1), ends_at=now + timedelta(days=2))
    lead = Lead.objects.order_by("id").first()
    assert lead is not None
    REAL.clear()
    REAL.update(
        {
            "slug": "emea",
            "group_slug": "emea",
            "source": "webform",
            "rep_id": reps[0].id,
            "absence": absence.id,
            "rep": reps[1].id,
            "rule": RoutingRule.objects.get().id,
            "lead": lead.id,
        }
    )
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
    # Loaded at collection (rendering the schema needs no database), so every operation is a
    # test of its own with a node id of its own: xdist runs each. (schemathesis' own
    # `parametrize` gives its items one shared node id under pytest 9, so xdist would run one.)
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
OPERATIONS = [result.ok() for result in schema.get_all_operations()]
SETTINGS = settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.generate],
    derandomize=True,
    database=None,
)


REAL: dict[str, object] = {}  # the seeded objects' slugs and ids (set by `seeded`)


def aim(path: str, parameters: dict | None) -> dict | None:
    """A case's path parameters pointed at seeded objects (for two cases in three), so the
    bodies and queries the fuzzer makes reach real groups, reps, rules, leads and sources
    instead of 404s. Assigned back to the case as a new dict: schemathesis then re-validates
    the case, so a negative case whose only flaw was in the path is known to be valid now."""
    if not parameters:
        return parameters
    aimed = dict(parameters)
    for name in aimed:
        if name == "id":
            kind = "absence" if "/absences/" in path else path.split("/")[3].rstrip("s")  # reps, rules, leads
            aimed[name] = str(REAL.get(kind, aimed[name]))  # the schema's path parameters are strings
        elif name in REAL:
            aimed[name] = str(REAL[name])
    return aimed


def may_aim(case) -> bool:
    """Whether the case's path parameters may be replaced: positive cases only (a negative
    case may be negative by its path alone, and must stay so)."""
    meta = case._meta  # schemathesis' generation record (pinned version: see requirements-dev)
    return meta is not None and meta.generation.mode == GenerationMode.POSITIVE


def test_the_schema_has_every_endpoint():
    labels = {op.label for op in OPERATIONS}
    assert {"POST /api/v1/leads/", "GET /api/v1/queue/", "POST /api/v1/hooks/{source}/"} <= labels
    assert len(labels) == len(OPERATIONS) >= 25


@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda op: op.label)
def test_api_conforms_to_its_schema(operation, token):
    """schemathesis' examples, coverage and fuzzing phases for one operation, with its
    default checks except `positive_data_acceptance`: the contract makes some schema-valid
    values 400s the schema cannot express (a group slug naming no group, an unknown time zone,
    a PATCH naming no field), as SPEC 6 requires."""

    cases = iter(range(1_000_000))

    def check(case):
        if next(cases) % 3 and may_aim(case):
            case.path_parameters = aim(operation.path, case.path_parameters)
        response = case.call_and_validate(
            headers={"Authorization": f"Bearer {token}"}, excluded_checks=[positive_data_acceptance]
        )
        sent = "" if case.method.upper() == operation.method.upper() else f"{case.method.upper()} "
        RAN[operation.label][f"{sent}{response.status_code}"] += 1

    run = build_operation_test(
        config=schema.config,
        operation=operation,
        test_func=check,
        given_kwargs={},
        feedback=FeedbackSources(),
        explicit_settings=SETTINGS,
    )
    run()
