"""A turn's events, numbered and kept a while after it ends, so any client in any process can follow it
and pick it up again where it lost it (issue 12).

The process running the turn writes (`TurnLog`); readers ask for what came after the last number they
saw (`read`, `follow`). The log lives in the database: it needs no extra service, and every web process
behind the database reads the same one. Tokens are merged and written at most every `FLUSH_SECONDS`,
so a long answer costs a few rows a second rather than a row a token; a merged event is one numbered
event, so a reader resuming after any number gets exactly the rest.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from config.db import release_connection
from conversations.models import TurnLogEntry, TurnRun
from conversations.turns.events import ENDINGS, EventType, TurnEvent

FLUSH_SECONDS = 0.1
POLL_SECONDS = 0.1
ORPHAN_SECONDS = 3

Entry = tuple[int, TurnEvent]


class TurnLog:
    """The writer of one run's log, in the process that runs the turn."""

    def __init__(self, run_id: uuid.UUID, *, after: int = 0):
        self.run_id = run_id
        self.seq = after  # a log ended by another process (recovery) goes on from its last number
        self._tokens: list[str] = []
        self._token_node: int | None = None
        self._flushed_at = time.monotonic()

    def append(self, event: TurnEvent) -> list[Entry]:
        """Log `event`; return the entries written now (a token may wait to be merged with the next ones)."""
        if event.type == EventType.TOKEN and self._token_node in (None, event.data["node"]):
            self._tokens.append(event.data["text"])
            self._token_node = event.data["node"]
            return self.flush() if time.monotonic() - self._flushed_at >= FLUSH_SECONDS else []
        written = self.flush()
        if event.type == EventType.TOKEN:  # a new node's first token
            return written + self.append(event)
        return [*written, self._write(event)]

    def flush(self) -> list[Entry]:
        self._flushed_at = time.monotonic()
        if not self._tokens:
            return []
        merged = TurnEvent(EventType.TOKEN, {"text": "".join(self._tokens), "node": self._token_node})
        self._tokens, self._token_node = [], None
        return [self._write(merged)]

    def close(self) -> list[Entry]:
        """The turn ended: write what is buffered and mark the run ended (its log is kept a while)."""
        written = self.flush()
        TurnRun.objects.filter(pk=self.run_id).update(ended_at=timezone.now())
        release_connection()
        return written

    def _write(self, event: TurnEvent) -> Entry:
        self.seq += 1
        TurnLogEntry.objects.create(run_id=self.run_id, seq=self.seq, type=event.type, data=event.data)
        release_connection()  # the model goes on talking; no connection is held meanwhile
        return self.seq, event


def read(run_id: uuid.UUID, *, after: int = 0) -> list[Entry]:
    """The run's events numbered above `after`, in order."""
    rows = TurnLogEntry.objects.filter(run_id=run_id, seq__gt=after).order_by("seq").values_list(
        "seq", "type", "data")
    return [(seq, TurnEvent(EventType(kind), data)) for seq, kind, data in rows]


def follow(run_id: uuid.UUID, *, after: int = 0, sleep: Callable[[float], None] = time.sleep
           ) -> Iterator[Entry]:
    """The run's events above `after`, then the new ones as they are written, until the turn's ending.

    A run that ended without one, or whose lock has been gone for `ORPHAN_SECONDS` with nothing written
    (its process died, or its turn never began), ends the reading: a reader never follows a dead run
    for ever. A turn that ends gives its lock back just before it writes its ending, hence the grace."""
    lock_gone_since: float | None = None
    while True:
        entries = read(run_id, after=after)
        for entry in entries:
            yield entry
            if entry[1].type in ENDINGS:
                return
        if entries:
            after, lock_gone_since = entries[-1][0], None
            continue
        run = TurnRun.objects.filter(pk=run_id).values("ended_at", "conversation__turn_token").first()
        release_connection()
        if run is None or (run["ended_at"] is not None and not read(run_id, after=after)):
            return
        if run["conversation__turn_token"] != run_id:
            lock_gone_since = lock_gone_since or time.monotonic()
            if time.monotonic() - lock_gone_since > ORPHAN_SECONDS:
                return
        sleep(POLL_SECONDS)


def latest_run(conversation_id: int) -> TurnRun | None:
    """The conversation's turn under way, or the one that ended within ARBOR_TURN_LOG_RETENTION_SECONDS."""
    since = timezone.now() - timedelta(seconds=settings.ARBOR_TURN_LOG_RETENTION_SECONDS)
    run = TurnRun.objects.filter(conversation_id=conversation_id).order_by("-started_at").first()
    if run is None or (run.ended_at is not None and run.ended_at < since):
        return None
    return run


def forget_old() -> int:
    """Delete the runs (and their logs) that ended more than the retention ago; return how many."""
    since = timezone.now() - timedelta(seconds=settings.ARBOR_TURN_LOG_RETENTION_SECONDS)
    deleted, _ = TurnRun.objects.filter(ended_at__lt=since).delete()
    return deleted
