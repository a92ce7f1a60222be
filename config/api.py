"""What every app's API views share: the one error shape ({"error": {"code": ..., "message": ...}}), input
validation and pagination. Imports no app."""

from __future__ import annotations

import logging

from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError
from django.http import Http404, HttpRequest, JsonResponse
from django.urls import Resolver404, resolve
from rest_framework import exceptions, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import exception_handler as drf_exception_handler

from config.errors import ArborError

logger = logging.getLogger("arbor.api")


def error_body(code: str, message: str, **extra) -> dict:
    return {"error": {"code": code, "message": message, **extra}}


def _flatten(detail, prefix: str = "") -> list[str]:
    if isinstance(detail, dict):
        return [
            message
            for key, value in detail.items()
            for message in _flatten(value, prefix if key == "non_field_errors" else f"{prefix}{key}: ")
        ]
    if isinstance(detail, list):
        return [m for value in detail for m in _flatten(value, prefix)]
    return [f"{prefix}{detail}"]


_CODES = {
    exceptions.ParseError: "malformed_json",
    exceptions.NotAuthenticated: "not_authenticated",
    exceptions.AuthenticationFailed: "authentication_failed",
    exceptions.PermissionDenied: "permission_denied",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method_not_allowed",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.NotAcceptable: "not_acceptable",
    exceptions.Throttled: "throttled",
}


def exception_handler(exc, context):
    if isinstance(exc, ArborError):
        return Response(error_body(exc.code, exc.message, **exc.extra), status=exc.status)
    if isinstance(exc, RequestDataTooBig):
        return Response(error_body("too_large", "The request body is too large."),
                        status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    if isinstance(exc, Http404):
        return Response(error_body("not_found", "Not found."), status=status.HTTP_404_NOT_FOUND)
    if isinstance(exc, exceptions.ValidationError):
        messages = _flatten(exc.detail)
        return Response(
            error_body("bad_input", " ".join(messages) or "Invalid input.", fields=exc.detail),
            status=status.HTTP_400_BAD_REQUEST,
        )
    response = drf_exception_handler(exc, context)
    if response is not None and isinstance(exc, exceptions.APIException):
        code = _CODES.get(type(exc), exc.default_code)
        response.data = error_body(code, " ".join(_flatten(exc.detail)))
        return response
    if isinstance(exc, DatabaseError):
        logger.exception("database error answering an API request")
        return Response(error_body("unavailable", "The database is busy or unavailable; nothing was changed. "
                                   "Try again."), status=status.HTTP_503_SERVICE_UNAVAILABLE)
    logger.exception("unexpected error answering an API request")
    return Response(error_body("server_error", "Something went wrong on the server."),
                    status=status.HTTP_500_INTERNAL_SERVER_ERROR)


def valid_input(serializer_class, request: Request) -> dict:
    """The request's JSON object, checked by `serializer_class`; a 400 names every problem."""
    if not isinstance(request.data, dict):
        raise exceptions.ValidationError({"non_field_errors": ["The body must be a JSON object."]})
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def paginated(view, request: Request, queryset, serializer_class) -> Response:
    """One page of `queryset` with the project's paginator (read when called, never at import)."""
    paginator = api_settings.DEFAULT_PAGINATION_CLASS()
    page = paginator.paginate_queryset(queryset, request, view=view)
    return paginator.get_paginated_response(serializer_class(page, many=True).data)


def not_found(request: HttpRequest, *args, **kwargs) -> JsonResponse:
    """Any other path under /api/: the API's own 404, not an HTML page."""
    message = f"No API endpoint at {request.path}."
    if not request.path.endswith("/"):
        try:
            slashed = resolve(f"{request.path}/")
        except Resolver404:
            slashed = None
        if slashed is not None and slashed.func is not not_found:
            message += f" Did you mean {request.path}/ (API paths end with a slash)?"
    return JsonResponse(error_body("not_found", message), status=404)
