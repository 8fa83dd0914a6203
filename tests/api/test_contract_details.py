"""Small parts of the contract a client or an operator meets: a replay carries the first
answer's Location, probes answer only reads, and a drain for a deleted group is a no-op."""

import pytest
from django.test import Client

from leads import actions
from leads.models import Lead
from rotation.models import Group
from tests.conftest import lead_body

pytestmark = pytest.mark.django_db


def test_an_idempotent_replay_carries_the_location_of_the_first_answer(api, make_group):
    make_group(2, slug="north")
    body = lead_body(group="north")
    first = api.post("/api/v1/leads/", body, format="json", headers={"Idempotency-Key": "loc-1"})
    again = api.post("/api/v1/leads/", body, format="json", headers={"Idempotency-Key": "loc-1"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert again["Idempotent-Replayed"] == "true"
    assert again["Location"] == first["Location"] == f"/api/v1/leads/{first.json()['id']}/"


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics"])
def test_probes_answer_get_and_head_and_refuse_writes_with_a_405(path):
    client = Client()
    assert client.get(path).status_code == 200
    assert client.head(path).status_code == 200
    for method in ("post", "put", "delete"):
        r = getattr(client, method)(path)
        assert r.status_code == 405 and "GET" in r["Allow"]


def test_a_queue_drain_for_a_deleted_group_routes_nothing_and_raises_nothing(make_group):
    group, _reps = make_group(1)
    group_id = group.pk
    Group.objects.filter(pk=group_id).delete()
    assert actions.queue_drain(group_id=group_id) == 0


@pytest.mark.parametrize("spelled", [lambda pk: pk + 0.5, float, str])
def test_a_member_is_named_by_an_integer_id_only(api, make_group, spelled):
    group, _none = make_group(0, slug="north")
    _other, (rep,) = make_group(1)
    r = api.post("/api/v1/groups/north/members/", {"rep": spelled(rep.pk)}, format="json")
    assert r.status_code == 400 and "rep" in r.json(), r.content
    assert not group.memberships.exists()
    assert api.post("/api/v1/groups/north/members/", {"rep": rep.pk}, format="json").status_code == 201


def test_a_patch_naming_a_field_it_cannot_change_says_read_only_not_unknown(api, make_group):
    make_group(1, slug="north")
    lead_id = api.post("/api/v1/leads/", lead_body(group="north"), format="json").json()["id"]
    r = api.patch(
        f"/api/v1/leads/{lead_id}/",
        {"group": "north", "external_id": "x", "status": "closed", "colour": "red"},
        format="json",
    )
    assert r.status_code == 400
    assert r.json() == {
        "group": ["This field is read-only."],
        "external_id": ["This field is read-only."],
        "status": ["This field is read-only."],
        "colour": ["Unknown field."],
    }


def test_an_email_with_a_non_ascii_domain_is_stored_and_answered_in_ascii(api, make_group):
    make_group(1, slug="emea")
    lead = api.post("/api/v1/leads/", lead_body(email=" Jane@Bücher.example ", group="emea"), format="json").json()
    assert lead["email"] == "Jane@xn--bcher-kva.example"  # the schema's `email` format is ASCII
    again = api.post("/api/v1/leads/", lead_body(email="jane@bücher.example", group="emea"), format="json")
    assert again.status_code == 200 and again.json()["duplicate_of"] == lead["id"]
    rep = api.post("/api/v1/reps/", {"name": "R", "email": "rep@bücher.example"}, format="json").json()
    assert rep["email"] == "rep@xn--bcher-kva.example"
    bad = api.post("/api/v1/leads/", lead_body(email="jane@" + "ü" * 70 + ".example"), format="json")
    assert bad.status_code == 400 and "email" in bad.json()


def test_an_email_whose_ascii_form_outgrows_the_column_is_a_400_never_a_500(api, make_group):
    make_group(1, slug="emea")
    lead_id = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"]
    # Valid and 158 characters as typed; 316 once each label of distinct CJK characters is IDNA.
    labels = ["".join(chr(0x4E00 + 97 * i + 7 * j) for j in range(14)) for i in range(6)]
    domain = ".".join(labels) + ".example"
    email = "a" * 60 + "@" + domain
    assert len(email) <= 254 < len("a" * 60 + "@" + domain.encode("idna").decode("ascii"))
    api.raise_request_exception = False
    for method, path, body in (
        ("post", "/api/v1/leads/", {"email": email, "group": "emea"}),
        ("post", "/api/v1/routing/simulate/", {"email": email}),
        ("patch", f"/api/v1/leads/{lead_id}/", {"email": email}),
        ("post", "/api/v1/reps/", {"name": "R", "email": email}),
    ):
        r = getattr(api, method)(path, body, format="json")
        assert r.status_code == 400 and list(r.json()) == ["email"], (path, r.status_code, r.content)
    assert Lead.objects.count() == 1


@pytest.mark.parametrize("letter", ["\u0130", "\u212a", "\u017f"])  # İ, the Kelvin sign, the long s
def test_an_email_whose_local_part_is_not_ascii_is_a_400_never_a_500(api, make_group, letter):
    """Django's validator refuses "josé@" but lets through the letters its case-insensitive
    match folds to ASCII. In lower case for dedup "İ" is two characters: an address of 254
    once failed to fit its column (a 500); "ſ@" stood apart from "s@" and "S@"."""
    make_group(1, slug="emea")
    lead_id = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"]
    email = letter * 100 + "@" + "a" * 60 + "." + "b" * 60 + "." + "c" * 20 + ".example"
    assert len(email) <= 254
    api.raise_request_exception = False
    for address in (email, f"{letter}@acme.example"):
        for method, path, body in (
            ("post", "/api/v1/leads/", {"email": address, "group": "emea"}),
            ("post", "/api/v1/routing/simulate/", {"email": address}),
            ("patch", f"/api/v1/leads/{lead_id}/", {"email": address}),
            ("post", "/api/v1/reps/", {"name": "R", "email": address}),
        ):
            r = getattr(api, method)(path, body, format="json")
            assert r.status_code == 400 and list(r.json()) == ["email"], (path, r.status_code, r.content)
    assert Lead.objects.count() == 1


def test_the_schema_states_the_limits_the_server_enforces():
    schema = Client().get("/api/schema/?format=json").json()
    components = schema["components"]["schemas"]
    sla = components["GroupRequest"]["properties"]["sla_minutes"]["oneOf"]
    assert sla[0] == {"type": "number", "minimum": 0.01, "maximum": 999999.99}
    assert sla[1]["pattern"] == r"^\d{1,6}(\.\d{1,2})?$"
    assert sla[1]["not"] == {"pattern": r"^0+(\.0+)?$"}
    assert components["RuleRequest"]["properties"]["conditions"]["minItems"] == 1
    assert components["PatchedLeadPatchRequest"]["minProperties"] == 1
    intake = schema["paths"]["/api/v1/leads/"]["post"]
    (key,) = [p for p in intake["parameters"] if p["name"] == "Idempotency-Key"]
    assert key["schema"]["maxLength"] == 255 and key["schema"]["minLength"] == 1
    assert "411" in intake["responses"]  # a chunked body (routing_project/middleware.py)
    (owner,) = [p for p in schema["paths"]["/api/v1/leads/"]["get"]["parameters"] if p["name"] == "owner"]
    assert owner["schema"] == {"type": "integer", "minimum": 1, "maximum": 2**63 - 1}  # ?owner=2**63 is a 400


def test_a_lead_patch_with_an_email_that_cannot_be_ascii_names_the_field(api, make_group):
    make_group(1, slug="emea")
    lead = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()
    r = api.patch(f"/api/v1/leads/{lead['id']}/", {"email": "a@" + "ü" * 60 + ".example"}, format="json")
    assert r.status_code == 400 and list(r.json()) == ["email"], r.json()


def test_the_schema_documents_the_busy_and_conflict_answers_with_retry_after():
    """A write racing another one is a 409 and a row held past the lock timeout (or the
    database away) a 503 with Retry-After (tests/rotation/test_config_concurrency.py): the
    schema says so for every operation, and documents Retry-After wherever 429 or 503 is."""
    paths = Client().get("/api/schema/?format=json").json()["paths"]
    operations = [(f"{m.upper()} {p}", op) for p, item in paths.items() for m, op in item.items()]
    assert operations
    for label, operation in operations:
        responses = operation["responses"]
        assert "503" in responses, label
        for code in ("429", "503"):
            if code in responses:
                assert "Retry-After" in responses[code].get("headers", {}), f"{label} {code}"
    members = paths["/api/v1/groups/{group_slug}/members/"]["post"]["responses"]
    assert {"409", "503"} <= set(members)
    assert "409" in paths["/api/v1/groups/{group_slug}/members/{rep_id}/"]["delete"]["responses"]
    assert "409" not in paths["/api/v1/groups/{slug}/"]["get"]["responses"]
    assert "409" not in paths["/api/v1/routing/simulate/"]["post"]["responses"]  # writes nothing


@pytest.mark.parametrize(("method", "path"), [("post", "/api/v1/leads/"), ("get", "/api/v1/groups/")])
def test_an_accept_header_without_json_is_a_documented_406(api, method, path):
    if method == "post":
        r = api.post(path, {"email": "a@b.example"}, format="json", HTTP_ACCEPT="text/html")
    else:
        r = api.get(path, HTTP_ACCEPT="text/html")
    assert r.status_code == 406 and "detail" in r.json()
    operation = Client().get("/api/schema/?format=json").json()["paths"][path][method]
    assert "406" in operation["responses"]


@pytest.mark.parametrize("accept", ["", "  ", "application/json", "*/*", "text/html, application/json;q=0.5"])
def test_an_empty_accept_header_is_read_as_none(api, make_group, accept):
    """`Accept:` with no value (what some HTTP libraries send when told to send none) lost the
    lead to a 406; it means no preference, as no header does."""
    make_group(1, slug="emea")
    r = api.post("/api/v1/leads/", lead_body(group="emea"), format="json", HTTP_ACCEPT=accept)
    assert r.status_code == 201 and r["Content-Type"] == "application/json", r.content
    assert api.get("/api/v1/groups/", HTTP_ACCEPT=accept).status_code == 200


def test_the_signed_intake_example_is_a_request_example_only():
    """The form's fields are what a form posts, not what intake answers (id, status, ...)."""
    operation = Client().get("/api/schema/?format=json").json()["paths"]["/api/v1/hooks/{source}/"]["post"]
    assert "examples" in operation["requestBody"]["content"]["application/json"]
    for code, response in operation["responses"].items():
        for media in response.get("content", {}).values():
            assert "examples" not in media, code


def test_the_schema_documents_the_headers_of_intakes_answers(api, make_group):
    make_group(1, slug="emea")
    body = lead_body(group="emea")
    first = api.post("/api/v1/leads/", body, format="json", headers={"Idempotency-Key": "headers-1"})
    replay = api.post("/api/v1/leads/", body, format="json", headers={"Idempotency-Key": "headers-1"})
    assert (first.status_code, replay.status_code, replay["Idempotent-Replayed"]) == (201, 200, "true")
    assert first["Location"] == f"/api/v1/leads/{first.json()['id']}/"
    responses = Client().get("/api/schema/?format=json").json()["paths"]["/api/v1/leads/"]["post"]["responses"]
    assert responses["200"]["headers"]["Idempotent-Replayed"]["schema"]["enum"] == ["true"]
    assert responses["201"]["headers"]["Location"]["required"] is True


@pytest.mark.parametrize(
    ("method", "action", "body"),
    [
        ("post", "accept/", {"rep": "x"}),
        ("post", "reassign/", {}),
        ("post", "reroute/", {"colour": 1}),
        ("post", "close/", {"outcome": "maybe"}),
        ("patch", "", {"email": "broken"}),
    ],
)
def test_an_action_on_an_unknown_lead_is_a_404_whatever_its_body(api, method, action, body):
    response = getattr(api, method)(f"/api/v1/leads/999999/{action}", body, format="json")
    assert response.status_code == 404, response.content


@pytest.mark.parametrize(
    ("method", "path"), [("post", "/api/v1/leads/"), ("get", "/api/v1/groups/"), ("get", "/api/v1/queue/")]
)
def test_a_format_parameter_naming_no_offered_format_is_a_406_not_a_404(api, method, path):
    if method == "post":
        r = api.post(f"{path}?format=xml", {"email": "a@b.example"}, format="json")
    else:
        r = api.get(f"{path}?format=xml")
    assert r.status_code == 406 and r["Content-Type"] == "application/json"
    assert "Format 'xml' is not offered" in r.json()["detail"] and "json" in r.json()["detail"]
    assert not Lead.objects.exists()
    assert api.get("/api/v1/groups/?format=json").status_code == 200
    assert Client().get("/api/schema/?format=json")["Content-Type"].startswith("application/vnd.oai.openapi+json")


def test_options_on_the_leads_list_describes_what_a_post_takes(api):
    """It described the lead a POST answers: every field read-only, the email not required."""
    r = api.options("/api/v1/leads/")
    assert r.status_code == 200, r.content
    post = r.json()["actions"]["POST"]
    assert post["email"]["required"] is True and post["email"]["read_only"] is False
    assert post["attributes"]["read_only"] is False and "status" not in post and "id" not in post
