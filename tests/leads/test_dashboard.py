"""The managers' dashboard and the CSV upload page in the admin."""

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from audit.models import AuditEvent
from leads import actions
from leads.dashboard import QUEUE_LOOKBACK, dashboard_view, queue_chart, queue_levels
from leads.models import Assignment, Lead
from rotation.models import Membership

pytestmark = pytest.mark.django_db


def test_shares_speed_breaches_and_queue(make_group, post_lead):
    group, reps = make_group(3, slug="emea", sla_minutes=10)
    Membership.objects.filter(group=group, rep=reps[0]).update(weight=2)
    for _ in range(8):
        post_lead(group="emea")
    now = timezone.now()
    assignments = list(Assignment.objects.filter(group=group).order_by("id"))
    # Two accepted after 60 s and 120 s; one accepted late; one still open past its due time.
    for a, seconds in zip(assignments[:2], (60, 120), strict=True):
        Assignment.objects.filter(pk=a.pk).update(accepted_at=a.started_at + timedelta(seconds=seconds))
    a = assignments[2]
    Assignment.objects.filter(pk=a.pk).update(accepted_at=a.started_at + timedelta(minutes=30))
    Assignment.objects.filter(pk=assignments[3].pk).update(due_at=now - timedelta(minutes=1))
    empty, _ = make_group(0, slug="empty")
    for _ in range(3):
        post_lead(group="empty")

    panels = {p.slug: p for p in dashboard_view(since=now - timedelta(days=1), until=now + timedelta(minutes=1))}
    p = panels["emea"]
    assert (p.assigned, p.accepted, p.breaches) == (8, 3, 2)
    assert p.median_accept_s == pytest.approx(120)
    assert p.median_accept == "2 min" and panels["empty"].median_accept == "-"
    # A round robin gives the rep of weight 2 no more turns: its fair share is a third, as the others'.
    shares = {r.rep_id: (r.assigned, round(r.share, 3), round(r.target_share, 3)) for r in p.reps}
    assert shares == {reps[0].id: (3, 0.375, 0.333), reps[1].id: (3, 0.375, 0.333), reps[2].id: (2, 0.25, 0.333)}
    assert panels["empty"].queue_now == 3 and panels["empty"].queue_max == 3
    assert panels["empty"].queue_points[-1][1] == 3 and panels["emea"].queue_max == 0


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "-"),
        (44.6, "45 s"),
        (59.4, "59 s"),
        (1524, "25 min"),
        (3599, "1 h 00 min"),
        (7500, "2 h 05 min"),
        (3 * 86400 + 4 * 3600, "3 d 4 h"),
    ],
)
def test_times_to_accept_read_as_a_manager_reads_them(seconds, text):
    from leads.dashboard import duration_text

    assert duration_text(seconds) == text


def test_dashboard_page_renders_its_charts_in_a_fixed_number_of_queries(admin_client, make_group, post_lead):
    def page_queries() -> int:
        with CaptureQueriesContext(connection) as ctx:
            response = admin_client.get("/admin/dashboard/?days=7")
        assert response.status_code == 200
        return len(ctx.captured_queries)

    make_group(2, slug="g0")
    post_lead(group="g0")
    one = page_queries()
    for i in range(1, 5):
        make_group(3, slug=f"g{i}")
        post_lead(group=f"g{i}")
    assert page_queries() == one  # no query per group or rep

    html = admin_client.get("/admin/dashboard/?days=30").content.decode()
    assert html.count('class="share-chart"') == 5 and html.count('class="queue-chart"') == 5
    assert "<svg" in html and 'class="bar-actual"' in html
    one_group = admin_client.get("/admin/dashboard/?group=g2").content.decode()
    assert one_group.count('class="share-chart"') == 1
    # The strategy in words, as the group's page names it, not its code.
    assert "(g2, Round robin)" in one_group and "round_robin)" not in one_group


@pytest.mark.postgres
def test_the_dashboards_queue_read_is_one_the_queue_entry_index_answers(admin_client, make_group, post_lead):
    """The queue depth's read of the trail by time matches audit_queue_entry_at_idx's condition
    (else PostgreSQL reads all 450,000 events, a second a page): with a sequential scan ruled
    out, the plan of the page's own query names the index."""
    make_group(0, slug="emea")
    post_lead(group="emea")
    with CaptureQueriesContext(connection) as ctx:
        assert admin_client.get("/admin/dashboard/?days=7").status_code == 200
    reads = [
        q["sql"] for q in ctx.captured_queries if 'FROM "audit_auditevent"' in q["sql"] and "lead.queued" in q["sql"]
    ]
    by_time = [q for q in reads if '"audit_auditevent"."at" >=' in q]
    assert len(by_time) == 1, reads
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN {by_time[0]}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "audit_queue_entry_at_idx" in plan, plan


def test_the_queue_chart_starts_where_the_period_starts(admin_client, make_group):
    """The chart's left label was the end of its first step (3.5 hours into a 7-day period),
    while the page above it said the period began 3.5 hours earlier."""
    make_group(1, slug="emea")
    response = admin_client.get("/admin/dashboard/?days=7")
    since = response.context["since"]
    assert f">{since:%m-%d %H:%M}</text>" in response.content.decode()


def test_the_admin_index_links_the_dashboard_and_the_import(admin_client):
    html = admin_client.get("/admin/").content.decode()
    assert 'href="/admin/dashboard/"' in html and 'href="/admin/lead-import/"' in html


def test_the_sidebar_links_the_operations_pages_a_user_may_open(client, db):
    # Only the index linked them: a manager in the queue went back home to reach the dashboard.
    user = User.objects.create_user("manager", password="pw-12345678", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_lead"))
    client.force_login(user)
    sidebar = client.get("/admin/leads/lead/").content.decode().split('id="nav-sidebar"')[1].split("</nav>")[0]
    assert 'class="app-operations module' in sidebar and 'href="/admin/dashboard/"' in sidebar
    assert "/admin/lead-import/" not in sidebar  # no permission to import
    assert 'aria-current="page">Routing dashboard' in client.get("/admin/dashboard/").content.decode()


def test_pages_need_their_permissions(client, db):
    user = User.objects.create_user("viewer", password="pw-12345678", is_staff=True)
    client.force_login(user)
    assert client.get("/admin/dashboard/").status_code == 403
    refused = client.get("/admin/lead-import/")
    assert refused.status_code == 403
    # The admin's own page, with a way back, not Django's bare one-line "403 Forbidden".
    html = refused.content.decode()
    assert "Your role does not open this page." in html and 'href="/admin/"' in html
    user.user_permissions.add(Permission.objects.get(codename="view_lead"))
    assert client.get("/admin/dashboard/").status_code == 200


def html_of(response) -> str:
    """The page, whole: an import's is streamed (progress bar first, then the report)."""
    if response.streaming:
        return b"".join(response.streaming_content).decode()
    return response.content.decode()


def test_upload_imports_and_lists_bad_lines(admin_client, make_group):
    make_group(2, slug="emea")
    body = b"external_id,email,group\nu-1,one@customer.example,emea\nu-2,broken,emea\nu-3,three@customer.example,emea\n"
    response = admin_client.post(
        "/admin/lead-import/", {"file": SimpleUploadedFile("leads.csv", body, "text/csv"), "notify": "on"}
    )
    assert response.status_code == 200
    html = html_of(response)
    assert "3 rows: 2 imported (2 assigned, 0 queued)" in html
    assert "<td>3</td>" in html and "Enter a valid email address." in html
    assert "Import id <code>import-" in html  # the events it wrote carry it
    assert Lead.objects.count() == 2
    again = admin_client.post("/admin/lead-import/", {"file": SimpleUploadedFile("leads.csv", body, "text/csv")})
    assert "2 already imported" in html_of(again) and Lead.objects.count() == 2
    assert "Import id" not in html_of(again)  # it wrote no event to carry it
    bad = admin_client.post("/admin/lead-import/", {"file": SimpleUploadedFile("x.csv", b"colour\nred\n")})
    assert "unknown columns" in html_of(bad)


def test_upload_names_the_line_a_repeated_external_id_duplicates(admin_client, make_group):
    make_group(2, slug="emea")
    rows = ("u-1,one@customer.example,emea", "u-2,two@customer.example,emea", "u-1,x@customer.example,emea")
    body = ("external_id,email,group\n" + "".join(f"{row}\n" for row in rows)).encode()
    response = admin_client.post("/admin/lead-import/", {"file": SimpleUploadedFile("leads.csv", body, "text/csv")})
    html = " ".join(html_of(response).split())
    assert "1 already imported (1 repeating an earlier line of the file)" in html
    table = html.split('id="import-repeats"')[1].split("</table>")[0]
    assert "<tr><td>4</td><td><code>u-1</code></td><td>2</td></tr>" in table, table
    assert Lead.objects.get(external_id="u-1").email == "one@customer.example"


def test_upload_lists_the_rows_whose_values_differ_from_their_lead_linking_it(admin_client, make_group):
    make_group(2, slug="emea")

    def upload(company: str) -> str:
        body = f"external_id,email,company,group\nv-1,one@customer.example,{company},emea\n".encode()
        file = SimpleUploadedFile("leads.csv", body, "text/csv")
        return " ".join(html_of(admin_client.post("/admin/lead-import/", {"file": file})).split())

    assert 'id="import-changes"' not in upload("Acme")
    html = upload("Acme Corp")
    assert "1 already imported (1 differing from the lead taken in before)" in html
    table = html.split('id="import-changes"')[1].split("</table>")[0]
    lead = Lead.objects.get(external_id="v-1")
    link = f'<a href="/admin/leads/lead/{lead.pk}/change/">{lead.pk}</a>'
    assert f"<tr><td>2</td><td><code>v-1</code></td><td>{link}</td><td>company</td></tr>" in table, table
    assert lead.company == "Acme"


def test_an_upload_shows_its_progress_batch_by_batch(admin_client, make_group):
    """The page arrives in parts: the bar first, one update per batch committed, then the
    report (a browser shows each part as it comes)."""
    from leads.bulk import BATCH_SIZE

    make_group(2, slug="emea")
    rows = BATCH_SIZE * 2 + 10
    body = "external_id,email,group\n" + "".join(f"p-{i},p{i}@customer.example,emea\n" for i in range(rows))
    response = admin_client.post("/admin/lead-import/", {"file": SimpleUploadedFile("leads.csv", body.encode())})
    assert response.status_code == 200 and response.streaming
    parts = [part.decode() for part in response.streaming_content]
    assert '<progress id="import-bar" max="1010"' in parts[0] and "Import finished:" not in parts[0]
    updates = [int(n) for part in parts for n in re.findall(r"leadImportProgress\((\d+)\)", part)]
    assert updates == [BATCH_SIZE, BATCH_SIZE * 2, rows]
    report = next(i for i, part in enumerate(parts) if "Import finished:" in part)
    assert "leadImportProgress(null)" in parts[report - 1]
    assert f"{rows} rows: {rows} imported" in parts[report] and "</html>" in parts[-1]
    assert Lead.objects.count() == rows


@pytest.mark.django_db(transaction=True)  # closing the response ends the request, and its connection
def test_an_upload_whose_page_is_closed_stops_and_says_how_far_it_got_in_the_log(admin_client, make_group, caplog):
    """The tab closed mid-import: the import stopped with the page, and nothing said so, so an
    operator saw a plain 200 in the access log and half a file imported."""
    from leads.bulk import BATCH_SIZE

    make_group(2, slug="emea")
    rows = BATCH_SIZE * 3
    body = "external_id,email,group\n" + "".join(f"c-{i},c{i}@customer.example,emea\n" for i in range(rows))
    response = admin_client.post("/admin/lead-import/", {"file": SimpleUploadedFile("leads.csv", body.encode())})
    parts = iter(response.streaming_content)
    next(parts), next(parts)  # the bar, and the first batch's update
    response.close()  # the server closes the stream when the browser goes
    assert Lead.objects.count() == BATCH_SIZE
    (line,) = [r.getMessage() for r in caplog.records if "lead import stopped" in r.getMessage()]
    assert f"the page was closed after {BATCH_SIZE} rows" in line, line


@pytest.mark.parametrize("spooled", [False, True], ids=["in-memory", "temporary-file"])
def test_upload_reads_cr_endings_and_a_windows_1252_file_once_its_encoding_is_chosen(
    admin_client, make_group, settings, spooled
):
    if spooled:
        settings.FILE_UPLOAD_MAX_MEMORY_SIZE = 10  # Django writes the upload to a temporary file
    make_group(1, slug="emea")
    body = "external_id,email,first_name,group\rc-1,one@customer.example,Ann,emea\rc-2,two@customer.example,René,emea\r"

    def upload(**fields):
        file = SimpleUploadedFile("leads.csv", body.encode("cp1252"), "text/csv")
        return admin_client.post("/admin/lead-import/", {"file": file, **fields})

    refused = upload()
    assert refused.status_code == 200 and not Lead.objects.exists()
    html = html_of(refused)
    assert "line 3 holds bytes that are not UTF-8" in html and "Choose the one that reads right" in html
    assert "&quot;René&quot; as Windows-1252 (cp1252)" in html
    response = upload(encoding="cp1252")
    assert response.status_code == 200
    assert "2 rows: 2 imported" in html_of(response)
    assert dict(Lead.objects.values_list("external_id", "first_name")) == {"c-1": "Ann", "c-2": "René"}


def test_an_image_uploaded_to_the_import_is_said_to_be_one(admin_client):
    png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256))
    refused = admin_client.post("/admin/lead-import/", {"file": SimpleUploadedFile("leads.csv", png, "text/csv")})
    html = html_of(refused)
    assert "The file is not CSV text: it is a PNG image." in html and "Encoding" not in html.split("errornote")[1][:200]
    assert not Lead.objects.exists()


def test_a_queued_lead_rerouted_and_queued_again_counts_once_and_a_short_queue_shows_its_peak(
    api, make_group, post_lead
):
    make_group(0, slug="empty")
    leads = [post_lead(group="empty").json()["id"] for _ in range(3)]
    for _ in range(2):
        assert api.post(f"/api/v1/leads/{leads[0]}/reroute/", {}, format="json").status_code == 200
    now = timezone.now()
    (panel,) = [
        p for p in dashboard_view(since=now - timedelta(days=1), until=now + timedelta(minutes=1)) if p.slug == "empty"
    ]
    assert panel.queue_now == 3 and panel.queue_max == 3
    # Closed a minute later: gone between two of the chart's points, still the period's peak.
    for lead_id in leads:
        assert api.post(f"/api/v1/leads/{lead_id}/close/", {"outcome": "lost"}, format="json").status_code == 200
    later = timezone.now()
    (panel,) = [
        p
        for p in dashboard_view(since=later - timedelta(days=1), until=later + timedelta(minutes=1))
        if p.slug == "empty"
    ]
    assert panel.queue_now == 0 and panel.queue_max == 3
    # The chart draws it: its step holds the three at their most, where the point at its end
    # reads none (the chart drew a flat zero under "peak 3").
    assert 3 in panel.queue_highs and all(n == 0 for _, n in panel.queue_points)
    chart = queue_chart(panel)
    assert f",{chart['top']:.1f} " in chart["polyline"], chart  # a step at the top: the peak
    assert chart["step"] == "30 min"


def test_a_rep_paused_after_its_leads_keeps_its_fair_share(make_group, post_lead):
    group, (a, b) = make_group(2, slug="emea", strategy="weighted")
    for _ in range(4):
        post_lead(group="emea")
    Membership.objects.filter(group=group, rep=b).update(active=False)
    now = timezone.now()
    (panel,) = [
        p for p in dashboard_view(since=now - timedelta(days=1), until=now + timedelta(minutes=1)) if p.slug == "emea"
    ]
    assert {r.rep_id: (r.share, r.target_share) for r in panel.reps} == {a.id: (0.5, 0.5), b.id: (0.5, 0.5)}


@pytest.mark.parametrize(
    ("strategy", "fair", "caption"),
    [
        ("weighted", {0: "50.0%", 1: "25.0%"}, "fair share (by weight)"),
        ("round_robin", {0: "33.3%", 1: "33.3%"}, "equal turns"),
        ("least_loaded", {0: "33.3%", 1: "33.3%"}, "equal turns"),
    ],
)
def test_the_fair_share_counts_weights_only_where_the_rotation_does(
    admin_client, make_group, post_lead, strategy, fair, caption
):
    """Weight 2 of 4 is half the turns of a weighted group, and a third of a round robin's
    (it gives each member one turn a round, whatever its weight): the chart and the table
    compare each rep with what its group's rotation gives it."""
    group, reps = make_group(3, slug="emea", strategy=strategy)
    Membership.objects.filter(group=group, rep=reps[0]).update(weight=2)
    for _ in range(6):
        post_lead(group="emea")
    html = admin_client.get("/admin/dashboard/?group=emea").content.decode()
    assert caption in html
    for i, pct in fair.items():
        assert f"{reps[i].name}: fair share {pct}</title>" in html
    assert "<th>Fair share</th>" in html


def test_a_group_filter_naming_no_group_says_so(admin_client, make_group):
    """?group=<slug> of a group renamed or deleted: "no such group", not "No groups yet"."""
    make_group(1, slug="emea")
    html = admin_client.get("/admin/dashboard/?group=gone").content.decode()
    assert "No groups yet" not in html
    assert "No group with the slug “gone”" in html


def test_a_lead_queued_for_longer_than_the_lookback_is_still_queued_now(make_group, post_lead):
    """The queue episodes are looked for a bounded time before the period (QUEUE_LOOKBACK),
    but a lead stuck in the queue since before then is in it all period, and now."""
    make_group(0, slug="empty")
    post_lead(group="empty")
    later = timezone.now() + QUEUE_LOOKBACK + timedelta(days=10)  # the same page, weeks later
    (panel,) = [p for p in dashboard_view(since=later - timedelta(days=1), until=later) if p.slug == "empty"]
    assert panel.queue_now == 1 and panel.queue_max == 1
    assert [n for _, n in panel.queue_points] == [1] * len(panel.queue_points)


@pytest.mark.parametrize("days", ["90", "abc"])
def test_a_period_the_dashboard_does_not_offer_says_so(admin_client, make_group, days):
    make_group(1, slug="emea")
    response = admin_client.get("/admin/dashboard/", {"days": days})
    assert response.status_code == 200
    html = response.content.decode()
    assert f"No period “{days}”: showing the last 7 days" in html
    assert "No period" not in admin_client.get("/admin/dashboard/?days=30").content.decode()


def _a_lets_its_two_leads_escalate_to_b(make_group, post_lead):
    group, (a, b) = make_group(2, slug="emea", sla_minutes=10)
    for _ in range(4):
        post_lead(group="emea")  # a, b, a, b
    for assignment in Assignment.objects.filter(group=group, rep=a):
        Assignment.objects.filter(pk=assignment.pk).update(due_at=timezone.now() - timedelta(seconds=1))
    actions.escalation_sweep()  # a's two leads escalate to b
    return group, a, b


def test_the_share_is_of_rotation_turns_so_escalations_do_not_make_an_even_rotation_look_unfair(make_group, post_lead):
    """Escalations go to whoever has not had the lead: the escalated-to rep's share rose over
    the fair one while the rotation's own turns were even, and a manager read it as unfair."""
    group, a, b = _a_lets_its_two_leads_escalate_to_b(make_group, post_lead)
    now = timezone.now()
    (panel,) = dashboard_view(since=now - timedelta(days=1), until=now + timedelta(minutes=1), group_slug="emea")
    rows = {r.rep_id: (r.assigned, r.turns, r.share) for r in panel.reps}
    assert rows == {a.id: (2, 2, 0.5), b.id: (4, 2, 0.5)}
    assert (panel.assigned, panel.turns) == (6, 4)


def test_the_table_shows_the_shares_the_chart_draws(admin_client, make_group, post_lead):
    """Eight leads over three reps in turn: 37.5 % of the assignments against a third of the
    weights, not "38 %" and "33 %" in the table beside "37.5 %" and "33.3 %" on the chart."""
    make_group(3, slug="emea")
    for _ in range(8):
        post_lead(group="emea")
    html = admin_client.get("/admin/dashboard/?group=emea").content.decode()
    assert html.count("37.5% / 33.3%") == 2  # the chart's labels of the two reps with 3 leads
    assert html.count("<td>37.5%</td><td>33.3%</td>") == 2


def test_queued_leads_that_no_group_holds_are_counted_above_the_panels(admin_client, make_group, post_lead):
    """A lead that matched no rule, with no default group, waits in the queue in no group: no
    panel counted it, so the dashboard showed an empty queue while the lead waited."""
    make_group(1, slug="emea")
    assert post_lead().json()["queue_reason"]  # no rule, no default group: queued, no group
    post_lead()
    html = admin_client.get("/admin/dashboard/").content.decode()
    assert 'id="queued-without-group">2 leads in the' in html
    assert '/admin/leads/queuedlead/?group__isnull=True"' in html
    queue = admin_client.get("/admin/leads/queuedlead/?group__isnull=True")
    assert queue.status_code == 200 and queue.context["cl"].result_count == 2
    # A page filtered to one group is that group's alone.
    assert "queued-without-group" not in admin_client.get("/admin/dashboard/?group=emea").content.decode()


def test_a_queued_lead_moved_to_another_groups_queue_or_to_none_leaves_the_first_groups_queue(
    api, make_group, post_lead
):
    """A lead queued in one group and rerouted into another group's queue (or into the queue
    with no group) left the first one: its panel, on its own page too, counted it as queued
    there until it was assigned or closed, beside the queue of the group that now holds it."""
    from rotation.models import RoutingRule

    first, _ = make_group(0, slug="first")
    second, _ = make_group(0, slug="second")
    to_first = RoutingRule.objects.create(
        name="First", priority=1, group=first, conditions=[{"field": "source", "op": "equals", "value": "first"}]
    )
    moved = post_lead(source="move", group="first").json()["id"]
    lost = post_lead(source="first").json()["id"]  # no default group: only the rule holds it
    assert Lead.objects.filter(group=first, status="queued").count() == 2
    RoutingRule.objects.create(
        name="Second", priority=1, group=second, conditions=[{"field": "source", "op": "equals", "value": "move"}]
    )
    to_first.delete()
    for lead_id in (moved, lost):
        assert api.post(f"/api/v1/leads/{lead_id}/reroute/", {}, format="json").status_code == 200
    assert Lead.objects.get(pk=moved).group == second and Lead.objects.get(pk=lost).group is None

    now = timezone.now()
    since, until = now - timedelta(days=1), now + timedelta(minutes=1)
    panels = {p.slug: p for p in dashboard_view(since=since, until=until)}
    assert (panels["first"].queue_now, panels["second"].queue_now) == (0, 1)
    assert panels["first"].queue_points[-1][1] == 0 and panels["first"].queue_max == 2
    for slug, queued in (("first", 0), ("second", 1)):  # a page of one group says the same
        (panel,) = dashboard_view(since=since, until=until, group_slug=slug)
        assert panel.queue_now == queued and panel.queue_points[-1][1] == queued


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_lines_an_upload_logs_while_its_page_streams_carry_the_requests_id(
    admin_client, make_group, settings, caplog
):
    """The upload goes on after the view has answered (its page is streamed, batch by batch):
    what it logged meanwhile (a batch retried, the import stopped) had "-" for a request id,
    so the operator could not tell which upload, and whose, the error was."""
    from leads.bulk import BATCH_SIZE
    from routing_project.logging import RequestIdFilter
    from tests.leads.test_bulk_import import rotation_row_held

    settings.ROUTING_LOCK_TIMEOUT_MS = 100
    settings.ROUTING_MAX_RETRIES = 0
    group, _ = make_group(2, slug="emea")
    caplog.handler.addFilter(RequestIdFilter())  # as the console handler does, at emit time
    body = "external_id,email,group\n" + "".join(f"s-{i},s{i}@customer.example,emea\n" for i in range(BATCH_SIZE + 10))
    upload = SimpleUploadedFile("leads.csv", body.encode())
    response = admin_client.post("/admin/lead-import/", {"file": upload}, headers={"X-Request-ID": "up-7"})
    assert response.status_code == 200 and response.streaming and response["X-Request-ID"] == "up-7"
    with rotation_row_held(group):  # the second batch waits past the lock timeout: the import stops
        page = b"".join(response.streaming_content).decode()
    assert f"The import stopped (OperationalError) after {BATCH_SIZE} rows" in page
    (stopped,) = [r for r in caplog.records if r.getMessage() == "lead import stopped"]
    assert stopped.request_id == "up-7"


def test_leads_assigned_by_hand_to_a_rep_outside_the_group_are_not_said_to_be_of_a_former_member(
    admin_client, make_group, post_lead
):
    """A manager may give a lead to a rep who is not in its group (audited as such). The panel
    counted those as "assignments to reps no longer in the group": a manager reads that a
    member was removed, when none was."""
    from leads import actions
    from tests.factories import RepFactory

    make_group(1, slug="emea")
    outsider = RepFactory()
    lead_id = post_lead(group="emea").json()["id"]
    actions.lead_reassign(lead_id=lead_id, rep_id=outsider.pk, reason="covering", actor="test")
    html = admin_client.get("/admin/dashboard/?group=emea").content.decode()
    assert "removed since" not in html
    assert f"<td>{outsider.name} <small>(not a member now: given leads by hand)</small></td>" in html


def test_a_lead_given_by_hand_to_a_paused_member_leaves_the_fair_shares_alone(make_group, post_lead):
    # The rotation skipped the paused rep, as it should; a lead a manager gave it by hand once
    # counted it as taking part, and the chart showed the others over their shares.
    group, (a, b, paused) = make_group(3, slug="emea", strategy="weighted")
    Membership.objects.filter(group=group, rep=a).update(weight=3)
    Membership.objects.filter(group=group, rep=paused).update(active=False)
    for _ in range(4):
        post_lead(group="emea")
    queued = post_lead(group="emea").json()["id"]
    actions.lead_reassign(lead_id=queued, rep_id=paused.pk, reason="covering", actor="test")
    (panel,) = dashboard_view(since=timezone.now() - timedelta(days=1), until=timezone.now(), group_slug="emea")
    assert {r.rep_id: (r.turns, r.target_share) for r in panel.reps} == {
        a.id: (4, 0.75),
        b.id: (1, 0.25),
        paused.id: (0, 0.0),
    }


def test_a_member_removed_since_keeps_its_turns_its_fair_share_and_its_row(admin_client, make_group, post_lead, api):
    # A removed member's turns stayed in the total while it left the table and the fair shares:
    # the one left read 50% of the turns against a fair share of 100%.
    group, (a, b) = make_group(2, slug="emea", strategy="weighted", sla_minutes=1)
    Membership.objects.filter(group=group, rep=b).update(weight=3)
    for _ in range(4):
        post_lead(group="emea")
    Assignment.objects.filter(rep=b).update(due_at=timezone.now() - timedelta(seconds=1))  # missed
    assert api.delete(f"/api/v1/groups/emea/members/{b.pk}/").status_code == 204
    (panel,) = dashboard_view(since=timezone.now() - timedelta(days=1), until=timezone.now(), group_slug="emea")
    rows = {r.rep_id: (r.name, r.weight, r.turns, r.share, r.target_share, r.breaches, r.member) for r in panel.reps}
    assert rows == {a.id: (a.name, 1, 1, 0.25, 0.25, 0, True), b.id: (b.name, 3, 3, 0.75, 0.75, 3, False)}
    html = admin_client.get("/admin/dashboard/?group=emea").content.decode()
    assert f"<td>{b.name} <small>(not a member now: removed since)</small></td>" in html


def test_a_member_removed_after_leads_given_by_hand_is_said_removed(admin_client, make_group, post_lead, api):
    group, (a, b) = make_group(2, slug="emea")
    lead_id = post_lead(group="emea").json()["id"]  # a's turn
    actions.lead_reassign(lead_id=lead_id, rep_id=b.pk, reason="covering", actor="test")  # b's, by hand
    assert api.delete(f"/api/v1/groups/emea/members/{b.pk}/").status_code == 204
    html = admin_client.get("/admin/dashboard/?group=emea").content.decode()
    assert f"<td>{b.name} <small>(not a member now: removed since)</small></td>" in html, html


def test_a_group_without_rotation_turns_in_the_period_says_so_rather_than_draw_zeros(admin_client, make_group):
    make_group(3, slug="emea")
    html = admin_client.get("/admin/dashboard/?group=emea").content.decode()
    assert "No rotation turns in this period" in html
    assert "– / 33.3%" in html and "0.0% / 33.3%" not in html


def test_an_auto_paused_member_says_why(admin_client, make_group):
    group, (a,) = make_group(1, slug="emea")
    Membership.objects.filter(group=group, rep=a).update(active=False, paused_reason="auto-paused after 3 SLA misses")
    html = admin_client.get("/admin/dashboard/?group=emea").content.decode()
    assert f"<td>{a.name} <small>(paused in this group: auto-paused after 3 SLA misses)</small></td>" in html


def test_the_share_chart_is_drawn_to_the_largest_share_so_a_large_groups_bars_can_be_told_apart(make_group, post_lead):
    from leads.dashboard import share_chart

    make_group(25, slug="big")
    for _ in range(25):
        post_lead(group="big")
    (panel,) = dashboard_view(since=timezone.now() - timedelta(days=1), until=timezone.now(), group_slug="big")
    chart = share_chart(panel)
    assert chart["scale_pct"] == 5  # every share is 4%
    assert {r["target_w"] for r in chart["rows"]} == {round(chart["plot_w"] * 0.04 / 0.05, 1)}


def test_groups_are_listed_with_their_numbers_in_order(admin_client, make_group):
    for n in (10, 2, 1):
        make_group(0, slug=f"g{n}", name=f"Group {n}")
    html = admin_client.get("/admin/dashboard/").content.decode()
    assert html.index('id="group-g1"') < html.index('id="group-g2"') < html.index('id="group-g10"')
    picker = html.split("<select")[1].split("</select>")[0]
    assert picker.index("Group 1 (g1)") < picker.index("Group 2 (g2)") < picker.index("Group 10 (g10)")


def test_a_rep_made_inactive_is_said_inactive_not_paused_in_the_group(admin_client, make_group, post_lead):
    """Pausing is a membership's (the rep still works the other groups); a rep made inactive
    takes no leads anywhere: the table said "(paused)" for both."""
    from rotation.models import Rep

    group, (a, b, c) = make_group(3, slug="emea")
    Membership.objects.filter(group=group, rep=b).update(active=False)
    Rep.objects.filter(pk=c.pk).update(active=False)
    html = admin_client.get("/admin/dashboard/?group=emea").content.decode()
    assert f"<td>{a.name}</td>" in html
    assert f"<td>{b.name} <small>(paused in this group)</small></td>" in html
    assert f"<td>{c.name} <small>(rep inactive)</small></td>" in html


def test_an_uploads_events_carry_the_request_id_of_its_page(admin_client, make_group):
    """The access line and the log lines of an upload carry its request's id; its events
    carried the import's own id instead, and nothing tied them to the request."""
    make_group(2, slug="emea")
    body = b"external_id,email,group\nr-1,one@customer.example,emea\nr-2,two@customer.example,emea\n"
    response = admin_client.post(
        "/admin/lead-import/", {"file": SimpleUploadedFile("leads.csv", body)}, headers={"X-Request-ID": "upload-7"}
    )
    assert response["X-Request-ID"] == "upload-7"
    assert "2 rows: 2 imported" in html_of(response)
    events = AuditEvent.objects.filter(type__startswith="lead.")
    assert events.count() == 4 and set(events.values_list("request_id", flat=True)) == {"upload-7"}
    # Every event of the upload, its decisions too, names the import and the row's line.
    assert len({e.explanation["import"] for e in events}) == 1
    assert sorted(e.explanation["line"] for e in events) == [2, 2, 3, 3]
    assert events.get(type="lead.received", explanation__line=2).explanation["import"].startswith("import-")


def test_a_groups_queued_now_links_to_its_leads_in_the_queue(admin_client, make_group, post_lead):
    """A manager who reads "3 queued now" on a panel goes to work those leads: the count is a
    link to the fallback queue filtered to that group (a group with none queued has no link)."""
    emea, _ = make_group(0, slug="emea")
    make_group(1, slug="dach")
    for _ in range(3):
        post_lead(group="emea")  # no member: queued in emea
    html = admin_client.get("/admin/dashboard/").content.decode()
    link = f'href="/admin/leads/queuedlead/?group__id__exact={emea.id}"'
    panel = html.split('id="group-emea"')[1].split("</section>")[0]
    assert link in panel and "<strong>3</strong>queued now</a>" in panel
    assert "queuedlead" not in html.split('id="group-dach"')[1].split("</section>")[0]
    queue = admin_client.get(f"/admin/leads/queuedlead/?group__id__exact={emea.id}")
    assert queue.status_code == 200 and queue.context["cl"].result_count == 3


def test_a_picker_lists_the_groups_and_shows_the_one_chosen(admin_client, make_group, post_lead):
    """With many groups, the all-groups page was a long scroll to the one wanted; the only way
    to one group was its title, once found."""
    make_group(1, slug="emea", name="EMEA")
    make_group(1, slug="apac", name="APAC", active=False)
    post_lead(group="emea")
    html = admin_client.get("/admin/dashboard/?days=30").content.decode()
    picker = re.search(r'<form method="get" class="dash-filters" id="group-picker">(.*?)</form>', html, re.S)
    assert picker, html
    assert '<input type="hidden" name="days" value="30">' in picker[1]
    assert '<option value="" selected>All groups</option>' in picker[1]
    assert picker[1].index('value="apac">APAC (apac, inactive)') < picker[1].index('value="emea">EMEA (emea)')
    # What the form sends: one panel, the group chosen selected in the picker.
    html = admin_client.get("/admin/dashboard/", {"days": "30", "group": "emea"}).content.decode()
    assert '<option value="emea" selected>EMEA (emea)</option>' in html
    assert 'id="group-emea"' in html and 'id="group-apac"' not in html
    # "All groups" in the picker sends an empty group: every panel again.
    html = admin_client.get("/admin/dashboard/", {"days": "30", "group": ""}).content.decode()
    assert 'id="group-emea"' in html and 'id="group-apac"' in html


@given(
    episodes=st.lists(
        st.tuples(st.integers(0, 60), st.one_of(st.none(), st.integers(0, 60))).map(
            lambda e: (e[0], None if e[1] is None else max(e[0], e[1]))
        ),
        max_size=30,
    ),
    points=st.lists(st.integers(0, 60), min_size=1, max_size=10, unique=True).map(sorted),
)
def test_the_queue_levels_of_one_sweep_are_those_of_counting_each_lead_at_each_point(episodes, points):
    """At a point, a lead entered at or before it and not yet left (one that left at that very
    instant is gone) counts; a step's high is the most at any instant after the point before,
    up to its own; the peak is the most at any instant, with leaving before entering."""
    base = timezone.now()
    at = [base + timedelta(minutes=m) for m in points]
    changes = []
    for entered, left in episodes:
        changes.append((base + timedelta(minutes=entered), 1))
        if left is not None:
            changes.append((base + timedelta(minutes=left), -1))
    counts, highs, peak = queue_levels(changes, at)

    def waiting(m):
        return sum(1 for entered, left in episodes if entered <= m and (left is None or left > m))

    assert counts == [waiting(m) for m in points]
    instants = {e for e, _ in episodes} | {left for _, left in episodes if left is not None}
    assert peak == max((waiting(m) for m in instants), default=0)
    for i, m in enumerate(points):
        before = points[i - 1] if i else None
        inside = {t for t in instants if t <= m and (before is None or t > before)} | ({before} if i else set())
        assert highs[i] == max((waiting(t) for t in inside), default=0), (i, highs)


def test_the_rotation_view_says_who_got_leads_by_escalation_and_who_let_them_run_out(
    make_group, post_lead, api, admin_client
):
    """An escalation is a rotation turn: the rep after one who lets every lead sit gets its
    escalations in the place of new leads, while the rotation view showed even counts only."""
    group, a, b = _a_lets_its_two_leads_escalate_to_b(make_group, post_lead)
    members = {m["rep"]["id"]: m for m in api.get("/api/v1/groups/emea/rotation/").json()["members"]}
    seen = {rep: (m["assigned_week"], m["escalated_to_week"], m["sla_missed_week"]) for rep, m in members.items()}
    assert seen == {a.id: (2, 0, 2), b.id: (4, 2, 0)}
    page = admin_client.get(f"/admin/rotation/group/{group.pk}/change/").content.decode()
    assert '4 <span class="rotation-week-detail">(2 by escalation)</span>' in page
    assert '2 <span class="rotation-week-detail">(2 SLA missed)</span>' in page
