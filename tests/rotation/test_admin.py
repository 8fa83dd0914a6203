"""The admin for sales ops and managers: pages, audited changes, no N+1 queries."""

import re

import pytest
from django.db import connection
from django.db.models import Max
from django.test.utils import CaptureQueriesContext

from audit.models import AuditEvent
from leads.models import Lead
from rotation import services
from rotation.models import Group, Membership, Rep, RoutingRule
from tests.conftest import lead_body
from tests.factories import RepFactory
from tests.security.test_admin_roles import form_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(client, django_user_model):
    user = django_user_model.objects.create_superuser("ops", "ops@example.com", "pw-ops-123")
    client.force_login(user)
    return client


def fill(api, make_group, groups: int, leads: int) -> None:
    for g in range(groups):
        make_group(2, slug=f"g{g}-{Group.objects.count()}")
    slugs = list(Group.objects.values_list("slug", flat=True))
    for i in range(leads):
        api.post("/api/v1/leads/", lead_body(group=slugs[i % len(slugs)]), format="json")


@pytest.mark.parametrize(
    "url",
    [
        "/admin/rotation/group/",
        "/admin/rotation/rep/",
        "/admin/leads/lead/",
        "/admin/leads/queuedlead/",
        "/admin/audit/auditevent/",
        "/admin/rotation/routingrule/",
        "/admin/leads/apiclient/",
        "/admin/notifications/outboxmessage/",
    ],
)
def test_list_pages_have_no_n_plus_1(staff, api, make_group, url):
    fill(api, make_group, 2, 4)
    with CaptureQueriesContext(connection) as small:
        assert staff.get(url).status_code == 200
    fill(api, make_group, 6, 40)
    with CaptureQueriesContext(connection) as large:
        assert staff.get(url).status_code == 200
    assert len(large) == len(small), [q["sql"] for q in large.captured_queries]


def test_group_page_shows_members_and_rotation(staff, make_group):
    group, reps = make_group(3, slug="emea")
    page = staff.get(f"/admin/rotation/group/{group.pk}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "Next: <strong>" + reps[0].name in html
    assert "Strategy <strong>Round robin</strong>" in html  # in words, not "round_robin"
    for rep in reps:
        assert rep.name in html
    first = Membership.objects.filter(group=group).order_by("position").values_list("position", flat=True)[0]
    assert (
        "after 0 turns since the group was made" in html
        and f"walk starts at position <strong>{first}</strong>." in html
    )


def test_the_group_page_says_where_the_next_turn_starts_when_the_pointer_wraps(staff, api, make_group):
    """After the last member's turn the stored pointer is past every position: the page said
    "pointer at position 4" of a group of three."""
    group, reps = make_group(3, slug="emea")
    positions = list(Membership.objects.filter(group=group).order_by("position").values_list("position", flat=True))
    for _ in range(3):
        api.post("/api/v1/leads/", lead_body(group="emea"), format="json")
    html = " ".join(staff.get(f"/admin/rotation/group/{group.pk}/change/").content.decode().split())
    assert "after 3 turns since the group was made (every lead its rotation gave out" in html, html
    wrapped = f"walk starts at position <strong>{positions[0]}</strong> (past the last member, so back at the first)."
    assert wrapped in html
    assert "Next: <strong>" + reps[0].name in html
    api.post("/api/v1/leads/", lead_body(group="emea"), format="json")
    html = " ".join(staff.get(f"/admin/rotation/group/{group.pk}/change/").content.decode().split())
    assert f"walk starts at position <strong>{positions[1]}</strong>." in html and "back at the first" not in html


def test_a_weighted_groups_page_says_an_ineligible_members_next_turn_waits_for_it(staff, api, make_group):
    """ "Next turn in 2" beside "no: rep inactive" read as a turn coming; it comes once the
    member is eligible again."""
    group, reps = make_group(3, slug="emea", strategy="weighted")
    for _ in range(2):
        api.post("/api/v1/leads/", lead_body(group="emea"), format="json")
    Membership.objects.filter(group=group, rep=reps[2]).update(active=False)
    html = staff.get(f"/admin/rotation/group/{group.pk}/change/").content.decode()
    row = html.split(f"<td>{reps[2].name}</td>", 1)[1].split("</tr>", 1)[0]
    assert "no: " in row and "<td>once eligible</td>" in row
    # Each eligible member's next turn, as the lead it will be: reps[0] and reps[1] took a
    # lead each, and with reps[2] out they take turns again.
    first = html.split(f"<td>{reps[0].name}</td>", 1)[1].split("</tr>", 1)[0]
    second = html.split(f"<td>{reps[1].name}</td>", 1)[1].split("</tr>", 1)[0]
    assert "once eligible" not in first + second
    assert "<td>the next lead</td>" in first and "<td>lead 2 from now</td>" in second, (first, second)


def test_a_weighted_groups_page_shows_each_members_current_weight_as_the_api_does(staff, api, make_group):
    """SPEC 4's rotation view shows current weights, in the admin as over the API: the page
    left them out."""
    group, reps = make_group(3, slug="emea", strategy="weighted")
    Membership.objects.filter(group=group, rep=reps[0]).update(weight=3)
    for _ in range(4):
        api.post("/api/v1/leads/", lead_body(group="emea"), format="json")
    members = api.get("/api/v1/groups/emea/rotation/").json()["members"]
    html = staff.get(f"/admin/rotation/group/{group.pk}/change/").content.decode()
    assert "<th" in html and ">Current weight</th>" in html
    for m in members:
        row = html.split(f"<td>{m['rep']['name']}</td>", 1)[1].split("</tr>", 1)[0]
        assert f"<td>{m['current_weight']}</td>" in row, (m, row)
    # A round robin has none: no column.
    make_group(1, slug="apac")
    html = staff.get(f"/admin/rotation/group/{Group.objects.get(slug='apac').pk}/change/").content.decode()
    assert "Current weight" not in html


def test_group_page_shows_the_week_share_as_it_shows_the_weight_share(staff, api, make_group):
    """Two decimals both: "0.33" of the weights beside "0.67" of the week, not "0.6667"."""
    group, reps = make_group(3, slug="emea")
    for _ in range(3):
        api.post("/api/v1/leads/", lead_body(group="emea"), format="json")
    Membership.objects.filter(group=group, rep=reps[2]).delete()
    html = staff.get(f"/admin/rotation/group/{group.pk}/change/").content.decode()
    assert "<td>0.50</td>" in html and "<td>0.33</td>" in html  # 1 of the week's 3 each
    assert "0.3333" not in html


def test_the_admin_shows_times_to_the_second(staff, api, make_group):
    """An assignment started, due, accepted and escalated within one minute read as one moment:
    Django's English format cuts times to the minute ("3:30 a.m.")."""
    from leads.models import Lead

    make_group(1, slug="emea", sla_minutes="0.5")
    lead_id = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"]
    due = Lead.objects.get(pk=lead_id).sla_due_at
    html = staff.get(f"/admin/leads/lead/{lead_id}/change/").content.decode()
    assert f"{due:%H:%M:%S} UTC" in html, html[-3000:]
    assert "a.m." not in html and "p.m." not in html


def test_lead_and_event_pages(staff, api, make_group):
    make_group(2, slug="emea")
    lead_id = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"]
    lead_page = staff.get(f"/admin/leads/lead/{lead_id}/change/")
    assert lead_page.status_code == 200
    # Labels as a manager reads them: "SLA due at", and each assignment row by its attempt.
    assert "SLA due at" in lead_page.content.decode() and "Sla due" not in lead_page.content.decode()
    assert f"Lead #{lead_id}, attempt 1" in lead_page.content.decode()
    event = AuditEvent.objects.get(type="lead.assigned", lead_id=lead_id)
    page = staff.get(f"/admin/audit/auditevent/{event.pk}/change/")
    assert page.status_code == 200 and b"pointer_before" in page.content
    # The rep once, by name and id; not again as a bare "Rep id" field above the event's id.
    html = page.content.decode()
    assert "field-rep_id" not in html and f"(#{event.rep_id})" in html
    # The lead is a link to its page (the trail is read to act on the lead), and the JSON as
    # recorded is folded away under the sentence that says it in words.
    assert f'<a href="/admin/leads/lead/{lead_id}/change/">#{lead_id}</a>' in html
    when = html.split("field-when")[1].split('<div class="readonly">')[1].split("</div>")[0]
    assert "+00:00" not in when and str(event.at.year) in when, when  # formatted, not ISO
    assert 'class="module aligned collapse"' in html and "Explanation as recorded (JSON)" in html
    listed = staff.get(f"/admin/audit/auditevent/?lead_id={lead_id}").content.decode()
    assert f'<a href="/admin/leads/lead/{lead_id}/change/">#{lead_id}</a>' in listed
    # Column and filter named as read: "When" and "By date", not "At" and "By at".
    assert "By date" in listed and "By at" not in listed and ">When</a>" in listed
    # The page's widths and no-wraps name columns the table has (renamed, they styled nothing).
    styled = re.findall(r"td\.field-(\w+)", listed)
    assert styled and all(f'class="field-{name}' in listed for name in styled), styled
    assert staff.get("/admin/leads/lead/?q=customer.example").status_code == 200
    assert staff.get("/admin/leads/lead/?status__exact=assigned").status_code == 200


def test_an_events_explanation_reads_names_as_written(staff, api, make_group):
    """The explanation on an event's page showed every accented letter as a JSON escape: a rep
    José Núñez was "Jos\\u00e9 N\\u00fa\\u00f1ez" among the candidates, for the manager reading why."""
    group, reps = make_group(2, slug="emea")
    reps[0].name = "José Núñez"
    reps[0].save(update_fields=["name"])
    lead_id = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"]
    event = AuditEvent.objects.get(type="lead.assigned", lead_id=lead_id)
    html = staff.get(f"/admin/audit/auditevent/{event.pk}/change/").content.decode()
    assert "&quot;name&quot;: &quot;José Núñez&quot;" in html
    assert "\\u00e9" not in html


def test_audit_trail_is_read_only_in_the_admin(staff, api, make_group):
    make_group(1, slug="emea")
    api.post("/api/v1/leads/", lead_body(group="emea"), format="json")
    event = AuditEvent.objects.first()
    assert staff.get("/admin/audit/auditevent/add/").status_code == 403
    before = event.explanation
    r = staff.post(f"/admin/audit/auditevent/{event.pk}/change/", {"type": "lead.closed", "actor": "me"})
    assert r.status_code == 403
    assert staff.post(f"/admin/audit/auditevent/{event.pk}/delete/", {"post": "yes"}).status_code == 403
    r = staff.post(
        "/admin/audit/auditevent/",
        {"action": "delete_selected", "_selected_action": [event.pk], "post": "yes"},
    )
    event.refresh_from_db()
    assert event.explanation == before


def inline_management(prefix: str, total: int, initial: int) -> dict:
    return {
        f"{prefix}-TOTAL_FORMS": str(total),
        f"{prefix}-INITIAL_FORMS": str(initial),
        f"{prefix}-MIN_NUM_FORMS": "0",
        f"{prefix}-MAX_NUM_FORMS": "1000",
    }


def group_form(**overrides) -> dict:
    data = {
        "slug": "admin-made",
        "name": "Made in the admin",
        "strategy": "round_robin",
        "active": "on",
        "timezone": "UTC",
        "max_attempts": "3",
        "dedup_days": "30",
        "owner_match_fallback_to_rotation": "on",
    }
    data.update(overrides)
    return data


def test_sales_ops_create_a_group_with_members_and_it_is_audited(staff):
    a, b = RepFactory(), RepFactory()
    data = group_form()
    data.update(inline_management("memberships", 2, 0))
    data.update({"memberships-0-rep": a.pk, "memberships-0-weight": "1", "memberships-0-active": "on"})
    data.update({"memberships-1-rep": b.pk, "memberships-1-weight": "2", "memberships-1-active": "on"})
    r = staff.post("/admin/rotation/group/add/", data)
    assert r.status_code == 302, r.content.decode()[:3000]
    group = Group.objects.get(slug="admin-made")
    assert list(
        Membership.objects.filter(group=group).order_by("position").values_list("rep_id", "position", "weight")
    ) == [
        (a.pk, 0, 1),
        (b.pk, 1, 2),
    ]
    events = AuditEvent.objects.filter(group="admin-made").order_by("id")
    assert [e.type for e in events] == ["group.changed", "membership.changed", "membership.changed"]
    assert all(e.actor == "admin:ops" for e in events)

    # Pausing a member in the inline is a membership change, audited with what changed.
    ma, mb = Membership.objects.filter(group=group).order_by("position")
    data = group_form()
    data.update(inline_management("memberships", 2, 2))
    data.update(
        {
            "memberships-0-id": ma.pk,
            "memberships-0-group": group.pk,
            "memberships-0-rep": a.pk,
            "memberships-0-position": "0",
            "memberships-0-weight": "1",
        }
    )
    data.update(
        {
            "memberships-1-id": mb.pk,
            "memberships-1-group": group.pk,
            "memberships-1-rep": b.pk,
            "memberships-1-position": "1",
            "memberships-1-weight": "2",
            "memberships-1-active": "on",
        }
    )
    r = staff.post(f"/admin/rotation/group/{group.pk}/change/", data)
    assert r.status_code == 302, r.content.decode()[:3000]
    ma.refresh_from_db()
    assert ma.active is False
    last = AuditEvent.objects.filter(type="membership.changed").last()
    assert last.rep_id == a.pk and last.explanation["changes"] == {"active": False}


def test_a_member_paused_in_the_inline_may_say_why(staff):
    a = RepFactory()
    data = group_form()
    data.update(inline_management("memberships", 1, 0))
    data.update({"memberships-0-rep": a.pk, "memberships-0-weight": "1", "memberships-0-active": "on"})
    assert staff.post("/admin/rotation/group/add/", data).status_code == 302
    group = Group.objects.get(slug="admin-made")
    member = Membership.objects.get(group=group)
    row = {
        "memberships-0-id": member.pk,
        "memberships-0-group": group.pk,
        "memberships-0-rep": a.pk,
        "memberships-0-position": "0",
        "memberships-0-weight": "1",
        "memberships-0-paused_reason": "parental leave",
    }
    data = {**group_form(), **inline_management("memberships", 1, 1), **row, "memberships-0-active": "on"}
    refused = staff.post(f"/admin/rotation/group/{group.pk}/change/", data)
    assert refused.status_code == 200 and "Only a paused member has a reason" in refused.content.decode()
    data.pop("memberships-0-active")  # unticked: paused
    assert staff.post(f"/admin/rotation/group/{group.pk}/change/", data).status_code == 302
    member.refresh_from_db()
    assert (member.active, member.paused_reason) == (False, "parental leave")


def test_leads_cannot_be_added_or_deleted_in_the_admin(staff, api, make_group):
    make_group(1, slug="emea")
    lead_id = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"]
    assert staff.get("/admin/leads/lead/add/").status_code == 403
    assert staff.post(f"/admin/leads/lead/{lead_id}/delete/", {"post": "yes"}).status_code == 403
    assert Lead.objects.filter(pk=lead_id).exists()


def absence_extended_on_the_rep_page(rep):
    """An absence of `rep` (10 to 12 January 2030, 09:00 UTC) and the rep page's form data
    that extends it to the 14th."""
    from datetime import UTC, datetime

    from rotation.models import Absence

    absence = Absence.objects.create(
        rep=rep, starts_at=datetime(2030, 1, 10, 9, tzinfo=UTC), ends_at=datetime(2030, 1, 12, 9, tzinfo=UTC)
    )
    return absence, {
        "name": rep.name,
        "email": rep.email,
        "timezone": rep.timezone,
        "active": "on",
        "working_hours": "null",
        **inline_management("absences", 1, 1),
        "absences-0-id": str(absence.pk),
        "absences-0-rep": str(rep.pk),
        "absences-0-starts_at_0": "2030-01-10",
        "absences-0-starts_at_1": "09:00:00",
        "absences-0-ends_at_0": "2030-01-14",
        "absences-0-ends_at_1": "09:00:00",
        "absences-0-reason": "holiday (extended)",
    }


def test_editing_an_absence_in_the_admin_is_audited_as_a_change_with_its_before(staff):
    """The rep page's absence inline: an edited absence is a change (with the values before),
    not a second "created" event for the same absence."""
    from datetime import UTC, datetime

    rep = RepFactory(name="Edsger Dijkstra", email="edsger@example.com")
    absence, form = absence_extended_on_the_rep_page(rep)
    response = staff.post(f"/admin/rotation/rep/{rep.pk}/change/", form)
    assert response.status_code == 302, response.content[-3000:]
    absence.refresh_from_db()
    assert absence.ends_at == datetime(2030, 1, 14, 9, tzinfo=UTC)
    event = AuditEvent.objects.get(type="absence.changed", rep_id=rep.pk)
    assert event.explanation["action"] == "changed"
    assert set(event.explanation["changes"]) == {"ends_at", "reason"}
    assert event.explanation["before"]["ends_at"].startswith("2030-01-12")


def test_deleting_a_rep_ends_the_trail_of_the_accounts_it_owned(staff):
    """A rep's accounts go with it (sticky routing for those domains ends): each account's
    trail must say so, as deleting the account from its own page does."""
    from rotation import services
    from rotation.models import Account

    rep = RepFactory(name="Temp Rep", email="temp@example.com")
    services.account_save(account=Account(domain="temp.example", name="Temp", owner=rep), actor="test")
    response = staff.post(f"/admin/rotation/rep/{rep.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not Account.objects.exists()
    deleted = AuditEvent.objects.filter(type="account.changed", explanation__action="deleted")
    assert [(e.rep_id, e.explanation["account"], e.explanation.get("because")) for e in deleted] == [
        (rep.pk, "temp.example", "rep deleted")
    ]


def test_a_reps_absences_are_entered_and_shown_in_the_reps_time_zone(staff):
    """The rep page took absence times as UTC, unlabelled, while working hours are in the rep's
    time zone: a Paris rep's 09:00 start was stored an hour late."""
    from datetime import UTC, datetime

    from rotation.models import Absence

    rep = RepFactory(name="Grace Hopper", email="grace@example.com", timezone="Europe/Paris")
    form = {
        "name": rep.name,
        "email": rep.email,
        "timezone": rep.timezone,
        "active": "on",
        "working_hours": "null",
        **inline_management("absences", 1, 0),
        "absences-0-rep": str(rep.pk),
        "absences-0-starts_at_0": "2030-01-10",
        "absences-0-starts_at_1": "09:00:00",
        "absences-0-ends_at_0": "2030-01-14",
        "absences-0-ends_at_1": "18:00:00",
        "absences-0-reason": "holiday",
    }
    response = staff.post(f"/admin/rotation/rep/{rep.pk}/change/", form)
    assert response.status_code == 302, response.content[-3000:]
    absence = Absence.objects.get(rep=rep)
    assert (absence.starts_at, absence.ends_at) == (
        datetime(2030, 1, 10, 8, tzinfo=UTC),
        datetime(2030, 1, 14, 17, tzinfo=UTC),
    )
    page = staff.get(f"/admin/rotation/rep/{rep.pk}/change/").content.decode()
    assert 'value="09:00:00"' in page and 'value="18:00:00"' in page
    assert "In the rep&#x27;s time zone (Europe/Paris)." in page
    # In the columns' headings too, which a tabular inline shows (its help text only on hover).
    assert "Starts at (Europe/Paris)" in page and "Ends at (Europe/Paris)" in page


def test_an_absence_saved_already_over_is_said_to_keep_nobody_out(staff):
    """Typed as the browser's clock reads for a rep in a zone hours ahead, an absence was over
    when saved, and the rep stayed in the rotation without a word."""
    rep = RepFactory(name="Mei Wang", email="mei@example.com", timezone="Asia/Tokyo")
    form = {
        "name": rep.name,
        "email": rep.email,
        "timezone": rep.timezone,
        "active": "on",
        "working_hours": "null",
        **inline_management("absences", 1, 0),
        "absences-0-rep": str(rep.pk),
        "absences-0-starts_at_0": "2020-01-10",
        "absences-0-starts_at_1": "09:00:00",
        "absences-0-ends_at_0": "2020-01-14",
        "absences-0-ends_at_1": "18:00:00",
        "absences-0-reason": "holiday",
    }
    response = staff.post(f"/admin/rotation/rep/{rep.pk}/change/", form, follow=True)
    shown = [str(m) for m in response.context["messages"]]
    assert any("The absence ending 2020-01-14 18:00 (Asia/Tokyo) is already over" in m for m in shown), shown


def test_a_new_reps_absences_are_in_the_time_zone_it_is_created_with(staff):
    """On the add page the absences were read as UTC whatever time zone the new rep was given:
    a Paris rep's holiday from 09:00 started at 10:00 Paris time."""
    from datetime import UTC, datetime

    from rotation.models import Absence, Rep

    form = {
        "name": "Grace Hopper",
        "email": "grace@example.com",
        "timezone": "Europe/Paris",
        "active": "on",
        "working_hours": "null",
        **inline_management("absences", 1, 0),
        "absences-0-starts_at_0": "2030-01-10",
        "absences-0-starts_at_1": "09:00:00",
        "absences-0-ends_at_0": "2030-01-14",
        "absences-0-ends_at_1": "18:00:00",
        "absences-0-reason": "holiday",
    }
    response = staff.post("/admin/rotation/rep/add/", form)
    assert response.status_code == 302, response.content[-3000:]
    absence = Absence.objects.get(rep=Rep.objects.get(email="grace@example.com"))
    assert (absence.starts_at, absence.ends_at) == (
        datetime(2030, 1, 10, 8, tzinfo=UTC),
        datetime(2030, 1, 14, 17, tzinfo=UTC),
    )
    assert "(UTC)" not in staff.get("/admin/rotation/rep/add/").content.decode()


def test_a_reps_absence_row_is_titled_in_the_reps_time_zone(staff):
    """The absence row's title said the UTC times above fields in the rep's time zone: a Paris
    rep's 09:00 to 18:00 read "08:00 to 17:00" right beside them."""
    from datetime import UTC, datetime

    from rotation.models import Absence

    rep = RepFactory(name="Grace Hopper", email="grace@example.com", timezone="Europe/Paris")
    Absence.objects.create(
        rep=rep, starts_at=datetime(2030, 1, 10, 8, tzinfo=UTC), ends_at=datetime(2030, 1, 14, 17, tzinfo=UTC)
    )
    page = staff.get(f"/admin/rotation/rep/{rep.pk}/change/").content.decode()
    assert "Grace Hopper away 2030-01-10 09:00 to 2030-01-14 18:00" in page


def test_a_groups_slug_cannot_be_renamed_in_the_admin(staff, api, make_group):
    """As over the API: integrations post to the slug and the audit trail names it."""
    group, _ = make_group(1, slug="emea")
    assert staff.get(f"/admin/rotation/group/{group.pk}/change/").status_code == 200
    data = group_form(slug="renamed", name="EMEA inbound")
    data.update(inline_management("memberships", 0, 0))
    r = staff.post(f"/admin/rotation/group/{group.pk}/change/", data)
    assert r.status_code == 302, r.content.decode()[:3000]
    group.refresh_from_db()
    assert (group.slug, group.name) == ("emea", "EMEA inbound")
    assert api.post("/api/v1/leads/", lead_body(group="emea"), format="json").status_code == 201


def test_an_existing_member_rows_rep_cannot_be_swapped_in_the_admin(staff, make_group):
    group, (a, b) = make_group(2, slug="emea")
    other = RepFactory()
    ma, mb = Membership.objects.filter(group=group).order_by("position")
    data = group_form(slug="emea", name=group.name)
    data.update(inline_management("memberships", 2, 2))
    for i, (m, rep) in enumerate(((ma, other), (mb, b))):  # the first row's rep "changed"
        data.update(
            {
                f"memberships-{i}-id": m.pk,
                f"memberships-{i}-group": group.pk,
                f"memberships-{i}-rep": rep.pk,
                f"memberships-{i}-position": str(m.position),
                f"memberships-{i}-weight": "1",
                f"memberships-{i}-active": "on",
            }
        )
    r = staff.post(f"/admin/rotation/group/{group.pk}/change/", data)
    assert r.status_code == 302, r.content.decode()[:3000]
    ma.refresh_from_db()
    assert ma.rep_id == a.pk
    assert not Membership.objects.filter(group=group, rep=other).exists()


def test_an_existing_member_whose_position_is_emptied_moves_to_the_end_of_the_rotation(staff, make_group):
    """The admin says "leave empty to append at the end". An existing member's row emptied was
    saved at the form's placeholder position (1,000,000,000), past the highest position the API
    and the admin take, so that no member could be appended to the group any more."""
    group, (a, b, c) = make_group(3, slug="emea")
    members = list(Membership.objects.filter(group=group).order_by("position"))
    data = _member_rows(group, members)
    data["memberships-0-position"] = ""
    r = staff.post(f"/admin/rotation/group/{group.pk}/change/", data)
    assert r.status_code == 302, r.content.decode()[-2000:]
    positions = dict(Membership.objects.filter(group=group).values_list("rep_id", "position"))
    assert positions == {b.pk: 1, c.pk: 2, a.pk: 3}
    event = AuditEvent.objects.filter(type="membership.changed", rep_id=a.pk).last()
    assert event.actor == "admin:ops"
    assert event.explanation["before"] == {"position": 0} and event.explanation["changes"] == {"position": 3}
    # The group still takes joiners, appended after it.
    services.membership_add(group=group, rep=RepFactory(), actor="test")
    assert Membership.objects.filter(group=group).aggregate(m=Max("position"))["m"] == 4


def test_a_group_page_holding_a_member_appended_past_the_highest_given_position_saves(staff, make_group):
    """Every row of the page is validated, changed or not: a member appended at 100,001 (after
    one given 100,000, the most a position may be given) made the whole page refuse to save."""
    from rotation.services import MAX_GIVEN_POSITION

    group, (a,) = make_group(1, slug="emea")
    Membership.objects.filter(group=group).update(position=MAX_GIVEN_POSITION)
    services.membership_add(group=group, rep=RepFactory(), actor="test")
    members = list(Membership.objects.filter(group=group).order_by("position"))
    assert members[1].position == MAX_GIVEN_POSITION + 1
    data = _member_rows(group, members)
    data["memberships-0-weight"] = "3"
    r = staff.post(f"/admin/rotation/group/{group.pk}/change/", data)
    assert r.status_code == 302, r.content.decode()[-3000:]
    assert Membership.objects.get(pk=members[0].pk).weight == 3
    # Moving a member there by hand is still refused.
    data["memberships-0-position"] = str(MAX_GIVEN_POSITION + 5)
    r = staff.post(f"/admin/rotation/group/{group.pk}/change/", data)
    assert r.status_code == 200 and "less than or equal to 100000" in r.content.decode()


def test_a_new_member_row_past_the_highest_position_is_a_form_error(staff, make_group):
    group, (a,) = make_group(1, slug="emea")
    Membership.objects.filter(group=group).update(position=1_000_000)
    other = RepFactory()
    data = group_form(slug="emea", name=group.name)
    data.update(inline_management("memberships", 1, 0))
    data.update({"memberships-0-rep": other.pk, "memberships-0-weight": "1", "memberships-0-active": "on"})
    r = staff.post(f"/admin/rotation/group/{group.pk}/change/", data)
    assert r.status_code == 200 and "the highest" in r.content.decode()
    assert not Membership.objects.filter(group=group, rep=other).exists()


def test_the_audit_trail_says_what_a_configuration_change_did(staff, make_group):
    """Configuration events read "-" under "What happened": a member paused and a member
    removed looked the same in the trail."""
    from rotation import services

    group, (a, b) = make_group(2, slug="emea")
    paused, removed = Membership.objects.filter(group=group).order_by("position")
    paused.active = False
    services.membership_update(membership=paused, actor="admin:ops", changed=["active"])
    services.membership_remove(membership=removed, actor="admin:ops")
    html = staff.get("/admin/audit/auditevent/?type__exact=membership.changed").content.decode()
    assert "Changed: active true → false." in html
    assert "Removed from the rotation (was at position 1)." in html


def test_deleting_a_rep_with_leads_says_the_leads_keep_it(staff, api, make_group):
    """The delete page said "your account doesn't have permission to delete ... lead", sending
    sales ops to ask for a permission no one has: the rep's leads keep it (protected)."""
    group, (rep,) = make_group(1, slug="emea")
    assert api.post("/api/v1/leads/", lead_body(group="emea"), format="json").status_code == 201
    for url in (f"/admin/rotation/rep/{rep.pk}/delete/", f"/admin/rotation/group/{group.pk}/delete/"):
        html = staff.get(url).content.decode()
        assert "following protected related objects" in html, url
        assert "permission to delete" not in html, url


def test_the_delete_page_of_a_group_with_many_leads_says_what_keeps_it_without_listing_them(staff, api, make_group):
    """Django's page lists every protected row: a busy group's year of leads took half a
    minute and megabytes to say no. It says what keeps the group, in as many queries for many
    leads as for one."""
    group, (rep,) = make_group(1, slug="emea")
    counts = []
    for n in (1, 6):
        while Lead.objects.count() < n:
            assert api.post("/api/v1/leads/", lead_body(group="emea"), format="json").status_code in (200, 201)
        with CaptureQueriesContext(connection) as queries:
            html = staff.get(f"/admin/rotation/group/{group.pk}/delete/").content.decode()
        counts.append(len(queries))
        assert "kept by its leads" in html and "Lead:" not in html
        assert "following protected related objects" in html
        rep_page = staff.get(f"/admin/rotation/rep/{rep.pk}/delete/").content.decode()
        assert "kept by its leads" in rep_page and "Lead:" not in rep_page
    assert counts[0] == counts[1], counts
    assert Group.objects.filter(pk=group.pk).exists()


@pytest.mark.parametrize(
    ("zone", "starts", "ends", "bad"),
    [
        # "Away for good": the end, read in UTC, is in the year 10000.
        ("America/New_York", ("2026-01-01", "00:00:00"), ("9999-12-31", "23:59:00"), "ends_at"),
        # The start, read in UTC, is before the year 1.
        ("Asia/Tokyo", ("0001-01-01", "00:00:00"), ("2030-01-01", "00:00:00"), "starts_at"),
    ],
)
def test_an_absence_out_of_range_once_in_utc_is_a_form_error(staff, api, make_group, zone, starts, ends, bad):
    """A New York rep marked away until 9999-12-31 23:59 was saved: PostgreSQL keeps the year
    10000 in UTC, but it cannot be read back, so every lead routed to the rep's group, the
    rep's page and the group's rotation view failed with a server error from then on."""
    from rotation.models import Absence, Rep

    group, (rep,) = make_group(1, slug="emea")
    Rep.objects.filter(pk=rep.pk).update(timezone=zone)
    form = {
        "name": rep.name,
        "email": rep.email,
        "timezone": zone,
        "active": "on",
        "working_hours": "null",
        **inline_management("absences", 1, 0),
        "absences-0-rep": str(rep.pk),
        "absences-0-starts_at_0": starts[0],
        "absences-0-starts_at_1": starts[1],
        "absences-0-ends_at_0": ends[0],
        "absences-0-ends_at_1": ends[1],
        "absences-0-reason": "left",
    }
    response = staff.post(f"/admin/rotation/rep/{rep.pk}/change/", form)
    assert response.status_code == 200
    errors = response.context["inline_admin_formsets"][0].formset.forms[0].errors
    assert "out of range" in errors[bad][0], errors
    assert not Absence.objects.exists()
    assert api.post("/api/v1/leads/", lead_body(group="emea"), format="json").status_code == 201
    assert staff.get(f"/admin/rotation/rep/{rep.pk}/change/").status_code == 200


def test_a_reps_page_with_an_absence_that_has_no_time_in_its_zone_is_shown_in_utc(staff, api, make_group):
    """An absence posted over the API until 9999-12-31T23:59:59Z ("for good"), for a Paris
    rep: the rep's page, shown in the rep's time zone, failed with a server error (the end is
    in the year 10000 there), so sales ops could not open the rep any more."""
    from rotation.models import Absence, Rep
    from tests.security.test_admin_roles import form_of

    group, (rep,) = make_group(1, slug="emea")
    Rep.objects.filter(pk=rep.pk).update(timezone="Europe/Paris")
    body = {"starts_at": "2030-01-01T00:00:00Z", "ends_at": "9999-12-31T23:59:59Z", "reason": "left"}
    assert api.post(f"/api/v1/reps/{rep.pk}/absences/", body, format="json").status_code == 201
    url = f"/admin/rotation/rep/{rep.pk}/change/"
    page = staff.get(url)
    assert page.status_code == 200
    html = page.content.decode()
    assert 'value="9999-12-31"' in html and 'value="23:59:59"' in html
    assert "In UTC: an absence of this rep has no time in its time zone (Europe/Paris)." in html
    # Saved as shown, the absence is unchanged (read in UTC, as it is shown).
    data = form_of(page)
    data["name"] = ["Renamed"]
    assert staff.post(url, data).status_code == 302
    absence = Absence.objects.get(rep=rep)
    assert (absence.starts_at.isoformat(), absence.ends_at.isoformat()) == (
        "2030-01-01T00:00:00+00:00",
        "9999-12-31T23:59:59+00:00",
    )
    assert Rep.objects.get(pk=rep.pk).name == "Renamed"


def test_searching_the_trail_for_a_number_finds_the_leads_and_reps_events_by_their_indexes(staff, api, make_group):
    """The trail's search compared lead and rep ids as text (Django's "=" search): every search
    read the whole audit table, seconds per page on a large trail. A number is now looked up
    as a lead id or a rep id, through their indexes; other text still searches actor and
    request id."""
    group, reps = make_group(2, slug="emea")
    lead_id = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"]
    with CaptureQueriesContext(connection) as queries:
        page = staff.get(f"/admin/audit/auditevent/?q={lead_id}")
    found = list(page.context["cl"].result_list)
    assert {e.type for e in found if e.lead_id == lead_id} == {"lead.received", "lead.assigned"}
    assert all(e.lead_id == lead_id or e.rep_id == lead_id for e in found)
    searched = [q["sql"] for q in queries.captured_queries if 'FROM "audit_auditevent"' in q["sql"]]
    assert searched and not [sql for sql in searched if "::text" in sql], searched
    by_rep = staff.get(f"/admin/audit/auditevent/?q={reps[1].pk}").context["cl"].result_list
    assert any(e.rep_id == reps[1].pk and e.type == "membership.changed" for e in by_rep)
    by_actor = staff.get("/admin/audit/auditevent/?q=test").context["cl"].result_list
    assert by_actor and all("test" in e.actor for e in by_actor)
    assert staff.get("/admin/audit/auditevent/?q=99999999999999999999").status_code == 200


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)  # the position constraint is checked at commit
def test_new_member_rows_appended_and_placed_in_one_save_take_distinct_positions(staff):
    """Two new member rows in one save, the first left to append and the second given
    position 0: the first was appended (at 0, the group being empty) before the second was
    written at 0, and the commit failed on the unique position, a server error."""
    first, second = RepFactory(), RepFactory()
    data = group_form()
    data.update(inline_management("memberships", 2, 0))
    data.update({"memberships-0-rep": str(first.pk), "memberships-0-weight": "1", "memberships-0-active": "on"})
    data.update({"memberships-1-rep": str(second.pk), "memberships-1-weight": "1", "memberships-1-active": "on"})
    data["memberships-1-position"] = "0"
    response = staff.post("/admin/rotation/group/add/", data)
    assert response.status_code == 302, response.content[-2000:]
    group = Group.objects.get(slug="admin-made")
    positions = dict(Membership.objects.filter(group=group).values_list("rep_id", "position"))
    assert positions == {second.pk: 0, first.pk: 1}
    joined = [e.rep_id for e in AuditEvent.objects.filter(type="membership.changed").order_by("id")]
    assert sorted(joined) == sorted([first.pk, second.pk])


def test_the_audit_trail_lists_the_newest_events_first(staff, api, make_group):
    """A manager opens the trail for what just happened: the first page held the oldest events."""
    import re

    make_group(1, slug="emea")
    for _ in range(3):
        assert api.post("/api/v1/leads/", lead_body(group="emea"), format="json").status_code == 201
    html = staff.get("/admin/audit/auditevent/").content.decode()
    shown = [int(i) for i in re.findall(r'<th class="field-id"><a href="[^"]*">(\d+)</a>', html)]
    assert shown and shown == sorted(AuditEvent.objects.values_list("id", flat=True), reverse=True)


def test_reps_of_one_name_are_told_apart_where_a_rep_is_picked(staff, make_group):
    group, (member,) = make_group(1, slug="emea")
    twin = RepFactory(name=member.name, active=False)
    found = staff.get(
        "/admin/autocomplete/",
        {"app_label": "rotation", "model_name": "membership", "field_name": "rep", "term": member.name},
    )
    assert found.status_code == 200, found.content
    texts = sorted(r["text"] for r in found.json()["results"])
    assert texts == sorted([f"{member.name} <{member.email}>", f"{twin.name} <{twin.email}> (inactive)"])
    owner = staff.get(
        "/admin/autocomplete/",
        {"app_label": "rotation", "model_name": "account", "field_name": "owner", "term": twin.email},
    )
    assert [r["text"] for r in owner.json()["results"]] == [f"{twin.name} <{twin.email}> (inactive)"]
    # The rep already chosen on a member row reads the same.
    page = staff.get(f"/admin/rotation/group/{group.pk}/change/").content.decode()
    assert f"{member.name} &lt;{member.email}&gt;</option>" in page


def _member_rows(group, members) -> dict:
    data = group_form(slug=group.slug, name=group.name)
    data.update(inline_management("memberships", len(members), len(members)))
    for i, m in enumerate(members):
        data.update(
            {
                f"memberships-{i}-id": m.pk,
                f"memberships-{i}-group": group.pk,
                f"memberships-{i}-rep": m.rep_id,
                f"memberships-{i}-position": str(m.position),
                f"memberships-{i}-weight": str(m.weight),
                f"memberships-{i}-active": "on",
            }
        )
    return data


@pytest.mark.parametrize("row", ["new", "existing"])
def test_a_position_taken_since_the_group_page_was_read_is_a_form_error(staff, make_group, row):
    """The page lists the members as they were when it was read: one who joined since at
    position 7 is not on it. A row of the page placed at 7 (a new member, or one moved there)
    was checked against the rows of the page only, and the commit failed on the unique
    position: a server error, where the page should say the position is taken."""
    group, (a,) = make_group(1, slug="emea")
    members = list(Membership.objects.filter(group=group))  # the page as read
    joiner, newcomer = RepFactory(), RepFactory()
    Membership.objects.create(group=group, rep=joiner, position=7)  # joined meanwhile
    data = _member_rows(group, members)
    if row == "new":
        data.update(inline_management("memberships", 2, 1))
        data.update(
            {
                "memberships-1-rep": str(newcomer.pk),
                "memberships-1-group": group.pk,
                "memberships-1-position": "7",
                "memberships-1-weight": "1",
                "memberships-1-active": "on",
            }
        )
    else:
        data["memberships-0-position"] = "7"
    r = staff.post(f"/admin/rotation/group/{group.pk}/change/", data)
    assert r.status_code == 200, r.content.decode()[-2000:]
    assert "Position 7 is taken" in r.content.decode()
    positions = dict(Membership.objects.filter(group=group).values_list("rep_id", "position"))
    assert positions == {a.pk: members[0].position, joiner.pk: 7}


def test_members_swapping_positions_on_the_page_is_no_conflict(staff, make_group):
    group, (a, b) = make_group(2, slug="emea")
    ma, mb = Membership.objects.filter(group=group).order_by("position")
    data = _member_rows(group, [ma, mb])
    data["memberships-0-position"], data["memberships-1-position"] = str(mb.position), str(ma.position)
    r = staff.post(f"/admin/rotation/group/{group.pk}/change/", data)
    assert r.status_code == 302, r.content.decode()[-2000:]
    positions = dict(Membership.objects.filter(group=group).values_list("rep_id", "position"))
    assert positions == {a.pk: mb.position, b.pk: ma.position}


# Committed: the unique position is checked at commit (deferred, so that members swap places).
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "race",
    # SQLite has no deferred unique constraint: Django leaves the position's out there.
    ["same_rep_added", pytest.param("position_taken_by_a_row_of_the_page", marks=pytest.mark.postgres)],
)
def test_a_group_page_colliding_with_a_change_saved_since_is_refused_and_said(staff, make_group, race):
    """Two tabs of one group: one adds a rep (or moves a member to position 7) and saves; the
    other, read before, adds the same rep (or moves another member to 7). Its form checks the
    rows of its own page, which pass; the save then hit the unique constraint: a 500 page."""
    group, (a, b) = make_group(2, slug="emea")
    members = list(Membership.objects.filter(group=group).order_by("position"))
    data = form_of(staff.get(f"/admin/rotation/group/{group.pk}/change/"))  # the page as read
    if race == "same_rep_added":
        newcomer = RepFactory()
        services.membership_add(group=group, rep=newcomer, actor="test")  # the other tab
        data["memberships-TOTAL_FORMS"] = ["3"]
        row = {"rep": newcomer.pk, "group": group.pk, "position": "", "weight": 1, "active": "on"}
        data.update({f"memberships-2-{k}": [str(v)] for k, v in row.items()})
        expected = "a rep added here was made a member of the group"
    else:
        services.membership_update(membership=_with(members[0], position=7), actor="test", changed=["position"])
        data["memberships-1-position"] = ["7"]
        expected = "a position given here was taken by another member"
    data["name"] = ["Renamed on the late tab"]
    before = dict(Membership.objects.filter(group=group).values_list("rep_id", "position"))
    r = staff.post(f"/admin/rotation/group/{group.pk}/change/", data)
    assert r.status_code == 302 and r["Location"] == f"/admin/rotation/group/{group.pk}/change/"
    # Nothing of the late page half-saved: not its rows, not the group's own fields.
    assert dict(Membership.objects.filter(group=group).values_list("rep_id", "position")) == before
    assert Group.objects.get(pk=group.pk).name == group.name
    page = staff.get(r["Location"]).content.decode()
    if connection.vendor == "postgresql":  # SQLite's error names no constraint
        assert f"Nothing was saved: {expected} by someone else since the page was read." in page
    else:
        assert "Nothing was saved:" in page


def _with(membership: Membership, **fields) -> Membership:
    for name, value in fields.items():
        setattr(membership, name, value)
    return membership


def test_a_save_of_a_group_page_holding_a_member_removed_since_is_refused_and_said(staff, make_group):
    """Another sales ops removed a member while this page was open: its row's hidden id no
    longer names a member. The page said "Please correct the error below." and showed no error
    anywhere (the row is not drawn again), and saving it again failed again."""
    group, (a, b) = make_group(2, slug="emea")
    members = list(Membership.objects.filter(group=group).order_by("position"))
    data = _member_rows(group, members)
    data["memberships-0-weight"] = "2"
    members[1].delete()
    r = staff.post(f"/admin/rotation/group/{group.pk}/change/", data)
    assert r.status_code == 302 and r["Location"] == f"/admin/rotation/group/{group.pk}/change/"
    assert Membership.objects.get(pk=members[0].pk).weight == 1  # nothing half-saved
    page = staff.get(r["Location"])
    assert "1 membership of this page was removed by someone else since the page was read" in page.content.decode()
    data = form_of(page)
    data["memberships-0-weight"] = ["2"]
    again = staff.post(f"/admin/rotation/group/{group.pk}/change/", data)  # the change made again
    assert again.status_code == 302, again.content.decode()[-3000:]
    assert Membership.objects.get(pk=members[0].pk).weight == 2


def test_a_save_of_a_rep_page_holding_an_absence_removed_since_is_refused_and_said(staff):

    rep = RepFactory(timezone="UTC")
    absence, form = absence_extended_on_the_rep_page(rep)
    absence.delete()
    r = staff.post(f"/admin/rotation/rep/{rep.pk}/change/", form, follow=True)
    assert "removed by someone else since the page was read" in r.content.decode()
    assert not AuditEvent.objects.filter(type="rep.changed", explanation__action="changed").exists()


def test_group_page_says_when_a_rep_away_is_back_in_the_reps_time_zone(staff, make_group):
    """ "out of office until 2026-12-04T13:17:46.567557+00:00" is the API's reason; on the
    page a manager reads the date and time the rep is back, in the rep's time zone."""
    from datetime import UTC, datetime, timedelta

    from django.utils import timezone

    from rotation.models import Absence

    group, reps = make_group(2, slug="emea")
    reps[1].timezone = "Europe/Paris"
    reps[1].save(update_fields=["timezone"])
    back = datetime(timezone.now().year + 1, 1, 5, 8, 30, 15, 123456, tzinfo=UTC)
    Absence.objects.create(rep=reps[1], starts_at=timezone.now() - timedelta(hours=1), ends_at=back)
    html = staff.get(f"/admin/rotation/group/{group.pk}/change/").content.decode()
    assert f"no: out of office until {back.year}-01-05 09:30 (Europe/Paris)" in html
    assert back.isoformat() not in html


def test_group_page_of_a_rep_away_until_the_last_year_there_is(staff, make_group):
    """Away "until 9999-12-31 23:00" (UTC, until further notice) is past the last date there is
    in a time zone east of UTC: the group page failed with a server error, for every member."""
    from datetime import UTC, datetime, timedelta

    from django.utils import timezone

    from rotation.models import Absence

    group, reps = make_group(2, slug="emea")
    reps[1].timezone = "Europe/Paris"
    reps[1].save(update_fields=["timezone"])
    back = datetime(9999, 12, 31, 23, 0, tzinfo=UTC)
    Absence.objects.create(rep=reps[1], starts_at=timezone.now() - timedelta(hours=1), ends_at=back)
    page = staff.get(f"/admin/rotation/group/{group.pk}/change/")
    assert page.status_code == 200
    assert "no: out of office until 9999-12-31 23:00 (UTC)" in page.content.decode()


def test_the_trail_puts_its_sentence_beside_the_type_and_keeps_it_readable(staff, api, make_group):
    """On a laptop's width, beside the menu and the filters, the columns after the first few
    are scrolled to: "What happened" comes right after the type, and holds a measure wide
    enough to read (else the other columns squeezed it to a word a line)."""
    make_group(2, slug="emea")
    api.post("/api/v1/leads/", lead_body(group="emea"), format="json")
    html = staff.get("/admin/audit/auditevent/").content.decode()
    headers = re.findall(r'<th scope="col" class="[^"]*column-(\w+)', html)
    assert headers[headers.index("type") + 1] == "summary", headers
    assert headers[-1] == "actor", headers
    assert "td.field-summary { min-width:" in html


def test_a_rep_without_working_hours_shows_an_empty_box_and_saves_as_none(staff):
    """ "Empty: always", says the help text: the box was filled with the word null."""
    rep = RepFactory(working_hours=None)
    url = f"/admin/rotation/rep/{rep.pk}/change/"
    page = staff.get(url)
    assert re.search(r'<textarea name="working_hours"[^>]*>\s*</textarea>', page.content.decode())
    data = form_of(page)
    assert staff.post(url, data).status_code == 302
    assert Rep.objects.get(pk=rep.pk).working_hours is None
    assert not AuditEvent.objects.filter(type="rep.changed").exists()  # nothing changed
    data["working_hours"] = ['{"mon": [["09:00", "17:30"]]}']
    assert staff.post(url, data).status_code == 302
    assert Rep.objects.get(pk=rep.pk).working_hours == {"mon": [["09:00", "17:30"]]}
    page = staff.get(url).content.decode()
    assert "09:00" in page and "null" not in re.search(r"<textarea[^>]*>(.*?)</textarea>", page, re.S).group(1)


def test_the_rule_form_says_how_conditions_are_written_and_which_priority_goes_first(staff):
    """Sales ops writing a rule met an empty "Conditions" box and "[]": the shape, the fields
    and the operators were found only by trying (and reading the errors)."""
    html = staff.get("/admin/rotation/routingrule/add/").content.decode()
    assert '[{"field": "country", "op": "in", "value": ["FR", "BE"]}' in html
    for name in ("company_size", "email_domain", "attributes.campaign", "not_in", "exists"):
        assert name in html, name
    # A rule needs a condition (as over the API): the form said "[] matches every lead", showed
    # [] in the box, and refused it on save as "This field is required."
    assert "[] matches every lead" not in html and "At least one: the leads no rule matches" in html
    assert "lowest first (1 before 10)" in html


def test_group_and_rep_forms_name_the_default_flag_and_the_time_zone_in_words(staff, make_group):
    """The labels were the field names as Django cased them ("Is default", "Timezone"), and
    the time zone box gave no hint of what it takes until a save was refused."""
    make_group(1, slug="emea")
    group_page = staff.get("/admin/rotation/group/add/").content.decode()
    assert "Default group" in group_page and "Is default" not in group_page
    assert ">Time zone:</label>" in group_page and "such as Europe/Paris" in group_page
    listed = staff.get("/admin/rotation/group/").content.decode()
    assert ">Default group</a>" in listed and "Is default" not in listed
    rep_page = staff.get("/admin/rotation/rep/add/").content.decode()
    assert ">Time zone:</label>" in rep_page and "such as Europe/Paris" in rep_page


def test_api_clients_are_spelled_with_api_in_capitals(staff, api, make_group):
    """Django cased the model's name as "Api clients" on the index and "Api client" on a lead."""
    make_group(1, slug="emea")
    lead_id = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"]
    index = staff.get("/admin/").content.decode()
    assert ">API clients</a>" in index and "Api client" not in index
    lead_page = staff.get(f"/admin/leads/lead/{lead_id}/change/").content.decode()
    assert "API client:" in lead_page and "Api client" not in lead_page


def test_a_leads_attributes_read_as_key_and_value_not_as_json(staff, api, make_group):
    """A manager reading why a lead went where it went saw {"campaign": "spring", "vip": true}."""
    make_group(1, slug="emea")
    body = lead_body(group="emea", attributes={"vip": True, "campaign": "spring"})
    lead_id = api.post("/api/v1/leads/", body, format="json").json()["id"]
    html = staff.get(f"/admin/leads/lead/{lead_id}/change/").content.decode()
    facts = html.split("Routing facts")[1].split("Routing</")[0]
    assert "campaign: spring<br>vip: true" in facts
    assert "&quot;campaign&quot;" not in facts


def test_the_filters_name_their_no_group_and_no_rep_choices(staff, make_group):
    """The group and owner filters ended on a bare "-", read as a stray dash, not as "none"."""
    make_group(1, slug="emea")
    queue = staff.get("/admin/leads/queuedlead/").content.decode()
    assert '?group__isnull=True">(no group)</a>' in queue
    leads = staff.get("/admin/leads/lead/").content.decode()
    assert '?group__isnull=True">(no group)</a>' in leads and '?owner__isnull=True">(no rep)</a>' in leads


def test_the_account_form_says_what_an_account_does(staff):
    """The three field names alone did not say that an account routes its leads to its owner,
    past the rotation, nor what is typed as a domain."""
    html = staff.get("/admin/rotation/account/add/").content.decode()
    assert "like acme.example" in html and "skipping the rotation" in html


def test_a_members_fixed_rep_offers_no_add_a_rep_button(staff, make_group):
    """An existing member's rep cannot be changed (the box is disabled), yet a "+" beside it
    offered to add a new rep into that box; a new member row keeps it."""
    group, reps = make_group(1, slug="emea")
    html = staff.get(f"/admin/rotation/group/{group.pk}/change/").content.decode()
    assert 'id="add_id_memberships-0-rep"' not in html
    assert 'id="change_id_memberships-0-rep"' in html  # the rep's page is still a click away
    assert 'id="add_id_memberships-__prefix__-rep"' in html  # a new member may add a rep


def test_making_a_rep_inactive_says_the_open_leads_it_keeps_and_links_them(staff, api, make_group):
    """A rep made inactive takes no new leads but keeps those it holds until a manager moves
    them: the page said only "changed successfully", and the leads looked handled."""
    group, reps = make_group(2, slug="emea")
    for _ in range(5):
        api.post("/api/v1/leads/", lead_body(group="emea"), format="json")
    rep = reps[0]
    held = Lead.objects.filter(owner=rep).order_by("id")
    assert held.count() == 3
    api.post(f"/api/v1/leads/{held[0].pk}/accept/", {"rep": rep.pk}, format="json")  # accepted: still open
    api.post(f"/api/v1/leads/{held[1].pk}/close/", {"outcome": "won"}, format="json")  # closed: not held
    form = {
        "name": rep.name,
        "email": rep.email,
        "timezone": rep.timezone,
        "working_hours": "",
        **inline_management("absences", 0, 0),
    }  # "active" left out: unticked
    response = staff.post(f"/admin/rotation/rep/{rep.pk}/change/", form, follow=True)
    assert response.status_code == 200
    shown = [str(m) for m in response.context["messages"]]
    link = f"/admin/leads/lead/?owner__id__exact={rep.pk}&amp;status__in=assigned%2Caccepted"
    assert (
        f"{rep.name} still holds 2 open leads: they stay with this rep until a manager reassigns them or "
        f'routes them again. <a href="{link}">See them</a>.'
    ) in shown, shown
    listed = staff.get(link.replace("&amp;", "&"))
    assert sorted(lead.pk for lead in listed.context["cl"].result_list) == [held[0].pk, held[2].pk]
    # Saved again while inactive, or a rep with nothing open: nothing to say.
    again = staff.post(f"/admin/rotation/rep/{rep.pk}/change/", form, follow=True)
    assert not any("open lead" in str(m) for m in again.context["messages"])
    other = reps[1]
    Lead.objects.filter(owner=other).update(status="closed", outcome="won")
    form.update(name=other.name, email=other.email, timezone=other.timezone)
    quiet = staff.post(f"/admin/rotation/rep/{other.pk}/change/", form, follow=True)
    assert not any("open lead" in str(m) for m in quiet.context["messages"])


def test_a_reps_page_lists_its_groups_its_open_leads_and_its_trail(staff, api, make_group):
    """Which groups a rep is in, and paused in, was found only by opening every group's page;
    the rep's leads and trail only by filtering the lists by hand."""
    emea, reps = make_group(2, slug="emea")
    dach, _ = make_group(0, slug="dach")
    rep = reps[0]
    services.membership_add(group=dach, rep=rep, actor="test", weight=3)
    Membership.objects.filter(group=dach, rep=rep).update(active=False, paused_reason="3 SLAs missed in a row")
    api.post("/api/v1/leads/", lead_body(group="emea"), format="json")
    page = " ".join(staff.get(f"/admin/rotation/rep/{rep.pk}/change/").content.decode().split())
    assert (
        f'<a href="/admin/rotation/group/{dach.pk}/change/">dach</a>: position 0, weight 3, paused (3 SLAs missed '
        f'in a row)<br><a href="/admin/rotation/group/{emea.pk}/change/">emea</a>: position 0, weight 1'
    ) in page, page
    assert (
        f'<a href="/admin/leads/lead/?owner__id__exact={rep.pk}&amp;status__in=assigned%2Caccepted">1 open lead</a>'
        f' · <a href="/admin/audit/auditevent/?rep_id={rep.pk}">Audit trail of this rep</a>'
    ) in page
    trail = staff.get(f"/admin/audit/auditevent/?rep_id={rep.pk}")
    assert trail.status_code == 200 and {e.rep_id for e in trail.context["cl"].result_list} == {rep.pk}
    loner = RepFactory(name="Loner", email="loner@example.com")
    page = " ".join(staff.get(f"/admin/rotation/rep/{loner.pk}/change/").content.decode().split())
    assert "In no group: takes no leads from the rotation." in page and ">0 open leads</a>" in page


def test_making_a_group_inactive_says_which_leads_will_wait_in_the_queue(staff, api, make_group):
    """An inactive group queues the leads its active rules (and, as the default, no rule) send
    it: sales ops who made it inactive were told only "changed successfully"."""
    from rotation.models import RoutingRule

    group, _ = make_group(1, slug="emea", is_default=True)
    countries = [{"field": "country", "op": "in", "value": ["FR", "GB"]}]
    for name, priority, active in (("EMEA & Co", 10, True), ("Old campaign", 20, False)):
        rule = RoutingRule(name=name, priority=priority, conditions=countries, group=group, active=active)
        services.rule_save(rule=rule, actor="test")
    data = group_form(slug="emea", name=group.name, is_default="on")
    del data["active"]  # unticked
    data.update(inline_management("memberships", 0, 0))
    r = staff.post(f"/admin/rotation/group/{group.pk}/change/", data, follow=True)
    shown = [str(m) for m in r.context["messages"]]
    assert (
        "The group emea is inactive: the leads its active rules match "
        f'(<a href="/admin/rotation/routingrule/?group__id__exact={group.pk}&amp;active__exact=1">EMEA &amp; Co</a>)'
        " and the leads no rule matches (it is the default group) wait in the fallback queue until it is active again."
    ) in shown, shown
    for country in ("FR", "JP"):  # by the rule, and by no rule (the default group): as the page said
        body = api.post("/api/v1/leads/", lead_body(country=country), format="json").json()
        assert body["queue_reason"] == "group 'emea' is inactive", body
    # Saved again while inactive: nothing new to say; an active group says nothing either.
    r = staff.post(f"/admin/rotation/group/{group.pk}/change/", data, follow=True)
    assert not any("inactive" in str(m) for m in r.context["messages"])


def test_a_rule_saved_for_an_inactive_group_says_its_leads_will_wait(staff, make_group):
    """The rule was saved as if it would route; its leads went to the fallback queue."""
    group, _ = make_group(1, slug="dach")
    Group.objects.filter(pk=group.pk).update(active=False)
    conditions = '[{"field": "country", "op": "in", "value": ["DE", "AT", "CH"]}]'
    data = {"name": "German speakers", "priority": "5", "conditions": conditions, "group": group.pk, "active": "on"}
    r = staff.post("/admin/rotation/routingrule/add/", data, follow=True)
    shown = [str(m) for m in r.context["messages"]]
    assert (
        f'The group <a href="/admin/rotation/group/{group.pk}/change/">dach</a> is inactive: the leads this rule '
        "matches wait in the fallback queue until it is active again."
    ) in shown, shown
    Group.objects.filter(pk=group.pk).update(active=True)
    data["name"] = "German speakers, active group"
    r = staff.post("/admin/rotation/routingrule/add/", data, follow=True)
    assert not any("inactive" in str(m) for m in r.context["messages"])


def test_the_rules_list_flags_a_rule_whose_group_is_inactive(staff, make_group):
    """Sales ops scanning the rules saw "dach" beside an active rule whose every lead was
    queued: the group had been deactivated since."""
    dach, _ = make_group(1, slug="dach")
    emea, _ = make_group(1, slug="emea")
    conditions = [{"field": "country", "op": "in", "value": ["DE"]}]
    RoutingRule.objects.create(name="German speakers", priority=5, conditions=conditions, group=dach)
    RoutingRule.objects.create(name="Old German rule", priority=6, conditions=conditions, group=dach, active=False)
    RoutingRule.objects.create(name="Europe", priority=7, conditions=conditions, group=emea)
    Group.objects.filter(pk=dach.pk).update(active=False)
    page = staff.get("/admin/rotation/routingrule/").content.decode()
    assert page.count("dach <strong>(inactive: this rule's leads wait in the queue)</strong>") == 1, page
    assert page.count("dach <strong>(inactive)</strong>") == 1
    assert ">emea</td>" in page and "emea <strong>" not in page
    # Ordered by the group, as the column it replaced was.
    ordered = staff.get("/admin/rotation/routingrule/?o=3").content.decode()
    assert ordered.index("dach <strong>") < ordered.index(">emea</td>")


def test_a_rule_without_conditions_is_refused_in_words(staff, make_group):
    """As over the API, a rule needs a condition; the box shows [] and the refusal said only
    "This field is required."."""
    group, _ = make_group(1, slug="emea")
    data = {"name": "Everything", "priority": "900", "conditions": "[]", "group": group.pk, "active": "on"}
    refused = staff.post("/admin/rotation/routingrule/add/", data)
    assert refused.status_code == 200
    assert refused.context["adminform"].form.errors["conditions"] == [
        "A rule needs at least one condition: the leads no rule matches go to the default group."
    ]


def test_a_group_page_reads_its_members_in_as_many_queries_for_many_as_for_few(staff, make_group):
    """A group of 60 members made 120 more queries than a group of none, one for each member's
    rep (the autocomplete box) and one for its group (the row's title): over a second a page.
    The members come with their rep and group, as one read."""
    group, _ = make_group(2, slug="emea")
    url = f"/admin/rotation/group/{group.pk}/change/"
    with CaptureQueriesContext(connection) as few:
        assert staff.get(url).status_code == 200
    for _ in range(8):
        services.membership_add(group=group, rep=RepFactory(), actor="test")
    with CaptureQueriesContext(connection) as many:
        page = staff.get(url)
    assert len(many) == len(few), [q["sql"] for q in many.captured_queries]
    html = page.content.decode()
    for member in Membership.objects.filter(group=group).select_related("rep"):
        # Each row still shows its rep, chosen, as the autocomplete box lists it.
        assert f'<option value="{member.rep_id}" selected>{member.rep.name} &lt;{member.rep.email}&gt;</option>' in html


def test_a_group_page_read_before_a_colleagues_change_saves_only_what_its_user_edited(staff, make_group):
    """Two tabs on one group: A makes it inactive and sets a member's weight; B, read before,
    renames the group and sets that member's cap. B's save put back active and the weight,
    unasked and unwarned; now each save writes what its user edited."""
    group, (a, _b) = make_group(2, slug="emea")
    stale = form_of(staff.get(f"/admin/rotation/group/{group.pk}/change/"))  # tab B, as read
    assert "initial-active" in stale  # each field carries its value as loaded
    current = form_of(staff.get(f"/admin/rotation/group/{group.pk}/change/"))  # tab A
    current.pop("active")
    row = next(k.rsplit("-", 1)[0] for k, v in current.items() if k.endswith("-rep") and v == [str(a.pk)])
    current[f"{row}-weight"] = ["5"]
    assert staff.post(f"/admin/rotation/group/{group.pk}/change/", current).status_code == 302
    stale["name"] = ["Europe"]
    stale[f"{row}-max_open"] = ["3"]
    r = staff.post(f"/admin/rotation/group/{group.pk}/change/", stale)
    assert r.status_code == 302, r.content.decode()[-2000:]
    group.refresh_from_db()
    member = Membership.objects.get(group=group, rep=a)
    assert (group.name, group.active) == ("Europe", False)
    assert (member.weight, member.max_open) == (5, 3)
    event = AuditEvent.objects.filter(type="group.changed", actor="admin:ops").last()
    assert event.explanation["changes"] == {"name": "Europe"}


def test_unticking_the_last_default_group_says_where_the_leads_no_rule_matches_go(staff, api, make_group):
    """Only deactivating the default group warned; taking the flag off left the leads that
    match no rule to queue, unannounced (a third of the demo's traffic)."""
    group, _ = make_group(1, slug="emea", is_default=True)
    data = group_form(slug="emea", name=group.name)  # "is_default" unticked
    data.update(inline_management("memberships", 0, 0))
    r = staff.post(f"/admin/rotation/group/{group.pk}/change/", data, follow=True)
    shown = [str(m) for m in r.context["messages"]]
    assert any(m.startswith("No group is the default now (emea no longer is)") for m in shown), shown
    body = api.post("/api/v1/leads/", lead_body(country="JP"), format="json").json()
    assert body["queue_reason"] == "no rule matched and there is no default group"
    # Another group made the default instead: the leads have a home, nothing to say.
    other, _ = make_group(1, slug="apac")
    data = group_form(slug="apac", name=other.name, is_default="on")
    data.update(inline_management("memberships", 0, 0))
    r = staff.post(f"/admin/rotation/group/{other.pk}/change/", data, follow=True)
    assert not any("No group is the default" in str(m) for m in r.context["messages"])


def test_a_slug_taken_as_it_is_is_said_once_on_the_add_page(staff, make_group):
    # The case-blind constraint said it again beside unique's message, by its own name.
    make_group(1, slug="emea")
    page = staff.post("/admin/rotation/group/add/", group_form(slug="emea", name="Another")).content.decode()
    assert "Group with this Slug already exists." in page
    assert "group_slug_unique_without_case" not in page and "is violated" not in page
