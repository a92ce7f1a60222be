"""What every app's API views share: the one error shape ({"error": {"code": ..., "message": ...}}), input
parsing and validation, and pagination. Imports no app."""

from __future__ import annotations

import json
import logging
import math
import re
from itertools import accumulate
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError
from django.http import Http404, HttpRequest, JsonResponse
from django.urls import Resolver404, resolve
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, status
from rest_framework.parsers import JSONParser, get_encoding
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings

from config.errors import ArborError

logger = logging.getLogger("arbor.api")


def error_body(code: str, message: str, **extra) -> dict:
    return {"error": {"code": code, "message": message, **extra}}


# --- strict JSON: what a body, a socket frame or an imported file may hold ---------------------------------

MAX_JSON_DEPTH = 32  # nesting; no request of Arbor's nests more than a few levels, its export files about 8
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # what a database integer column (and an id) can hold

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)  # an unterminated one runs to the end: linear
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
_UNSTORABLE = re.compile(r"[\x00\ud800-\udfff]")  # PostgreSQL text holds no NUL; UTF-8 has no lone surrogates
# What could decode to a bad value, so the decoded values are walked: in a string a NUL or surrogate escape (or
# character); outside strings 19+ digits (an int64 has at most 19), a 3-digit exponent (a float past 1.8e308 is
# infinite), NaN or Infinity.
_ODD_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")  # D800-DFFF
_LONG_NUMBER = re.compile(r"[0-9]{19}|[eE][+-]?[0-9]{3}")
_OUT_OF_RANGE = object()  # stands in for an integer no column can hold, until its path is found


class UnsafeJSON(ValueError):
    """Well-formed JSON that Arbor refuses to read: nested too deep, or holding what no column can store. The
    message names the value by its path first (`$.values.limit: expected a whole number ...`), the way a field's
    error is named; `path` holds it alone."""

    def __init__(self, problem: str, *, path: str | None = None):
        super().__init__(f"{path}: {problem}" if path else problem)
        self.path = path


class TooDeep(UnsafeJSON):
    """The nesting alone was refused (the caller may know why a file of its kind nests so deep)."""


def strict_loads(text: str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Decode JSON text, refusing (UnsafeJSON) nesting deeper than `max_depth`, a NUL character or a lone
    surrogate in any text or key, an integer outside the signed 64-bit range, and NaN or an infinity.

    The depth is counted before decoding, so a deep document never recurses. The decoded values are walked only
    when a scan of the text finds what could be a bad one, so a plain file costs little more than json.loads.
    Malformed JSON raises json's own ValueError.
    """
    outside = _STRING.sub("", text)  # what is not in a string: brackets, numbers, literals
    depth = _depth(outside)
    if depth > max_depth:
        raise TooDeep(f"The JSON nests deeper than {max_depth} levels.")
    suspect = bool(_ODD_ESCAPE.search(text) or "\x00" in text or (not text.isascii() and _UNSTORABLE.search(text))
                   or "NaN" in outside or "Infinity" in outside or _LONG_NUMBER.search(outside))
    # json's decoder recurses once a level: past DECODER_DEPTH the text is read by a loop instead (issue 28: a long
    # LibreChat export nests two levels a message).
    loads = json.loads if depth <= DECODER_DEPTH else _loads_deep
    try:
        # Out-of-range integers decode as a marker the walk names (int() alone refuses 4300+ digits unnamed).
        document = loads(text, parse_int=_int64) if suspect else loads(text)
    except RecursionError:  # a safety net: the depth count above keeps the decoder from recursing this far
        raise TooDeep(f"The JSON nests deeper than {max_depth} levels.") from None
    if suspect:
        _refuse_unstorable(document)
    return document


DECODER_DEPTH = 400  # json's C decoder recurses a level at a time; well inside Python's limit of 1000 frames
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_LITERALS = (("null", None), ("true", True), ("false", False), ("NaN", math.nan), ("Infinity", math.inf),
             ("-Infinity", -math.inf))


def _loads_deep(text: str, *, parse_int: Any = int) -> Any:
    """json.loads with a loop and a stack instead of recursion, for text nested deeper than DECODER_DEPTH. Strings
    are json's own (`scanstring`, strict), numbers its own pattern; malformed text raises ValueError as json does."""
    stack: list[list] = []  # the containers being read: [container, the key its next value goes to]
    at = _WHITESPACE.match(text, 0).end()
    while True:
        value, at, opened = _value(text, at, parse_int)
        if opened is not None:
            stack.append(opened)
            continue
        while True:  # a value is whole: put it in its container; a container that closes is a value in turn
            if not stack:
                at = _WHITESPACE.match(text, at).end()
                if at != len(text):
                    raise ValueError(f"Extra data: char {at}")
                return value
            frame = stack[-1]
            container = frame[0]
            if isinstance(container, dict):
                container[frame[1]] = value
            else:
                container.append(value)
            at = _WHITESPACE.match(text, at).end()
            if text.startswith(",", at):
                at = _WHITESPACE.match(text, at + 1).end()
                if isinstance(container, dict):
                    frame[1], at = _key(text, at)
                break
            if text.startswith("}" if isinstance(container, dict) else "]", at):
                value, at = stack.pop()[0], at + 1
                continue
            raise ValueError(f"Expecting ',' delimiter: char {at}")


def _value(text: str, at: int, parse_int: Any) -> tuple[Any, int, list | None]:
    """The value at `at` and where it ends; or, for a container with something in it, the frame it opens."""
    char = text[at:at + 1]
    if char in ("{", "["):
        inside = _WHITESPACE.match(text, at + 1).end()
        if text.startswith("}" if char == "{" else "]", inside):
            return ({} if char == "{" else []), inside + 1, None
        if char == "[":
            return None, inside, [[], None]
        key, inside = _key(text, inside)
        return None, inside, [{}, key]
    if char == '"':
        value, end = json.decoder.scanstring(text, at + 1, True)
        return value, end, None
    number = json.scanner.NUMBER_RE.match(text, at)
    if number:
        integer, fraction, exponent = number.groups()
        value = float(integer + (fraction or "") + (exponent or "")) if fraction or exponent else parse_int(integer)
        return value, number.end(), None
    for literal, value in _LITERALS:
        if text.startswith(literal, at):
            return value, at + len(literal), None
    raise ValueError(f"Expecting value: char {at}")


def _key(text: str, at: int) -> tuple[str, int]:
    """An object's key and the colon after it; returns the key and where its value begins."""
    if not text.startswith('"', at):
        raise ValueError(f"Expecting property name enclosed in double quotes: char {at}")
    key, at = json.decoder.scanstring(text, at + 1, True)
    at = _WHITESPACE.match(text, at).end()
    if not text.startswith(":", at):
        raise ValueError(f"Expecting ':' delimiter: char {at}")
    return key, _WHITESPACE.match(text, at + 1).end()


def _int64(digits: str) -> int | object:
    """json's parse_int: the integer, or the out-of-range marker (never int() of thousands of digits)."""
    if len(digits) <= 20 and INT64_MIN <= (number := int(digits)) <= INT64_MAX:
        return number
    return _OUT_OF_RANGE


def nesting(value: Any) -> int:
    """How deep a decoded value nests (1 for a list or object of plain values), counted without recursing."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in (value.values() if isinstance(value, dict) else value))
    return deepest


def _depth(outside: str) -> int:
    """How deep the brackets of JSON text with its strings taken out nest."""
    return max(accumulate(map(_STEP.__getitem__, _NOT_BRACKET.sub("", outside))), default=0)


def _refuse_unstorable(document: Any) -> None:
    """Walk the decoded document (without recursing) and raise UnsafeJSON at the first value no column can hold."""
    stack: list[tuple[Any, tuple | None]] = [(document, None)]  # a value and its path, as (parent's, step) links
    while stack:
        value, link = stack.pop()
        if isinstance(value, str):
            _check_text(value, link, "")
        elif value is _OUT_OF_RANGE:
            raise UnsafeJSON(f"expected a whole number from {INT64_MIN} to {INT64_MAX}", path=_path(link))
        elif isinstance(value, float) and not math.isfinite(value):
            raise UnsafeJSON("expected a finite number, not NaN or an infinity", path=_path(link))
        elif isinstance(value, dict):
            for key in value:
                _check_text(key, (link, key), "a key with ")
            stack.extend((item, (link, key)) for key, item in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((value[index], (link, index)) for index in range(len(value) - 1, -1, -1))


def _check_text(text: str, link: tuple | None, where: str) -> None:
    found = _UNSTORABLE.search(text)
    if found is None:
        return
    if found.group() == "\x00":
        raise UnsafeJSON(f"{where}a NUL character (\\u0000) cannot be stored", path=_path(link))
    raise UnsafeJSON(f"{where}a lone surrogate (\\u{ord(found.group()):04x}) is not a character", path=_path(link))


def _path(link: tuple | None) -> str:
    """`$`, then `.name` or `["odd name"]` for each key and `[n]` for each index, from the root down."""
    steps = []
    while link is not None:
        link, step = link
        steps.append(step)
    return "$" + "".join(
        f"[{step}]" if isinstance(step, int) else f".{step}" if step.isidentifier() else f"[{json.dumps(step)}]"
        for step in reversed(steps))


class RefusedJSON(exceptions.ParseError):
    """A body that is JSON but that Arbor will not read (UnsafeJSON): a 400 `bad_input` naming the problem."""

    default_code = "bad_input"

    def __init__(self, error: UnsafeJSON):
        super().__init__(str(error))
        self.path = error.path


class StrictJSONParser(JSONParser):
    """DRF's JSON parser held to `strict_loads`: every API body is read through it (the default parser)."""

    def parse(self, stream, media_type=None, parser_context=None):
        encoding = get_encoding(parser_context or {})
        try:
            text = stream.read().decode(encoding)
        except UnicodeDecodeError as error:
            raise exceptions.ParseError(f"JSON parse error - the body is not {encoding} text: {error}") from None
        try:
            return strict_loads(text)
        except UnsafeJSON as error:
            raise RefusedJSON(error) from None
        except ValueError as error:
            raise exceptions.ParseError(f"JSON parse error - {error}") from None


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
        response = Response(error_body(exc.code, exc.message, **exc.extra), status=exc.status)
        if "retry_after" in exc.extra:  # when to ask again, in the header clients and proxies read
            response["Retry-After"] = str(exc.extra["retry_after"])
        return response
    if isinstance(exc, RefusedJSON):
        extra = {"path": exc.path} if exc.path else {}
        return Response(error_body("bad_input", str(exc.detail), **extra), status=status.HTTP_400_BAD_REQUEST)
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
    # Not imported at the top: rest_framework.views reads DEFAULT_PARSER_CLASSES (this module's parser) while
    # it is first imported, so importing it from here would be a cycle. The parser wants a module of its own.
    from rest_framework.views import exception_handler as drf_exception_handler

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


def valid_input(serializer_class, request: Request, *, partial: bool = False) -> dict:
    """The request's JSON object, checked by `serializer_class` (`partial`: only the fields sent); a 400 names
    every problem."""
    if not isinstance(request.data, dict):
        raise exceptions.ValidationError({"non_field_errors": ["The body must be a JSON object."]})
    serializer = serializer_class(data=request.data, partial=partial)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def paginated(view, request: Request, queryset, serializer_class) -> Response:
    """One page of `queryset` with the project's paginator (read when called, never at import)."""
    paginator = api_settings.DEFAULT_PAGINATION_CLASS()
    page = paginator.paginate_queryset(queryset, request, view=view)
    return paginator.get_paginated_response(serializer_class(page, many=True).data)


@csrf_exempt  # nothing here to protect: a POST to no endpoint gets the JSON 404, not the HTML CSRF page
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
