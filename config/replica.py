"""Reads that may lag go to a PostgreSQL streaming replica (issue 34), when `DATABASE_REPLICA_URL` names one.

A replica applies the primary's changes a moment later, so only reads a person would not miss for that moment
go there: the word search, the conversation list and the admin's lists. They run inside `reads_may_lag` (or a
view wrapped by it); everything else (a turn, its lock, the head, what a person just wrote and reads back, an
ownership check, an export's one snapshot, the tree map a person marks, similar messages, whose vectors a turn's
retrieval shares, every write) stays on the primary. Without a replica every read is the primary's.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

from django.conf import settings

REPLICA = "replica"
_lag_ok: ContextVar[bool] = ContextVar("reads_may_lag", default=False)


@contextlib.contextmanager
def _lagging() -> Iterator[None]:
    token = _lag_ok.set(True)
    try:
        yield
    finally:
        _lag_ok.reset(token)


def reads_may_lag(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function` (a view, a method, anything that reads) with its reads on the replica. What it returns must be
    read by then: a DRF response's data, a rendered page (a lazy template response's reads would reach the
    primary; the admin's lists use `ListsMayLag`)."""
    @functools.wraps(function)
    def lagging(*args: Any, **kwargs: Any) -> Any:
        with _lagging():
            return function(*args, **kwargs)
    return lagging


class ReplicaRouter:
    """Reads inside `reads_may_lag` to the replica, when there is one; every write, and every other read, to the
    primary (also a save of an object read from the replica)."""

    def db_for_read(self, model, **hints) -> str | None:
        return REPLICA if _lag_ok.get() and REPLICA in settings.DATABASES else "default"

    def db_for_write(self, model, **hints) -> str:
        return "default"

    def allow_relation(self, obj1, obj2, **hints) -> bool:
        return True  # one database: the replica is the primary, a moment ago

    def allow_migrate(self, db: str, app_label: str, **hints) -> bool:
        return db == "default"


def lagging_queryset(queryset):
    """`queryset` read from the replica, when there is one (a list whose rows are read after its view returned)."""
    return queryset.using(REPLICA) if REPLICA in settings.DATABASES else queryset


class ListsMayLag:
    """A ModelAdmin whose lists read from the replica; an object's own page, and every change, the primary's."""

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        match = getattr(request, "resolver_match", None)
        listing = request.method == "GET" and match is not None and (match.url_name or "").endswith("_changelist")
        return lagging_queryset(queryset) if listing else queryset


def reading_connection():
    """The connection a raw read goes through: the replica's inside `reads_may_lag`, else the primary's (the
    router routes the ORM's reads; a cursor opened by hand must ask)."""
    from django.db import connections

    return connections[REPLICA if _lag_ok.get() and REPLICA in settings.DATABASES else "default"]
