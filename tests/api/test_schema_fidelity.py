"""The schema describes the answers as they are, strictly: every field an answer always
carries is `required` (a generated client then types it as present), no answer carries a
field the schema does not name, and the JSON values the server builds (working hours,
attributes, explanations, strategies) have their shapes in the schema. schemathesis' response
check is lenient on all of these (extra fields pass, optional fields need not be there)."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from django.test import Client

from tests.conftest import lead_body

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return Client().get("/api/schema/?format=json").json()


def strict(node: Any, components: dict[str, Any]) -> Any:
    """An OpenAPI 3.0 response schema as a JSON Schema that refuses what the document does not
    promise: each object's fields are all required and no other field is allowed."""
    if isinstance(node, list):
        return [strict(item, components) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return strict(components[node["$ref"].rsplit("/", 1)[-1]], components)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {name: strict(sub, components) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not", "allOf", "oneOf", "anyOf"):
            out[key] = strict(value, components)
        elif key not in ("nullable", "readOnly", "writeOnly", "example", "description"):
            out[key] = value
    if "properties" in out:
        out.setdefault("additionalProperties", False)
    if node.get("nullable"):
        out = {"anyOf": [out, {"type": "null"}]}
    return out


def conforms(schema: dict[str, Any], method: str, path: str, response: Any) -> None:
    """The response is exactly what the schema documents for it (status, every field)."""
    operation = schema["paths"][path][method]
    documented = operation["responses"][str(response.status_code)]["content"]["application/json"]["schema"]
    jsonschema.validate(response.json(), strict(documented, schema["components"]["schemas"]))
    # Strict in reverse too: each documented field of each object is required.
    check_all_required(documented, schema["components"]["schemas"], f"{method.upper()} {path}")


def check_all_required(node: Any, components: dict[str, Any], where: str, seen: frozenset = frozenset()) -> None:
    """Each component an answer is made of requires all its fields (an inline object, such as
    a rule's condition, may have optional ones: `exists` takes no value)."""
    if isinstance(node, list):
        for item in node:
            check_all_required(item, components, where, seen)
        return
    if not isinstance(node, dict):
        return
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        if name not in seen:
            component = components[name]
            missing = set(component.get("properties", {})) - set(component.get("required", []))
            assert not missing, f"{where} {name}: always answered, not required: {sorted(missing)}"
            check_all_required(component, components, f"{where} {name}", seen | {name})
        return
    for value in node.values():
        check_all_required(value, components, where, seen)


def test_every_answer_is_exactly_what_the_schema_documents(api, make_group, schema):
    group, reps = make_group(2, slug="emea", is_default=True, sla_minutes="1.5", strategy="weighted")
    made = api.post("/api/v1/groups/", {"slug": "apac", "name": "APAC", "sla_minutes": 2.25}, format="json")
    conforms(schema, "post", "/api/v1/groups/", made)
    assert made.json()["sla_minutes"] == 2.25  # answered as a number, as documented
    conforms(schema, "get", "/api/v1/groups/", api.get("/api/v1/groups/"))
    conforms(schema, "get", "/api/v1/groups/{slug}/", api.get("/api/v1/groups/emea/"))
    conforms(schema, "patch", "/api/v1/groups/{slug}/", api.patch("/api/v1/groups/apac/", {"name": "A"}, format="json"))

    hours = {"mon": [["09:00", "12:00"], ["13:00", "17:30"]], "sat": []}
    rep = api.post("/api/v1/reps/", {"name": "Ann", "email": "ann@example.com", "working_hours": hours}, format="json")
    conforms(schema, "post", "/api/v1/reps/", rep)
    conforms(schema, "get", "/api/v1/reps/", api.get("/api/v1/reps/"))
    conforms(schema, "get", "/api/v1/reps/{id}/", api.get(f"/api/v1/reps/{reps[0].id}/"))
    rep_id = rep.json()["id"]
    patched = api.patch(f"/api/v1/reps/{rep_id}/", {"working_hours": None}, format="json")
    conforms(schema, "patch", "/api/v1/reps/{id}/", patched)

    member = api.post("/api/v1/groups/emea/members/", {"rep": rep_id, "max_open": 3}, format="json")
    conforms(schema, "post", "/api/v1/groups/{group_slug}/members/", member)
    conforms(schema, "get", "/api/v1/groups/{group_slug}/members/", api.get("/api/v1/groups/emea/members/"))
    conforms(
        schema,
        "patch",
        "/api/v1/groups/{group_slug}/members/{rep_id}/",
        api.patch(f"/api/v1/groups/emea/members/{rep_id}/", {"weight": 2}, format="json"),
    )
    absence = api.post(
        f"/api/v1/reps/{rep_id}/absences/",
        {"starts_at": "2030-01-01T00:00:00Z", "ends_at": "2030-01-02T00:00:00Z"},
        format="json",
    )
    conforms(schema, "post", "/api/v1/reps/{rep_id}/absences/", absence)
    conforms(schema, "get", "/api/v1/reps/{rep_id}/absences/", api.get(f"/api/v1/reps/{rep_id}/absences/"))

    conditions = [{"field": "attributes.plan", "op": "equals", "value": "pro"}]
    rule = api.post("/api/v1/rules/", {"name": "pro", "conditions": conditions, "group": "emea"}, format="json")
    conforms(schema, "post", "/api/v1/rules/", rule)
    conforms(schema, "get", "/api/v1/rules/", api.get("/api/v1/rules/"))
    conforms(schema, "get", "/api/v1/rules/{id}/", api.get(f"/api/v1/rules/{rule.json()['id']}/"))

    body = lead_body(attributes={"plan": "pro", "seats": 3, "trial": True}, score=40)
    lead = api.post("/api/v1/leads/", body, format="json")
    conforms(schema, "post", "/api/v1/leads/", lead)
    lead_id = lead.json()["id"]
    conforms(schema, "post", "/api/v1/leads/", api.post("/api/v1/leads/", body, format="json"))  # duplicate
    conforms(schema, "get", "/api/v1/leads/", api.get("/api/v1/leads/"))
    conforms(schema, "get", "/api/v1/leads/{id}/", api.get(f"/api/v1/leads/{lead_id}/"))
    conforms(schema, "get", "/api/v1/leads/{id}/events/", api.get(f"/api/v1/leads/{lead_id}/events/"))
    queued = api.post("/api/v1/leads/", lead_body(group="apac"), format="json")  # apac has no members
    assert queued.json()["status"] == "queued"
    conforms(schema, "get", "/api/v1/queue/", api.get("/api/v1/queue/"))

    conforms(schema, "get", "/api/v1/groups/{slug}/rotation/", api.get("/api/v1/groups/emea/rotation/"))
    conforms(schema, "get", "/api/v1/groups/{slug}/rotation/", api.get("/api/v1/groups/apac/rotation/"))
    simulated = api.post("/api/v1/routing/simulate/", lead_body(attributes={"plan": "pro"}), format="json")
    conforms(schema, "post", "/api/v1/routing/simulate/", simulated)
    window = {"since": "2020-01-01T00:00:00Z", "until": "2100-01-01T00:00:00Z"}
    conforms(schema, "post", "/api/v1/routing/replay/", api.post("/api/v1/routing/replay/", window, format="json"))


def test_a_decimal_is_documented_as_the_number_it_is_answered_as(schema):
    components = schema["components"]["schemas"]
    sla = strict(components["Group"]["properties"]["sla_minutes"], components)
    jsonschema.validate(1.5, sla)
    jsonschema.validate(None, sla)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate("1.5", sla)  # the request takes its text too, the answer never has it
    request = strict(components["GroupRequest"]["properties"]["sla_minutes"], components)
    jsonschema.validate("1.5", request)


def test_the_values_the_server_builds_have_their_shapes_in_the_schema(schema):
    components = schema["components"]["schemas"]
    strategies = components["StrategyEnum"]["enum"]
    assert strategies == ["round_robin", "weighted", "least_loaded"]
    for name, field in [
        ("RotationView", "strategy"),
        ("Simulate", "strategy"),
        ("ReplayGroup", "strategy"),
        ("ReplayGroup", "proposed_strategy"),
    ]:
        documented = strict(components[name]["properties"][field], components)
        for strategy in strategies:
            jsonschema.validate(strategy, documented)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate("fastest", documented)
    for name in ("Rep", "RepRequest", "PatchedRepRequest"):
        hours = strict(components[name]["properties"]["working_hours"], components)
        jsonschema.validate({"mon": [["09:00", "17:30"]], "sun": []}, hours)
        jsonschema.validate(None, hours)
        for wrong in (
            [],
            "always",
            {},
            {"mon": "09:00-17:30"},
            {"mon": [["09:00"]]},
            {"mon": [["9h", "10h"]]},
            {"x": []},
        ):
            with pytest.raises(jsonschema.ValidationError):
                jsonschema.validate(wrong, hours)
    assert components["HookAccepted"]["properties"]["status"] == {"$ref": "#/components/schemas/StatusEnum"}
    for name, field in [("Lead", "attributes"), ("AuditEvent", "explanation")]:
        assert components[name]["properties"][field]["type"] == "object", (name, field)


def test_each_lead_read_says_what_it_answers(schema):
    """The docs show an operation's description: the list and the single lead had the
    docstring of the class that adds the lead actions ("Adds the action endpoints...")."""
    listed = schema["paths"]["/api/v1/leads/"]["get"]["description"]
    assert "newest first" in listed and "created_after" in listed
    assert schema["paths"]["/api/v1/leads/{id}/"]["get"]["description"].startswith("One lead")
    descriptions = [op.get("description", "") for item in schema["paths"].values() for op in item.values()]
    assert not [d for d in descriptions if "viewset" in d.lower()]


@pytest.mark.parametrize("component", ["Rule", "RuleRequest", "PatchedRuleRequest"])
def test_a_condition_the_schema_allows_is_one_the_server_saves(api, make_group, schema, component):
    """A rule's condition is documented by its operator: the value each takes, the fields a
    condition names, and no other key (the server refuses anything else with a 400)."""
    make_group(1, slug="emea")
    components = schema["components"]["schemas"]
    conditions = strict(components[component]["properties"]["conditions"], components)
    saved = [
        {"field": "country", "op": "in", "value": ["FR", "BE"]},
        {"field": "score", "op": "gte", "value": 50},
        {"field": "attributes.plan", "op": "equals", "value": "pro"},
        {"field": "email_domain", "op": "contains", "value": "acme"},
        {"field": "attributes.trial", "op": "exists", "value": False},
        {"field": "region", "op": "not_in", "value": ["north"]},
        {"field": "company_size", "op": "lte", "value": 10.5},
    ]
    jsonschema.validate(saved, conditions)
    jsonschema.validate([{"field": "product", "op": "exists"}], conditions)
    refused = [
        {"field": "country", "op": "in", "value": "FR"},
        {"field": "score", "op": "gte", "value": "50"},
        {"field": "email", "op": "equals", "value": "a@b.example"},
        {"field": "attributes.", "op": "exists"},
        {"field": "country", "op": "equals", "value": "FR", "note": "x"},
        {"field": "region", "op": "contains", "value": ""},
        {"field": "region", "op": "equals"},
        {"field": "region", "op": "exists", "value": "yes"},
        {"field": "region", "op": "in", "value": ["north", ""]},
    ]
    for condition in refused:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate([condition], conditions)
        r = api.post("/api/v1/rules/", {"name": "r", "conditions": [condition], "group": "emea"}, format="json")
        assert r.status_code == 400, condition
    r = api.post("/api/v1/rules/", {"name": "all", "conditions": saved, "group": "emea"}, format="json")
    assert r.status_code == 201, r.json()
    jsonschema.validate(r.json()["conditions"], conditions)


def test_every_operation_documents_what_the_web_server_answers_before_the_application(schema):
    """A 7.6 KB query got gunicorn's 414 (in JSON), an 8 KB header its 431, a malformed
    request line its 400: answers no operation documented, so a client generated from the
    schema, and schemathesis, called them undocumented."""
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            assert {"400", "414", "431"} <= set(operation["responses"]), (method, path)
    # The 409 of a retry while its Idempotency-Key's first request is answered says when to come back.
    conflict = schema["paths"]["/api/v1/leads/"]["post"]["responses"]["409"]
    assert "Retry-After" in conflict["headers"]
