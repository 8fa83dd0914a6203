import itertools
import time

import pytest
from rest_framework.test import APIClient

from rotation import services
from rotation.models import Group, Rep

from .factories import GroupFactory, RepFactory, api_client_with

_emails = itertools.count()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Makes `@pytest.mark.xdist_group` work again: pytest-xdist 3.8 groups a test by renaming
    `item._nodeid` to `<nodeid>@<group>`, which pytest 9 no longer reads (it keeps `item._id`),
    so `--dist loadgroup` silently spread every group over the workers. Same renaming, on the
    attribute pytest 9 reads; a no-op when xdist already did it or is not grouping."""
    if not hasattr(config, "workerinput") or not config.getvalue("loadgroup"):
        return
    from _pytest.nodeid import NodeId

    for item in items:
        names = {
            str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")
        }
        if names and "@" not in item.nodeid and hasattr(item, "_id"):
            item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(sorted(names))}")


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


def start_of_a_window(needed_s: float, window_s: int = 60) -> None:
    """Waits for the next fixed window when fewer than `needed_s` seconds are left in this
    one: the limits count per window, so hits meant to add up must fall in one."""
    left = window_s - time.time() % window_s
    if left < needed_s:
        time.sleep(left + 0.05)
