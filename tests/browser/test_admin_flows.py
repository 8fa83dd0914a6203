"""The admin as people use it, in a real browser (Playwright on Debian's chromium)."""

import json
import os
import re
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.contrib.auth.models import Group as Role
from django.contrib.auth.models import Permission, User
from playwright.sync_api import Page, expect

from audit.models import AuditEvent
from leads.models import Lead
from leads.tokens import api_client_create
from rotation import services
from rotation.models import Account, Group, Membership
from tests.factories import GroupFactory, RepFactory

from .conftest import SCREENSHOTS

pytestmark = [pytest.mark.xdist_group("browser"), pytest.mark.postgres]
PASSWORD = "a-long-test-password"


def user_in(role: str, username: str) -> User:
    """A staff user holding one of the admin roles (the roles migration makes the groups)."""
    user = User.objects.create_user(username, password=PASSWORD, is_staff=True)
    group = Role.objects.filter(name=role).first()
    if group is None or not group.permissions.exists():  # flushed by an earlier transactional test
        from security.roles import roles_sync

        roles_sync(group_model=Role, permission_model=Permission)
        group = Role.objects.get(name=role)
    user.groups.add(group)
    return user


def superuser() -> User:
    return User.objects.create_superuser("root", "root@example.com", PASSWORD)


def log_in(page: Page, live: str, username: str) -> None:
    page.goto(f"{live}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    expect(page.locator("#user-tools")).to_contain_text(username)


@contextmanager
def logged_in_page(browser, live: str, username: str, width: int, **context_options) -> Iterator[Page]:
    """A page of its own window size (and options: a time zone), logged in; closed afterwards."""
    context = browser.new_context(viewport={"width": width, "height": 900}, **context_options)
    try:
        page = context.new_page()
        log_in(page, live, username)
        yield page
    finally:
        context.close()


def post_lead(live: str, token: str, body: dict) -> dict:
    assert live.startswith("http://127.0.0.1:")
    request = urllib.request.Request(  # noqa: S310 - the live server
        f"{live}/api/v1/leads/",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
        assert response.status in (200, 201)
        return json.loads(response.read())


def test_sales_ops_create_a_group_and_add_reps_in_the_member_inline(page: Page, live: str):
    RepFactory(name="Alice Martin")
    RepFactory(name="Bob Durand")
    user_in("Sales ops", "ops")
    log_in(page, live, "ops")
    page.goto(f"{live}/admin/rotation/group/add/")
    page.locator("#id_name").press_sequentially("Benelux inbound")
    expect(page.locator("#id_slug")).to_have_value("benelux-inbound")  # prepopulated by the admin's JS
    page.select_option("#id_strategy", "round_robin")
    for i, name in enumerate(["Alice", "Bob"]):
        page.click("#memberships-group .add-row a")
        page.click(f"#memberships-{i} .select2-selection")
        page.fill(".select2-container--open .select2-search__field", name)
        page.click(f".select2-results__option:has-text('{name}')")
    page.click("input[name=_save]")
    expect(page.locator(".messagelist")).to_contain_text("was added successfully")

    group = Group.objects.get(slug="benelux-inbound")
    members = list(Membership.objects.filter(group=group).order_by("position").values_list("rep__name", "position"))
    assert members == [("Alice Martin", 0), ("Bob Durand", 1)]
    assert AuditEvent.objects.filter(type="membership.changed", group="benelux-inbound").count() == 2


def test_a_lead_posted_over_the_api_shows_up_assigned(page: Page, live: str):
    group = GroupFactory(slug="emea", name="EMEA")
    rep = RepFactory(name="Chloe Petit")
    services.membership_add(group=group, rep=rep, actor="test")
    _, token = api_client_create(name="web-form", scopes=["intake"])
    lead = post_lead(live, token, {"email": "jane@acme.example", "company": "Acme Browser", "group": "emea"})
    assert lead["status"] == "assigned"

    superuser()
    log_in(page, live, "root")
    page.goto(f"{live}/admin/leads/lead/")
    row = page.locator("#result_list tbody tr", has_text="Acme Browser")
    expect(row).to_contain_text("Chloe Petit")
    expect(row).to_contain_text(re.compile("assigned", re.IGNORECASE))
    expect(row).to_contain_text("emea")


def test_a_manager_assigns_a_queued_lead(page: Page, live: str):
    group = GroupFactory(slug="apac", name="APAC")
    rep = RepFactory(name="Dev Patel")
    services.membership_add(group=group, rep=rep, actor="test", active=False)  # paused: nobody eligible
    _, token = api_client_create(name="form", scopes=["intake"])
    lead = post_lead(live, token, {"email": "kim@corp.example", "company": "Queued Corp", "group": "apac"})
    assert lead["status"] == "queued"

    user_in("Managers", "manager")
    log_in(page, live, "manager")
    page.goto(f"{live}/admin/leads/queuedlead/")
    row = page.locator("#result_list tbody tr", has_text="Queued Corp")
    expect(row).to_contain_text("no eligible rep")
    row.locator("input.action-select").check()
    page.select_option("select[name=action]", "assign_to_rep")
    page.click("button[name=index]")
    expect(page.locator("#content")).to_contain_text("Assign 1 lead to one rep")
    page.select_option("select[name=rep]", label="Dev Patel (paused here)")  # first: a member of apac
    if page.locator("[name=reason]").count():
        page.fill("[name=reason]", "covering the queue")
    page.click("input[type=submit][value=Assign]")
    expect(page.locator(".messagelist")).to_contain_text("Dev Patel")

    assigned = Lead.objects.get(pk=lead["id"])
    assert (assigned.status, assigned.owner_id) == ("assigned", rep.id)
    assert AuditEvent.objects.filter(lead_id=lead["id"], actor="admin:manager").exists()
    expect(page.locator("#result_list tbody tr", has_text="Queued Corp")).to_have_count(0)


def test_the_audit_trail_shows_the_explanation(page: Page, live: str):
    group = GroupFactory(slug="nordics", name="Nordics")
    first, second = RepFactory(name="Erik Berg"), RepFactory(name="Frida Lund")
    services.membership_add(group=group, rep=first, actor="test")
    services.membership_add(group=group, rep=second, actor="test")
    _, token = api_client_create(name="form", scopes=["intake"])
    lead = post_lead(live, token, {"email": "ola@firm.example", "group": "nordics"})

    superuser()
    log_in(page, live, "root")
    page.goto(f"{live}/admin/audit/auditevent/?q={lead['id']}")
    received = re.compile(r"lead\.received|lead received", re.IGNORECASE)
    expect(page.locator("#result_list tbody tr", has_text=received)).to_have_count(1)
    assigned = re.compile(r"lead\.assigned|lead assigned", re.IGNORECASE)
    page.locator("#result_list tbody tr", has_text=assigned).locator("a").first.click()
    explanation = page.locator("pre")
    expect(explanation).to_contain_text('"pointer_before": 0')
    expect(explanation).to_contain_text('"pointer_after": 1')
    expect(explanation).to_contain_text('"strategy": "round_robin"')
    expect(explanation).to_contain_text("Frida Lund")  # every candidate, with why it was not chosen
    expect(explanation).to_contain_text('"reason": "chosen"')
    # Read-only for everyone: no save button, no delete link.
    expect(page.locator("input[name=_save]")).to_have_count(0)
    expect(page.locator("a.deletelink")).to_have_count(0)


def test_the_dashboard_renders_its_charts(page: Page, live: str):
    group = GroupFactory(slug="france", name="France", strategy="weighted", sla_minutes=15)
    reps = [RepFactory(name=n) for n in ("Gabriel Roux", "Hugo Blanc", "Ines Faure")]
    for rep, weight in zip(reps, (3, 2, 1), strict=True):
        services.membership_add(group=group, rep=rep, actor="test", weight=weight)
    GroupFactory(slug="unstaffed", name="Unstaffed")
    _, token = api_client_create(name="form", scopes=["intake"])
    for i in range(12):
        post_lead(live, token, {"email": f"lead{i}@prospect.example", "group": "france"})
    for i in range(2):
        post_lead(live, token, {"email": f"q{i}@prospect.example", "group": "unstaffed"})

    superuser()
    log_in(page, live, "root")
    page.goto(f"{live}/admin/")
    page.click("text=Routing dashboard")
    expect(page.locator("h1")).to_contain_text("Routing dashboard")
    panel = page.locator("#group-france")
    expect(panel.locator(".dash-kpis")).to_contain_text("12")
    bars = panel.locator("svg rect.bar-actual")
    expect(bars).to_have_count(3)
    widths = [float(bars.nth(i).get_attribute("width") or 0) for i in range(3)]
    assert widths[0] > widths[1] > widths[2] > 0  # 6 / 4 / 2 leads for weights 3 / 2 / 1
    expect(panel).to_contain_text("50.0% / 50.0%")
    queue = page.locator("#group-unstaffed .queue-chart polyline")
    expect(queue).to_have_count(1)
    expect(page.locator("#group-unstaffed .dash-kpis")).to_contain_text("2")
    os.makedirs(SCREENSHOTS, exist_ok=True)
    page.screenshot(path=os.path.join(SCREENSHOTS, "dashboard.png"), full_page=True)
    # The group picker narrows the page to one group, keeping the period.
    page.click("text=Last 30 days")
    page.select_option("#dash-group", "france")
    page.click("#group-picker input[type=submit]")
    expect(page.locator("#group-france")).to_have_count(1)
    expect(page.locator("#group-unstaffed")).to_have_count(0)
    assert "days=30" in page.url and "group=france" in page.url


def test_the_share_charts_figures_fit_in_the_chart_at_a_full_share(page: Page, live: str):
    """A rep with all the group's leads (a group of one, or the only one available): its
    "100.0% / 100.0%" was written past the chart's right edge and cut off after "100.0% / 1"."""
    group = GroupFactory(slug="solo", name="Solo")
    services.membership_add(group=group, rep=RepFactory(name="Only Rep"), actor="test")
    _, token = api_client_create(name="form", scopes=["intake"])
    post_lead(live, token, {"email": "solo@prospect.example", "group": "solo"})

    superuser()
    log_in(page, live, "root")
    page.goto(f"{live}/admin/dashboard/?group=solo")
    chart = page.locator("#group-solo .share-chart svg")
    label = chart.locator("text", has_text="100.0% / 100.0%")
    expect(label).to_have_count(1)
    right = label.evaluate("t => t.getBBox().x + t.getBBox().width")
    assert right <= float(chart.get_attribute("width") or 0)


def test_a_csv_upload_imports_routes_and_lists_bad_lines(page: Page, live: str, tmp_path):
    group = GroupFactory(slug="dach", name="DACH")
    for name in ("Jonas Weber", "Klara Huber"):
        services.membership_add(group=group, rep=RepFactory(name=name), actor="test")
    path = tmp_path / "leads.csv"
    path.write_text(
        "external_id,email,company,country,group\n"
        "up-1,anna@kunde.example,Kunde GmbH,DE,dach\n"
        "up-2,not-an-email,Broken AG,DE,dach\n"
        "up-3,ben@firma.example,Firma AG,ZZ,dach\n"
        "up-4,carl@werk.example,Werk KG,AT,dach\n"
    )
    user_in("Sales ops", "ops")
    log_in(page, live, "ops")
    page.click("text=Import leads (CSV)")
    page.set_input_files("input[name=file]", str(path))
    page.click("input[type=submit][value=Import]")
    report = page.locator("#import-report")
    expect(report).to_contain_text("Import finished: 4 rows: 2 imported (2 assigned, 0 queued)")
    # The progress bar the page streamed ahead of the report, full once the import is done.
    expect(page.locator("#import-count")).to_have_text("done")
    assert page.evaluate("document.getElementById('import-bar').value") == 4
    expect(report.locator("tbody tr")).to_have_count(2)
    expect(report.locator("tbody tr").nth(0)).to_contain_text("3")
    expect(report.locator("tbody tr").nth(1)).to_contain_text("not an ISO 3166-1 alpha-2 country code")
    os.makedirs(SCREENSHOTS, exist_ok=True)
    page.screenshot(path=os.path.join(SCREENSHOTS, "import.png"), full_page=True)
    owners = list(Lead.objects.order_by("id").values_list("external_id", "owner__name"))
    assert owners == [("up-1", "Jonas Weber"), ("up-4", "Klara Huber")]


def test_two_managers_assign_the_same_queued_lead_the_second_is_told(browser, live: str):
    """Two managers open "Assign to" on the same queued lead; the first one assigns it. The
    second one's submit must say the lead left the queue, not report nothing (or move it)."""
    group = GroupFactory(slug="latam", name="LatAm")
    first_rep = RepFactory(name="Ana Souza")
    RepFactory(name="Bruno Lima")
    services.membership_add(group=group, rep=first_rep, actor="test", active=False)
    _, token = api_client_create(name="form", scopes=["intake"])
    lead = post_lead(live, token, {"email": "race@corp.example", "company": "Race Corp", "group": "latam"})
    assert lead["status"] == "queued"
    user_in("Managers", "manager-a")
    user_in("Managers", "manager-b")

    pages = []
    for username in ("manager-a", "manager-b"):
        page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        page.set_default_timeout(15_000)
        log_in(page, live, username)
        page.goto(f"{live}/admin/leads/queuedlead/")
        page.locator("#result_list tbody tr", has_text="Race Corp").locator("input.action-select").check()
        page.select_option("select[name=action]", "assign_to_rep")
        page.click("button[name=index]")
        expect(page.locator("#content")).to_contain_text("Assign 1 lead to one rep")
        pages.append(page)
    for page, rep in zip(pages, ("Ana Souza (paused here)", "Bruno Lima"), strict=True):  # a member, then not
        page.select_option("select[name=rep]", label=rep)
        page.fill("[name=reason]", "covering the queue")
        page.click("input[type=submit][value=Assign]")
    expect(pages[0].locator(".messagelist")).to_contain_text("1 lead assigned to Ana Souza")
    expect(pages[1].locator(".messagelist .error")).to_contain_text(f"#{lead['id']}: no longer in the queue")

    assigned = Lead.objects.get(pk=lead["id"])
    assert (assigned.status, assigned.owner_id) == ("assigned", first_rep.id)
    assert AuditEvent.objects.filter(lead_id=lead["id"], type="lead.reassigned").count() == 1
    for page in pages:
        page.context.close()


def test_a_manager_reads_in_the_audit_trail_who_got_the_lead_and_why(page: Page, live: str):
    """The trail names the reps (not only their ids) and says in a sentence why the lead went
    where it went: the rule, the group, the rep chosen, the others and why not, the hand moves."""
    group = GroupFactory(slug="dach", name="DACH")
    first, second = RepFactory(name="Jonas Weber"), RepFactory(name="Klara Huber")
    services.membership_add(group=group, rep=first, actor="test")
    services.membership_add(group=group, rep=second, actor="test")
    _, token = api_client_create(name="form", scopes=["intake"])
    lead = post_lead(live, token, {"email": "max@firma.example", "group": "dach"})
    assert lead["owner"]["name"] == "Jonas Weber"

    user_in("Managers", "manager")
    log_in(page, live, "manager")
    page.goto(f"{live}/admin/leads/lead/{lead['id']}/reassign/")
    page.select_option("select[name=rep]", label="Klara Huber")
    page.fill("[name=reason]", "speaks the customer's dialect")
    page.click("input[type=submit]")
    expect(page.locator(".messagelist")).to_contain_text("reassigned to Klara Huber")

    page.goto(f"{live}/admin/audit/auditevent/?lead_id={lead['id']}")
    assigned = page.locator("#result_list tbody tr", has_text=re.compile("lead assigned", re.IGNORECASE))
    expect(assigned).to_contain_text(f"Jonas Weber (#{first.id})")
    expect(assigned).to_contain_text("Given to Jonas Weber")
    expect(assigned).to_contain_text("Klara Huber: not next in rotation")
    moved = page.locator("#result_list tbody tr", has_text=re.compile("lead reassigned", re.IGNORECASE))
    expect(moved).to_contain_text(f"Klara Huber (#{second.id})")
    expect(moved).to_contain_text("from Jonas Weber")
    expect(moved).to_contain_text("speaks the customer's dialect")
    moved.locator("a").first.click()
    expect(page.locator(".field-summary")).to_contain_text("Assigned by hand from Jonas Weber")


def test_an_account_domain_that_no_email_can_have_is_refused(page: Page, live: str):
    """Sales ops paste "@acme.example" or a URL into an account's domain: refused with a
    message, since no lead's email domain could ever match it (the account would do nothing)."""
    RepFactory(name="Lena Vogel")
    user_in("Sales ops", "ops")
    log_in(page, live, "ops")
    for bad in ("@acme.example", "https://acme.example/", "acme"):
        page.goto(f"{live}/admin/rotation/account/add/")
        page.fill("#id_domain", bad)
        page.click("#account_form .select2-selection")
        page.fill(".select2-container--open .select2-search__field", "Lena")
        page.click(".select2-results__option:has-text('Lena Vogel')")
        page.click("input[name=_save]")
        expect(page.locator(".field-domain .errorlist")).to_contain_text("the email domain alone")
    assert not Account.objects.exists()
    page.fill("#id_domain", "Acme.example")
    page.click("input[name=_save]")
    expect(page.locator(".messagelist")).to_contain_text("was added successfully")
    assert list(Account.objects.values_list("domain", flat=True)) == ["acme.example"]


def test_assigning_a_queued_lead_to_a_rep_out_of_office_warns_the_manager(page: Page, live: str):
    """A manager may give a lead to a rep who cannot take it now (out of office, not in the
    group): allowed by hand, but the page must say so, not only a plain success."""
    from datetime import timedelta

    from django.utils import timezone

    from rotation.models import Absence

    group = GroupFactory(slug="iberia", name="Iberia")
    away = RepFactory(name="Lucia Gomez")
    services.membership_add(group=group, rep=away, actor="test")
    now = timezone.now()
    Absence.objects.create(rep=away, starts_at=now - timedelta(hours=1), ends_at=now + timedelta(days=3))
    _, token = api_client_create(name="form", scopes=["intake"])
    lead = post_lead(live, token, {"email": "pablo@corp.example", "company": "Away Corp", "group": "iberia"})
    assert lead["status"] == "queued"

    user_in("Managers", "manager")
    log_in(page, live, "manager")
    page.goto(f"{live}/admin/leads/queuedlead/")
    page.locator("#result_list tbody tr", has_text="Away Corp").locator("input.action-select").check()
    page.select_option("select[name=action]", "assign_to_rep")
    page.click("button[name=index]")
    # The choice itself says she is away, before the manager picks her.
    expect(page.locator(f"select[name=rep] option[value='{away.pk}']")).to_contain_text("Lucia Gomez (out of office")
    page.select_option("select[name=rep]", value=str(away.pk))
    page.fill("[name=reason]", "her account")
    page.click("input[type=submit][value=Assign]")
    expect(page.locator(".messagelist .success")).to_contain_text("assigned to Lucia Gomez")
    warning = page.locator(".messagelist .warning")
    expect(warning).to_contain_text(f"#{lead['id']}")
    expect(warning).to_contain_text("Lucia Gomez is not eligible now")
    expect(warning).to_contain_text("out of office until")


def test_a_lead_page_offers_reassign_only_to_those_who_may(page: Page, live: str):
    """Sales ops read leads but do not move them: their lead page links the audit trail and
    offers no "Reassign…" button that would only lead to a 403 page."""
    group = GroupFactory(slug="baltics", name="Baltics")
    services.membership_add(group=group, rep=RepFactory(name="Mari Tamm"), actor="test")
    _, token = api_client_create(name="form", scopes=["intake"])
    lead = post_lead(live, token, {"email": "juri@corp.example", "group": "baltics"})

    user_in("Sales ops", "ops")
    log_in(page, live, "ops")
    page.goto(f"{live}/admin/leads/lead/{lead['id']}/change/")
    expect(page.locator("#content")).to_contain_text("Audit trail: every decision on this lead")
    expect(page.locator("#content a", has_text="Reassign")).to_have_count(0)
    expect(page.locator("#content a", has_text="Close…")).to_have_count(0)


def test_a_manager_closes_a_lead_from_its_page(page: Page, live: str):
    """The lead's page has a "Close…" button: the outcome is asked, then the lead is closed,
    audited as the manager, and its page says so."""
    group = GroupFactory(slug="nordics", name="Nordics")
    services.membership_add(group=group, rep=RepFactory(name="Sami Laine"), actor="test")
    _, token = api_client_create(name="form", scopes=["intake"])
    lead = post_lead(live, token, {"email": "aino@corp.example", "group": "nordics"})

    user_in("Managers", "manager")
    log_in(page, live, "manager")
    page.goto(f"{live}/admin/leads/lead/{lead['id']}/change/")
    page.click("#content a.button:has-text('Close…')")
    expect(page.locator("#content")).to_contain_text("owned by Sami Laine")
    page.check("input[name=outcome][value=won]")
    page.click("input[type=submit][value='Close the lead']")
    expect(page.locator(".messagelist .success")).to_contain_text(f"Lead #{lead['id']} closed as won.")
    expect(page.locator("#content")).to_contain_text("Closed (Won): not reassigned.")
    closed = Lead.objects.get(pk=lead["id"])
    assert (closed.status, closed.outcome) == ("closed", "won")
    assert AuditEvent.objects.get(type="lead.closed", lead_id=lead["id"]).actor == "admin:manager"


def test_sales_ops_move_the_default_group_in_one_save(page: Page, live: str):
    """Ticking "is default" on another group moves the flag (the old default loses it, both
    audited), as the API does; the form must not refuse it as a constraint violation."""
    old = GroupFactory(slug="global", name="Global", is_default=True)
    GroupFactory(slug="europe", name="Europe")
    user_in("Sales ops", "ops")
    log_in(page, live, "ops")
    page.goto(f"{live}/admin/rotation/group/{Group.objects.get(slug='europe').pk}/change/")
    page.check("#id_is_default")
    page.click("input[name=_save]")
    expect(page.locator(".messagelist")).to_contain_text("was changed successfully")
    # Said: it changed the old default too.
    expect(page.locator(".messagelist")).to_contain_text("The default group is now europe, in place of global")
    assert list(Group.objects.filter(is_default=True).values_list("slug", flat=True)) == ["europe"]
    moved = AuditEvent.objects.filter(type="group.changed", group=old.slug, actor="admin:ops")
    assert [e.explanation["changes"] for e in moved] == [{"is_default": False}]


def test_sales_ops_see_a_groups_members_and_state_on_a_laptop_without_scrolling(browser, live: str):
    """At 1300 pixels, beside the menu and the filters, the group list's "Members" column was
    past the table's edge: sales ops scrolled sideways to see who is in each group."""
    group = GroupFactory(slug="north-america-enterprise", name="North America enterprise")
    services.membership_add(group=group, rep=RepFactory(name="Grace Hopper"), actor="test")
    user_in("Sales ops", "ops")
    with logged_in_page(browser, live, "ops", 1300) as page:
        page.goto(f"{live}/admin/rotation/group/")
        table = page.locator("#changelist .results").bounding_box()
        assert table is not None
        for column in ("member_count", "active", "is_default"):
            box = page.locator(f"#result_list thead th.column-{column}").bounding_box()
            assert box is not None and box["x"] + box["width"] <= table["x"] + table["width"] + 1, column


def test_a_groups_member_table_fits_its_page_on_a_laptop(page: Page, live: str):
    """At 1280 pixels the member table of a group's page ran past the page's edge: its Delete
    box was reached by scrolling sideways."""
    group = GroupFactory(slug="north-america-enterprise", name="North America enterprise")
    services.membership_add(group=group, rep=RepFactory(name="Katherine Johnson-Goble"), actor="test")
    user_in("Sales ops", "ops")
    log_in(page, live, "ops")
    page.goto(f"{live}/admin/rotation/group/{group.pk}/change/")
    section = page.locator("#memberships-group fieldset").bounding_box()
    delete = page.locator("#memberships-group input[name='memberships-0-DELETE']").bounding_box()
    assert section is not None and delete is not None
    assert delete["x"] + delete["width"] <= section["x"] + section["width"]
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280


def test_a_manager_sees_each_leads_status_owner_and_sla_on_a_laptop_without_scrolling(browser, live: str):
    """At 1300 pixels the lead list showed the contact and the group, and left the SLA due
    time, the one a manager watches, past the table's edge."""
    group = GroupFactory(slug="emea", name="EMEA", sla_minutes=30)
    services.membership_add(group=group, rep=RepFactory(name="Katherine Johnson-Goble"), actor="test")
    _, token = api_client_create(name="web-form", scopes=["intake"])
    post_lead(live, token, {"email": "marguerite.yourcenar@editions-gallimard.example", "group": "emea"})
    post_lead(live, token, {"email": "diego.hernandez@mexico.example", "group": "emea"})
    user_in("Managers", "manager")
    with logged_in_page(browser, live, "manager", 1300) as page:
        page.goto(f"{live}/admin/leads/lead/")
        table = page.locator("#changelist .results").bounding_box()
        assert table is not None
        for column in ("status", "owner", "sla_due"):
            box = page.locator(f"#result_list thead th.column-{column}").bounding_box()
            assert box is not None and box["x"] + box["width"] <= table["x"] + table["width"] + 1, column


def test_a_reps_absences_say_they_are_in_the_reps_time_zone_not_the_servers(browser, live: str):
    """The page shows a rep's absences in the rep's zone; Django's own note told a user in Paris
    "You are 9 hours ahead of server time" on a Los Angeles rep's page, inviting a "correction" of a
    right value."""
    from datetime import timedelta

    from django.utils import timezone

    from rotation.models import Absence

    rep = RepFactory(name="Ada Lovelace", timezone="America/Los_Angeles")
    now = timezone.now()
    Absence.objects.create(rep=rep, starts_at=now + timedelta(days=1), ends_at=now + timedelta(days=2))
    user_in("Sales ops", "ops")
    with logged_in_page(browser, live, "ops", 1280, timezone_id="Europe/Paris") as page:
        page.goto(f"{live}/admin/rotation/rep/{rep.pk}/change/")
        notes = page.locator(".timezonewarning")
        expect(notes.first).to_have_text(
            re.compile(r"In the rep's time zone \(America/Los_Angeles\), [89] hours behind yours\.")
        )
        expect(page.get_by_text("server time")).to_have_count(0)


def test_a_groups_rotation_view_scrolls_on_a_narrow_window(browser, live: str):
    """At 800 pixels the rotation view's table was cut at the page's edge with no way to reach
    its columns past "Eligible now" (the form row hides what overflows)."""
    group = GroupFactory(slug="north-america-enterprise", name="North America enterprise")
    for name in ("Katherine Johnson-Goble", "Grace Hopper"):
        services.membership_add(group=group, rep=RepFactory(name=name), actor="test")
    user_in("Sales ops", "ops")
    with logged_in_page(browser, live, "ops", 800) as page:
        page.goto(f"{live}/admin/rotation/group/{group.pk}/change/")
        page.locator(".rotation-view").evaluate("view => { view.scrollLeft = view.scrollWidth; }")
        last = page.locator(".rotation-view thead th").last
        expect(last).to_have_text("Week share")
        box = last.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 800, box


def test_a_very_long_rep_name_keeps_the_reassign_page_in_the_window(page: Page, live: str):
    # One rep named to the field's 200 characters stretched the "Assign to" list to 2,241 px.
    group = GroupFactory(slug="emea", name="EMEA")
    rep = RepFactory(name="Dev Patel")
    RepFactory(name="Maria " + "Long-Name " * 19)
    services.membership_add(group=group, rep=rep, actor="test")
    _, token = api_client_create(name="form", scopes=["intake"])
    lead = post_lead(live, token, {"email": "kim@corp.example", "group": "emea"})
    user_in("Managers", "manager")
    log_in(page, live, "manager")
    page.goto(f"{live}/admin/leads/lead/{lead['id']}/reassign/")
    expect(page.locator("select#id_rep")).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
