"""Structured logs: JSON lines with request ids; one access line per API request; no contact data."""

import json
import logging
import os
import subprocess
import sys

import pytest

from routing_project.logging import JsonFormatter, RequestIdFilter, request_id_var
from security.redaction import RedactingFilter


def test_json_formatter_writes_one_object_with_request_id_and_extra_fields():
    token = request_id_var.set("req-123")
    try:
        record = logging.LogRecord("x.y", logging.INFO, __file__, 1, "routed %s", ("lead 7",), None)
        record.status = 201
        RequestIdFilter().filter(record)
        line = JsonFormatter().format(record)
    finally:
        request_id_var.reset(token)
    assert "\n" not in line
    out = json.loads(line)
    assert out["message"] == "routed lead 7"
    assert out["level"] == "INFO" and out["logger"] == "x.y"
    assert out["request_id"] == "req-123"
    assert out["status"] == 201
    assert out["ts"].endswith("+00:00")


def test_json_formatter_includes_the_exception():
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    out = json.loads(JsonFormatter().format(record))
    assert "ValueError: boom" in out["exc"]


@pytest.mark.django_db
def test_one_access_line_per_api_request_without_contact_data(make_group, post_lead, caplog):
    group, _ = make_group(2)
    caplog.set_level(logging.INFO, logger="routing_project.access")
    caplog.handler.addFilter(RequestIdFilter())  # as the console handler does, at emit time
    response = post_lead(
        group=group.slug,
        email="secret.person@customer.example",
        phone="+33 6 12 34 56 78",
        first_name="Secretname",
        headers={"X-Request-ID": "trace-42"},
    )
    assert response.status_code == 201
    access = [r for r in caplog.records if r.name == "routing_project.access"]
    assert len(access) == 1
    record = access[0]
    assert record.method == "POST"
    assert record.path == "/api/v1/leads/"
    assert record.status == 201
    assert record.duration_ms > 0
    assert record.client.startswith("client-")
    assert json.loads(JsonFormatter().format(record))["request_id"] == "trace-42"
    for rec in caplog.records:
        text = JsonFormatter().format(rec)
        assert "secret.person" not in text and "12 34 56" not in text and "Secretname" not in text


@pytest.mark.django_db
def test_a_request_id_of_a_dash_is_replaced_so_the_trail_keeps_the_id_the_response_carried(make_group, post_lead):
    """A "-" is what a line outside any request carries and the audit stores as no id: taken
    from the caller, the response echoed "-" while the lead's events held "", and neither
    found the other."""
    from audit.models import AuditEvent

    group, _ = make_group(1)
    response = post_lead(group=group.slug, headers={"X-Request-ID": "-"})
    assert response.status_code == 201
    echoed = response["X-Request-ID"]
    assert echoed not in ("-", "")
    ids = set(AuditEvent.objects.filter(lead_id=response.json()["id"]).values_list("request_id", flat=True))
    assert ids == {echoed}


@pytest.mark.django_db
def test_a_line_break_in_the_path_cannot_forge_an_access_line(client, caplog):
    """The plain format writes the access line as text: a path holding a CR or LF (%0A) would
    start a line of the caller's choosing. It is escaped as Django escapes its own lines."""
    caplog.set_level(logging.INFO, logger="routing_project.access")
    forged = "2026-01-01 00:00:00,000 ERROR forged.logger [-] all good"
    assert client.get(f"/x%0D%0A{forged.replace(' ', '%20')}/").status_code == 404
    (record,) = [r for r in caplog.records if r.name == "routing_project.access"]
    plain = logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s").format(record)
    assert "\n" not in plain and "\r" not in plain, plain
    assert "GET /x\\r\\n2026-01-01 00:00:00,000 ERROR forged.logger [-] all good/ 404 " in plain, plain
    assert "\n" not in record.path and "\r" not in record.path


@pytest.mark.django_db
def test_metrics_and_health_are_not_access_logged(client, caplog):
    caplog.set_level(logging.INFO, logger="routing_project.access")
    assert client.get("/healthz").status_code == 200
    assert client.get("/metrics").status_code == 200
    assert not [r for r in caplog.records if r.name == "routing_project.access"]


@pytest.mark.django_db
def test_djangos_own_4xx_records_carry_the_request_id_and_no_query_string(api, caplog):
    caplog.set_level(logging.INFO, logger="django.request")
    caplog.handler.addFilter(RequestIdFilter())  # as the console handler does, at emit time
    caplog.handler.addFilter(RedactingFilter())
    response = api.get(
        "/api/v1/leads/?status=jane.doe@acme.example&phone=%2B33612345678", headers={"X-Request-ID": "trace-43"}
    )
    assert response.status_code == 400
    (record,) = [r for r in caplog.records if r.name == "django.request"]
    out = json.loads(JsonFormatter().format(record))
    assert out["request_id"] == "trace-43"
    assert out["request"] == "GET /api/v1/leads/"
    assert "jane.doe" not in json.dumps(out) and "612345678" not in json.dumps(out)


def test_structured_fields_of_any_shape_are_redacted():
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "sent", (), None)
    record.data = {"to": ["ann@corp.example"], "n": 3, "nested": {"phone": "+33 6 12 34 56 78"}}
    record.target = ("bob@corp.example", 5)
    RedactingFilter().filter(record)
    out = json.loads(JsonFormatter().format(record))
    assert out["data"] == {"to": ["[redacted]"], "n": 3, "nested": {"phone": "[redacted]"}}
    assert out["target"] == ["[redacted]", 5]


def test_python_warnings_are_log_records_json_and_redacted():
    # A library's warning (Celery's, staticfiles') went to stderr as text, outside the
    # handler: not JSON under LOG_FORMAT=json, and not redacted.
    script = "import django, warnings; django.setup(); warnings.warn('a warning naming jane@customer.example')"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "routing_project.settings.local", "LOG_FORMAT": "json"}
    err = subprocess.run([sys.executable, "-c", script], env=env, check=True, capture_output=True, text=True).stderr
    assert "customer.example" not in err, err
    lines = [json.loads(line) for line in err.splitlines() if line.strip()]
    assert [line["logger"] for line in lines] == ["py.warnings"], err


def _logging_task():
    from routing_project.celery import app

    @app.task(name="tests.log_a_line", shared=False)
    def log_a_line() -> str:
        logging.getLogger("leads.tasks").warning("task line")
        return request_id_var.get()

    return log_a_line


def test_a_tasks_lines_carry_its_task_id_as_request_id(caplog):
    caplog.handler.addFilter(RequestIdFilter())
    result = _logging_task().apply()
    assert result.get() == result.id
    (line,) = [r for r in caplog.records if r.getMessage() == "task line"]
    assert line.request_id == result.id
    assert request_id_var.get() == "-"  # put back after the task


def test_a_task_run_inside_a_request_keeps_the_requests_id():
    token = request_id_var.set("req-9")
    try:
        assert _logging_task().apply().get() == "req-9"
        assert request_id_var.get() == "req-9"
    finally:
        request_id_var.reset(token)


@pytest.mark.django_db
def test_a_page_refused_to_a_role_is_one_line_not_a_traceback(client, django_user_model, caplog):
    """A staff user opening a page their role may not (a 403) wrote the PermissionDenied's
    whole traceback: 131 of them in one walk through the admin, refusals working as meant."""
    client.force_login(django_user_model.objects.create_user("clerk", "clerk@example.com", "pw", is_staff=True))
    with caplog.at_level(logging.WARNING, logger="django.request"):
        assert client.get("/admin/leads/apiclient/").status_code == 403
    (refused,) = [r for r in caplog.records if r.name == "django.request"]
    assert "Forbidden" in refused.getMessage() and refused.exc_info is None and refused.exc_text is None


@pytest.mark.django_db
def test_a_login_whose_next_is_another_site_lands_on_the_admin(client, django_user_model):
    django_user_model.objects.create_superuser("ops", "ops@example.com", "pw-long-enough-1")
    r = client.post("/admin/login/?next=//evil.example/", {"username": "ops", "password": "pw-long-enough-1"})
    assert (r.status_code, r["Location"]) == (302, "/admin/")
