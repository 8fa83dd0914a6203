"""The admin's big list pages (leads, the queue, the audit trail, deliveries) answer from
indexes and small reads: no page view reads a whole table for its date navigation, its filter
choices, its count or a manager's search by email."""

import re
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit.models import AuditEvent
from leads.admin import LeadAdmin
from leads.models import Lead
from notifications.models import Delivery, OutboxMessage
from rotation.models import Group
from tests.conftest import lead_body

pytestmark = pytest.mark.django_db


def get(client, url):
    with CaptureQueriesContext(connection) as ctx:
        page = client.get(url)
    assert page.status_code == 200, (url, page.status_code, page.get("Location"))
    return page, [q["sql"] for q in ctx.captured_queries]


def whole_table_reads(queries, table):
    """The queries that read every row of `table` for the page's furniture: the date
    hierarchy's drill-down and `SELECT DISTINCT <column>` filter choices."""
    return [
        q
        for q in queries
        if "DATE_TRUNC" in q.upper() or re.search(rf'SELECT DISTINCT "{table}"\."', q) or "MIN(" in q.upper()
    ]


def post_leads(api, group, *emails, **fields):
    return [
        api.post("/api/v1/leads/", lead_body(email=e, group=group, **fields), format="json").json()["id"]
        for e in emails
    ]


def test_the_leads_list_reads_no_whole_table_for_dates_and_filter_choices(api, make_group, manager):
    make_group(2, slug="emea")
    post_leads(api, "emea", "a@one.example", source="web")
    post_leads(api, "emea", "b@two.example", source="partner")
    page, queries = get(manager, "/admin/leads/lead/")
    assert whole_table_reads(queries, "leads_lead") == []
    html = page.content.decode()
    # What managers filter by is all still there: status, group, owner, source, dates.
    for choice in ("?status__exact=assigned", "?source=partner", "?source=web", "created_at__gte="):
        assert choice in html, choice
    assert len(page.context["cl"].result_list) == 2


def test_the_leads_list_filters_by_source_and_by_date(api, make_group, manager):
    make_group(2, slug="emea")
    web, partner = (
        post_leads(api, "emea", "a@one.example", source="web")[0],
        post_leads(api, "emea", "b@two.example", source="partner")[0],
    )
    Lead.objects.filter(pk=partner).update(created_at=timezone.now() - timedelta(days=40))
    by_source, _ = get(manager, "/admin/leads/lead/?source=partner")
    assert [lead.pk for lead in by_source.context["cl"].result_list] == [partner]
    since = urlencode({"created_at__gte": (timezone.now() - timedelta(days=7)).isoformat()})
    by_date, _ = get(manager, f"/admin/leads/lead/?{since}")
    assert [lead.pk for lead in by_date.context["cl"].result_list] == [web]


def test_a_whole_email_address_is_found_through_the_dedup_index(api, make_group, manager):
    make_group(2, slug="emea")
    wanted, other = post_leads(api, "emea", "Zelda.Smith@Customer.example", "zelda.smithson@customer.example")
    page, queries = get(manager, "/admin/leads/lead/?q=%20ZELDA.smith@customer.EXAMPLE%20")
    assert [lead.pk for lead in page.context["cl"].result_list] == [wanted]
    assert not [q for q in queries if "LIKE" in q.upper()]  # no scan of every lead's email
    # A partial address (or one no lead has) is still searched as a substring.
    partial, _ = get(manager, "/admin/leads/lead/?q=zelda.smith")
    assert {lead.pk for lead in partial.context["cl"].result_list} == {wanted, other}
    by_domain, _ = get(manager, "/admin/leads/lead/?q=@customer.example")
    assert {lead.pk for lead in by_domain.context["cl"].result_list} == {wanted, other}


def test_the_search_still_finds_by_company_and_external_id(api, make_group, manager):
    make_group(2, slug="emea")
    acme = post_leads(api, "emea", "a@one.example", company="Acme Widgets", external_id="crm-17")[0]
    other = post_leads(api, "emea", "b@two.example", company="Other", external_id="crm-170")[0]
    by_company, _ = get(manager, "/admin/leads/lead/?q=widget")
    assert [lead.pk for lead in by_company.context["cl"].result_list] == [acme]
    exact, queries = get(manager, "/admin/leads/lead/?q=crm-17")
    assert [lead.pk for lead in exact.context["cl"].result_list] == [acme]
    assert not [q for q in queries if "LIKE" in q.upper()]
    part, _ = get(manager, "/admin/leads/lead/?q=crm-1")
    assert {lead.pk for lead in part.context["cl"].result_list} == {acme, other}


def test_the_search_finds_a_lead_by_its_id_and_by_names_and_phone(api, make_group, manager):
    make_group(2, slug="emea")
    ada = post_leads(api, "emea", "a@one.example", first_name="Ada", last_name="Byron", phone="+33 6 12 34 56 78")[0]
    other = post_leads(api, "emea", "b@two.example", first_name="Grace", external_id=str(ada))[0]
    # 41: the lead of that id, and one whose external id is "41"; #41: the id alone.
    for term, found in ((str(ada), {ada, other}), (f"%23{ada}", {ada})):
        page, queries = get(manager, f"/admin/leads/lead/?q={term}")
        assert {lead.pk for lead in page.context["cl"].result_list} == found
        assert not [q for q in queries if "LIKE" in q.upper()]
    for term in ("ada", "BYRON", "12%2034%2056"):
        page, _ = get(manager, f"/admin/leads/lead/?q={term}")
        assert [lead.pk for lead in page.context["cl"].result_list] == [ada], term
    assert "A lead&#x27;s id (41 or #41)" in page.content.decode()
    huge, _ = get(manager, "/admin/leads/lead/?q=99999999999999999999999")
    assert list(huge.context["cl"].result_list) == []


def test_the_queue_finds_a_whole_email_address_among_queued_leads_only(api, make_group, manager):
    group, _ = make_group(2, slug="emea")
    group.memberships.update(active=False)
    (queued,) = post_leads(api, "emea", "q@one.example")
    page, queries = get(manager, "/admin/leads/queuedlead/?q=Q@one.example")
    assert [lead.pk for lead in page.context["cl"].result_list] == [queued]
    assert not [q for q in queries if "LIKE" in q.upper()]


def test_the_queue_counts_its_leads_in_words(api, make_group, manager):
    """ "3 queued leads" under the list, not the page's name after a number ("3 fallback queue")."""
    group, _ = make_group(2, slug="emea")
    group.memberships.update(active=False)
    post_leads(api, "emea", "a@one.example")
    html = manager.get("/admin/leads/queuedlead/").content.decode()
    assert re.search(r"\b1 queued lead\b(?!s)", html) and "fallback queue\n" not in html.split('class="paginator"')[1]
    post_leads(api, "emea", "b@one.example", "c@one.example")
    paginator = manager.get("/admin/leads/queuedlead/").content.decode().split('class="paginator"')[1]
    assert "3 queued leads" in paginator and "fallback queue" not in paginator.split("</p>")[0]


def test_the_queue_page_is_titled_as_the_queue_and_shows_why_before_who(api, make_group, manager):
    group, _ = make_group(2, slug="emea")
    group.memberships.update(active=False)
    post_leads(api, "emea", "a@one.example")
    html = manager.get("/admin/leads/queuedlead/").content.decode()
    assert "<h1>Fallback queue: leads waiting for a rep, oldest first</h1>" in html
    headers = re.findall(r'<th scope="col" class="[^"]*column-(\w+)', html)
    assert headers.index("queue_reason") < headers.index("email"), headers


@pytest.mark.postgres
def test_a_large_list_says_about_how_many_from_the_planner_and_counts_a_small_one(
    api, make_group, manager, monkeypatch
):
    from routing_project import admin_lists

    make_group(2, slug="emea")
    post_leads(api, "emea", *(f"n{i}@one.example" for i in range(6)))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE leads_lead")
    monkeypatch.setattr(admin_lists, "EXACT_COUNT_UP_TO", 3)
    monkeypatch.setattr(LeadAdmin, "list_per_page", 2)
    page, queries = get(manager, "/admin/leads/lead/")
    assert not [q for q in queries if "COUNT(" in q.upper()]
    html = page.content.decode()
    assert page.context["cl"].paginator.estimated and re.search(r"about 6</span> leads", html)
    # Selecting across pages names the estimate too, not a number that looks counted.
    assert "Select all (about 6) leads" in html and "All (about 6) selected" in html
    monkeypatch.setattr(LeadAdmin, "list_per_page", 100)
    monkeypatch.setattr(admin_lists, "EXACT_COUNT_UP_TO", 1000)
    page, queries = get(manager, "/admin/leads/lead/")
    assert page.context["cl"].result_count == 6 and not page.context["cl"].paginator.estimated
    assert "about" not in page.content.decode()
    # An estimate under the true count does not hide the last pages: past it, pages still open,
    # and one absurdly far is refused as out of range, not a server error.
    monkeypatch.setattr(admin_lists, "_planner_rows", lambda queryset: 20)
    monkeypatch.setattr(admin_lists, "EXACT_COUNT_UP_TO", 10)
    monkeypatch.setattr(LeadAdmin, "list_per_page", 2)
    post_leads(api, "emea", *(f"m{i}@one.example" for i in range(20)))
    listed = set()
    for number in range(1, 15):  # 26 leads, 2 a page: 13 pages, the 14th empty
        page, _ = get(manager, f"/admin/leads/lead/?p={number}")
        assert page.context["cl"].paginator.estimated
        listed |= {lead.email for lead in page.context["cl"].result_list}
    assert len(listed) == 26 and not page.context["cl"].result_list
    far = manager.get("/admin/leads/lead/?p=99999999999999999999999")
    assert far.status_code == 302 and far["Location"].endswith("?e=1")


@pytest.mark.postgres
def test_a_table_never_analysed_is_counted_not_estimated_and_the_search_says_about_too(
    api, make_group, manager, monkeypatch
):
    """With no statistics the planner guesses from the table's size on disk: the outbox list
    said "about 117858" of 16,047 rows. Such a table is counted; an estimate, when there is
    one, is said as such beside the search box too ("23706 results" read as counted)."""
    from routing_project import admin_lists

    make_group(2, slug="emea")
    post_leads(api, "emea", *(f"n{i}@one.example" for i in range(6)))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE leads_lead")
    assert admin_lists._never_analysed(Lead.objects.all()) is False
    monkeypatch.setattr(admin_lists, "_planner_rows", lambda queryset: 117_858)
    monkeypatch.setattr(admin_lists, "EXACT_COUNT_UP_TO", 3)
    page, _ = get(manager, "/admin/leads/lead/?q=one.example")
    html = " ".join(page.content.decode().split())
    assert page.context["cl"].paginator.estimated
    assert re.search(r'<span class="small quiet"><span title="An estimate[^"]*">about</span> 117858 results', html)
    monkeypatch.setattr(admin_lists, "_never_analysed", lambda queryset: True)
    monkeypatch.setattr(admin_lists, "EXACT_COUNT_UP_TO", 1000)
    page, _ = get(manager, "/admin/leads/lead/?q=one.example")
    assert page.context["cl"].result_count == 6 and not page.context["cl"].paginator.estimated


@pytest.mark.postgres
def test_a_search_the_planner_thinks_small_stops_counting_and_says_more_than(api, make_group, manager, monkeypatch):
    """A substring search the planner guesses at a few rows was counted exactly however many
    it found: 150,000 leads counted, most of a second, for a page of 100. Counting stops one
    past the limit; the page says "more than", and pages past the counted ones still open."""
    from routing_project import admin_lists

    make_group(2, slug="emea")
    post_leads(api, "emea", *(f"n{i}@wide.example" for i in range(7)), "x@narrow.example")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE leads_lead")
    # The planner's estimate of the search is at or under the limit: counted, but only so far.
    monkeypatch.setattr(admin_lists, "_planner_rows", lambda queryset: 1)
    monkeypatch.setattr(admin_lists, "EXACT_COUNT_UP_TO", 4)
    monkeypatch.setattr(LeadAdmin, "list_per_page", 2)
    page, queries = get(manager, "/admin/leads/lead/?q=wide")
    counts = [q for q in queries if "COUNT(" in q.upper()]
    assert len(counts) == 1 and "LIMIT 5" in counts[0], counts
    html = page.content.decode()
    assert page.context["cl"].paginator.at_least and re.search(r"more than 4</span> leads", html)
    assert "Select all (more than 4) leads" in html
    # Past the counted rows (page 3 holds leads 5 and 6, page 4 the 7th): read, not refused.
    emails = set()
    for number in (1, 2, 3, 4):
        listed = get(manager, f"/admin/leads/lead/?q=wide&p={number}")[0].context["cl"].result_list
        emails |= {lead.email for lead in listed}
    assert emails == {f"n{i}@wide.example" for i in range(7)}
    assert get(manager, "/admin/leads/lead/?q=wide&p=9")[0].context["cl"].result_list.count() == 0
    # A search that finds no more than the limit is counted exactly, as before.
    page, _ = get(manager, "/admin/leads/lead/?q=narrow")
    assert page.context["cl"].result_count == 1 and not page.context["cl"].paginator.count_prefix


@pytest.mark.postgres
@pytest.mark.parametrize(
    "url",
    [
        "/admin/leads/lead/?id=99999999999999999999",
        "/admin/leads/lead/?owner__id__exact=99999999999999999999",
        "/admin/leads/lead/?group__id__exact=-99999999999999999999",
        "/admin/audit/auditevent/?lead_id=99999999999999999999",
    ],
)
def test_an_id_past_the_columns_range_in_the_address_lists_nothing(api, make_group, manager, url):
    """Django compiles such a filter to no SQL (it can match nothing); the planner's estimate
    is then 0, not a server error."""
    make_group(2, slug="emea")
    post_leads(api, "emea", "a@one.example")
    page, _ = get(manager, url)
    assert page.context["cl"].result_count == 0 and list(page.context["cl"].result_list) == []


def test_the_audit_trail_reads_no_whole_table_and_still_filters_by_group_and_date(api, make_group, manager):
    group, _ = make_group(2, slug="emea")
    make_group(1, slug="apac")
    (lead,) = post_leads(api, "emea", "a@one.example")
    AuditEvent.objects.create(
        type="group.changed", actor="test", group="gone", explanation={}, at=timezone.now() - timedelta(days=400)
    )
    Group.objects.filter(slug="apac").update(active=False)
    page, queries = get(manager, "/admin/audit/auditevent/")
    assert whole_table_reads(queries, "audit_auditevent") == []
    html = page.content.decode()
    # Every group the trail names, a deleted one's too; and dates by range.
    for choice in ("?group__exact=emea", "?group__exact=gone", "?group__exact=apac", "at__gte="):
        assert choice in html, choice
    by_group, _ = get(manager, "/admin/audit/auditevent/?group__exact=gone")
    assert [e.type for e in by_group.context["cl"].result_list] == ["group.changed"]
    since = urlencode({"at__gte": (timezone.now() - timedelta(days=7)).isoformat()})
    recent, _ = get(manager, f"/admin/audit/auditevent/?{since}&group__exact=emea&lead_id={lead}")
    assert {e.type for e in recent.context["cl"].result_list} == {"lead.received", "lead.assigned"}


def test_the_delivery_log_reads_no_whole_table_and_filters_by_event(manager, make_group):
    group, (rep,) = make_group(1, slug="emea")
    now = timezone.now()
    for event in ("lead.assigned", "lead.escalated"):
        message = OutboxMessage.objects.create(event=event, lead_id=1, group_id=group.pk, created_at=now)
        Delivery.objects.create(
            message=message, channel="email", rep=rep, target=rep.email, created_at=now, next_attempt_at=now
        )
    page, queries = get(manager, "/admin/notifications/delivery/")
    assert [q for q in queries if "DISTINCT" in q.upper() or "DATE_TRUNC" in q.upper()] == []
    html = page.content.decode()
    for choice in ("?message__event=lead.escalated", "?message__event=lead.rerouted", "created_at__gte="):
        assert choice in html, choice
    for param in ("message__event", "message__event__exact"):  # the second as the page wrote it before
        by_event, _ = get(manager, f"/admin/notifications/delivery/?{param}=lead.escalated")
        assert [d.message.event for d in by_event.context["cl"].result_list] == ["lead.escalated"]


def test_the_delivery_log_and_the_outbox_find_a_lead_id_as_a_number(manager, make_group):
    group, (rep,) = make_group(1, slug="emea")
    now = timezone.now()
    for lead_id, event in ((12345, "lead.assigned"), (123456, "lead.escalated")):
        message = OutboxMessage.objects.create(event=event, lead_id=lead_id, group_id=group.pk, created_at=now)
        Delivery.objects.create(
            message=message, channel="email", rep=rep, target=rep.email, created_at=now, next_attempt_at=now
        )
    deliveries, queries = get(manager, "/admin/notifications/delivery/?q=12345")
    assert [d.message.lead_id for d in deliveries.context["cl"].result_list] == [12345]
    assert not [q for q in queries if "::text" in q or "LIKE" in q.upper()]  # not every row's id as text
    messages, queries = get(manager, "/admin/notifications/outboxmessage/?q=%2012345%20")
    assert [m.lead_id for m in messages.context["cl"].result_list] == [12345]
    assert not [q for q in queries if "::text" in q or "DISTINCT" in q.upper()]
    assert "?event=lead.rerouted" in messages.content.decode()  # the event choices, without reading every message
    by_event, _ = get(manager, "/admin/notifications/outboxmessage/?event=lead.escalated")
    assert [m.lead_id for m in by_event.context["cl"].result_list] == [123456]
    by_target, _ = get(manager, f"/admin/notifications/delivery/?q={rep.email}")
    assert len(by_target.context["cl"].result_list) == 2


@pytest.mark.parametrize(
    "url",
    [
        "/admin/leads/lead/",
        "/admin/leads/queuedlead/",
        "/admin/audit/auditevent/",
        "/admin/notifications/delivery/",
        "/admin/notifications/outboxmessage/",
    ],
)
def test_a_big_list_offers_no_counts_per_filter_choice(api, make_group, manager, url):
    """Django's "Show counts" link (`?_facets=True`) counted every choice of every filter over
    the whole table, one aggregate scanning every row (1.3 s for 600,000 audit events, and for
    the leads' source filter one count per source of the newest 10,000 leads): the one click
    that undid what keeps these lists fast. Neither offered nor honoured."""
    make_group(2, slug="emea")
    post_leads(api, "emea", "a@one.example", source="web")
    page, _ = get(manager, url)
    assert "_facets" not in page.content.decode()
    counted, queries = get(manager, url + "?_facets=True")
    assert not [q for q in queries if "FILTER (WHERE" in q.upper()], queries


def test_a_lead_moved_many_times_shows_its_latest_attempts_only(api, make_group, manager):
    """Every attempt of a lead moved hundreds of times made a page of 870 KB that took over a
    second; the latest ones are shown, and the audit trail keeps them all."""
    from leads.admin import ASSIGNMENTS_SHOWN
    from leads.models import Assignment

    group, reps = make_group(2, slug="many")
    (lead_id,) = post_leads(api, "many", "moved@customer.example")
    first = Assignment.objects.get(lead_id=lead_id)
    now = timezone.now()
    Assignment.objects.filter(pk=first.pk).update(ended_at=now, end_reason="reassigned")
    Assignment.objects.bulk_create(
        Assignment(
            lead_id=lead_id,
            rep=reps[n % 2],
            group=group,
            attempt=n,
            reason="manual",
            started_at=now,
            ended_at=None if n == 30 else now,
            end_reason="" if n == 30 else "reassigned",
        )
        for n in range(2, 31)
    )
    page, _queries = get(manager, f"/admin/leads/lead/{lead_id}/change/")
    html = page.content.decode()
    shown = re.findall(r'field-attempt">\s*<p>(\d+)</p>', html)
    assert sorted(map(int, shown)) == list(range(31 - ASSIGNMENTS_SHOWN, 31))
    assert f"the latest {ASSIGNMENTS_SHOWN}" in html
    # An attempt's end in words, and "over cap" said only where it was.
    assert re.search(r'field-ended_by">\s*<p>reassigned</p>', html) and re.search(r'field-ended_by">\s*<p>-</p>', html)
    assert "icon-no.svg" not in html.split(f"the latest {ASSIGNMENTS_SHOWN}")[1].split("</fieldset>")[0]
    Assignment.objects.filter(lead_id=lead_id, attempt=29).update(end_reason="sla_missed", over_cap=True)
    html = get(manager, f"/admin/leads/lead/{lead_id}/change/")[0].content.decode()
    assert re.search(r'field-ended_by">\s*<p>SLA missed</p>', html)
    assert re.search(r'field-given_over_cap">\s*<p>yes, given by hand over a cap</p>', html)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("created_at__gte=2026-03-02", {"b", "c"}),
        ("created_at__gte=2026-03-02&created_at__lt=2026-03-03", {"b"}),
        ("created_at__gte=2026-03-02 12:00", {"c"}),
        ("created_at__lt=2026-03-02T08:00:00%2B01:00", {"a", "b"}),
        ("created_at__gte=2026-03-02+00:00:00%2B00:00&created_at__lt=2026-03-03+00:00:00%2B00:00", {"b"}),
    ],
)
def test_dates_typed_in_the_address_filter_by_the_days_and_times_they_name(
    api, make_group, manager, query, expected, recwarn
):
    """`?created_at__gte=2026-03-02` is that day's midnight in the site's time zone (UTC), a time
    without an offset too, one with an offset as it says; Django took them as naive datetimes
    and logged a warning for each page."""
    make_group(2, slug="emea")
    ids = dict(zip("abc", post_leads(api, "emea", "a@one.example", "b@one.example", "c@one.example"), strict=True))
    for key, moment in (("a", (2026, 3, 1, 23)), ("b", (2026, 3, 2, 6, 30)), ("c", (2026, 3, 3, 9))):
        Lead.objects.filter(pk=ids[key]).update(created_at=datetime(*moment, tzinfo=UTC))
    page, _ = get(manager, f"/admin/leads/lead/?{query}")
    assert {lead.email[0] for lead in page.context["cl"].result_list} == expected
    assert not [w for w in recwarn if "naive datetime" in str(w.message)]


@pytest.mark.parametrize("value", ["yesterday", "2026-02-30", "2026-03-02 25:00", "99999-01-01"])
def test_a_date_in_the_address_that_names_no_day_says_the_address_is_wrong(api, make_group, manager, value):
    make_group(2, slug="emea")
    post_leads(api, "emea", "a@one.example")
    for url in ("/admin/leads/lead/", "/admin/audit/auditevent/", "/admin/notifications/delivery/"):
        field = "at" if "audit" in url else "created_at"
        response = manager.get(url, {f"{field}__gte": value})
        assert response.status_code == 302 and response["Location"].endswith("?e=1"), (url, response.status_code)
        # Where it leads, the list says its filter was left out (Django's own page said nothing).
        shown = manager.get(response["Location"]).content.decode()
        assert "The address held a filter this list cannot apply" in shown, url


def test_the_leads_list_shows_an_sla_due_time_only_while_the_sla_runs(api, make_group, manager):
    """A closed (or accepted) lead kept its due time in the list, read as a deadline pending."""
    make_group(1, slug="emea", sla_minutes="30")
    open_id, closed_id = (
        api.post("/api/v1/leads/", {"email": f"{n}@sla.example", "group": "emea"}, format="json").json()["id"]
        for n in ("open", "closed")
    )
    assert api.post(f"/api/v1/leads/{closed_id}/close/", {"outcome": "won"}, format="json").status_code == 200
    html = manager.get("/admin/leads/lead/").content.decode()
    rows = {
        int(m.group(1)): m.group(0) for m in re.finditer(r"<tr>.*?/admin/leads/lead/(\d+)/change/.*?</tr>", html, re.S)
    }
    assert 'class="field-sla_due">-<' not in rows[open_id] and 'class="field-sla_due">-<' in rows[closed_id]


def test_a_leads_history_page_points_to_its_audit_trail(api, make_group, manager):
    """Django's history lists only the form's edits: for a lead routed, accepted and rerouted
    it said "This object doesn't have a change history", as if nothing had happened."""
    make_group(1, slug="emea")
    (lead_id,) = post_leads(api, "emea", "h@one.example")
    html = " ".join(manager.get(f"/admin/leads/lead/{lead_id}/history/").content.decode().split())
    assert f'<a href="/admin/audit/auditevent/?lead_id={lead_id}">its audit trail</a>' in html
