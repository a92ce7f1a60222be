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

_END = object()
SETTLE_SECONDS = 5


async def events_in_thread(make_events: Callable[[], Iterator], *, detach: bool = False) -> AsyncIterator:
    """Yield what `make_events()` yields, run in its own thread. Leaving early closes it, unless `detach`:
    then the thread reads it to its end, unheard (a detached turn runs on when its client leaves)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    stop = threading.Event()
    finished = loop.create_future()

    def post(callback, value) -> None:
        with contextlib.suppress(RuntimeError):  # the caller's loop is gone: nobody is listening
            loop.call_soon_threadsafe(callback, value)

    def work() -> None:
        try:
            events = make_events()
            try:
                for event in events:
                    if not stop.is_set():
                        post(queue.put_nowait, event)
                    elif not detach:
                        break
            finally:
                events.close()  # a turn still running when its reader left (not detached) ends cancelled
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
        if not detach:
            # Let the turn record how it ended before this caller moves on; a call that sends nothing
            # (a silent provider) notices the stop only at its next event, so do not wait for ever.
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(finished), timeout=SETTLE_SECONDS)
