"""Run a turn's events in a worker thread and hand them to async code (SSE, WebSockets).

The turn runner is synchronous (the ORM and its transactions are); an ASGI server must not spend its
one shared sync thread on a turn that lasts seconds, so each turn gets a thread of its own.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator

from django.db import connections

_END = object()


async def events_in_thread(make_events: Callable[[], Iterator]) -> AsyncIterator:
    """Yield what `make_events()` yields, run in its own thread. Leaving early stops the turn (closes it)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    stop = threading.Event()

    def work() -> None:
        try:
            events = make_events()
            try:
                for event in events:
                    loop.call_soon_threadsafe(queue.put_nowait, event)
                    if stop.is_set():
                        break
            finally:
                events.close()  # ends the turn as cancelled if it was still running
        except BaseException as error:  # handed over to the async side
            loop.call_soon_threadsafe(queue.put_nowait, error)
        finally:
            connections.close_all()
            loop.call_soon_threadsafe(queue.put_nowait, _END)

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
