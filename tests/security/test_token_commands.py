"""Tokens made from the command line (`create_api_token`, and `seed_demo`, which `make run`
runs and which replaces the demo token each time) are audited as the admin's are: creating
or deleting a token writes a `client.changed` event naming who did it, never the token."""

import copy
import json
import re
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from audit.models import AuditEvent
from leads.models import ApiClient


def _client_events() -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(type="client.changed").order_by("id"))


@pytest.mark.django_db
def test_create_api_token_writes_a_client_changed_event():
    out = StringIO()
    call_command("create_api_token", "my-form", "--scopes", "intake,read", stdout=out)
    token = out.getvalue().strip()

    (event,) = _client_events()
    assert event.actor == "system:create_api_token"
    assert event.explanation == {"api_client": "my-form", "change": "created", "scopes": ["intake", "read"]}
    assert token not in str(event.explanation)


@pytest.mark.django_db
def test_create_api_token_refused_writes_nothing():
    call_command("create_api_token", "my-form", "--scopes", "intake", stdout=StringIO())
    with pytest.raises(CommandError, match="Unknown scopes"):
        call_command("create_api_token", "other", "--scopes", "intake,admin", stdout=StringIO())
    assert not ApiClient.objects.filter(name="other").exists()
    assert [e.explanation["api_client"] for e in _client_events()] == ["my-form"]


@pytest.mark.django_db
def test_seed_demo_replacing_the_demo_token_is_audited():
    call_command("seed_demo", "--admin-password", "first-pw-123", stdout=StringIO())
    first = ApiClient.objects.get(name="demo")
    call_command("seed_demo", "--admin-password", "second-pw-123", stdout=StringIO())
    second = ApiClient.objects.get(name="demo")
    assert second.pk != first.pk

    changes = [(e.actor, e.explanation["api_client"], e.explanation["change"]) for e in _client_events()]
    assert changes == [
        ("system:seed_demo", "demo", "created"),
        ("system:seed_demo", "demo", "deleted"),
        ("system:seed_demo", "demo", "created"),
    ]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scopes", ""], "--scopes must name at least one"),
        (["--scopes", " , "], "--scopes must name at least one"),
        (["--rate-limit", "0"], "--rate-limit is a number of requests a minute"),
        (["--rate-limit", str(2**31)], "--rate-limit is a number of requests a minute"),
    ],
)
def test_create_api_token_refuses_bad_scopes_and_limits_by_name(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("create_api_token", "my-form", *args, stdout=StringIO())
    assert not ApiClient.objects.exists()
    assert not _client_events()


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["", "   ", "x" * 101])
def test_create_api_token_refuses_a_blank_or_too_long_name(name):
    with pytest.raises(CommandError, match="The name must be 1 to 100 characters"):
        call_command("create_api_token", name, "--scopes", "intake", stdout=StringIO())
    assert not ApiClient.objects.exists()


@pytest.mark.django_db
def test_create_api_token_trims_the_name():
    call_command("create_api_token", " my-form ", "--scopes", "intake", stdout=StringIO())
    assert ApiClient.objects.get().name == "my-form"
    with pytest.raises(CommandError, match="exists already"):
        call_command("create_api_token", "my-form", "--scopes", "intake", stdout=StringIO())


@pytest.mark.django_db
def test_seed_demo_prints_a_curl_with_an_address_of_its_own_each_run():
    # The data are kept from one `make run` to the next: the same address in the printed curl
    # answered the second run's 200 as a duplicate, not the new lead it announced.
    printed = []
    for password in ("first-pw-123", "second-pw-123"):
        out = StringIO()
        call_command("seed_demo", "--admin-password", password, stdout=out)
        (email,) = re.findall(r'"email": "([^"]+)"', out.getvalue())
        printed.append(email)
    assert printed[0] != printed[1]
    assert all(e.endswith("@acme.example") for e in printed)


@pytest.mark.django_db
def test_seed_demo_prints_one_json_object_under_log_format_json(settings, client):
    # `make run` under LOG_FORMAT=json: its start block was text lines among the JSON ones.
    logging = copy.deepcopy(settings.LOGGING)
    logging["handlers"]["console"]["formatter"] = "json"
    settings.LOGGING = logging
    out = StringIO()
    call_command("seed_demo", "--admin-password", "json-pw-123", "--base-url", "http://h:8123", stdout=out)
    (line,) = out.getvalue().splitlines()
    start = json.loads(line)
    assert (start["level"], start["logger"], start["message"]) == ("INFO", "seed_demo", "Demo data loaded.")
    assert start["request_id"] == "-"  # as every JSON line has one
    assert (start["admin_url"], start["admin_login"], start["admin_password"]) == (
        "http://h:8123/admin/",
        "admin",
        "json-pw-123",
    )
    assert f"Bearer {start['token']}" in start["curl"] and "@acme.example" in start["curl"]
    # The token printed is the demo client's, and works.
    answer = client.get("/api/v1/groups/", HTTP_AUTHORIZATION=f"Bearer {start['token']}")
    assert answer.status_code == 200

    logging = copy.deepcopy(logging)
    logging["handlers"]["console"]["formatter"] = "plain"
    settings.LOGGING = logging
    out = StringIO()
    call_command("seed_demo", "--admin-password", "json-pw-123", stdout=out)
    assert "Post a lead:\n  curl -sS -X POST" in out.getvalue()
