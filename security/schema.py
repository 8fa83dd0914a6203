"""A drf-spectacular postprocessing hook: the schema documents the error responses every
operation can give, so clients (and schemathesis) know them all. It covers endpoints added
later without each view repeating them."""

from __future__ import annotations

from typing import Any

ERROR_SCHEMA = {
    "type": "object",
    "properties": {"detail": {"type": "string"}},
    "required": ["detail"],
}
VALIDATION_SCHEMA = {
    "type": "object",
    "additionalProperties": True,
    "description": "`{field: [messages]}` naming every bad field (or `detail`).",
}

_COMMON = {
    "401": "No token, or an invalid or revoked one.",
    "403": "The token lacks the scope this endpoint needs.",
    "429": "Over the client's rate limit; retry after `Retry-After` seconds.",
}
_WRITE = {
    "409": "Conflicts with a change made at the same time (or with the object's state); read it and retry.",
}
_EVERY = {
    "406": "The Accept header excludes JSON, the only type this API answers in.",
    "503": "The database is unavailable, or a row this request needs is busy; retry after `Retry-After` seconds.",
    # Answered by the web server (gunicorn) before the application, in JSON too
    # (routing_project/web_worker.py): any operation can get them.
    "414": "The request line (path and query string) is over 4,094 bytes.",
    "431": "A request header, or all of them, too large.",
}
# The web server's answer to a request it cannot read (a malformed request line or header).
_MALFORMED = "A malformed request (request line, header or query parameter)."
# Posted to, but write nothing (what-if answers): nothing of theirs can conflict with a write.
_WRITES_NOTHING = {("post", "/api/v1/routing/simulate/"), ("post", "/api/v1/routing/replay/")}
_RETRY_AFTER = {"schema": {"type": "integer"}, "description": "Seconds to wait."}
_RETRY_AFTER_IN_FLIGHT = {
    "schema": {"type": "integer"},
    "description": "Seconds to wait: sent when a request with the same Idempotency-Key is still being answered.",
}
_BODY = {
    "400": "Validation error naming every bad field.",
    "413": "Request body over 64 KiB.",
    "415": "Unsupported content type: send JSON.",
    "411": "A chunked request body: send it with a Content-Length.",
}


def _response(description: str, schema_ref: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": {"$ref": schema_ref}}}}


def document_common_errors(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas.setdefault("ErrorDetail", ERROR_SCHEMA)
    schemas.setdefault("ValidationErrorBody", VALIDATION_SCHEMA)
    error_ref = "#/components/schemas/ErrorDetail"
    for path, item in result.get("paths", {}).items():
        for method, operation in item.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            responses = operation["responses"]
            wanted: dict[str, str] = dict(_EVERY)
            if operation.get("security"):
                wanted.update(_COMMON)
                if method in ("post", "put", "patch", "delete") and (method, path) not in _WRITES_NOTHING:
                    wanted.update(_WRITE)
            if "requestBody" in operation or method in ("post", "put", "patch"):
                wanted.update(_BODY)
            if "{" in path:
                wanted["404"] = "No such object."
            query = {p.get("name") for p in operation.get("parameters", []) if p.get("in") == "query"}
            if query:
                wanted.setdefault("400", "Invalid query parameter.")
            if "page" in query:
                wanted.setdefault("404", "No such page.")
            wanted.setdefault("400", _MALFORMED)
            for code, description in wanted.items():
                if code not in responses:
                    ref = "#/components/schemas/ValidationErrorBody" if code == "400" else error_ref
                    responses[code] = _response(description, ref)
            # Both are sent with Retry-After, also where the view documents the status itself.
            for code in ("429", "503"):
                if code in responses:
                    responses[code].setdefault("headers", {}).setdefault("Retry-After", _RETRY_AFTER)
            if "409" in responses and method == "post":
                # A retry while the first request with its Idempotency-Key is still answered.
                responses["409"].setdefault("headers", {}).setdefault("Retry-After", _RETRY_AFTER_IN_FLIGHT)
    return result


def forbid_unknown_request_fields(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """Every JSON request body refuses a field it does not name (a 400 naming it, SPEC 6):
    the request components say so, so that a client generating bodies from the schema never
    sends one. Request components are split from the responses' (COMPONENT_SPLIT_REQUEST)."""
    for name, schema in result.get("components", {}).get("schemas", {}).items():
        if name.endswith("Request") and schema.get("type") == "object" and "properties" in schema:
            schema.setdefault("additionalProperties", False)
    # A lead's PATCH names at least one contact field (an empty one is a 400).
    lead_patch = result.get("components", {}).get("schemas", {}).get("PatchedLeadPatchRequest")
    if lead_patch is not None:
        lead_patch["minProperties"] = 1
    return result


def require_answered_fields(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """An answer carries every field its serializer names, always (null when it has no
    value): the response components say each is required, so that a client generated from
    the schema types it as present. drf-spectacular leaves out the writable fields that have
    a default (a group's strategy, a member's weight) and a page's next and previous links.
    Request components are split from the responses' (COMPONENT_SPLIT_REQUEST)."""
    for name, schema in result.get("components", {}).get("schemas", {}).items():
        if name.endswith("Request") or schema.get("type") != "object" or "properties" not in schema:
            continue
        schema["required"] = sorted(set(schema.get("required", [])) | set(schema["properties"]))
    return result
