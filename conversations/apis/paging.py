"""Cursor pages for a conversation's long lists (issue 13): `/bubbles/` by place on the path, `/nodes/` by id.

A page is `{"next", "previous", "results"}`, as DRF's CursorPagination answers; `next` and `previous` are links
with an opaque `cursor`. A cursor names where a page ends (a node), never an offset, so turns added while a
client reads shift nothing and repeat nothing. Cursors are signed for the one conversation they were given for:
one names a node to walk the history from, which must be a node the server itself put there.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import signing
from rest_framework.pagination import BasePagination
from rest_framework.request import Request
from rest_framework.utils.urls import replace_query_param

from config.errors import NotFound

CURSOR = "cursor"


def page_nodes() -> int:
    """Nodes per page (ARBOR_PAGE_NODES): generous, so a short conversation is one page."""
    return max(1, settings.ARBOR_PAGE_NODES)


def _signer(scope: str) -> signing.Signer:
    return signing.Signer(salt=f"arbor.cursor.{scope}")


def read_cursor(request: Request, *, scope: str) -> dict[str, Any] | None:
    """The request's cursor (None for the first page: none, or empty); one not signed for `scope` is a 404."""
    return decode_cursor(request.query_params.get(CURSOR, ""), scope=scope)


def decode_cursor(raw: str, *, scope: str) -> dict[str, Any] | None:
    if not raw:
        return None
    try:
        value = _signer(scope).unsign_object(raw)
    except (signing.BadSignature, ValueError):
        value = None
    if not isinstance(value, dict):  # as DRF's own cursor pages answer: no such page
        raise NotFound("No such page: `cursor` is not one this list gave out; take a page's `next` or `previous`.")
    return value


def cursor_token(value: dict[str, Any], *, scope: str) -> str:
    return _signer(scope).sign_object(value, compress=False)


def page_link(request: Request, value: dict[str, Any] | None, *, scope: str) -> str | None:
    """The request's own URL with `cursor` set to `value` (None: no such page)."""
    if value is None:
        return None
    return replace_query_param(request.build_absolute_uri(), CURSOR, cursor_token(value, scope=scope))


def page_body(request: Request, results: list, *, scope: str, after: dict | None, before: dict | None) -> dict:
    return {"next": page_link(request, after, scope=scope), "previous": page_link(request, before, scope=scope),
            "results": results}


class CursorPages(BasePagination):
    """What the schema says of a cursor-paged list (drf-spectacular reads a view's `pagination_class`)."""

    def get_paginated_response_schema(self, schema: dict) -> dict:
        link = {"type": "string", "format": "uri", "nullable": True}
        return {
            "type": "object",
            "required": ["next", "previous", "results"],
            "properties": {
                "next": {**link, "description": "The next page; null on the last one."},
                "previous": {**link, "description": "The page before; null on the first one."},
                "results": schema,
            },
        }

    def get_schema_operation_parameters(self, view) -> list[dict]:
        return [{
            "name": CURSOR, "required": False, "in": "query", "schema": {"type": "string"},
            "description": "Where the page starts: the `cursor` of a page's `next` or `previous` link (opaque; "
                           "any other is a 404, no such page). Without it, the first page.",
        }]
