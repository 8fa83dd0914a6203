import itertools

import pytest
from rest_framework.test import APIClient

from rotation import services
from rotation.models import Group, Rep

from .factories import GroupFactory, RepFactory, api_client_with

_emails = itertools.count()


def api_for(scopes: list[str]) -> APIClient:
    _client, token = api_client_with(scopes)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return api


@pytest.fixture
def api(db) -> APIClient:
    """A client whose token has every scope."""
    return api_for(["intake", "read", "manage"])


@pytest.fixture
def api_with(db):
    return api_for


@pytest.fixture
def make_group(db):
    """A group with `n` reps appended in order (through the service, as sales ops would)."""

    def make(n: int = 3, **group_fields) -> tuple[Group, list[Rep]]:
        group = GroupFactory(**group_fields)
        reps = [RepFactory() for _ in range(n)]
        for rep in reps:
            services.membership_add(group=group, rep=rep, actor="test")
        return group, reps

    return make


def lead_body(**fields) -> dict:
    body = {"email": f"lead{next(_emails)}@customer.example"}
    body.update(fields)
    return body


@pytest.fixture
def post_lead(api):
    def post(client: APIClient | None = None, headers: dict | None = None, **fields):
        return (client or api).post("/api/v1/leads/", lead_body(**fields), format="json", headers=headers or {})

    return post
