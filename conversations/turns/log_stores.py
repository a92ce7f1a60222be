"""Where a turn's numbered events are kept for readers in other processes (issue 12): the database, or
Redis Streams when `REDIS_URL` is set.

With Redis an entry goes to the run's stream (its id is `<seq>-0`, so a reader asks Redis for what came
after its number); one Redis could not take goes to the database instead, and Redis is left alone for
`REDIS_REST_SECONDS` rather than each token waiting on a dead connection. A reader takes Redis's entries
while they run on from its number without a gap, and asks the database as well when Redis fails, shows a
gap, or has had nothing for a while: a turn's stream goes on while Redis is down or restarted, and no
socket or stream is closed for it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid

from django.conf import settings

from config.db import release_connection
from conversations.models import TurnLogEntry
from conversations.turns.events import EventType, TurnEvent

logger = logging.getLogger("arbor.turns")

Entry = tuple[int, TurnEvent]

POLL_SECONDS = 0.1  # a database reader's pace
REDIS_WAIT_SECONDS = 1.0  # a Redis reader blocks this long for news, then looks at the database too
REDIS_REST_SECONDS = 5.0


class DatabaseStore:
    """The embedded default: rows of `TurnLogEntry`; every process behind the database reads them."""

    def write(self, run_id: uuid.UUID, entries: list[Entry]) -> None:
        TurnLogEntry.objects.bulk_create([TurnLogEntry(run_id=run_id, seq=seq, type=event.type, data=event.data)
                                          for seq, event in entries])
        release_connection()  # the model goes on talking; no connection is held meanwhile

    def read(self, run_id: uuid.UUID, after: int) -> list[Entry]:
        rows = list(TurnLogEntry.objects.filter(run_id=run_id, seq__gt=after).order_by("seq")
                    .values_list("seq", "type", "data"))
        release_connection()
        return [(seq, TurnEvent(EventType(kind), data)) for seq, kind, data in rows]

    def wait(self, run_id: uuid.UUID, after: int) -> list[Entry]:
        """What came after `after`, waiting a moment if nothing has yet."""
        entries = self.read(run_id, after)
        if not entries:
            time.sleep(POLL_SECONDS)
        return entries

    def ended(self, run_id: uuid.UUID) -> None:
        """The run's entries go with its `TurnRun` row (`log.forget_old`)."""


class RedisStore:
    """Redis Streams, with the database behind it for whatever Redis could not take."""

    def __init__(self, url: str):
        import redis  # only when REDIS_URL is set

        self.errors = (redis.RedisError, OSError)
        # Blocking reads wait REDIS_WAIT_SECONDS; the socket waits a little longer before it gives up.
        self.client = redis.Redis.from_url(url, socket_timeout=REDIS_WAIT_SECONDS + 2, socket_connect_timeout=1,
                                           retry_on_timeout=False)
        self.database = DatabaseStore()
        self._resting_until = 0.0
        self._rest_lock = threading.Lock()

    @staticmethod
    def key(run_id: uuid.UUID) -> str:
        return f"arbor:turn-log:{run_id}"

    def write(self, run_id: uuid.UUID, entries: list[Entry]) -> None:
        if self._usable():
            try:
                pipe = self.client.pipeline(transaction=False)
                for seq, event in entries:
                    fields = {"type": event.type, "data": json.dumps(event.data, ensure_ascii=False)}
                    pipe.xadd(self.key(run_id), fields, id=f"{seq}-0")
                # Kept while the turn runs (a lease it renews with every event), then the retention.
                pipe.expire(self.key(run_id), int(settings.ARBOR_TURN_LOG_RETENTION_SECONDS) + 3600)
                pipe.execute()
                return
            except self.errors as error:
                self._rest(error)
        self.database.write(run_id, entries)

    def read(self, run_id: uuid.UUID, after: int) -> list[Entry]:
        return self._with_database(run_id, after, self._redis_read(run_id, after, block=False))

    def wait(self, run_id: uuid.UUID, after: int) -> list[Entry]:
        return self._with_database(run_id, after, self._redis_read(run_id, after, block=True))

    def ended(self, run_id: uuid.UUID) -> None:
        if self._usable():
            try:
                self.client.expire(self.key(run_id), max(1, int(settings.ARBOR_TURN_LOG_RETENTION_SECONDS)))
            except self.errors as error:
                self._rest(error)

    def _redis_read(self, run_id: uuid.UUID, after: int, *, block: bool) -> list[Entry] | None:
        """Redis's entries after `after`; None when Redis cannot be asked."""
        if not self._usable():
            if block:
                time.sleep(POLL_SECONDS)
            return None
        try:
            if block:
                answer = self.client.xread({self.key(run_id): f"{after}-0"},
                                           block=int(REDIS_WAIT_SECONDS * 1000))
                found = answer[0][1] if answer else []
            else:
                found = self.client.xrange(self.key(run_id), min=f"({after}-0")
        except self.errors as error:
            self._rest(error)
            return None
        return [_entry(entry_id, fields) for entry_id, fields in found]

    def _with_database(self, run_id: uuid.UUID, after: int, entries: list[Entry] | None) -> list[Entry]:
        """Redis's entries when they follow on from `after`; else (Redis failed, showed a gap or had
        nothing) merged with the database's: entries written there while Redis was away."""
        if entries and _contiguous(after, entries):
            return entries
        merged = dict(entries or [])
        for seq, event in self.database.read(run_id, after):
            merged.setdefault(seq, event)
        return sorted(merged.items())

    def _usable(self) -> bool:
        return time.monotonic() >= self._resting_until

    def _rest(self, error: Exception) -> None:
        with self._rest_lock:
            if self._usable():
                logger.warning("Redis is unreachable (%s): turn logs use the database for %.0f s",
                               error, REDIS_REST_SECONDS)
            self._resting_until = time.monotonic() + REDIS_REST_SECONDS


def _contiguous(after: int, entries: list[Entry]) -> bool:
    return all(seq == after + i for i, (seq, _) in enumerate(entries, start=1))


def _entry(entry_id: bytes, fields: dict[bytes, bytes]) -> Entry:
    seq = int(_text(entry_id).split("-")[0])
    return seq, TurnEvent(EventType(_text(fields[b"type"])), json.loads(fields[b"data"]))


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


_store: DatabaseStore | RedisStore | None = None
_store_lock = threading.Lock()


def store() -> DatabaseStore | RedisStore:
    """The process's store, chosen once from `REDIS_URL`."""
    global _store
    with _store_lock:
        if _store is None:
            _store = RedisStore(settings.REDIS_URL) if settings.REDIS_URL else DatabaseStore()
        return _store


def reset() -> None:
    """Forget the chosen store (tests that change `REDIS_URL`)."""
    global _store
    with _store_lock:
        _store = None

