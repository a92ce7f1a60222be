"""A turn runs apart from the client that asked for it (issue 12).

`start` gives a turn its run (the key of its numbered event log); `run` is the one place a turn runs with
its log: it writes every event there and checks for a stop asked through the database, so any process
and any tab can ask one. Clients read what `run` yields, or the log itself (`log.follow`, from any
process); one that leaves never cancels the turn: the thread running it goes on to the end
(`streaming.events_in_thread(..., detach=True)`), or a thread of its own does (`launch`).

The lock makes a turn run once: it is taken before `start`, and a run's id is the lock's token.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator

from django.db import connections

from config.db import release_connection
from conversations.models import TurnRun
from conversations.turns.events import EventType, TurnEvent
from conversations.turns.log import Entry, TurnLog
from conversations.turns.runner import Turn

logger = logging.getLogger("arbor.turns")

STOP_CHECK_SECONDS = 0.5


def start(turn: Turn) -> uuid.UUID:
    """Open `turn`'s run: from now on `GET …/stream/` finds it. Return its id."""
    return TurnRun.objects.create(id=turn.lock.token, conversation=turn.conversation).pk


def launch(turn: Turn) -> uuid.UUID:
    """Start `turn` in a thread of its own; return its run id."""
    run_id = start(turn)
    run_apart(turn, run_id)
    return run_id


def run_apart(turn: Turn, run_id: uuid.UUID) -> None:
    """Run a started turn to its end in a thread of its own (its client left before reading it)."""

    def work() -> None:
        try:
            for _ in run(turn, run_id):
                pass
        finally:
            connections.close_all()

    threading.Thread(target=work, name=f"arbor-turn-{turn.conversation.pk}", daemon=True).start()


def run(turn: Turn, run_id: uuid.UUID) -> Iterator[Entry]:
    """Run `turn` here, logging its events; yield each as it is logged, numbered."""
    log = TurnLog(run_id)
    turn.stop_requested = _stop_check(run_id)
    events = turn.events()
    try:
        for event in events:
            yield from log.append(event)
    except Exception as error:  # a bug, or the log could not be written (the database is away)
        logger.exception("turn %s failed", run_id)
        with contextlib.suppress(Exception):
            events.throw(error)  # the turn records itself failed/interrupted (never "stopped by the user")
        yield from log.append(TurnEvent(EventType.ERROR, {"code": "server_error",
                                                          "message": str(error) or repr(error)}))
    finally:
        events.close()
        ending = log.close()  # written even when this reader is closed early; then nothing more is yielded
    yield from ending


def request_stop(conversation_id: int) -> bool:
    """Ask the conversation's running turn to stop; False if none runs."""
    return bool(TurnRun.objects.filter(conversation_id=conversation_id, ended_at__isnull=True)
                .update(stop_requested=True))


def running_run(conversation_id: int) -> uuid.UUID | None:
    """The run of the turn under way on the conversation, if one is."""
    return (TurnRun.objects.filter(conversation_id=conversation_id, ended_at__isnull=True)
            .order_by("-started_at").values_list("pk", flat=True).first())


def running(conversation_id: int) -> bool:
    """Whether a turn runs on the conversation now (a stop waits for this)."""
    return TurnRun.objects.filter(conversation_id=conversation_id, ended_at__isnull=True).exists()


def _stop_check(run_id: uuid.UUID) -> Callable[[], bool]:
    """Whether a stop was asked for the run: read from the database at most every STOP_CHECK_SECONDS (the
    turn asks on every token and every quarter second of a silent call)."""
    state = {"checked_at": 0.0, "asked": False}

    def asked() -> bool:
        if not state["asked"] and time.monotonic() - state["checked_at"] >= STOP_CHECK_SECONDS:
            state["checked_at"] = time.monotonic()
            state["asked"] = TurnRun.objects.filter(pk=run_id, stop_requested=True).exists()
            release_connection()
        return state["asked"]

    return asked
