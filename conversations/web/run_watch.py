"""Which conversations shown by this process's chat sockets have a turn running, or had one since the last look:
one query per process for all of them, not one per socket (issue 12: a socket joins a turn started in another
tab, process or through the API; issue 13: hundreds of idle sockets cost one query). It looks when a run starts
on one of them (`config.news`, issue 34: idle sockets cost no query at all), and every `WATCH_SECONDS` in case
news was lost (where news does not reach other processes, every `POLL_SECONDS`). A quick turn can start and
end before the look: it is still shown (issue 26: a second tab missed 6 of 6), to the sockets that were open
when it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta

from django.db.models import Q
from django.utils import timezone

from config import news
from config.web import in_pool_thread
from conversations.models import TurnRun
from conversations.turns.detached import RUN_NEWS

logger = logging.getLogger("arbor.web")

WATCH_SECONDS = 5.0
POLL_SECONDS = 0.5

Notify = Callable[[uuid.UUID], None]


class RunWatch:
    """The sockets of one event loop, by conversation (each with when it was added); a task that tells them of
    running turns, and of turns that started since the last look."""

    def __init__(self):
        self._sockets: dict[int, dict[Notify, datetime]] = {}
        self._unsubscribe: dict[int, Callable[[], None]] = {}
        self._task: asyncio.Task | None = None
        self._loop = asyncio.get_running_loop()
        self._news = asyncio.Event()

    def add(self, conversation_id: int, notify: Notify) -> None:
        if conversation_id not in self._sockets:
            self._unsubscribe[conversation_id] = news.subscribe(RUN_NEWS, str(conversation_id), self._poke)
        self._sockets.setdefault(conversation_id, {})[notify] = timezone.now()
        if self._task is None or self._task.done():
            self._task = self._loop.create_task(self._run())
        else:
            self._news.set()  # a turn may already run there: look now, for every socket added meanwhile

    def remove(self, conversation_id: int, notify: Notify) -> None:
        sockets = self._sockets.get(conversation_id)
        if sockets is not None:
            sockets.pop(notify, None)
            if not sockets:
                del self._sockets[conversation_id]
                self._unsubscribe.pop(conversation_id)()

    def _poke(self) -> None:
        """A run started on a watched conversation (called from the news listener's thread)."""
        with contextlib.suppress(RuntimeError):  # the loop is closed
            self._loop.call_soon_threadsafe(self._news.set)

    async def _run(self) -> None:
        since = timezone.now()
        while self._sockets:
            self._news.clear()  # before the look: news during it brings another
            looked = timezone.now()
            try:
                runs = await in_pool_thread(_runs_to_show, list(self._sockets), since - LOOK_MARGIN)
            except Exception:  # the database is away: sockets stay open, and it is asked again
                logger.exception("could not look for running turns")
            else:
                since = looked
                for conversation_id, run_id, started_at, running in runs:
                    for notify, added in list(self._sockets.get(conversation_id, {}).items()):
                        if running or started_at >= added:  # an ended turn: only to the tabs open when it began
                            notify(run_id)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._news.wait(), WATCH_SECONDS if news.pushes() else POLL_SECONDS)


# Clocks of server processes and the database differ a little: look a little before the last look.
LOOK_MARGIN = timedelta(seconds=2)


def _runs_to_show(conversation_ids: list[int], since: datetime) -> list[tuple[int, uuid.UUID, datetime, bool]]:
    """Each conversation's latest run that is running or started after `since`: (conversation, run, started at,
    running)."""
    rows = (TurnRun.objects.filter(Q(ended_at__isnull=True) | Q(started_at__gte=since),
                                   conversation_id__in=conversation_ids)
            .order_by("started_at").values_list("conversation_id", "pk", "started_at", "ended_at"))
    latest = {row[0]: row for row in rows}  # the latest last
    return [(conversation, run, started, ended is None) for conversation, run, started, ended in latest.values()]


_watches: dict[asyncio.AbstractEventLoop, RunWatch] = {}


def watch() -> RunWatch:
    """The watch of the running event loop (one per server process; tests run several loops)."""
    loop = asyncio.get_running_loop()
    for gone in [other for other in _watches if other.is_closed()]:
        with contextlib.suppress(KeyError):
            del _watches[gone]
    if loop not in _watches:  # made once a loop: a watch subscribes to news and holds the loop's sockets
        _watches[loop] = RunWatch()
    return _watches[loop]
