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
from dataclasses import dataclass, replace

from django.conf import settings
from django.utils import timezone

from config import news
from config.db import release_connection
from config.together import Together, together
from conversations.models import TurnLogEntry, TurnRun
from conversations.turns.events import EventType, TurnEvent

logger = logging.getLogger("arbor.turns")

Entry = tuple[int, TurnEvent]


@dataclass(frozen=True)
class Batch:
    """Entries of one run to keep, by its owner's id; `ends`: the run has ended, and says so with them."""

    run_id: uuid.UUID
    owner: int
    entries: list[Entry]
    ends: bool = False


POLL_SECONDS = 0.1  # a database reader's pace where news does not reach other processes (SQLite)
NEWS_WAIT_SECONDS = 1.0  # where it does (PostgreSQL's NOTIFY), a reader looks for itself this often
LOG_NEWS = "arbor_turn_log"  # the news channel a run's log grows on; the key is the run's id
REDIS_WAIT_SECONDS = 1.0  # a Redis reader blocks this long for news, then looks at the database too
REDIS_REST_SECONDS = 5.0


class DatabaseStore:
    """The embedded default: rows of `TurnLogEntry`; every process behind the database reads them."""

    def write(self, batches: list[Batch]) -> None:
        """Keep each batch's entries, and mark the runs that end ended with them: one statement on PostgreSQL for
        every run (the flusher writes all its runs' tokens at once: issue 34)."""
        with together() as writes:
            rows = [TurnLogEntry(run_id=batch.run_id, owner_id=batch.owner, seq=seq, type=event.type, data=event.data)
                    for batch in batches for seq, event in packed(batch.entries)]
            if rows:
                writes.insert_rows(rows)
            for batch in batches:
                if batch.ends:
                    _mark_ended(batch.run_id, batch.owner, writes)
                if batch.entries or batch.ends:
                    news.announce(LOG_NEWS, str(batch.run_id), writes=writes)  # readers elsewhere wake (issue 34)
        release_connection()  # the model goes on talking; no connection is held meanwhile

    def read(self, run_id: uuid.UUID, after: int, *, owner: int) -> list[Entry]:
        rows = list(TurnLogEntry.objects.filter(owner_id=owner, run_id=run_id, seq__gt=after).order_by("seq")
                    .values_list("seq", "type", "data"))
        release_connection()
        return unpacked([(seq, TurnEvent(EventType(kind), data)) for seq, kind, data in rows], after)

    def wait(self, run_id: uuid.UUID, after: int, waiter: news.Waiter | None = None, *, owner: int) -> list[Entry]:
        """What came after `after`, waiting for news of the run (or a moment) if nothing has yet."""
        entries = self.read(run_id, after, owner=owner)
        if not entries:
            if waiter is None:
                time.sleep(POLL_SECONDS)
            else:
                waiter.wait(NEWS_WAIT_SECONDS if news.pushes() else POLL_SECONDS)
        return entries



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

    def write(self, batches: list[Batch]) -> None:
        """Keep each batch's entries in Redis, all in one pipeline (in the database if Redis cannot take them);
        the runs that end are marked ended in the database once their entries are kept, and their streams kept for
        the retention only."""
        in_redis = [batch for batch in batches if batch.entries] if self._usable() else []
        if in_redis:
            try:
                pipe = self.client.pipeline(transaction=False)
                for batch in in_redis:
                    self._add(pipe, batch)
                pipe.execute()
            except self.errors as error:
                self._rest(error)
                in_redis = []
        kept = {id(batch) for batch in in_redis}  # with the retention set for those that end
        rest = [replace(batch, entries=[]) if id(batch) in kept else batch for batch in batches]
        if rest := [batch for batch in rest if batch.entries or batch.ends]:
            self.database.write(rest)
        for batch in batches:
            if batch.ends and id(batch) not in kept:
                self._expire(batch.run_id)

    def _add(self, pipe, batch: Batch) -> None:
        key = self.key(batch.run_id)
        for seq, event in packed(batch.entries):
            pipe.xadd(key, {"type": event.type, "data": json.dumps(event.data, ensure_ascii=False)}, id=f"{seq}-0")
        # Kept while the turn runs (a lease it renews with every event), then the retention, set with the last
        # entries (issue 34: a round trip of its own after them cost every turn one more).
        pipe.expire(key, self._retention() if batch.ends else self._retention() + 3600)

    def read(self, run_id: uuid.UUID, after: int, *, owner: int) -> list[Entry]:
        return self._with_database(run_id, after, self._redis_read(run_id, after, block=False), owner)

    def wait(self, run_id: uuid.UUID, after: int, waiter: news.Waiter | None = None, *, owner: int) -> list[Entry]:
        """Redis blocks until news (XREAD): `waiter` is not needed."""
        return self._with_database(run_id, after, self._redis_read(run_id, after, block=True), owner)

    def _expire(self, run_id: uuid.UUID) -> None:
        if self._usable():
            try:
                self.client.expire(self.key(run_id), self._retention())
            except self.errors as error:
                self._rest(error)

    @staticmethod
    def _retention() -> int:
        return max(1, int(settings.ARBOR_TURN_LOG_RETENTION_SECONDS))

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
        return unpacked([_entry(entry_id, fields) for entry_id, fields in found], after)

    def _with_database(self, run_id: uuid.UUID, after: int, entries: list[Entry] | None, owner: int) -> list[Entry]:
        """Redis's entries when they follow on from `after`; else (Redis failed, showed a gap or had
        nothing) merged with the database's: entries written there while Redis was away."""
        if entries and _contiguous(after, entries):
            return entries
        merged = dict(entries or [])
        for seq, event in self.database.read(run_id, after, owner=owner):
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


def _mark_ended(run_id: uuid.UUID, owner: int, writes: Together) -> None:
    writes.update(TurnRun.objects.filter(owner_id=owner, pk=run_id, ended_at__isnull=True), ended_at=timezone.now())


def packed(entries: list[Entry]) -> list[Entry]:
    """Each run of one node's tokens as one entry numbered by its last token, `{"node", "texts"}`: a turn's
    hundred tokens are one row or stream entry, not a hundred (issue 13: writing them one by one cost a
    turn about 15 ms and most of its server CPU). Every token keeps its own number (`unpacked`)."""
    out: list[Entry] = []
    for seq, event in entries:
        if event.type == EventType.TOKEN:
            last = out[-1] if out else None
            if (last is not None and last[1].type == EventType.TOKEN and last[0] == seq - 1
                    and last[1].data["node"] == event.data["node"]):
                last[1].data["texts"].append(event.data["text"])
                out[-1] = (seq, last[1])
                continue
            event = TurnEvent(EventType.TOKEN, {"node": event.data["node"], "texts": [event.data["text"]]})
        out.append((seq, event))
    return out


def unpacked(entries: list[Entry], after: int) -> list[Entry]:
    """Stored entries as the numbered events they hold, those after `after` only (a packed entry is found
    by its last number, and may begin at or before `after`)."""
    out: list[Entry] = []
    for seq, event in entries:
        texts = event.data.get("texts") if event.type == EventType.TOKEN else None
        if texts is None:
            out.append((seq, event))
            continue
        first = seq - len(texts) + 1
        out += [(first + i, TurnEvent(EventType.TOKEN, {"text": text, "node": event.data["node"]}))
                for i, text in enumerate(texts) if first + i > after]
    return out


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

