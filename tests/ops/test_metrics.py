"""GET /metrics: Prometheus text, no authentication, intake counters, lock wait, gauges."""

import os
import subprocess
import sys
import textwrap
from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from leads import actions
from leads.models import Assignment


def scrape() -> dict[tuple[str, tuple], float]:
    response = APIClient().get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.mark.django_db
def test_metrics_needs_no_token_and_counts_intake_by_group(make_group, post_lead):
    group, _reps = make_group(3)
    empty, _ = make_group(0)
    before = scrape()

    assert post_lead(group=group.slug).status_code == 201
    assert post_lead(group=group.slug).status_code == 201
    assert post_lead(group=group.slug, email="dup@customer.example").status_code == 201
    assert post_lead(group=group.slug, email="dup@customer.example").status_code == 200  # duplicate
    assert post_lead(group=empty.slug).json()["status"] == "queued"

    after = scrape()
    g = group.slug
    assert (
        value(after, "leadrouter_leads_received_total", group=g)
        - value(before, "leadrouter_leads_received_total", group=g)
        == 4
    )
    assert (
        value(after, "leadrouter_leads_routed_total", group=g) - value(before, "leadrouter_leads_routed_total", group=g)
        == 3
    )
    assert (
        value(after, "leadrouter_leads_duplicate_total", group=g)
        - value(before, "leadrouter_leads_duplicate_total", group=g)
        == 1
    )
    e = empty.slug
    assert (
        value(after, "leadrouter_leads_queued_total", group=e) - value(before, "leadrouter_leads_queued_total", group=e)
        == 1
    )
    # Every routed or queued lead took its group's rotation lock once; duplicates took none.
    lock_count = "leadrouter_rotation_lock_wait_seconds_count"
    assert value(after, lock_count) - value(before, lock_count) == 4
    routing_count = "leadrouter_routing_duration_seconds_count"
    assert value(after, routing_count) - value(before, routing_count) == 5
    # Scrape-time gauges, read from the database.
    assert value(after, "leadrouter_metrics_database_up") == 1
    assert value(after, "leadrouter_queue_depth", group=e) == 1
    # The HTTP histogram is labelled by the URL pattern's name, never by the raw path.
    name = "leadrouter_http_request_duration_seconds_count"
    assert value(after, name, method="POST", view="lead-list", status="201") >= 3


@pytest.mark.django_db
def test_escalations_and_sla_breaches_are_counted_by_group_and_outcome(
    make_group, post_lead, django_capture_on_commit_callbacks
):
    group, _reps = make_group(2, sla_minutes=30, max_attempts=2)
    lead = post_lead(group=group.slug).json()
    before = scrape()
    for expected in ("escalated", "queued"):  # to the other rep, then to the queue (max_attempts)
        Assignment.objects.filter(lead_id=lead["id"], ended_at=None).update(
            due_at=timezone.now() - timedelta(seconds=1)
        )
        open_assignment = Assignment.objects.get(lead_id=lead["id"], ended_at=None)
        with django_capture_on_commit_callbacks(execute=True):  # counted once committed
            assert actions.lead_escalate(assignment_id=open_assignment.pk).outcome == expected
    with django_capture_on_commit_callbacks(execute=True):
        assert actions.lead_escalate(assignment_id=open_assignment.pk).outcome == "done"  # twice: counted once
    after = scrape()

    def delta(name: str, **labels) -> float:
        return value(after, name, group=group.slug, **labels) - value(before, name, group=group.slug, **labels)

    assert delta("leadrouter_escalations_total", outcome="reassigned") == 1
    assert delta("leadrouter_escalations_total", outcome="queued") == 1
    assert delta("leadrouter_sla_breaches_total") == 2


def test_multiprocess_mode_sums_the_samples_of_every_process(tmp_path):
    """Under gunicorn each worker writes its own samples; a scrape in any worker sees them all."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    write = textwrap.dedent(
        """
        from routing_project import metrics
        metrics.lead_received(group="hot")
        metrics.rotation_lock_waited(0.002)
        """
    )
    for _ in range(2):  # two "workers"
        subprocess.run([sys.executable, "-c", write], env=env, check=True, cwd=os.getcwd())
    read = textwrap.dedent(
        """
        from routing_project import metrics
        print(metrics.exposition().decode())
        """
    )
    out = subprocess.run([sys.executable, "-c", read], env=env, check=True, capture_output=True, text=True).stdout
    samples = {}
    for family in text_string_to_metric_families(out):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    assert value(samples, "leadrouter_leads_received_total", group="hot") == 2
    assert value(samples, "leadrouter_rotation_lock_wait_seconds_count") == 2


def test_multiprocess_mode_declares_the_metrics_no_process_has_written_yet(tmp_path):
    """Before the first escalation (or 503, or queued lead), a scrape under gunicorn still
    names every metric with its HELP and TYPE, as a one-process registry does; a metric
    with samples is declared once."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    script = textwrap.dedent(
        """
        from routing_project import metrics
        metrics.lead_received(group="hot")
        print(metrics.exposition().decode())
        """
    )
    out = subprocess.run([sys.executable, "-c", script], env=env, check=True, capture_output=True, text=True).stdout
    for name, kind in [
        ("leadrouter_leads_received_total", "counter"),
        ("leadrouter_leads_routed_total", "counter"),
        ("leadrouter_leads_queued_total", "counter"),
        ("leadrouter_leads_duplicate_total", "counter"),
        ("leadrouter_routing_busy_total", "counter"),
        ("leadrouter_escalations_total", "counter"),
        ("leadrouter_sla_breaches_total", "counter"),
        ("leadrouter_routing_duration_seconds", "histogram"),
        ("leadrouter_rotation_lock_wait_seconds", "histogram"),
        ("leadrouter_http_request_duration_seconds", "histogram"),
    ]:
        assert out.count(f"# TYPE {name} {kind}\n") == 1, (name, out)
    families = {family.name for family in text_string_to_metric_families(out)}
    assert {"leadrouter_escalations", "leadrouter_leads_received"} <= families


def test_processes_of_two_containers_with_one_pid_keep_their_own_samples(tmp_path):
    """docker-compose.yml shares one directory between the web, worker and beat containers,
    and each container numbers its processes from 1: two processes with one pid, on two
    hosts, must not write into one file (each would overwrite the samples the other adds)."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "samples")}
    os.mkdir(env["PROMETHEUS_MULTIPROC_DIR"])
    write = textwrap.dedent(
        """
        import os, socket, sys, time
        os.getpid = lambda: 7  # before prometheus_client reads it: the same pid in both
        socket.gethostname = lambda: sys.argv[1]
        from routing_project import metrics
        me, other = sys.argv[1], sys.argv[2]
        metrics.lead_received(group=me + "-first")
        open(os.path.join(sys.argv[3], me), "w").close()
        while not os.path.exists(os.path.join(sys.argv[3], other)):
            time.sleep(0.01)
        metrics.lead_received(group=me + "-second")
        metrics.escalation_recorded(group=me, outcome="queued")
        """
    )
    hosts = ("web", "worker")
    processes = [
        subprocess.Popen([sys.executable, "-c", write, me, other, str(tmp_path)], env=env, cwd=os.getcwd())
        for me, other in (hosts, hosts[::-1])
    ]
    assert [p.wait(timeout=60) for p in processes] == [0, 0]
    read = "from routing_project import metrics; print(metrics.exposition().decode())"
    out = subprocess.run([sys.executable, "-c", read], env=env, check=True, capture_output=True, text=True).stdout
    samples = {}
    for family in text_string_to_metric_families(out):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    for host in hosts:
        assert value(samples, "leadrouter_leads_received_total", group=f"{host}-first") == 1, out
        assert value(samples, "leadrouter_leads_received_total", group=f"{host}-second") == 1, out
        assert value(samples, "leadrouter_escalations_total", group=host, outcome="queued") == 1, out


@pytest.mark.django_db(transaction=True)
def test_lock_held_is_observed_at_commit(make_group, post_lead):
    """The time the rotation row stays locked (acquire to COMMIT): a hot group's capacity."""
    group, _ = make_group(2)
    name = "leadrouter_rotation_lock_held_seconds_count"
    before = value(scrape(), name)
    assert post_lead(group=group.slug).status_code == 201
    assert post_lead(group=group.slug).status_code == 201
    assert value(scrape(), name) - before == 2


def test_a_worker_only_host_serves_its_samples_with_serve_metrics(tmp_path):
    """A machine running Celery and no web server: `manage.py serve_metrics` serves what its
    processes counted (here two escalations written by a "worker" process)."""
    import http.client
    import socket

    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    write = textwrap.dedent(
        """
        from routing_project import metrics
        metrics.escalation_recorded(group="emea", outcome="queued")
        metrics.sla_breach_recorded(group="emea")
        """
    )
    for _ in range(2):
        subprocess.run([sys.executable, "-c", write], env=env, check=True)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "manage.py", "serve_metrics", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert server.stdout is not None
        assert b"/metrics" in server.stdout.readline()  # listening
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        text = response.read().decode()
        conn.close()
    finally:
        server.terminate()
        server.wait(10)
    assert response.status == 200
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    assert value(samples, "leadrouter_escalations_total", group="emea", outcome="queued") == 2
    assert value(samples, "leadrouter_sla_breaches_total", group="emea") == 2


def test_serve_metrics_without_a_sample_directory_says_what_to_set(monkeypatch):
    from django.core.management import CommandError, call_command

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    with pytest.raises(CommandError, match="Set PROMETHEUS_MULTIPROC_DIR"):
        call_command("serve_metrics")


@pytest.mark.parametrize("port", ["65536", "99999", "-1"])
def test_serve_metrics_refuses_a_port_out_of_range_by_name(monkeypatch, tmp_path, port):
    # It ended in an OverflowError traceback from bind().
    from django.core.management import CommandError, call_command

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    with pytest.raises(CommandError, match="--port .*: a TCP port is 0 to 65535"):
        call_command("serve_metrics", "--port", port)


@pytest.mark.django_db
def test_http_methods_a_client_makes_up_share_one_label():
    """A client chooses the method token: each new one must not make a new series."""
    client = APIClient()
    for method in ("BREW", "X-1f3a9c", "PROPFIND"):
        assert client.generic(method, "/healthz").status_code == 405
    samples = scrape()
    methods = {dict(labels).get("method") for name, labels in samples if name.startswith("leadrouter_http_request")}
    assert {"BREW", "X-1F3A9C", "PROPFIND"}.isdisjoint(methods)
    name = "leadrouter_http_request_duration_seconds_count"
    assert value(samples, name, method="other", view="healthz", status="405") >= 3


@pytest.mark.django_db
def test_a_duplicate_of_another_groups_lead_counts_where_it_was_received(make_group, post_lead):
    """Per group, received = routed + queued + duplicate: dedup spans groups, and a lead
    resolved to one group that duplicates an open lead of another counts in its own."""
    first, _ = make_group(2)
    second, _ = make_group(2)
    assert post_lead(group=first.slug, email="twice@customer.example").status_code == 201
    before = scrape()
    assert post_lead(group=second.slug, email="twice@customer.example").json()["duplicate_of"] is not None
    after = scrape()

    def delta(name: str, group) -> float:
        return value(after, name, group=group.slug) - value(before, name, group=group.slug)

    assert delta("leadrouter_leads_received_total", second) == 1
    assert delta("leadrouter_leads_duplicate_total", second) == 1
    assert delta("leadrouter_leads_duplicate_total", first) == 0


@pytest.mark.django_db
def test_a_drained_queue_and_a_group_without_late_assignments_read_zero(make_group, post_lead, api):
    """The scrape-time gauges give every group a sample: 0 once its queue drains, not a
    series that vanishes (which reads as "no data")."""
    group, _ = make_group(0)
    lead = post_lead(group=group.slug).json()
    assert value(scrape(), "leadrouter_queue_depth", group=group.slug) == 1
    assert api.post(f"/api/v1/leads/{lead['id']}/close/", {"outcome": "lost"}, format="json").status_code == 200
    samples = scrape()
    assert samples[("leadrouter_queue_depth", (("group", group.slug),))] == 0
    assert samples[("leadrouter_sla_overdue_assignments", (("group", group.slug),))] == 0


@pytest.mark.django_db
def test_the_queue_of_leads_no_group_holds_reads_zero_once_drained(make_group, post_lead, api):
    """Leads no rule sent anywhere, with no default group, wait in the queue under "none": that
    series reads 0 once a manager has dealt with them, as every group's does."""
    make_group(1)
    lead = post_lead().json()
    assert (lead["status"], lead["group"]) == ("queued", None)
    assert value(scrape(), "leadrouter_queue_depth", group="none") == 1
    assert api.post(f"/api/v1/leads/{lead['id']}/close/", {"outcome": "lost"}, format="json").status_code == 200
    assert scrape()[("leadrouter_queue_depth", (("group", "none"),))] == 0
    # A group named "none" shares the label: one sample (a repeated series fails the scrape).
    make_group(0, slug="none")
    post_lead(group="none")
    text = APIClient().get("/metrics").content.decode()
    assert [line for line in text.splitlines() if line.startswith('leadrouter_queue_depth{group="none"}')] == [
        'leadrouter_queue_depth{group="none"} 1.0'
    ]


@pytest.mark.django_db
def test_an_sla_missed_without_an_escalation_is_a_breach_too(
    make_group, post_lead, api, django_capture_on_commit_callbacks
):
    """Accepted late (the timer came after the acceptance: a worker down) or moved or closed
    past the due time unaccepted: a breach, as the dashboard counts it. In time: none."""
    group, reps = make_group(2, sla_minutes=30)
    leads = [post_lead(group=group.slug).json() for _ in range(4)]
    for lead in leads[:3]:
        Assignment.objects.filter(lead_id=lead["id"]).update(due_at=timezone.now() - timedelta(seconds=1))
    before = scrape()
    with django_capture_on_commit_callbacks(execute=True):
        accepted = api.post(f"/api/v1/leads/{leads[0]['id']}/accept/", {"rep": leads[0]["owner"]["id"]}, format="json")
        other = next(r for r in reps if r.id != leads[1]["owner"]["id"])
        moved = api.post(f"/api/v1/leads/{leads[1]['id']}/reassign/", {"rep": other.id, "reason": "x"}, format="json")
        closed = api.post(f"/api/v1/leads/{leads[2]['id']}/close/", {"outcome": "lost"}, format="json")
        in_time = api.post(f"/api/v1/leads/{leads[3]['id']}/accept/", {"rep": leads[3]["owner"]["id"]}, format="json")
    assert [r.status_code for r in (accepted, moved, closed, in_time)] == [200] * 4
    after = scrape()
    name = "leadrouter_sla_breaches_total"
    assert value(after, name, group=group.slug) - value(before, name, group=group.slug) == 3


@pytest.mark.django_db
def test_a_bulk_import_counts_its_leads_as_intake_does(make_group, post_lead, django_capture_on_commit_callbacks):
    """Imported leads are leads taken in: received, and routed, queued or duplicate, by group."""
    import io

    from leads.bulk import leads_import

    group, _ = make_group(2)
    empty, _ = make_group(0)
    post_lead(group=group.slug, email="known@customer.example")
    rows = [
        f"i-1,one@customer.example,{group.slug}",
        f"i-2,two@customer.example,{group.slug}",
        f"i-3,known@customer.example,{group.slug}",
        f"i-4,three@customer.example,{empty.slug}",
    ]
    before = scrape()
    with django_capture_on_commit_callbacks(execute=True):
        leads_import(lines=io.StringIO("external_id,email,group\n" + "\n".join(rows) + "\n"), actor="import:test")
    after = scrape()

    def delta(name: str, g) -> float:
        return value(after, f"leadrouter_leads_{name}_total", group=g.slug) - value(
            before, f"leadrouter_leads_{name}_total", group=g.slug
        )

    assert [delta(n, group) for n in ("received", "routed", "queued", "duplicate")] == [3, 2, 0, 1]
    assert [delta(n, empty) for n in ("received", "routed", "queued", "duplicate")] == [1, 0, 1, 0]


@pytest.mark.django_db
def test_a_body_refused_before_its_view_counts_against_that_view(api, settings):
    """A 413 or 411 is answered before URL resolution: it still counts as the leads endpoint's,
    and a path no route matches as "unmatched", never by its raw path."""
    settings.MAX_REQUEST_BODY_BYTES = 100
    before = scrape()
    assert api.post("/api/v1/leads/", {"notes": "x" * 200}, format="json").status_code == 413
    r = api.generic("POST", "/api/v1/leads/", b"{}", content_type="application/json", HTTP_TRANSFER_ENCODING="chunked")
    assert r.status_code == 411
    assert api.post("/api/v1/no-such-thing/", {"notes": "x" * 200}, format="json").status_code == 413
    after = scrape()
    name = "leadrouter_http_request_duration_seconds_count"

    def delta(**labels) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta(method="POST", view="lead-list", status="413") == 1
    assert delta(method="POST", view="lead-list", status="411") == 1
    assert delta(method="POST", view="unmatched", status="413") == 1
    assert not [labels for n, labels in after if n == name and "no-such-thing" in str(labels)]
