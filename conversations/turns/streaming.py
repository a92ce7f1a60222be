"""Run a turn's events in a worker thread and hand them to async code (SSE, WebSockets).

The turn runner is synchronous (the ORM and its transactions are); an ASGI server must not spend its
one shared sync thread on a turn that lasts seconds, so each turn gets a thread of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator

from django.db import connections

from conversations.turns import log

_END = object()
SETTLE_SECONDS = 5


async def events_in_thread(make_events: Callable[[], Iterator], *, stop: threading.Event | None = None
                           ) -> AsyncIterator:
    """Yield what `make_events()` yields, run in its own thread. Leaving early sets `stop` and closes it
    at its next item (an iterator that waits long, as a log's reader does, looks at `stop` itself)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    stop = stop or threading.Event()
    finished = loop.create_future()

    def post(callback, value) -> None:
        with contextlib.suppress(RuntimeError):  # the caller's loop is gone: nobody is listening
            loop.call_soon_threadsafe(callback, value)

    def work() -> None:
        try:
            events = make_events()
            try:
                for event in events:
                    if stop.is_set():
                        break
                    post(queue.put_nowait, event)
            finally:
                events.close()  # a turn read here directly, still running when its reader left, ends cancelled
        except BaseException as error:  # handed over to the async side
            post(queue.put_nowait, error)
        finally:
            connections.close_all()
            post(queue.put_nowait, _END)
            post(finished.set_result, None)

    thread = threading.Thread(target=work, name="arbor-turn", daemon=True)
    thread.start()
    try:
        while True:
            item = await queue.get()
            if item is _END:
                break
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        # Let the thread close its iterator (a turn read directly records how it ended) before this caller
        # moves on; one that waits on something silent notices only later, so do not wait for ever.
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(finished), timeout=SETTLE_SECONDS)


async def follow_log_batches(run_id, *, after: int = 0) -> AsyncIterator[list]:
    """A run's numbered log entries (`log.follow`) for async code, in batches: what has come since the last
    batch. A run of this process is read from its memory on the caller's loop, without a thread; another's
    in a thread (leaving ends it within a second), an entry a batch."""
    local = log.local_run(run_id)
    if local is not None:
        async with contextlib.aclosing(local.follow_async(after)) as batches:
            async for batch in batches:
                yield batch
        return
    stop = threading.Event()
    async with contextlib.aclosing(events_in_thread(lambda: log.follow(run_id, after=after, stop=stop),
                                                    stop=stop)) as entries:
        async for entry in entries:
            yield [entry]


async def follow_log(run_id, *, after: int = 0) -> AsyncIterator:
    """A run's numbered log entries, one by one (`follow_log_batches`)."""
    async with contextlib.aclosing(follow_log_batches(run_id, after=after)) as batches:
        async for batch in batches:
            for entry in batch:
                yield entry
