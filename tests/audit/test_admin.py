"""The audit trail's admin list, as managers reach it from a lead's or a rep's page."""

import pytest
from django.contrib.auth.models import User

from tests.conftest import lead_body

pytestmark = pytest.mark.django_db


@pytest.fixture
def manager(client, db):
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw-for-tests-only"))
    return client


def test_the_trail_of_one_lead_or_rep_says_whose_it_is_and_links_back(manager, api, make_group):
    """Reached from "Audit trail: every decision on this lead" (or a rep's page), the list was
    titled "Select audit event to view", with no word of which lead and no way back to it."""
    group, reps = make_group(1, slug="emea")
    lead_id = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"]
    page = manager.get(f"/admin/audit/auditevent/?lead_id={lead_id}").content.decode()
    assert f"<h1>Audit trail of lead #{lead_id}</h1>" in page
    assert f'<a href="/admin/leads/lead/{lead_id}/change/">Lead #{lead_id}: its page</a>' in page
    rep = reps[0]
    page = manager.get(f"/admin/audit/auditevent/?rep_id={rep.pk}").content.decode()
    assert f"<h1>Audit trail of {rep.name} (rep #{rep.pk})</h1>" in page
    assert f'<a href="/admin/rotation/rep/{rep.pk}/change/">Rep {rep.name}: its page</a>' in page
    # A rep deleted since keeps its trail, by number; the whole trail keeps its own title.
    page = manager.get("/admin/audit/auditevent/?rep_id=987654").content.decode()
    assert "<h1>Audit trail of rep #987654</h1>" in page and 'class="trail-of"' not in page
    page = manager.get("/admin/audit/auditevent/").content.decode()
    assert "Audit trail of" not in page and 'class="trail-of"' not in page
