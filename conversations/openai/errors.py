"""The providers' error formats for the /v1/ surface (OpenAI's, and Anthropic's on /v1/messages), so the official
SDKs raise their usual exceptions.

The API's own handler (config.api) decides the status and the words; this one only reshapes the body into
`{"error": {"message", "type", "param", "code"}}`. A failed create also says `x-should-retry: false`: the SDK
retries a 5xx twice by default, and each retry would ask the question again as a new call.
"""

from __future__ import annotations

from typing import Any

from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt

from config.api import exception_handler as api_exception_handler

_TYPES = {401: "authentication_error", 403: "permission_error", 404: "invalid_request_error",
          409: "conflict_error", 429: "rate_limit_error"}


def error_type(status: int) -> str:
    return "server_error" if status >= 500 else _TYPES.get(status, "invalid_request_error")


def openai_error_body(status: int, message: str, code: str | None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}


ANTHROPIC_ERRORS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 409: "invalid_request_error", 413: "request_too_large",
                    429: "rate_limit_error", 529: "overloaded_error"}


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error shape, which its SDK reads into its own exceptions."""
    kind = "api_error" if status >= 500 and status != 529 else ANTHROPIC_ERRORS.get(status, "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def _reshaped(exc, context, shape):
    """The API's own handler decides; `shape(status, error)` writes its body in a provider's format."""
    response = api_exception_handler(exc, context)
    if response is None:
        return None
    response.data = shape(response.status_code, (response.data or {}).get("error", {}))
    response["x-should-retry"] = "false"
    return response


def _openai_shape(status: int, error: dict) -> dict:
    param = error.get("param") if isinstance(error.get("param"), str) else None  # the field at fault, if named
    return openai_error_body(status, error.get("message", ""), error.get("code"), param)


def exception_handler(exc, context):
    return _reshaped(exc, context, _openai_shape)


def anthropic_exception_handler(exc, context):
    """/v1/messages: the same decision, in Anthropic's error shape."""
    return _reshaped(exc, context, lambda status, error: anthropic_error_body(status, error.get("message", "")))


@csrf_exempt  # a POST to a path this server does not serve is the same 404, not Django's CSRF page
def not_found(request, *args, **kwargs) -> JsonResponse:
    """Every other /v1/ path, in OpenAI's format."""
    return JsonResponse(openai_error_body(404, f"Unknown path {request.path} on this server.", "not_found"),
                        status=404)
