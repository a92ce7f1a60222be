"""Which conversations shown by this process's chat sockets have a turn running: one query per process every
`WATCH_SECONDS` for all of them, not one per socket (issue 12: a socket joins a turn started in another tab,
process or through the API; issue 13: hundreds of idle sockets cost one query).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable

from config.web import in_pool_thread
from conversations.models import TurnRun

logger = logging.getLogger("arbor.web")

WATCH_SECONDS = 0.5

Notify = Callable[[uuid.UUID], None]


class RunWatch:
    """The sockets of one event loop, by conversation; a task that tells them of running turns."""

    def __init__(self):
        self._sockets: dict[int, set[Notify]] = {}
        self._task: asyncio.Task | None = None

    def add(self, conversation_id: int, notify: Notify) -> None:
        self._sockets.setdefault(conversation_id, set()).add(notify)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def remove(self, conversation_id: int, notify: Notify) -> None:
        sockets = self._sockets.get(conversation_id)
        if sockets is not None:
            sockets.discard(notify)
            if not sockets:
                del self._sockets[conversation_id]

    async def _run(self) -> None:
        while self._sockets:
            try:
                running = await in_pool_thread(_running_runs, list(self._sockets))
            except Exception:  # the database is away: sockets stay open, and it is asked again
                logger.exception("could not look for running turns")
                running = {}
            for conversation_id, run_id in running.items():
                for notify in list(self._sockets.get(conversation_id, ())):
                    notify(run_id)
            await asyncio.sleep(WATCH_SECONDS)


def _running_runs(conversation_ids: list[int]) -> dict[int, uuid.UUID]:
    """Each conversation's latest running turn."""
    rows = (TurnRun.objects.filter(conversation_id__in=conversation_ids, ended_at__isnull=True)
            .order_by("started_at").values_list("conversation_id", "pk"))
    return dict(rows)  # the latest last


_watches: dict[asyncio.AbstractEventLoop, RunWatch] = {}


def watch() -> RunWatch:
    """The watch of the running event loop (one per server process; tests run several loops)."""
    loop = asyncio.get_running_loop()
    for gone in [other for other in _watches if other.is_closed()]:
        with contextlib.suppress(KeyError):
            del _watches[gone]
    return _watches.setdefault(loop, RunWatch())
