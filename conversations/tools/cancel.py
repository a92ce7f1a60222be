"""How a running tool learns that nobody waits for it any more (its time ran out, or the turn was stopped).

A thread cannot be killed, so the runner sets the call's event and a tool that can stop (a query: SQLite's
progress handler) looks at `cancelled()` and ends early instead of running on, unseen, for as long as it likes.
"""

from __future__ import annotations

import threading
from contextvars import ContextVar

_current: ContextVar[threading.Event | None] = ContextVar("arbor_tool_cancel", default=None)


def cancelled() -> bool:
    event = _current.get()
    return event is not None and event.is_set()


def running_with(event: threading.Event):
    """Make `event` the running tool's (in the tool's own thread, before it starts)."""
    return _current.set(event)
