"""What every app's OpenAPI schema shares (issue 14): the one error body as a component, named by every error
response; the error statuses any API view can answer with; and what every request is held to (an integer fits
a signed 64-bit column, a field a body does not name holds such JSON, `page` is read as DRF reads it). A
drf-spectacular postprocessing hook (SPECTACULAR_SETTINGS) applies them to every operation, so a view declares
only what is its own; scripts/fuzz holds the API to the result. Imports no app.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rest_framework.settings import api_settings

from config.api import INT64_MAX, INT64_MIN  # what the API reads as an integer (strict_loads)

ERROR = "Error"
ERROR_REF = {"$ref": f"#/components/schemas/{ERROR}"}
ERROR_EVENT = "ErrorEvent"
JSON_VALUE = "JsonValue"
JSON_VALUE_REF = {"$ref": f"#/components/schemas/{JSON_VALUE}"}

# config.api.error_body: {"error": {"code": ..., "message": ..., **extra}}.
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Every error answer. `code` is for programs, `message` for a person. Some codes say more: "
                   "`fields` (bad_input: the problems by field), `path` (bad_input: where in the JSON), `node`, "
                   "`head` and `nodes` (a failed turn: its node is recorded), `errors` (playbook_invalid).",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "pattern": "^[a-z][a-z0-9_]*$", "example": "bad_input"},
                "message": {"type": "string"},
            },
            "required": ["code", "message"],
        },
    },
    "required": ["error"],
    "additionalProperties": False,
}

# Any JSON value the API reads (config.api.strict_loads): every integer in it fits a signed 64-bit column.
JSON_VALUE_SCHEMA: dict[str, Any] = {
    "nullable": True,
    "anyOf": [
        {"type": "string"},
        {"type": "boolean"},
        {"type": "integer", "minimum": INT64_MIN, "maximum": INT64_MAX},
        {"type": "number"},
        {"type": "array", "items": JSON_VALUE_REF},
        {"type": "object", "additionalProperties": JSON_VALUE_REF},
    ],
}

SSE = "text/event-stream"
# A text with something besides white space (Python's str.isspace(), which str.strip() and so DRF's
# trim_whitespace remove): a schema pattern for text that may not be blank once trimmed.
NOT_BLANK = "[^\\t-\\r\\x1c- \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]"


def sse_event_schema(events: list[str], data: dict[str, Any] | None = None) -> dict[str, Any]:
    """One server-sent event as a client parses it (`event`, `data`, `id`): the shape OpenAPI 3.2 calls an
    event stream's itemSchema, and what schemathesis checks each event against. `data` is JSON text."""
    data_schema: dict[str, Any] = {"type": "string", "contentMediaType": "application/json"}
    if data is not None:
        data_schema["contentSchema"] = data
    return {
        "type": "object",
        "properties": {
            "event": {"type": "string", "enum": events},
            "data": data_schema,
            "id": {"type": "string"},
        },
        "required": ["event", "data"],
    }


# What any API view can answer, besides its own: (status, description, applies to the operation?).
_SHARED_ERRORS = (
    ("400", "bad_input or malformed_json: the body or a parameter is invalid; `fields` names each problem",
     lambda op, method: "requestBody" in op or set(_parameters(op, "query")) - {"page", "format"}),
    ("401", "not_authenticated or authentication_failed: no valid token (`Authorization: Token <key>`) or session",
     lambda op, method: _secured(op)),
    ("403", "permission_denied: a signed-in browser session's unsafe request without its CSRF token",
     lambda op, method: _secured(op) and method in {"post", "put", "patch", "delete"}),
    ("404", "not_found: no such object, or not yours (also an unknown `page` or `format`)",
     lambda op, method: _parameters(op, "path") or {"page", "format"} & set(_parameters(op, "query"))),
    ("413", "too_large: the request body is too large",
     lambda op, method: "requestBody" in op),
    ("429", "throttled: too many requests from this caller lately (see `Retry-After`); a turn's "
     "too_many_turns: too many of the person's turns run at once",
     lambda op, method: True),
)


def _parameters(operation: dict, where: str) -> list[str]:
    return [p["name"] for p in operation.get("parameters", []) if p.get("in") == where]


def _secured(operation: dict) -> bool:
    security = operation.get("security")
    return bool(security) and {} not in security


def error_responses(result: dict, generator, request, public) -> dict:
    """drf-spectacular postprocessing hook: the Error component; every operation gets the shared error
    statuses that apply to it; every error response (4xx, 5xx) names the Error body in each media type the
    operation answers in (an event stream's error is an `error` event whose data is the Error body); and every
    integer is a signed 64-bit one, as the API reads them."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas[ERROR] = ERROR_SCHEMA
    schemas[ERROR_EVENT] = sse_event_schema(["error"], ERROR_REF)
    _bound_integers(result)
    _blank_or_constrained(result)
    _storable_request_extras(result)
    _page_parameters(result)
    for item in result.get("paths", {}).values():
        for method, operation in item.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            responses = operation["responses"]
            for code, description, applies in _SHARED_ERRORS:
                if code not in responses and applies(operation, method):
                    responses[code] = {"description": description}
            media_types = {"application/json"} | {
                media_type for code, response in responses.items() if code.startswith("2")
                for media_type in response.get("content", {})
            }
            for code, response in responses.items():
                if code[0] in "45" and not response.get("content"):
                    response["content"] = _error_content(media_types)
    return result


def _error_content(media_types: set[str]) -> dict:
    content = {"application/json": {"schema": ERROR_REF}}
    if SSE in media_types:
        content[SSE] = {"schema": {"$ref": f"#/components/schemas/{ERROR_EVENT}"}}
    return content


def _page_parameters(result: dict) -> None:
    """`page` as config.api.paginated()'s paginator (DRF's PageNumberPagination) reads it: a number from 1,
    `last`, or empty for the first page."""
    for item in result.get("paths", {}).values():
        for operation in item.values():
            for parameter in operation.get("parameters", []) if isinstance(operation, dict) else []:
                if parameter.get("in") == "query" and parameter.get("name") == "page":
                    parameter["schema"] = {"anyOf": [
                        {"type": "integer", "format": "int64", "minimum": 1, "maximum": INT64_MAX},
                        {"type": "string", "enum": ["last", ""]},
                    ]}


def _storable_request_extras(result: dict) -> None:
    """Fields a request body does not name, and free-form objects, hold any JSON value the API can read: a view
    ignores a field it does not read, but every body is refused (400) when an integer anywhere in it is outside
    the signed 64-bit range (config.api.strict_loads). Only in components that no response uses."""
    schemas = result["components"]["schemas"]
    schemas[JSON_VALUE] = JSON_VALUE_SCHEMA
    operations = [op for item in result.get("paths", {}).values() for op in item.values() if isinstance(op, dict)]
    requested = _refs([op.get("requestBody", {}) for op in operations], schemas)
    answered = _refs([op.get("responses", {}) for op in operations], schemas)
    for name in requested - answered - {JSON_VALUE}:
        stack = [schemas.get(name, {})]
        while stack:
            schema = stack.pop()
            if not isinstance(schema, dict):
                continue
            if schema.get("type") == "object" and schema.get("additionalProperties", {}) in ({}, True):
                schema["additionalProperties"] = JSON_VALUE_REF
            stack.extend(v for v in (*schema.get("properties", {}).values(), schema.get("items")) if v)


def _refs(node: Any, schemas: dict | None = None) -> set[str]:
    """The component names `node` refers to; with `schemas`, also those they refer to in turn."""
    found: set[str] = set()
    stack = [node]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            ref = value.get("$ref", "")
            if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
                name = ref.rsplit("/", 1)[1]
                if name not in found and schemas is not None:
                    stack.append(schemas.get(name, {}))
                found.add(name)
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return found


BLANK = {"type": "string", "maxLength": 0}


def _schemas_in(node: Any) -> Iterator[dict]:
    """Every object in a schema document, nested ones included."""
    stack = [node]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            yield value
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


def _blank_or_constrained(node: Any) -> None:
    """drf-spectacular gives a blank-allowed text with a pattern `oneOf: [<pattern>, <empty text>]`; the empty
    text meets both branches when the pattern allows it (a label's "" does), and `oneOf` then refuses the very
    value that removes a label. Any one of them is what the API reads: `anyOf`."""
    for schema in _schemas_in(node):
        if BLANK in schema.get("oneOf", ()):
            schema["anyOf"] = schema.pop("oneOf")


def _bound_integers(node: Any) -> None:
    """Give every integer schema without bounds the int64 range (a larger number is a 400, not a value)."""
    for schema in _schemas_in(node):
        if schema.get("type") == "integer" and "enum" not in schema:
            schema.setdefault("format", "int64")
            schema.setdefault("minimum", INT64_MIN)
            schema.setdefault("maximum", INT64_MAX)


class PaginatedList:
    """For an APIView whose GET answers with config.api.paginated(): lets drf-spectacular describe the page
    (`count`, `next`, `previous`, `results`) and its `page` parameter, with the paginator read when the schema
    is built, never at import."""

    @property
    def pagination_class(self):
        return api_settings.DEFAULT_PAGINATION_CLASS
