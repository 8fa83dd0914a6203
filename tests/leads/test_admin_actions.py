"""Managers' lead actions in the admin: queue "assign to" (intermediate form), bulk actions,
reassign from a lead's page; all audited as admin:<username>."""

import pytest

from audit.models import AuditEvent
from leads import actions
from leads.admin import ADMIN_EDITABLE
from leads.models import Lead
from rotation.models import Membership, RotationState, RoutingRule
from tests.conftest import lead_body

pytestmark = pytest.mark.django_db


def queued_leads(api, make_group, n: int):
    group, reps = make_group(2, slug="emea")
    Membership.objects.filter(group=group).update(active=False)
    ids = [api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"] for _ in range(n)]
    return group, reps, ids


def test_queue_assign_to_rep_asks_then_assigns(api, make_group, manager):
    group, reps, ids = queued_leads(api, make_group, 2)
    url = "/admin/leads/queuedlead/"
    page = manager.post(url, {"action": "assign_to_rep", "_selected_action": ids})
    assert page.status_code == 200 and b"Assign to" in page.content  # the intermediate form
    crumbs = page.content.decode().split('class="breadcrumbs"')[1].split("</div>")[0]
    assert 'href="/admin/leads/queuedlead/">Fallback queue</a>' in crumbs, crumbs
    done = manager.post(
        url,
        {"action": "assign_to_rep", "_selected_action": ids, "apply": "1", "rep": reps[1].id, "reason": "on call"},
    )
    assert done.status_code == 302
    assert set(Lead.objects.filter(pk__in=ids).values_list("status", "owner_id")) == {("assigned", reps[1].id)}
    events = AuditEvent.objects.filter(type="lead.reassigned", lead_id__in=ids)
    assert events.count() == 2 and {e.actor for e in events} == {"admin:maria"}
    assert all(e.explanation["reason"] == "on call" for e in events)
    assert RotationState.objects.get(group=group).pointer == 0
    assert manager.get(url).status_code == 200


def test_queue_assign_without_a_reason_shows_the_form_again(api, make_group, manager):
    group, reps, ids = queued_leads(api, make_group, 1)
    page = manager.post(
        "/admin/leads/queuedlead/",
        {"action": "assign_to_rep", "_selected_action": ids, "apply": "1", "rep": reps[0].id, "reason": ""},
    )
    assert page.status_code == 200 and b"This field is required" in page.content
    assert Lead.objects.get(pk=ids[0]).status == "queued"


def test_queue_bulk_close_and_reroute(api, make_group, manager):
    group, reps, ids = queued_leads(api, make_group, 3)
    # A page first, listing what will be closed; nothing is closed until it is confirmed.
    page = manager.post("/admin/leads/queuedlead/", {"action": "close_disqualified", "_selected_action": ids[:1]})
    assert page.status_code == 200 and "Close 1 lead as disqualified" in page.content.decode()
    assert f"#{ids[0]}" in page.content.decode() and Lead.objects.get(pk=ids[0]).status == "queued"
    r = manager.post(
        "/admin/leads/queuedlead/", {"action": "close_disqualified", "_selected_action": ids[:1], "apply": "1"}
    )
    assert r.status_code == 302
    assert Lead.objects.get(pk=ids[0]).outcome == "disqualified"
    assert AuditEvent.objects.get(type="lead.closed", lead_id=ids[0]).actor == "admin:maria"
    Membership.objects.filter(group=group).update(active=True)
    manager.post("/admin/leads/queuedlead/", {"action": "reroute", "_selected_action": ids[1:]})
    owners = list(Lead.objects.filter(pk__in=ids[1:]).order_by("id").values_list("owner_id", flat=True))
    assert owners == [reps[0].id, reps[1].id]
    assert AuditEvent.objects.filter(type="lead.rerouted", actor="admin:maria").count() == 2


def test_assigning_every_queued_lead_across_pages_assigns_them_all(api, make_group, manager):
    """ "Select all 130 leads" and "Assign to a rep…": the confirmation page said 130 leads,
    but its form posted back only the 100 ticked on the first page, so 30 stayed queued while
    the message read "100 lead(s) assigned"."""
    from tests.security.test_admin_roles import form_of

    group, reps, ids = queued_leads(api, make_group, 130)
    url = "/admin/leads/queuedlead/"
    on_page = [str(lead.pk) for lead in manager.get(url).context["cl"].result_list]
    assert len(on_page) == 100
    page = manager.post(
        url, {"action": "assign_to_rep", "select_across": "1", "index": "0", "_selected_action": on_page}
    )
    assert page.status_code == 200 and "Assign 130 leads" in page.content.decode()
    data = form_of(page)  # what the browser posts back from the confirmation page
    data.update({"rep": [str(reps[1].id)], "reason": ["whole queue to the on-call rep"]})
    done = manager.post(url, data, follow=True)
    assert [str(m) for m in done.context["messages"]][0] == f"130 leads assigned to {reps[1].name}."
    assert set(Lead.objects.filter(pk__in=ids).values_list("status", "owner_id")) == {("assigned", reps[1].id)}


@pytest.mark.parametrize("action", ["assign_to_rep", "reroute", "close_disqualified", "accept_for_owner"])
def test_select_all_over_more_leads_than_an_action_takes_is_refused_before_anything(
    api, make_group, manager, monkeypatch, action
):
    """Each lead is its own routing transaction: "Select all" over tens of thousands held the
    request for minutes, past any proxy's timeout, with no word of what had been done."""
    from leads import admin_actions

    monkeypatch.setattr(admin_actions, "MAX_LEADS_PER_ACTION", 3)
    group, reps, ids = queued_leads(api, make_group, 4)
    url = "/admin/leads/queuedlead/" if action != "accept_for_owner" else "/admin/leads/lead/"
    post = {"action": action, "select_across": "1", "index": "0", "_selected_action": ids[:1]}
    r = manager.post(url, post, follow=True)
    assert [str(m) for m in r.context["messages"]] == [
        "4 leads selected: an action takes at most 3 at a time. Nothing was done. "
        "Narrow the list with a filter or the search, then select again."
    ]
    assert set(Lead.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"queued"}
    assert not AuditEvent.objects.filter(actor="admin:maria").exists()
    # As many as the limit: the action runs (the form, or the leads closed).
    monkeypatch.setattr(admin_actions, "MAX_LEADS_PER_ACTION", 4)
    r = manager.post(url, post, follow=True)
    assert not any("Nothing was done" in str(m) for m in r.context["messages"])
    if action == "assign_to_rep":
        assert "Assign 4 leads" in r.content.decode()
    if action == "close_disqualified":
        assert "Close 4 leads as disqualified" in r.content.decode()
        manager.post(url, {**post, "apply": "1"})
        assert Lead.objects.filter(pk__in=ids, outcome="disqualified").count() == 4


def test_the_close_confirmation_lists_only_the_leads_it_closes(api, make_group, manager):
    """Leads closed already were listed among those the page "will close", with their status
    "Closed", as if they were about to be closed again with another outcome."""
    make_group(1, slug="emea")
    ids = [api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"] for _ in range(3)]
    api.post(f"/api/v1/leads/{ids[0]}/close/", {"outcome": "won"}, format="json")
    r = manager.post("/admin/leads/lead/", {"action": "close_disqualified", "_selected_action": ids})
    html = " ".join(r.content.decode().split())
    assert "Close 2 leads as disqualified" in html and f"<li>#{ids[0]} " not in html
    assert f"<li>#{ids[1]} " in html and f"<li>#{ids[2]} " in html
    assert "1 of the leads selected is closed already, and is left as it is." in html
    r = manager.post("/admin/leads/lead/", {"action": "close_disqualified", "_selected_action": ids[:1]})
    html = " ".join(r.content.decode().split())
    assert "There is nothing to close." in html and 'type="submit"' not in html.split("There is nothing")[1]
    assert Lead.objects.get(pk=ids[0]).outcome == "won"


def test_a_bulk_action_that_fails_on_many_leads_says_how_many(api, make_group, manager):
    """Past 20 refusals the message listed the first 20 and said nothing of the rest: closing 30
    leads of which 25 were closed already read as 5 done and 20 not done."""
    group, reps = make_group(1, slug="emea")
    ids = [api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"] for _ in range(30)]
    for lead_id in ids[:25]:
        api.post(f"/api/v1/leads/{lead_id}/close/", {"outcome": "won"}, format="json")
    r = manager.post("/admin/leads/lead/", {"action": "close_lost", "_selected_action": ids, "apply": "1"}, follow=True)
    shown = [str(m) for m in r.context["messages"]]
    assert shown[0] == "5 leads closed as lost."
    assert shown[1].startswith(f"Not done for 25 leads: #{ids[0]}: "), shown[1]
    assert f"#{ids[19]}: " in shown[1] and f"#{ids[20]}: " not in shown[1]
    assert shown[1].endswith(" and 5 more."), shown[1]


def test_route_again_says_when_a_lead_is_back_in_the_queue(api, make_group, manager):
    """ "Route again" on a lead that still has no eligible rep said only "1 lead(s) routed
    again", while the lead went straight back to the queue."""
    group, reps, ids = queued_leads(api, make_group, 22)
    r = manager.post("/admin/leads/queuedlead/", {"action": "reroute", "_selected_action": ids}, follow=True)
    lead = Lead.objects.get(pk=ids[0])
    assert set(Lead.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"queued"}
    shown = [str(m) for m in r.context["messages"]]
    first = ", ".join(f"#{pk}" for pk in sorted(ids)[:20])
    assert f"Still no rep for {first} and 2 more, back in the fallback queue: {lead.queue_reason}." in shown, shown


def test_route_again_says_when_it_took_a_lead_from_its_rep_into_the_queue(api, make_group, manager):
    """ "Route again" on a rep's lead that no rep can take now puts it in the queue: the
    message said "Still no rep for #N, back in the fallback queue", as if nothing had changed,
    while the lead was taken from the rep who held it (and had never been queued)."""
    group, reps = make_group(2, slug="emea")
    held = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()
    Membership.objects.filter(group=group).update(active=False)
    page = manager.post("/admin/leads/lead/", {"action": "reroute", "_selected_action": [held["id"]]})
    assert Lead.objects.get(pk=held["id"]).status == "assigned"  # a rep's lead: confirmed first
    assert "held by a rep" in page.content.decode()
    r = manager.post(
        "/admin/leads/lead/", {"action": "reroute", "_selected_action": [held["id"]], "apply": "1"}, follow=True
    )
    lead = Lead.objects.get(pk=held["id"])
    assert lead.status == "queued" and lead.owner_id is None
    shown = [str(m) for m in r.context["messages"]]
    said = f"#{lead.pk} taken from {held['owner']['name']} into the fallback queue: {lead.queue_reason}."
    assert said in shown, shown
    assert not any("Still no rep" in m for m in shown), shown


def test_assigning_a_lead_that_no_group_holds_does_not_call_the_rep_not_eligible(api, make_group, manager):
    """A queued lead that no group holds (no rule matched, no default group) has no members
    to be one of: given by hand to a rep who can work it, the page warned that the rep "is not
    eligible now (not a member of the lead's group)", and the trail said so too."""
    from audit.summary import event_summary

    group, reps = make_group(1, slug="emea")  # not the default group: the lead stays groupless
    lead = api.post("/api/v1/leads/", lead_body(), format="json").json()
    assert lead["status"] == "queued" and lead["group"] is None
    r = manager.post(
        "/admin/leads/queuedlead/",
        {"action": "assign_to_rep", "_selected_action": [lead["id"]], "apply": "1", "rep": reps[0].id, "reason": "x"},
        follow=True,
    )
    shown = [str(m) for m in r.context["messages"]]
    assert shown == [f"1 lead assigned to {reps[0].name}."], shown
    event = AuditEvent.objects.get(type="lead.reassigned", lead_id=lead["id"])
    text = event_summary(type=event.type, explanation=event.explanation, rep_id=event.rep_id, names={})
    assert "member" not in text, text


def test_assigning_many_leads_to_a_rep_not_eligible_now_names_the_first_20(api, make_group, manager):
    """The warning that the rep cannot work the leads now listed every lead: "Select all" over
    a queue of thousands put a message of thousands of ids on the page (and in the session),
    where the other messages of these actions say the first 20 and count the rest."""
    group, reps, ids = queued_leads(api, make_group, 25)  # the group's members are paused
    r = manager.post(
        "/admin/leads/queuedlead/",
        {"action": "assign_to_rep", "_selected_action": ids, "apply": "1", "rep": reps[0].id, "reason": "cover"},
        follow=True,
    )
    shown = [str(m) for m in r.context["messages"]]
    assert shown[0] == f"25 leads assigned to {reps[0].name}."
    warning = shown[1]
    first = ", ".join(f"#{pk}" for pk in sorted(ids)[:20])
    assert warning.startswith(f"{reps[0].name} is not eligible now (paused in this group): {first} and 5 more will"), (
        warning
    )


def test_assigning_leads_past_a_reps_cap_warns_once_for_them_all(api, make_group, manager):
    """Each lead past the cap had a warning of its own ("at max_open cap (2/2)", "(3/2)",
    "(4/2)"...): a wall of messages, one per lead, for one fact."""
    group, reps = make_group(1, slug="emea", sla_minutes=30)
    Membership.objects.filter(group=group).update(max_open=2)
    group.active = False
    group.save(update_fields=["active"])
    ids = [api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"] for _ in range(5)]
    group.active = True
    group.save(update_fields=["active"])
    r = manager.post(
        "/admin/leads/queuedlead/",
        {"action": "assign_to_rep", "_selected_action": ids, "apply": "1", "rep": reps[0].id, "reason": "cover"},
        follow=True,
    )
    shown = [str(m) for m in r.context["messages"]]
    over = ", ".join(f"#{pk}" for pk in sorted(ids)[2:])
    assert shown == [
        f"5 leads assigned to {reps[0].name}.",
        # Three leads: "them" and "their SLA" (it said "take it or its SLA escalates" of three).
        f"{reps[0].name} is not eligible now (over its max_open cap of 2): {over} will wait with them until they "
        "can take them or their SLA escalates.",
    ]


def test_assigning_a_lead_to_a_rep_not_eligible_does_not_promise_an_sla_the_group_has_not(api, make_group, manager):
    """In a group without an SLA nothing escalates a lead: the warning said it would wait with
    the paused rep "until they can take it or its SLA escalates", and the manager left it there."""
    group, reps, ids = queued_leads(api, make_group, 1)  # the group's members are paused
    assert group.sla_minutes is None
    r = manager.post(
        "/admin/leads/queuedlead/",
        {"action": "assign_to_rep", "_selected_action": ids, "apply": "1", "rep": reps[0].id, "reason": "cover"},
        follow=True,
    )
    shown = [str(m) for m in r.context["messages"]]
    assert shown[1] == (
        f"{reps[0].name} is not eligible now (paused in this group): #{ids[0]} will wait with them until they "
        "can take it: no SLA escalates it."
    ), shown


def test_reassign_from_the_lead_page(api, make_group, manager):
    group, reps = make_group(2, slug="emea")
    lead_id = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"]
    change = manager.get(f"/admin/leads/lead/{lead_id}/change/")
    assert change.status_code == 200 and f"/admin/leads/lead/{lead_id}/reassign/".encode() in change.content
    url = f"/admin/leads/lead/{lead_id}/reassign/"
    form = manager.get(url)
    assert form.status_code == 200
    crumbs = form.content.decode().split('class="breadcrumbs"')[1].split("</div>")[0]
    assert f'href="/admin/leads/lead/{lead_id}/change/">Lead #{lead_id}</a>' in crumbs, crumbs
    r = manager.post(url, {"rep": reps[1].id, "reason": "territory"})
    assert r.status_code == 302
    lead = Lead.objects.get(pk=lead_id)
    assert lead.owner_id == reps[1].id
    event = AuditEvent.objects.get(type="lead.reassigned", lead_id=lead_id)
    assert event.actor == "admin:maria" and event.explanation["from_rep"] == reps[0].id
    # Reassigning to the owner again is refused with a message, not an error page.
    again = manager.post(url, {"rep": reps[1].id, "reason": "again"}, follow=True)
    assert again.status_code == 200
    assert f"{reps[1].name} (rep {reps[1].id}) already owns lead #{lead_id}." in again.content.decode()


def test_a_closed_lead_offers_no_reassign(api, make_group, manager):
    """A closed lead is not moved (the API says 409): its page says it is closed instead of
    offering a form that could only fail, and an old link to that form says so too."""
    group, reps = make_group(2, slug="emea")
    lead_id = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"]
    assert api.post(f"/api/v1/leads/{lead_id}/close/", {"outcome": "won"}, format="json").status_code == 200
    change = manager.get(f"/admin/leads/lead/{lead_id}/change/").content.decode()
    assert f"/admin/leads/lead/{lead_id}/reassign/" not in change
    assert "Closed (Won): not reassigned." in change and f"?lead_id={lead_id}" in change
    r = manager.get(f"/admin/leads/lead/{lead_id}/reassign/", follow=True)
    assert r.redirect_chain == [(f"/admin/leads/lead/{lead_id}/change/", 302)]
    assert [str(m) for m in r.context["messages"]] == [f"Lead #{lead_id} is closed: it is not reassigned."]
    r = manager.post(f"/admin/leads/lead/{lead_id}/reassign/", {"rep": reps[1].id, "reason": "late"})
    assert r.status_code == 302 and Lead.objects.get(pk=lead_id).owner_id == reps[0].id
    assert not AuditEvent.objects.filter(type="lead.reassigned").exists()


def test_close_from_the_lead_page(api, make_group, manager):
    """A lead's page has a "Close…" button: a page that asks for the outcome, then closes the
    lead through the same service as the API's close, with the same audit event."""
    group, reps = make_group(2, slug="emea")
    lead_id = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"]
    change = manager.get(f"/admin/leads/lead/{lead_id}/change/")
    url = f"/admin/leads/lead/{lead_id}/close/"
    assert change.status_code == 200 and url.encode() in change.content
    form = manager.get(url)
    assert form.status_code == 200
    html = form.content.decode()
    crumbs = html.split('class="breadcrumbs"')[1].split("</div>")[0]
    assert f'href="/admin/leads/lead/{lead_id}/change/">Lead #{lead_id}</a>' in crumbs, crumbs
    for outcome in ("won", "lost", "disqualified"):
        assert f'type="radio" name="outcome" value="{outcome}"' in html, html
    assert f"{reps[0].name} gets the capacity back" in " ".join(html.split())
    # No outcome picked: asked again, nothing written.
    again = manager.post(url, {})
    assert again.status_code == 200 and b"This field is required" in again.content
    assert Lead.objects.get(pk=lead_id).status == "assigned"
    r = manager.post(url, {"outcome": "lost"}, follow=True)
    assert r.redirect_chain == [(f"/admin/leads/lead/{lead_id}/change/", 302)]
    assert [str(m) for m in r.context["messages"]] == [f"Lead #{lead_id} closed as lost."]
    lead = Lead.objects.get(pk=lead_id)
    assert (lead.status, lead.outcome, lead.owner_id) == ("closed", "lost", reps[0].id) and lead.closed_at
    assert list(lead.assignments.values_list("end_reason", flat=True)) == ["closed"]
    # The same event as a close over the API, but for the actor.
    other = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"]
    assert api.post(f"/api/v1/leads/{other}/close/", {"outcome": "lost"}, format="json").status_code == 200
    ours, theirs = (AuditEvent.objects.get(type="lead.closed", lead_id=pk) for pk in (lead_id, other))
    assert ours.actor == "admin:maria"
    assert ours.explanation == {"outcome": "lost", "from_status": "assigned", "attempt": 1}
    assert (ours.group, ours.explanation) == (theirs.group, theirs.explanation)
    # Now closed: the page offers neither button.
    html = manager.get(f"/admin/leads/lead/{lead_id}/change/").content.decode()
    assert "Closed (Lost): not reassigned." in html and url not in html


def test_closing_from_the_lead_page_frees_the_reps_place_for_the_queue(
    api, make_group, manager, django_capture_on_commit_callbacks, monkeypatch
):
    """As a close over the API: the rep's capacity frees up and the group's waiting lead takes it."""
    from leads import scheduling

    monkeypatch.setattr(scheduling, "publish", lambda *a, **k: True)  # no worker: drained inline
    group, (rep,) = make_group(1, slug="emea")
    Membership.objects.filter(group=group).update(max_open=1)
    first = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"]
    waiting = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()
    assert waiting["status"] == "queued"
    with django_capture_on_commit_callbacks(execute=True):
        assert manager.post(f"/admin/leads/lead/{first}/close/", {"outcome": "won"}).status_code == 302
    assert Lead.objects.get(pk=waiting["id"]).owner_id == rep.id
    drained = AuditEvent.objects.get(lead_id=waiting["id"], type="lead.assigned")
    assert drained.explanation["trigger"] == "queue_drain"


def test_a_closed_leads_close_page_says_so(api, make_group, manager):
    """An old link or a second tab: the page says the lead is closed, and a late post writes nothing."""
    group, reps = make_group(2, slug="emea")
    lead_id = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"]
    url = f"/admin/leads/lead/{lead_id}/close/"
    assert api.post(f"/api/v1/leads/{lead_id}/close/", {"outcome": "won"}, format="json").status_code == 200
    r = manager.get(url, follow=True)
    assert r.redirect_chain == [(f"/admin/leads/lead/{lead_id}/change/", 302)]
    assert [str(m) for m in r.context["messages"]] == [f"Lead #{lead_id} is already closed (Won)."]
    r = manager.post(url, {"outcome": "lost"}, follow=True)
    assert [str(m) for m in r.context["messages"]] == [f"Lead #{lead_id} is already closed (Won)."]
    assert Lead.objects.get(pk=lead_id).outcome == "won"
    assert AuditEvent.objects.filter(type="lead.closed", lead_id=lead_id).count() == 1


def test_a_lead_closed_by_someone_else_after_the_page_was_read_is_said(api, make_group, manager, monkeypatch):
    """Closed over the API between the manager's page and the post: the close is refused
    under the lead's lock, the page says why, and the first outcome stands."""
    group, reps = make_group(2, slug="emea")
    lead_id = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"]
    close = actions.lead_close

    def closed_meanwhile(**kwargs):
        close(lead_id=lead_id, outcome="won", actor="api:crm")
        return close(**kwargs)

    monkeypatch.setattr(actions, "lead_close", closed_meanwhile)
    r = manager.post(f"/admin/leads/lead/{lead_id}/close/", {"outcome": "lost"}, follow=True)
    assert r.redirect_chain == [(f"/admin/leads/lead/{lead_id}/change/", 302)]
    assert [str(m) for m in r.context["messages"]] == [f"Lead {lead_id} is already closed (won)."]
    assert Lead.objects.get(pk=lead_id).outcome == "won"
    assert list(AuditEvent.objects.filter(type="lead.closed").values_list("actor", flat=True)) == ["api:crm"]


def test_a_queued_lead_is_closed_from_its_page(api, make_group, manager):
    group, reps, ids = queued_leads(api, make_group, 1)
    html = manager.get(f"/admin/leads/queuedlead/{ids[0]}/change/").content.decode()
    assert f'href="/admin/leads/lead/{ids[0]}/close/"' in html
    assert manager.post(f"/admin/leads/lead/{ids[0]}/close/", {"outcome": "disqualified"}).status_code == 302
    lead = Lead.objects.get(pk=ids[0])
    assert (lead.status, lead.outcome, lead.queue_reason) == ("closed", "disqualified", "")
    event = AuditEvent.objects.get(type="lead.closed", lead_id=ids[0])
    assert event.actor == "admin:maria" and event.explanation["from_status"] == "queued"


def test_reassigning_to_a_rep_away_says_when_the_rep_is_back_in_the_reps_time_zone(api, make_group, manager):
    from datetime import UTC, datetime, timedelta

    from django.utils import timezone

    from rotation.models import Absence

    group, reps = make_group(2, slug="emea")
    lead_id = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"]
    reps[1].timezone = "America/New_York"
    reps[1].save(update_fields=["timezone"])
    back = datetime(timezone.now().year + 1, 3, 2, 14, 5, 59, 500, tzinfo=UTC)
    Absence.objects.create(rep=reps[1], starts_at=timezone.now() - timedelta(hours=1), ends_at=back)
    r = manager.post(f"/admin/leads/lead/{lead_id}/reassign/", {"rep": reps[1].id, "reason": "cover"}, follow=True)
    warning = [str(m) for m in r.context["messages"]][1]
    assert f"(out of office until {back.year}-03-02 09:05 (America/New_York))" in warning, warning


def test_reassigning_to_a_rep_away_until_the_last_year_there_is_says_so(api, make_group, manager):
    """Away "until 9999-12-31 23:00" (UTC) is past the last date there is in the rep's time zone:
    the lead was reassigned, then the page that was to say so failed with a server error."""
    from datetime import UTC, datetime, timedelta

    from django.utils import timezone

    from rotation.models import Absence

    group, reps = make_group(2, slug="emea")
    lead_id = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"]
    reps[1].timezone = "Asia/Tokyo"
    reps[1].save(update_fields=["timezone"])
    back = datetime(9999, 12, 31, 23, 0, tzinfo=UTC)
    Absence.objects.create(rep=reps[1], starts_at=timezone.now() - timedelta(hours=1), ends_at=back)
    r = manager.post(f"/admin/leads/lead/{lead_id}/reassign/", {"rep": reps[1].id, "reason": "cover"}, follow=True)
    assert r.status_code == 200
    warning = [str(m) for m in r.context["messages"]][1]
    assert "(out of office until 9999-12-31 23:00 (UTC))" in warning, warning


def test_the_reassign_page_of_a_queued_lead_says_why_it_is_queued(api, make_group, manager):
    """Reached from the queue's "Assign…": the manager picks a rep knowing why none was found."""
    from django.utils.html import escape

    group, reps, ids = queued_leads(api, make_group, 1)
    reason = Lead.objects.get(pk=ids[0]).queue_reason
    assert reason
    html = manager.get(f"/admin/leads/lead/{ids[0]}/reassign/").content.decode()
    assert f"is <strong>queued</strong> in emea: {escape(reason)}." in " ".join(html.split())


def test_the_rep_choices_tell_apart_two_reps_of_the_same_name(api, make_group, manager):
    """Both showed as "Ana Souza": the manager could not tell which one would get the lead."""
    from rotation.models import Rep

    group, reps = make_group(2, slug="emea")
    Rep.objects.filter(pk__in=[r.pk for r in reps]).update(name="Ana Souza")
    lead_id = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"]
    html = manager.get(f"/admin/leads/lead/{lead_id}/reassign/").content.decode()
    for rep in reps:
        assert f'<option value="{rep.pk}">Ana Souza &lt;{rep.email}&gt;</option>' in html, html
    Rep.objects.filter(pk=reps[1].pk).update(name="Bruno Lima")  # a name of one's own stays bare
    html = manager.get(f"/admin/leads/lead/{lead_id}/reassign/").content.decode()
    assert f'<option value="{reps[0].pk}">Ana Souza</option>' in html
    assert f'<option value="{reps[1].pk}">Bruno Lima</option>' in html


def test_managers_without_change_permission_cannot_act(api, make_group, client, django_user_model):
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user("viewer", password="pw-viewer-123", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=["view_lead", "view_queuedlead"]))
    client.force_login(user)
    group, reps, ids = queued_leads(api, make_group, 1)
    assert client.get(f"/admin/leads/lead/{ids[0]}/reassign/").status_code == 403
    assert client.get(f"/admin/leads/lead/{ids[0]}/close/").status_code == 403
    assert client.post(f"/admin/leads/lead/{ids[0]}/close/", {"outcome": "won"}).status_code == 403
    page = client.get(f"/admin/leads/lead/{ids[0]}/change/").content.decode()
    assert "/close/" not in page and "/reassign/" not in page and f"?lead_id={ids[0]}" in page
    client.post("/admin/leads/queuedlead/", {"action": "close_disqualified", "_selected_action": ids, "apply": "1"})
    assert Lead.objects.get(pk=ids[0]).status == "queued"


def test_a_queue_action_leaves_alone_a_lead_taken_between_the_page_and_the_lock(api, make_group):
    """The queue page's actions check, under the lead's lock, that it is still queued: a lead
    another manager assigned after the page read it is neither moved again nor closed."""
    from leads import actions

    group, reps, ids = queued_leads(api, make_group, 1)
    actions.lead_reassign(lead_id=ids[0], rep_id=reps[0].id, reason="first", actor="admin:a")
    with pytest.raises(actions.LeadConflict, match="no longer in the queue"):
        actions.lead_reassign(lead_id=ids[0], rep_id=reps[1].id, reason="second", actor="admin:b", only_queued=True)
    with pytest.raises(actions.LeadConflict, match="no longer in the queue"):
        actions.lead_close(lead_id=ids[0], outcome="disqualified", actor="admin:b", only_queued=True)
    with pytest.raises(actions.LeadConflict, match="no longer in the queue"):
        actions.lead_reroute(lead_id=ids[0], actor="admin:b", only_queued=True)
    lead = Lead.objects.get(pk=ids[0])
    assert (lead.status, lead.owner_id) == ("assigned", reps[0].id)
    assert AuditEvent.objects.filter(lead_id=ids[0], type="lead.reassigned").count() == 1


def test_a_leads_trail_says_how_it_came_in_and_what_was_edited(api, make_group, manager):
    """ "Lead Received" and "Lead Changed" read "-" under "What happened" in the trail."""
    make_group(1, slug="emea")
    body = lead_body(group="emea")
    body["source"] = "webform"
    lead_id = api.post("/api/v1/leads/", body, format="json").json()["id"]
    lead = Lead.objects.get(pk=lead_id)
    form = lead_form(lead, first_name="Renamed")
    r = manager.post(f"/admin/leads/lead/{lead_id}/change/", form)
    assert r.status_code == 302, r.content.decode()[-2000:]
    html = manager.get(f"/admin/audit/auditevent/?lead_id={lead_id}").content.decode()
    assert "Received from API client" in html and "source webform, asking for group emea." in html
    assert "Fields edited: first_name; the lead was not moved" in html


def lead_form(lead: Lead, **changes) -> dict:
    """A lead's page as the browser posts it: every editable field, with `changes`."""
    form = {name: "" if getattr(lead, name) is None else getattr(lead, name) for name in ADMIN_EDITABLE}
    form.update({"assignments-TOTAL_FORMS": "0", "assignments-INITIAL_FORMS": "0", **changes})
    return form


def test_a_manager_corrects_a_leads_routing_facts_and_routes_it_again(api, make_group, manager):
    emea, (emea_rep,) = make_group(1, slug="emea")
    us, (us_rep,) = make_group(1, slug="us")
    RoutingRule.objects.create(
        name="US", priority=1, conditions=[{"field": "country", "op": "equals", "value": "US"}], group=us
    )
    lead_id = api.post("/api/v1/leads/", lead_body(group="emea", country="FR"), format="json").json()["id"]
    lead = Lead.objects.get(pk=lead_id)
    url = f"/admin/leads/lead/{lead_id}/change/"
    r = manager.post(url, lead_form(lead, country="XX"))
    assert r.status_code == 200 and "not an ISO 3166-1 alpha-2 country code" in r.content.decode()
    r = manager.post(url, lead_form(lead, score="101"))
    assert r.status_code == 200 and "A score is 0 to 100." in r.content.decode()
    assert manager.post(url, lead_form(lead, country="us", score="90")).status_code == 302
    lead.refresh_from_db()
    assert (lead.country, lead.score, lead.group_id, lead.owner_id) == ("US", 90, emea.id, emea_rep.id)
    html = manager.get(f"/admin/audit/auditevent/?lead_id={lead_id}").content.decode()
    assert "Fields edited: country, score (country &quot;FR&quot; → &quot;US&quot;; score null → 90)" in html
    actions.lead_reroute(lead_id=lead_id, actor="admin:ops")
    lead.refresh_from_db()
    assert (lead.group_id, lead.owner_id) == (us.id, us_rep.id)


def test_editing_a_leads_email_to_another_open_leads_is_refused_on_the_field(api, make_group, manager):
    make_group(1, slug="emea")
    first = api.post("/api/v1/leads/", lead_body(group="emea", email="jane@acme.example"), format="json").json()
    second = api.post("/api/v1/leads/", lead_body(group="emea", email="john@acme.example"), format="json").json()
    lead = Lead.objects.get(pk=second["id"])
    r = manager.post(f"/admin/leads/lead/{lead.pk}/change/", lead_form(lead, email="Jane@Acme.example", first_name="x"))
    assert r.status_code == 200
    assert f"Lead {first['id']} is open with this email address" in r.content.decode()
    lead.refresh_from_db()
    assert (lead.email, lead.first_name) == ("john@acme.example", "")
    assert not AuditEvent.objects.filter(lead_id=lead.pk, type="lead.changed").exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.xdist_group("concurrency")
@pytest.mark.parametrize(
    ("page", "action"),
    [
        ("queuedlead", "assign_to_rep"),
        ("queuedlead", "reroute"),
        ("queuedlead", "close_disqualified"),
        ("lead", "close_won"),
    ],
)
def test_an_action_on_a_lead_locked_past_the_lock_timeout_says_to_retry(
    api, make_group, manager, settings, page, action
):
    """A lead whose row another transaction holds (an escalation, an accept) past the lock
    timeout is not acted on: the page says why and to retry, nothing is written, and the
    same action goes through once the row is free."""
    import threading

    from django.db import connection, transaction

    settings.ROUTING_LOCK_TIMEOUT_MS = 300
    group, reps, ids = queued_leads(api, make_group, 1)
    url = f"/admin/leads/{page}/"
    post = {"action": action, "_selected_action": ids}
    if action == "assign_to_rep":
        post.update({"apply": "1", "rep": reps[1].id, "reason": "on call"})
    if action.startswith("close_"):
        post["apply"] = "1"  # the confirmation page's answer
    before = (list(Lead.objects.values()), AuditEvent.objects.count())
    outcome: dict = {}

    def act() -> None:
        outcome["response"] = manager.post(url, post, follow=True)
        connection.close()

    with transaction.atomic():
        Lead.objects.select_for_update().get(pk=ids[0])
        thread = threading.Thread(target=act)
        thread.start()
        thread.join(timeout=10)
        waited = thread.is_alive()
    thread.join(timeout=30)
    assert not waited
    r = outcome["response"]
    assert r.status_code == 200
    shown = [str(m) for m in r.context["messages"]]
    assert any(f"#{ids[0]}" in m and "busy" in m and "retry" in m for m in shown), shown
    assert (list(Lead.objects.values()), AuditEvent.objects.count()) == before
    again = manager.post(url, post, follow=True)
    assert [str(m) for m in again.context["messages"] if str(m).startswith("Not done")] == []
    assert AuditEvent.objects.filter(lead_id=ids[0], actor="admin:maria").exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.xdist_group("concurrency")
def test_a_lead_page_saved_while_the_lead_is_locked_leaves_no_change_in_its_history(api, make_group, manager, settings):
    """The page said "nothing was saved. Save again", and nothing was: but the lead's history
    (the admin's log) recorded the edit as made, "Changed First name", for a change that never was."""
    import threading

    from django.contrib.admin.models import LogEntry
    from django.db import connection, transaction

    settings.ROUTING_LOCK_TIMEOUT_MS = 300
    make_group(1, slug="emea")
    lead = Lead.objects.get(pk=api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"])
    url = f"/admin/leads/lead/{lead.pk}/change/"
    outcome: dict = {}

    def save() -> None:
        outcome["response"] = manager.post(url, lead_form(lead, first_name="Jane"), follow=True)
        connection.close()

    with transaction.atomic():
        Lead.objects.select_for_update().get(pk=lead.pk)
        thread = threading.Thread(target=save)
        thread.start()
        thread.join(timeout=10)
    thread.join(timeout=30)
    shown = [str(m) for m in outcome["response"].context["messages"]]
    assert any("nothing was saved" in m for m in shown), shown
    assert Lead.objects.get(pk=lead.pk).first_name == ""
    assert not LogEntry.objects.filter(object_id=str(lead.pk)).exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.xdist_group("concurrency")
def test_closing_a_locked_lead_from_its_page_says_to_retry(api, make_group, manager, settings):
    """A lead whose row another transaction holds past the lock timeout is not closed: the
    page asks again, says why and to retry, writes nothing; the same post goes through after."""
    import threading

    from django.db import connection, transaction

    settings.ROUTING_LOCK_TIMEOUT_MS = 300
    make_group(1, slug="emea")
    lead_id = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"]
    url = f"/admin/leads/lead/{lead_id}/close/"
    before = (list(Lead.objects.values()), AuditEvent.objects.count())
    outcome: dict = {}

    def close() -> None:
        outcome["response"] = manager.post(url, {"outcome": "won"})
        connection.close()

    with transaction.atomic():
        Lead.objects.select_for_update().get(pk=lead_id)
        thread = threading.Thread(target=close)
        thread.start()
        thread.join(timeout=10)
        waited = thread.is_alive()
    thread.join(timeout=30)
    assert not waited
    r = outcome["response"]
    assert r.status_code == 200 and b'name="outcome"' in r.content  # the page again, to retry from
    shown = [str(m) for m in r.context["messages"]]
    assert shown == [f"Lead #{lead_id} is busy (being changed right now): it was not closed; retry."], shown
    assert (list(Lead.objects.values()), AuditEvent.objects.count()) == before
    assert manager.post(url, {"outcome": "won"}).status_code == 302
    assert AuditEvent.objects.get(lead_id=lead_id, type="lead.closed").actor == "admin:maria"


def test_a_manager_marks_leads_accepted_for_their_owner(api, make_group, manager):
    """The API's accept (manage scope) had no admin counterpart: a manager told by a rep that
    they took a lead could not stop its SLA clock from the admin."""
    from datetime import timedelta

    from django.utils import timezone

    from leads import actions

    group, reps = make_group(2, slug="emea", sla_minutes=30)
    ids = [api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"] for _ in range(3)]
    api.post(f"/api/v1/leads/{ids[1]}/close/", {"outcome": "lost"}, format="json")
    Membership.objects.filter(group=group).update(active=False)  # the next one is queued
    ids.append(api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"])
    owner = Lead.objects.get(pk=ids[0]).owner_id

    r = manager.post("/admin/leads/lead/", {"action": "accept_for_owner", "_selected_action": ids}, follow=True)
    shown = [str(m) for m in r.context["messages"]]
    assert shown[0] == "2 leads marked accepted by their owner.", shown
    assert f"#{ids[1]}: " in shown[1] and f"#{ids[3]}: no rep holds it (it is queued)." in shown[1], shown

    for lead_id in (ids[0], ids[2]):
        lead = Lead.objects.get(pk=lead_id)
        assert lead.status == "accepted" and lead.accepted_at is not None
        assert lead.assignments.get(ended_at__isnull=True).accepted_at == lead.accepted_at
        event = AuditEvent.objects.get(type="lead.accepted", lead_id=lead_id)
        assert event.actor == "admin:maria" and event.rep_id == lead.owner_id
    assert AuditEvent.objects.get(type="lead.accepted", lead_id=ids[0]).rep_id == owner
    assert Lead.objects.get(pk=ids[1]).status == "closed" and Lead.objects.get(pk=ids[3]).status == "queued"
    # Accepted, the leads are not escalated when their due time passes.
    actions.escalation_sweep(now=timezone.now() + timedelta(hours=1))
    assert not AuditEvent.objects.filter(type="lead.escalated").exists()
    assert Lead.objects.get(pk=ids[0]).owner_id == owner
    # Marked again, a lead already accepted is said to be so, not counted as "marked accepted".
    r = manager.post("/admin/leads/lead/", {"action": "accept_for_owner", "_selected_action": ids[:1]}, follow=True)
    shown = [str(m) for m in r.context["messages"]]
    assert shown == [f"Not done for 1 lead: #{ids[0]}: already accepted by its owner."], shown
    assert AuditEvent.objects.filter(type="lead.accepted", lead_id=ids[0]).count() == 1


def test_a_leads_email_edited_in_the_admin_is_stored_as_intake_stores_it(api, make_group, manager):
    """Intake and the API's PATCH store ana@bücher.example as ana@xn--bcher-kva.example; the
    lead form kept the Unicode form, so the same mailbox escaped dedup (a second open lead) and
    the API answered an address that is no schema email."""
    make_group(1, slug="emea")
    first = api.post("/api/v1/leads/", lead_body(group="emea", email="ana@bücher.example"), format="json").json()
    assert Lead.objects.get(pk=first["id"]).email == "ana@xn--bcher-kva.example"
    second = api.post("/api/v1/leads/", lead_body(group="emea", email="bo@acme.example"), format="json").json()
    lead = Lead.objects.get(pk=second["id"])
    form = lead_form(lead, first_name="")
    url = f"/admin/leads/lead/{lead.pk}/change/"
    r = manager.post(url, {**form, "email": "Ana@Bücher.example"})
    assert r.status_code == 200 and f"Lead {first['id']} is open with this email address" in r.content.decode()
    assert Lead.objects.get(pk=lead.pk).email == "bo@acme.example"

    assert manager.post(url, {**form, "email": "bo@bücher.example"}).status_code == 302
    lead.refresh_from_db()
    assert (lead.email, lead.email_normalized) == ("bo@xn--bcher-kva.example", "bo@xn--bcher-kva.example")
    assert api.get(f"/api/v1/leads/{lead.pk}/").json()["email"] == "bo@xn--bcher-kva.example"


def test_saving_a_queued_leads_page_writes_nothing(api, make_group, manager):
    """The queue's lead page has nothing editable, yet saving it wrote the whole lead row back
    as read, with no lock: a drain or an assignment committing in between was undone (the
    lead queued again, its new assignment left open)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    group, reps, ids = queued_leads(api, make_group, 1)
    url = f"/admin/leads/queuedlead/{ids[0]}/change/"
    with CaptureQueriesContext(connection) as queries:
        assert manager.post(url, {"_save": "Save"}).status_code in (302, 403)
    assert not [q["sql"] for q in queries.captured_queries if q["sql"].startswith('UPDATE "leads_lead"')]


def test_a_queued_leads_page_offers_what_a_manager_can_do_and_no_save(api, make_group, manager, client):
    """Its Save button changed nothing and said "changed successfully"; the page named no way
    to assign the lead. It is read-only now, with the lead's "Assign…" page and its trail."""
    from django.contrib.auth.models import Permission, User

    group, reps, ids = queued_leads(api, make_group, 1)
    url = f"/admin/leads/queuedlead/{ids[0]}/change/"
    page = manager.get(url)
    html = page.content.decode()
    assert page.status_code == 200 and 'name="_save"' not in html and 'name="_continue"' not in html
    assert f'href="/admin/leads/lead/{ids[0]}/reassign/"' in html and f"?lead_id={ids[0]}" in html
    assert manager.post(url, {"_save": "Save"}).status_code == 403
    assert Lead.objects.get(pk=ids[0]).status == "queued"
    # The list's actions still run from the queue page.
    manager.post("/admin/leads/queuedlead/", {"action": "close_disqualified", "_selected_action": ids, "apply": "1"})
    assert Lead.objects.get(pk=ids[0]).status == "closed"
    # Who may only read sees no "Assign…" leading to a 403.
    viewer = User.objects.create_user("viewer", password="pw-viewer-123", is_staff=True)
    viewer.user_permissions.add(*Permission.objects.filter(codename__in=["view_lead", "view_queuedlead"]))
    client.force_login(viewer)
    other = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"]
    seen = client.get(f"/admin/leads/queuedlead/{other}/change/")
    assert seen.status_code == 200 and b"/reassign/" not in seen.content and b"/close/" not in seen.content
    # But the lead's page and its trail, which the manager's "Manage" links: the page had none.
    assert f'href="/admin/leads/lead/{other}/change/"'.encode() in seen.content
    assert f'href="/admin/audit/auditevent/?lead_id={other}"'.encode() in seen.content


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.xdist_group("concurrency")
def test_saving_a_queued_leads_page_does_not_undo_an_assignment_made_meanwhile(api, make_group, manager):
    """The race itself: the page's save read the queued lead, another manager assigned it and
    committed, then the save wrote the row back as read: queued, with no owner, while its
    new assignment stayed open."""
    import threading
    import time

    from django.db import connection, transaction

    from leads import actions

    group, reps, ids = queued_leads(api, make_group, 1)
    url = f"/admin/leads/queuedlead/{ids[0]}/change/"
    done = threading.Event()

    def save_page() -> None:
        try:
            manager.post(url, {"_save": "Save"})
        finally:
            connection.close()
            done.set()

    with transaction.atomic():
        Lead.objects.select_for_update().get(pk=ids[0])  # as an assignment in progress holds it
        thread = threading.Thread(target=save_page)
        thread.start()
        deadline = time.monotonic() + 5
        while not done.is_set() and time.monotonic() < deadline:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
                if cursor.fetchone()[0]:
                    break  # the page's write waits for this transaction's row lock
            time.sleep(0.05)
        actions.lead_reassign(lead_id=ids[0], rep_id=reps[1].id, reason="on call", actor="admin:other")
    thread.join(timeout=30)
    lead = Lead.objects.get(pk=ids[0])
    assert (lead.status, lead.owner_id) == ("assigned", reps[1].id)
    assert lead.assignments.filter(ended_at__isnull=True).get().rep_id == reps[1].id


def test_route_again_says_where_each_lead_went(api, make_group, manager):
    group, reps = make_group(2, slug="emea")
    held = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()
    Membership.objects.filter(group=group, rep=reps[0]).update(active=False)
    moved = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()  # to reps[1]
    Membership.objects.filter(group=group).update(active=True)
    r = manager.post(
        "/admin/leads/lead/",
        {"action": "reroute", "_selected_action": [held["id"], moved["id"]], "apply": "1"},
        follow=True,
    )
    text = r.content.decode()
    assert "2 leads routed again." in text
    stored = {pk: Lead.objects.get(pk=pk) for pk in (held["id"], moved["id"])}
    for pk, lead in stored.items():
        stays = (
            " (stays with its rep)"
            if lead.owner_id == {held["id"]: held, moved["id"]: moved}[pk]["owner"]["id"]
            else ""
        )
        assert f"#{pk} to {lead.owner.name} in emea{stays}" in text


def test_a_queued_leads_pages_say_assign_and_close_without_an_assignment_to_end(api, make_group, manager):
    """A queued lead has no rep: its page offered "Reassign…", and its close page said closing
    "ends its assignment and stops its SLA clock", neither of which it has."""
    group, reps, ids = queued_leads(api, make_group, 1)
    change = manager.get(f"/admin/leads/lead/{ids[0]}/change/").content.decode()
    assert f'href="/admin/leads/lead/{ids[0]}/reassign/">Assign…</a>' in change
    page = " ".join(manager.get(f"/admin/leads/lead/{ids[0]}/reassign/").content.decode().split())
    assert "<title>Assign lead #" in page and 'value="Assign"' in page
    close = " ".join(manager.get(f"/admin/leads/lead/{ids[0]}/close/").content.decode().split())
    assert "Closing it takes it out of the fallback queue." in close
    assert "ends its assignment" not in close
    r = manager.post(f"/admin/leads/lead/{ids[0]}/reassign/", {"rep": reps[0].id, "reason": "cover"}, follow=True)
    assert [str(m) for m in r.context["messages"]][0] == f"Lead #{ids[0]} assigned to {reps[0].name}."
    # An assigned lead's pages keep saying what they do to it.
    change = manager.get(f"/admin/leads/lead/{ids[0]}/change/").content.decode()
    assert f'href="/admin/leads/lead/{ids[0]}/reassign/">Reassign…</a>' in change
    close = " ".join(manager.get(f"/admin/leads/lead/{ids[0]}/close/").content.decode().split())
    assert f"ends its assignment and stops its SLA clock; {reps[0].name} gets the capacity back." in close


def test_the_rep_choices_offer_the_leads_groups_members_first(api, make_group, manager):
    """Every active rep of the company, alphabetically: a manager giving a queued lead to
    someone in its group had to know who that was. The group's members come first (paused,
    away, off hours or full ones said so), the other reps after them; the bulk action does so
    when the leads share a group."""
    from rotation.models import Rep

    group, reps, ids = queued_leads(api, make_group, 2)  # emea's two members, both paused
    Membership.objects.filter(group=group, rep=reps[1]).update(active=True, max_open=0)  # active, still full
    Rep.objects.filter(pk=reps[0].pk).update(name="Zoe Member")
    make_group(1, slug="dach")
    other = Rep.objects.exclude(pk__in=[r.pk for r in reps]).get()
    Rep.objects.filter(pk=other.pk).update(name="Aaron Outsider")
    html = " ".join(manager.get(f"/admin/leads/lead/{ids[0]}/reassign/").content.decode().split())
    members = html.split('<optgroup label="Members of emea">')[1].split("</optgroup>")[0]
    others = html.split('<optgroup label="Other reps">')[1].split("</optgroup>")[0]
    assert f'<option value="{reps[0].pk}">Zoe Member (paused here)</option>' in members
    # One the rotation would step over says why, before the manager picks it.
    assert f'<option value="{reps[1].pk}">{reps[1].name} (at max_open cap (0/0))</option>' in members
    assert f'<option value="{other.pk}">Aaron Outsider</option>' in others and "Zoe" not in others
    # One is still picked by its id, from either list.
    r = manager.post(f"/admin/leads/lead/{ids[0]}/reassign/", {"rep": other.pk, "reason": "cover"})
    assert r.status_code == 302 and Lead.objects.get(pk=ids[0]).owner_id == other.pk
    page = manager.post("/admin/leads/queuedlead/", {"action": "assign_to_rep", "_selected_action": ids[1:]})
    assert '<optgroup label="Members of emea">' in page.content.decode()
    # Leads of two groups: one list, as before.
    in_dach = api.post("/api/v1/leads/", lead_body(group="dach"), format="json").json()["id"]
    mixed = manager.post("/admin/leads/lead/", {"action": "assign_to_rep", "_selected_action": [ids[1], in_dach]})
    assert "<optgroup" not in mixed.content.decode()


def test_route_again_asks_before_it_takes_leads_from_their_reps_naming_the_accepted_ones(api, make_group, manager):
    """Routed again, a rep's lead leaves the rep, an accepted one too: not undone by routing it
    back. The action ran at once; queued leads alone still go at once."""
    group, reps = make_group(2, slug="emea")
    held = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()
    accepted = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()
    api.post(f"/api/v1/leads/{accepted['id']}/accept/", {"rep": accepted["owner"]["id"]}, format="json")
    assert Lead.objects.get(pk=accepted["id"]).status == "accepted"
    ids = [held["id"], accepted["id"]]
    page = manager.post("/admin/leads/lead/", {"action": "reroute", "_selected_action": ids})
    text = " ".join(page.content.decode().split())
    assert page.status_code == 200 and "Route 2 leads again" in text
    assert "2 of them are held by a rep, <strong>1 accepted</strong>" in text
    assert [Lead.objects.get(pk=pk).status for pk in ids] == ["assigned", "accepted"]  # nothing done yet
    assert 'name="apply"' in text and all(f'value="{pk}"' in text for pk in ids)
    r = manager.post("/admin/leads/lead/", {"action": "reroute", "_selected_action": ids, "apply": "1"}, follow=True)
    assert "2 leads routed again." in r.content.decode()
    assert AuditEvent.objects.filter(lead_id__in=ids, type="lead.rerouted").count() == 2
    # Only queued leads: routed at once, the queue's daily work.
    Membership.objects.filter(group=group).update(active=False)
    queued = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()
    Membership.objects.filter(group=group).update(active=True)
    r = manager.post("/admin/leads/lead/", {"action": "reroute", "_selected_action": [queued["id"]]}, follow=True)
    assert "1 lead routed again." in r.content.decode() and Lead.objects.get(pk=queued["id"]).status == "assigned"


def test_a_reason_that_would_reorder_the_audit_trail_is_refused(api, make_group, manager):
    """A reason holding U+202E (right-to-left override) rendered the event's sentence backwards
    in the audit trail; names and pause reasons already refused it."""
    group, reps = make_group(2, slug="emea")
    lead_id = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"]
    r = manager.post(f"/admin/leads/lead/{lead_id}/reassign/", {"rep": reps[1].id, "reason": "late \u202egnorw"})
    assert r.status_code == 200 and "U+202E at character 6" in r.content.decode()
    r = api.post(f"/api/v1/leads/{lead_id}/reassign/", {"rep": reps[1].id, "reason": "late\u2066x"}, format="json")
    assert r.status_code == 400 and "U+2066" in r.json()["reason"][0], r.content
    assert Lead.objects.get(pk=lead_id).owner_id == reps[0].id
    assert not AuditEvent.objects.filter(type="lead.reassigned").exists()
    r = api.post(f"/api/v1/leads/{lead_id}/reassign/", {"rep": reps[1].id, "reason": " cover \u200f"}, format="json")
    assert r.status_code == 200, r.content  # a right-to-left mark a script needs stays
