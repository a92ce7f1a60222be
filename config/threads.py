"""A pool of threads made as work needs them, by a thread of the pool's own, never by the caller (issue 34).

`Thread.start()` waits until the new thread runs, and under load that wait is a hand-off of the GIL among
hundreds of busy threads. `ThreadPoolExecutor` makes its threads in `submit`, and `submit` is called on the event
loop (every HTTP request's view, a socket's sync calls): at 300 SSE streams the loop stood in `Thread.start()` in
70% of its stack samples, and every stream's tokens and every new request's headers waited behind it. Here
`submit` only queues the work; when no thread is idle, the pool's maker thread starts one. Daemon threads: work
hanging on a silent provider never holds up the process's exit.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any


class GrowingThreads(Executor):
    """Up to `most` threads (None: no ceiling), one more whenever work comes and none is idle; at the ceiling, work
    waits for a thread to be free."""

    def __init__(self, name: str, most: int | None = None):
        self._name, self._most = name, most
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._wanted: queue.SimpleQueue = queue.SimpleQueue()  # an item a thread the maker is to start
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for work that no queued work has counted on yet
        self._threads = 0  # made, or asked of the maker
        self._maker: threading.Thread | None = None

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        self._work.put((future, fn, args, kwargs))
        with self._lock:
            if self._idle:
                self._idle -= 1
                return future
            if self._most is not None and self._threads >= self._most:
                return future
            self._threads += 1
            first = self._maker is None
            if first:
                self._maker = threading.Thread(target=self._make, name=f"{self._name}-maker", daemon=True)
        if first:  # the only thread a caller starts, once a process
            self._maker.start()
        self._wanted.put(None)
        return future

    def _make(self) -> None:
        number = 0
        while True:
            self._wanted.get()
            number += 1
            threading.Thread(target=self._serve, name=f"{self._name}-{number}", daemon=True).start()

    def _serve(self) -> None:
        while True:
            future, fn, args, kwargs = self._work.get()
            if future.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as error:  # handed to whoever waits on the future
                    future.set_exception(error)
                else:
                    future.set_result(result)
            del future, fn, args, kwargs  # nothing of the last work is kept while idle
            with self._lock:
                self._idle += 1
