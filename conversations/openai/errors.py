"""OpenAI's error format for the /v1/ surface, so the official SDKs raise their usual exceptions.

The API's own handler (config.api) decides the status and the words; this one only reshapes the body into
`{"error": {"message", "type", "param", "code"}}`. A failed create also says `x-should-retry: false`: the SDK
retries a 5xx twice by default, and each retry would ask the question again as a new call.
"""

from __future__ import annotations

from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt

from config.api import exception_handler as api_exception_handler

_TYPES = {401: "authentication_error", 403: "permission_error", 404: "invalid_request_error",
          409: "conflict_error", 429: "rate_limit_error"}


def error_type(status: int) -> str:
    return "server_error" if status >= 500 else _TYPES.get(status, "invalid_request_error")


def openai_error_body(status: int, message: str, code: str | None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}


def exception_handler(exc, context):
    response = api_exception_handler(exc, context)
    if response is None:
        return None
    error = (response.data or {}).get("error", {})
    param = error.get("param") if isinstance(error.get("param"), str) else None  # the field at fault, if named
    response.data = openai_error_body(response.status_code, error.get("message", ""), error.get("code"), param)
    response["x-should-retry"] = "false"
    return response


@csrf_exempt  # a POST to a path this server does not serve is the same 404, not Django's CSRF page
def not_found(request, *args, **kwargs) -> JsonResponse:
    """Every other /v1/ path, in OpenAI's format."""
    return JsonResponse(openai_error_body(404, f"Unknown path {request.path} on this server.", "not_found"),
                        status=404)
