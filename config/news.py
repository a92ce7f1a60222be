"""News between processes: a writer says something happened (a turn started, a turn's log grew), and whoever
waits for it wakes at once instead of asking the database every tenth of a second (issue 34: 200 followers
polling cost 25 transactions a second each and took the whole pool).

On PostgreSQL the news travels by `NOTIFY` in the writer's own statement or transaction (so it is sent when
the write commits, never before), and each process has one thread that `LISTEN`s on a connection of its own
and hands each notice to this process's waiters. Elsewhere (SQLite, the embedded default: one process) the
news is handed over in memory when the write commits. A waiter always waits with a time limit and then looks
for itself, so a notice lost while the listener reconnects costs a delay, never a stuck reader; after a
reconnect every waiter is woken once, to look.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import partial

from django.db import connection, connections, transaction

logger = logging.getLogger("arbor.news")

LISTEN_TIMEOUT_SECONDS = 1.0  # the listener looks up this often to notice it should reconnect
RECONNECT_SECONDS = 1.0

Callback = Callable[[], None]


class _Board:
    """This process's waiters, by channel and key; called from the listener's thread or a committing one."""

    def __init__(self):
        self._lock = threading.Lock()
        self._waiters: dict[tuple[str, str], set[Callback]] = {}

    def add(self, channel: str, key: str, callback: Callback) -> None:
        with self._lock:
            self._waiters.setdefault((channel, key), set()).add(callback)

    def remove(self, channel: str, key: str, callback: Callback) -> None:
        with self._lock:
            waiters = self._waiters.get((channel, key))
            if waiters is not None:
                waiters.discard(callback)
                if not waiters:
                    del self._waiters[(channel, key)]

    def post(self, channel: str, key: str) -> None:
        with self._lock:
            callbacks = list(self._waiters.get((channel, key), ()))
        _call(callbacks)

    def post_channels(self, channels: list[str]) -> None:
        """Wake every waiter on `channels` (news on them may have been missed)."""
        with self._lock:
            callbacks = [c for (channel, _), waiters in self._waiters.items() if channel in channels for c in waiters]
        _call(callbacks)

    def post_all(self) -> None:
        """Wake every waiter (news may have been missed)."""
        with self._lock:
            callbacks = [c for waiters in self._waiters.values() for c in waiters]
        _call(callbacks)


def _call(callbacks: list[Callback]) -> None:
    for callback in callbacks:
        try:
            callback()
        except Exception:  # one waiter's trouble must not keep the news from the others
            logger.exception("a news waiter failed")


_board = _Board()


class _Listener:
    """One thread a process that LISTENs on PostgreSQL for every channel asked for, on a connection of its own
    (outside Django's pool: it is held for the process's life)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._channels: set[str] = set()
        self._thread: threading.Thread | None = None
        self._params: dict | None = None
        self._backend: int | None = None  # the listening connection's server process
        self._stopped = False
        self.listening = threading.Event()

    def ensure(self, channel: str) -> None:
        with self._lock:
            fresh = channel not in self._channels
            self._channels.add(channel)
            if self._thread is None or not self._thread.is_alive():
                self._stopped = False
                self._params = {**connection.get_connection_params(), "autocommit": True}
                self._params.pop("cursor_factory", None)
                self._params.pop("pool", None)
                self._thread = threading.Thread(target=self._run, name="arbor-news", daemon=True)
                self._thread.start()
            elif fresh:
                self.listening.clear()  # the thread sees the new channel within its next look

    def _run(self) -> None:
        import psycopg  # PostgreSQL only

        said = False
        while not self._stopped:
            try:
                with psycopg.connect(**self._params) as conn:
                    said, self._backend = False, conn.info.backend_pid
                    self._serve(conn)
            except Exception as error:  # the database went away or restarted: connect again
                self.listening.clear()
                if self._stopped:
                    return
                if not said:  # once an outage: waiters look for themselves meanwhile
                    logger.warning("news: the listener lost PostgreSQL (%s); connecting again", error)
                    said = True
                threading.Event().wait(RECONNECT_SECONDS)

    def _serve(self, conn) -> None:
        listened: set[str] = set()
        while not self._stopped:
            with self._lock:
                wanted = set(self._channels)
            fresh = sorted(wanted - listened)
            connected = not listened
            for channel in fresh:
                conn.execute(f'LISTEN "{channel}"')
                listened.add(channel)
            if not self.listening.is_set():
                # Anything said before this LISTEN was missed: its waiters look once, before anyone is told it
                # listens (a waiter that then unsubscribes is called no more). Every waiter on a new connection;
                # on a channel added later, that channel's only (the others missed nothing).
                if connected:
                    _board.post_all()
                else:
                    _board.post_channels(fresh)
                self.listening.set()
            for notice in conn.notifies(timeout=LISTEN_TIMEOUT_SECONDS):
                _board.post(notice.channel, notice.payload)
                if not self.listening.is_set():  # a channel was added: LISTEN to it now
                    break


    def stop(self) -> None:
        """End the listener and its connection (a test run's end: its database is about to be dropped)."""
        with self._lock:
            thread, backend, self._stopped = self._thread, self._backend, True
        if thread is None or not thread.is_alive() or backend is None:
            return
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", (backend,))
        thread.join(timeout=5)


_listener = _Listener()


def stop() -> None:
    """Stop listening (PostgreSQL); a later `subscribe` starts again."""
    if pushes():
        _listener.stop()


def listening(timeout: float) -> bool:
    """Wait up to `timeout` seconds until this process listens (its catch-up wake of every waiter done); True when
    it does, or where news stays in the process."""
    return not pushes() or _listener.listening.wait(timeout)


def pushes() -> bool:
    """Does news reach other processes (PostgreSQL), or only this one?"""
    return connection.vendor == "postgresql"


def subscribe(channel: str, key: str, callback: Callback) -> Callable[[], None]:
    """Call `callback` (quickly: it runs on the listener's thread) whenever `key` is announced on `channel`;
    return what stops it."""
    _board.add(channel, key, callback)
    if pushes():
        _listener.ensure(channel)
    return partial(_board.remove, channel, key, callback)


def announce(channel: str, key: str, *, writes=None, using: str = "default") -> None:
    """Tell every process that `key` happened on `channel`, once the current write commits. `writes`: a
    `config.together.Together` batch the notice joins (on PostgreSQL, inside its one statement)."""
    if not pushes():
        transaction.on_commit(partial(_board.post, channel, key), using=using)
    elif writes is not None and writes.one_statement:
        writes.notify(channel, key)
    else:
        with connections[using].cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", (channel, key))


class Waiter:
    """A thread's wait for news of one key: `wait` returns when it came (since the last wait) or at the limit."""

    def __init__(self, channel: str, key: str):
        self._event = threading.Event()
        self._stop = subscribe(channel, key, self._event.set)

    def wait(self, seconds: float) -> bool:
        came = self._event.wait(seconds)
        self._event.clear()
        return came

    def close(self) -> None:
        self._stop()

    def __enter__(self) -> Waiter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
