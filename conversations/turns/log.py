"""A turn's events, numbered and kept a while after it ends, so any client in any process can follow it
and pick it up again where it lost it (issue 12).

The process running the turn writes (`TurnLog`); readers ask for what came after the last number they
saw (`read`, `follow`). Entries are kept in a store every process reads (`log_stores`: Redis Streams
when `REDIS_URL` is set, else the database), and, while the run goes on and a little after, in this
process's memory: a reader in the process that runs the turn (the socket or request that started it,
another tab on the same server) gets each token the moment it arrives, never polling a store. Every event
is numbered as it comes; tokens go to the store in batches, every `FLUSH_SECONDS` (a flusher thread), so
a long answer costs a few writes a second rather than one a token; any other event is written at once,
after the tokens before it. A reader resuming after any number gets exactly the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone

from config import news
from config.db import release_connection
from conversations import locks
from conversations.models import Conversation, TurnRun
from conversations.turns import log_stores
from conversations.turns.events import ENDINGS, EventType, TurnEvent
from conversations.turns.log_stores import Entry

logger = logging.getLogger("arbor.turns")

FLUSH_SECONDS = 0.1
POLL_SECONDS = log_stores.POLL_SECONDS
ORPHAN_SECONDS = 3
LOCAL_WAIT_SECONDS = 1.0
LOCAL_KEEP_SECONDS = 60  # a run's entries stay in memory this long after it ends (then readers use the store)

__all__ = ["Entry", "TurnLog", "follow", "forget_old", "latest_run", "read"]


class LocalRun:
    """A run this process writes: its entries in memory, a condition its threads wait on, and the events
    of async readers (a socket or stream here needs no thread to follow it)."""

    def __init__(self):
        self.entries: list[Entry] = []
        self.ended_at: float | None = None
        self.changed = threading.Condition()
        self._wakes: set[_Wake] = set()

    def add(self, entry: Entry) -> None:
        with self.changed:
            self.entries.append(entry)
            self._notify()

    def end(self) -> None:
        with self.changed:
            self.ended_at = time.monotonic()
            self._notify()

    def _notify(self) -> None:
        self.changed.notify_all()
        for wake in list(self._wakes):
            wake.soon()

    async def follow_async(self, after: int) -> AsyncIterator[list[Entry]]:
        """The entries after `after`, as they come: each time, all that have come since the last (a busy loop
        reads tokens in batches and sends each batch at once)."""
        wake = _Wake(asyncio.get_running_loop())
        with self.changed:
            self._wakes.add(wake)
            self._followers_changed()
        try:
            while True:
                wake.event.clear()  # before looking: a write after the look sets it again
                with self.changed:
                    found, ended = self.since(after), self.ended_at is not None
                batch, last = _through_ending(found)
                if batch:
                    yield batch
                if last or (ended and not found):
                    return
                if found:
                    after = found[-1][0]
                else:
                    await wake.event.wait()
        finally:
            with self.changed:
                self._wakes.discard(wake)
                self._followers_changed()

    def _followers_changed(self) -> None:
        """An async follower came or left (under `changed`)."""

    def follow(self, after: int, stop: threading.Event) -> Iterator[Entry]:
        while not stop.is_set():
            with self.changed:
                while not self.since(after) and self.ended_at is None and not stop.is_set():
                    self.changed.wait(LOCAL_WAIT_SECONDS)
                found, ended = self.since(after), self.ended_at is not None
            batch, last = _through_ending(found)
            yield from batch
            if last or (ended and not found):
                return
            if found:
                after = found[-1][0]

    def since(self, after: int) -> list[Entry]:
        return self.entries[max(0, after):]  # a run written here is numbered from 1, one entry each


class _Wake:
    """Wakes an async reader from the writer's thread: at most one wake waits in the reader's loop at a time
    (each is a write to the loop's pipe; under load, a token each for hundreds of readers was most of the
    loop's work, issue 13)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop, self.event = loop, asyncio.Event()
        self._pending = False

    def soon(self) -> None:
        if self._pending:  # one already waits: it finds every entry added before it runs
            return
        self._pending = True
        with contextlib.suppress(RuntimeError):  # that reader's loop is closed
            self.loop.call_soon_threadsafe(self._fire)

    def _fire(self) -> None:
        self._pending = False
        self.event.set()


def _through_ending(entries: list[Entry]) -> tuple[list[Entry], bool]:
    """`entries` up to the turn's ending, if one is among them (a reader stops there); and whether it was."""
    for i, (_, event) in enumerate(entries):
        if event.type in ENDINGS:
            return entries[:i + 1], True
    return entries, False


_local: dict[uuid.UUID, LocalRun] = {}
_local_lock = threading.Lock()


def _share(run_id: uuid.UUID) -> LocalRun:
    with _local_lock:
        _forget_ended()
        return _local.setdefault(run_id, LocalRun())


FORGET_EVERY_SECONDS = 1.0
_forgot_at = 0.0


def _forget_ended() -> None:
    """Drop the runs that ended more than LOCAL_KEEP_SECONDS ago (under `_local_lock`), at most once a
    FORGET_EVERY_SECONDS: a look walks every run kept, and at 60 turns a second that was thousands each turn."""
    global _forgot_at
    now = time.monotonic()
    if now - _forgot_at < FORGET_EVERY_SECONDS:
        return
    _forgot_at = now
    gone = [key for key, run in _local.items() if run.ended_at is not None and now - run.ended_at > LOCAL_KEEP_SECONDS]
    for key in gone:
        del _local[key]


class TurnLog:
    """The writer of one run's log, in the process that runs the turn."""

    def __init__(self, run_id: uuid.UUID, *, owner: int, after: int = 0):
        self.run_id = run_id
        self.owner = owner  # the run's (its conversation's), which its log rows name (issue 34)
        self.seq = after
        # A run started here is shared in memory with this process's readers; a log ended for a run whose
        # process died (recovery, `after` its last number) is only written to the store.
        self._local = _share(run_id) if after == 0 else None
        self._store = log_stores.store()
        self._unwritten: list[Entry] = []  # tokens numbered and shared here, not yet in the store
        self._written_at = time.monotonic()
        self._ended = False
        self._lock = threading.Lock()  # numbering and `_unwritten`: the turn's thread and the flusher
        self._write_lock = threading.Lock()  # store writes, one batch at a time, in order
        if self._local is not None:
            _flusher.watch(self)

    def append(self, event: TurnEvent) -> list[Entry]:
        """Log `event` and return its entry. A token is shared with readers here at once and written to the
        store with the next batch; any other event is written at once, after the tokens before it."""
        with self._lock:
            self.seq += 1
            entry = (self.seq, event)
            self._unwritten.append(entry)
        if event.type == EventType.TOKEN and self._local is not None:
            self._local.add(entry)
            return [entry]
        try:
            # An ending marks the run ended with its entry (a reader elsewhere that sees the run ended finds
            # it), before readers here see it (the run has ended once they have).
            self._write_out(ends=event.type in ENDINGS)
        except DatabaseError:
            if self._local is None:
                raise
            # The database is away: this process's readers still get the event (a turn's error says what
            # was recorded); readers elsewhere find the run orphaned and end.
            logger.exception("turn log %s: event %d kept in memory only", self.run_id, self.seq)
        finally:
            if self._local is not None:
                self._local.add(entry)
        return [entry]

    def due(self) -> bool:
        """Have tokens waited FLUSH_SECONDS (the flusher writes them)?"""
        return bool(self._unwritten) and time.monotonic() - self._written_at >= FLUSH_SECONDS

    def close(self) -> None:
        """The turn ended: write what waits and mark the run ended (its log is kept a while)."""
        _flusher.forget(self)
        try:
            self._write_out(ends=True)
        except DatabaseError:  # the database is away: the sweep ends the run for other readers later
            logger.exception("turn log %s: could not write its last entries or mark the run ended", self.run_id)
        finally:
            release_connection()
            if self._local is not None:
                self._local.end()

    def _write_out(self, *, ends: bool = False) -> None:
        """Write the entries waiting; `ends`: and mark the run ended, in the same statement where the store is
        the database (once: an ending event marks it, then `close` finds it marked)."""
        with self._write_lock:
            batch = self._taken()
            ends = ends and not self._ended
            if batch or ends:
                self._store.write([log_stores.Batch(self.run_id, self.owner, batch, ends)])
                self._ended = self._ended or ends

    def _taken(self) -> list[Entry]:
        """The entries waiting, taken to be written (under `_write_lock`: batches go to the store in order)."""
        with self._lock:
            batch, self._unwritten = self._unwritten, []
        self._written_at = time.monotonic()
        return batch


class _Flusher:
    """One thread per process that writes the tokens of its turns to the store, a batch at a time."""

    def __init__(self):
        self._logs: weakref.WeakSet[TurnLog] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def watch(self, log: TurnLog) -> None:
        with self._lock:
            self._logs.add(log)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="arbor-log-flusher", daemon=True)
                self._thread.start()

    def forget(self, log: TurnLog) -> None:
        with self._lock:
            self._logs.discard(log)

    def _run(self) -> None:
        while True:
            time.sleep(FLUSH_SECONDS)
            with self._lock:
                due = [log for log in self._logs if log.due()]
            stores: dict[int, list[TurnLog]] = {}  # one, but for a test that changes REDIS_URL meanwhile
            for log in due:
                stores.setdefault(id(log._store), []).append(log)
            for logs in stores.values():
                try:
                    _write_tokens(logs)
                except Exception:  # each turn's own next write meets the same trouble and reports it
                    logger.exception("turn logs %s: writing their tokens failed", [str(log.run_id) for log in logs])
                finally:
                    release_connection()


def _write_tokens(logs: list[TurnLog]) -> None:
    """The tokens waiting in each of `logs`, to the store in one write: one Redis pipeline or one statement for
    every run of the process (issue 34: a write a run, ten a second each, was 3,000 round trips a second at 300
    streams). Each log's write lock is held meanwhile, so its own next write follows this one."""
    with contextlib.ExitStack() as held:
        for log in logs:
            held.enter_context(log._write_lock)
        batches = [log_stores.Batch(log.run_id, log.owner, entries) for log in logs if (entries := log._taken())]
        if batches:
            logs[0]._store.write(batches)


_flusher = _Flusher()


def local_run(run_id: uuid.UUID) -> LocalRun | None:
    """The run's copy in this process's memory, if this process runs it (or ran it lately), or mirrors it."""
    return _local.get(run_id)


MIRROR_IDLE_SECONDS = 5  # a mirror nobody has followed this long stops reading


def mirrored(run_id: uuid.UUID, *, owner: int) -> LocalRun:
    """The run in this process's memory: its own copy if it runs here, else a mirror that one thread fills from
    the store (issue 34: one reader a run a process, whatever its followers; each used to poll the database
    itself, and 200 of them took the whole pool). The mirror reads while anyone follows it, and a little after."""
    with _local_lock:
        _forget_ended()
        run = _local.get(run_id)
        if run is None:
            run = _local[run_id] = _Mirror()
            threading.Thread(target=_fill, args=(run_id, owner, run), name="arbor-log-mirror", daemon=True).start()
        if isinstance(run, _Mirror):
            run.claimed()
        return run


class _Mirror(LocalRun):
    """A run of another process, as far as this process's one reader of it has read."""

    def __init__(self):
        super().__init__()
        self.unfollowed_since: float | None = None
        self.stopped = False  # the reader left because nobody followed

    def claimed(self) -> None:
        """Someone is about to follow (under `_local_lock`): the reader must not leave before they do."""
        with self.changed:
            self.unfollowed_since = None

    def _followers_changed(self) -> None:
        self.unfollowed_since = None if self._wakes else time.monotonic()

    def is_set(self) -> bool:
        """The reader's `stop`: nobody has followed it for MIRROR_IDLE_SECONDS."""
        with self.changed:
            self.stopped = self.stopped or self.idle()
            return self.stopped

    def idle(self) -> bool:
        return (not self._wakes and self.unfollowed_since is not None
                and time.monotonic() - self.unfollowed_since > MIRROR_IDLE_SECONDS)


def _fill(run_id: uuid.UUID, owner: int, mirror: _Mirror) -> None:
    """Read the run from the store into `mirror` until it ends, or nobody follows it (then it leaves memory)."""
    try:
        while True:
            mirror.stopped = False
            with contextlib.closing(follow_store(run_id, owner=owner, after=len(mirror.entries),
                                                 stop=mirror)) as entries:
                for entry in entries:
                    mirror.add(entry)
            with _local_lock, mirror.changed:
                if not mirror.stopped:
                    if not _through_ending(mirror.entries[-1:])[1]:
                        # The run died without its ending: the worker's sweep writes one later, which a follower
                        # resuming then must find in the store, not this copy's end (issue 34).
                        _local.pop(run_id, None)
                    break  # the run ended: the mirror is kept a while, as a run of this process is
                if mirror.idle():
                    _local.pop(run_id, None)  # the next follower starts a mirror afresh
                    break
                # someone came as it went idle: read on
    except Exception:  # the database is away: the followers end, and the next one reads again
        logger.exception("turn log %s: its mirror stopped reading", run_id)
        with _local_lock:
            _local.pop(run_id, None)
    finally:
        release_connection()
        mirror.end()


def read(run_id: uuid.UUID, *, owner: int, after: int = 0) -> list[Entry]:
    """`owner`'s run's events numbered above `after`, in order."""
    local = _local.get(run_id)
    if local is not None:
        with local.changed:
            return local.since(after)
    return log_stores.store().read(run_id, after, owner=owner)


def follow(run_id: uuid.UUID, *, owner: int, after: int = 0, stop: threading.Event | None = None
           ) -> Iterator[Entry]:
    """The run's events above `after`, then the new ones as they are written, until the turn's ending.

    A run written in this process is read from memory. Elsewhere, a run that ended without an ending, or
    whose lock has been gone for `ORPHAN_SECONDS` with nothing written (its process died, or its turn
    never began), ends the reading: a reader never follows a dead run for ever. A turn that ends gives its
    lock back just before it writes its ending, hence the grace. `stop` set ends it within a second."""
    stop = stop or threading.Event()
    local = _local.get(run_id)
    if local is not None:
        yield from local.follow(after, stop)
        return
    yield from follow_store(run_id, owner=owner, after=after, stop=stop)


def follow_store(run_id: uuid.UUID, *, owner: int, after: int, stop) -> Iterator[Entry]:
    """`follow` from the store, woken by news of the run (`config.news`) rather than asking again and again."""
    with news.Waiter(log_stores.LOG_NEWS, str(run_id)) as waiter:
        yield from _follow_store(run_id, owner, after, stop, waiter)


def _follow_store(run_id: uuid.UUID, owner: int, after: int, stop, waiter: news.Waiter) -> Iterator[Entry]:
    store = log_stores.store()
    lock_gone_since: float | None = None
    while not stop.is_set():
        entries = store.wait(run_id, after, waiter, owner=owner)
        batch, last = _through_ending(entries)
        yield from batch
        if last:
            return
        if entries:
            after, lock_gone_since = entries[-1][0], None
            continue
        run = locks.run_state(run_id, owner=owner)
        release_connection()
        if run is None:
            return
        ended_at, holds_lock = run
        if ended_at is not None and not store.read(run_id, after, owner=owner):
            return
        if not holds_lock:
            lock_gone_since = lock_gone_since or time.monotonic()
            if time.monotonic() - lock_gone_since > ORPHAN_SECONDS:
                return


def latest_run(conversation: Conversation) -> TurnRun | None:
    """The conversation's turn under way, or the one that ended within ARBOR_TURN_LOG_RETENTION_SECONDS."""
    since = timezone.now() - timedelta(seconds=settings.ARBOR_TURN_LOG_RETENTION_SECONDS)
    run = (TurnRun.objects.filter(owner_id=conversation.owner_id, conversation=conversation)
           .order_by("-started_at").first())
    if run is None or (run.ended_at is not None and run.ended_at < since):
        return None
    return run


def forget_old() -> int:
    """Delete the runs (and their logs) that ended more than the retention ago; return how many."""
    since = timezone.now() - timedelta(seconds=settings.ARBOR_TURN_LOG_RETENTION_SECONDS)
    deleted, _ = TurnRun.objects.filter(ended_at__lt=since).delete()
    return deleted
