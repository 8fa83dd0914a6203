"""The audit trail's admin list, as managers reach it from a lead's or a rep's page."""

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.utils import timezone

from audit.models import AuditEvent
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


def test_an_event_links_its_group_and_rep_to_their_pages(manager, api, make_group, client):
    """A manager reading why a lead went to a rep goes on to the rep's or the group's page;
    both were plain text, on the list and on the event's own page."""
    group, reps = make_group(1, slug="emea")
    lead_id = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"]
    rep = reps[0]
    group_link = f'<a href="/admin/rotation/group/{group.pk}/change/">emea</a>'
    rep_link = f'<a href="/admin/rotation/rep/{rep.pk}/change/"><bdi>{rep.name}</bdi></a> (#{rep.pk})'
    page = manager.get(f"/admin/audit/auditevent/?lead_id={lead_id}").content.decode()
    assert group_link in page and rep_link in page, page
    event = AuditEvent.objects.get(lead_id=lead_id, type="lead.assigned")
    page = manager.get(f"/admin/audit/auditevent/{event.pk}/change/").content.decode()
    assert group_link in page and rep_link in page, page
    # A group deleted since stays its slug, a rep deleted since its number: no dead link.
    gone = AuditEvent.objects.create(
        type="group.changed", at=timezone.now(), actor="admin:root", group="gone-group", rep_id=987654
    )
    page = manager.get("/admin/audit/auditevent/?group__exact=gone-group").content.decode()
    assert ">gone-group</td>" in page and ">#987654</td>" in page, page
    assert not re.search(r"/admin/rotation/group/\d+/", page) and "/admin/rotation/rep/987654/" not in page
    page = manager.get(f"/admin/audit/auditevent/{gone.pk}/change/").content.decode()
    assert not re.search(r"/admin/rotation/group/\d+/", page) and "/admin/rotation/rep/987654/" not in page
    # A user who may read the trail but not the configuration gets the names, unlinked.
    reader = User.objects.create_user("reader", password="pw-for-tests-only", is_staff=True)
    reader.user_permissions.add(Permission.objects.get(codename="view_auditevent"))
    client.force_login(reader)
    page = client.get(f"/admin/audit/auditevent/?lead_id={lead_id}").content.decode()
    assert group_link not in page and rep_link not in page
    assert f"<bdi>{rep.name}</bdi> (#{rep.pk})" in page and ">emea</td>" in page


def test_the_queue_filter_lists_every_way_a_lead_entered_the_queue(manager, api, make_group):
    """A lead enters the fallback queue by the event of what put it there: queued at intake,
    escalated to no rep, rerouted to none. Filtering the type `lead.queued` missed the last two,
    the leads an SLA or a reroute queued."""
    from leads import actions
    from leads.models import Assignment
    from rotation.models import Membership

    emea, _ = make_group(1, slug="emea", sla_minutes="30", max_attempts=1)
    Membership.objects.filter(group=emea).update(max_open=1)
    escalated = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()
    queued = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()
    assert (escalated["status"], queued["status"]) == ("assigned", "queued")
    make_group(1, slug="apac")
    rerouted = api.post("/api/v1/leads/", lead_body(group="apac"), format="json").json()
    assert api.patch("/api/v1/groups/apac/", {"active": False}, format="json").status_code == 200
    assert api.post(f"/api/v1/leads/{rerouted['id']}/reroute/", {}, format="json").json()["status"] == "queued"
    missed = Assignment.objects.get(lead_id=escalated["id"])
    Assignment.objects.filter(pk=missed.pk).update(due_at=timezone.now() - timedelta(seconds=1))
    actions.lead_escalate(assignment_id=missed.pk)

    page = manager.get("/admin/audit/auditevent/?queue=entered").content.decode()
    rows = re.findall(r'<td class="field-type">([^<]+)</td>.*?/admin/leads/lead/(\d+)/change/', page)
    assert sorted((int(lead), type) for type, lead in rows) == [
        (escalated["id"], "Lead Escalated"),
        (queued["id"], "Lead Queued"),
        (rerouted["id"], "Lead Rerouted"),
    ]
    assert "Leads entering it" in page


def _result_ids(page: str) -> set[int]:
    return {int(n) for n in re.findall(r'<th class="field-id"><a href="/admin/audit/auditevent/(\d+)/change/', page)}


def test_the_trail_is_searched_by_lead_id_as_written_by_import_id_and_by_rep_name(
    manager, api, make_group, tmp_path, client
):
    """ "#20" found nothing (the queue and the leads list take it); the import id an import
    report gives found nothing; a rep's name found nothing."""
    from io import StringIO

    from django.core.management import call_command

    group, (ada, bob) = make_group(2, slug="emea")
    ada.name, bob.name = "Ada Lovelace", "Bob Stone"
    ada.save(), bob.save()
    lead_id = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"]
    csv = tmp_path / "leads.csv"
    csv.write_text("email,group,external_id\na@x.example,emea,x-1\nb@x.example,emea,x-2\n")
    out = StringIO()
    call_command("import_leads", str(csv), stdout=out, stderr=StringIO())
    (import_id,) = re.findall(r"import id (import-[0-9a-f]{12})", out.getvalue())

    def found(term: str) -> set[int]:
        return _result_ids(manager.get("/admin/audit/auditevent/", {"q": term}).content.decode())

    by_lead = set(AuditEvent.objects.filter(lead_id=lead_id).values_list("pk", flat=True))
    assert by_lead and found(f"#{lead_id}") >= by_lead and found(f" #{lead_id} ") == found(str(lead_id))
    imported = set(AuditEvent.objects.filter(explanation__import=import_id).values_list("pk", flat=True))
    assert len(imported) >= 4 and found(import_id) == imported  # 2 received, 2 assigned
    of_ada = set(AuditEvent.objects.filter(rep_id=ada.pk).values_list("pk", flat=True))
    assert of_ada and found("lovelace") == of_ada
    assert found("no such rep or actor") == set()
    page = manager.get("/admin/audit/auditevent/").content.decode()
    assert "an import id (import-…)" in page  # the box says what it takes


def test_a_right_to_left_rep_name_keeps_its_id_after_it(manager, api, make_group):
    # Not isolated, "محمد (#10)" read "(10#) محمد": the name's direction took the id with it.
    group, (rep,) = make_group(1, slug="emea")
    rep.name = "محمد <b>"
    rep.save()
    lead_id = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"]
    page = manager.get(f"/admin/audit/auditevent/?lead_id={lead_id}").content.decode()
    assert f"Given to <bdi>محمد &lt;b&gt;</bdi> (#{rep.pk})" in page  # the sentence, escaped
    assert f"<bdi>محمد &lt;b&gt;</bdi></a> (#{rep.pk})" in page  # the rep column
    assert "\ue000" not in page and "<b>" not in page
