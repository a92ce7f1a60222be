"""A turn runs apart from the client that asked for it (issue 12).

`run` is the one place a turn runs: it writes every event to the run's numbered log (`log.TurnLog`) and
checks for a stop asked through the database, so any process and any tab can ask one. `launch` runs a
turn in a thread of its own and gives back its run's id: clients then read the log (`log.follow`), the
one that started the turn as any other, so one that leaves never cancels it. `run_here` runs one in the
caller's thread (a JSON request, a playbook run) and gives back its events.

The lock makes a turn run once: it is taken before `start`, and a run's id is the lock's token.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator

from django.conf import settings
from django.db import DatabaseError, connections
from django.db.models import QuerySet

from config import news
from config.db import release_connection
from config.together import together
from conversations.models import Conversation, TurnRun
from conversations.turns.events import EventType, TurnEvent
from conversations.turns.log import Entry, TurnLog
from conversations.turns.runner import Turn

logger = logging.getLogger("arbor.turns")

STOP_CHECK_SECONDS = 5.0  # a running turn looks for a stop this often without news of one


RUN_NEWS = "arbor_turn_runs"  # the news channel a run starts on; the key is its conversation's id
STOP_NEWS = "arbor_turn_stops"  # the news channel a stop is asked on; the key is the conversation's id


def start(turn: Turn) -> uuid.UUID:
    """Open `turn`'s run: from now on `GET …/stream/` finds it, and every open tab of the conversation is told
    (`config.news`; issue 34: they used to ask every half second). Return its id."""
    with together() as writes:  # the news goes in the INSERT's own statement (PostgreSQL)
        writes.insert(TurnRun(id=turn.lock.token, conversation=turn.conversation,
                              owner_id=turn.conversation.owner_id))
        news.announce(RUN_NEWS, str(turn.conversation.pk), writes=writes)
    return turn.lock.token


def launch(turn: Turn) -> uuid.UUID:
    """Start `turn` in a thread of its own; return its run id (follow it with `log.follow`)."""
    run_id = start(turn)
    # Before the thread: a reader that follows the id at once finds it in memory.
    log = TurnLog(run_id, owner=turn.conversation.owner_id)

    def work() -> None:
        try:
            for _ in run(turn, run_id, log=log):
                pass
        finally:
            connections.close_all()

    threading.Thread(target=work, name=f"arbor-turn-{turn.conversation.pk}", daemon=True).start()
    return run_id


def run_here(turn: Turn, report: Callable[[TurnEvent], None] | None = None) -> list[TurnEvent]:
    """Run `turn` in this thread, logged like any other; return its events, each given to `report` as it comes
    (a playbook run's page watches them)."""
    events = []
    for _, event in run(turn, start(turn)):
        events.append(event)
        if report is not None:
            report(event)
    return events


def run(turn: Turn, run_id: uuid.UUID, *, log: TurnLog | None = None) -> Iterator[Entry]:
    """Run `turn` here, logging its events; yield each as it is logged, numbered."""
    log = log or TurnLog(run_id, owner=turn.conversation.owner_id)
    stop_check = _StopCheck(run_id, owner=turn.conversation.owner_id, conversation_id=turn.conversation.pk)
    turn.stop_requested = stop_check.check
    events = turn.events()
    try:
        for event in events:
            yield from log.append(event)
    except Exception as error:  # a bug, or the database went away
        logger.exception("turn %s failed", run_id)
        with contextlib.suppress(Exception):
            events.throw(error)  # the turn records itself failed/interrupted (never "stopped by the user")
        yield from log.append(TurnEvent(EventType.ERROR, failure(turn, error)))
    finally:
        events.close()
        stop_check.close()
        log.close()  # even when this reader is closed early


def failure(turn: Turn, error: Exception) -> dict:
    """The `error` event of a turn that broke off: what it was, and what of the turn is recorded (a
    client must never read "nothing changed" when a node was written)."""
    outage = isinstance(error, DatabaseError)
    code = "unavailable" if outage else "server_error"
    cause = "The database could not be reached" if outage else f"The server failed ({error!r})"
    if not turn.nodes:
        return {"code": code, "message": f"{cause}; no node of this turn was recorded.", "node": None}
    nodes = ", ".join(map(str, turn.nodes))
    return {"code": code, "node": turn.nodes[-1],
            "message": f"{cause} during the turn. Recorded: node(s) {nodes}, with the answer's text as "
                       f"last saved; a call left pending is marked interrupted (with that text, and Retry) "
                       f"within {settings.ARBOR_TURN_LOCK_SECONDS} s of the database being back."}


def _under_way(conversation: Conversation) -> QuerySet[TurnRun]:
    return TurnRun.objects.filter(owner_id=conversation.owner_id, conversation=conversation, ended_at__isnull=True)


def request_stop(conversation: Conversation) -> bool:
    """Ask the conversation's running turn to stop, and tell it (`_StopCheck`); False if none runs."""
    if not _under_way(conversation).update(stop_requested=True):
        return False
    news.announce(STOP_NEWS, str(conversation.pk))  # after the update has committed (autocommit)
    return True


def running_run(conversation: Conversation) -> uuid.UUID | None:
    """The run of the turn under way on the conversation, if one is."""
    return _under_way(conversation).order_by("-started_at").values_list("pk", flat=True).first()


def running(conversation: Conversation) -> bool:
    """Whether a turn runs on the conversation now (a stop waits for this)."""
    return _under_way(conversation).exists()


class _StopCheck:
    """Whether a stop was asked for the run (`check()`; the turn asks on every token and every quarter second of
    a silent call). A stop is news (issue 34): the check reads the database when news of one came for the
    conversation, and otherwise only every STOP_CHECK_SECONDS, for a stop whose news was lost. It polled every
    half second: at 300 streams, 600 queries a second that found nothing. `close()` when the run ends."""

    def __init__(self, run_id: uuid.UUID, *, owner: int, conversation_id: int):
        self._run_id, self._owner = run_id, owner
        self._asked = False
        self._checked_at = time.monotonic()  # first looked for after STOP_CHECK_SECONDS: a quick turn asks nothing
        self._news = threading.Event()
        self._unsubscribe = news.subscribe(STOP_NEWS, str(conversation_id), self._news.set)

    def check(self) -> bool:
        if not self._asked and (self._news.is_set() or time.monotonic() - self._checked_at >= STOP_CHECK_SECONDS):
            self._news.clear()
            self._checked_at = time.monotonic()
            self._asked = TurnRun.objects.filter(owner_id=self._owner, pk=self._run_id, stop_requested=True).exists()
            release_connection()
        return self._asked

    def close(self) -> None:
        self._unsubscribe()
