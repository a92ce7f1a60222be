"""One question asked of several models at once (issue 33): one sibling branch per model from the same parent.

Each branch is a normal `Turn` (the one runner, R1) with its own model; they run concurrently, each in a thread
of its own with its own database connection, under the one turn lock the group took (T9): nothing else moves
the head until the last branch ends. No branch moves the head itself: when the last has ended, the group moves
it to where the first model's branch ended (its answer is the one the conversation goes on from, as for a single
turn), in the UPDATE that gives the lock back. So a process killed mid-group leaves the head where the question
was asked, as a single turn's would (`turns.recovery`). Choosing another answer is a switch (T8), which the tree
already knows how to do: the siblings are ordinary nodes with the same parent.

The group is run like a turn (`turns.detached`): its events are every branch's, each marked with its `model`,
and one ending, the first model's, carrying `answers` (each branch's model, node and how it ended). A branch's
own ending is not passed on: a reader of the run's log stops at the first ending it reads.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator

from django.conf import settings
from django.db import connections

from config.db import release_connection
from conversations import services
from conversations.models import Node
from conversations.turns import compaction
from conversations.turns.events import ENDINGS, EventType, TurnEvent
from conversations.turns.runner import Turn

_DONE = object()  # a branch's thread has ended


class SiblingTurns:
    """Several `Turn`s from one parent under one lock; run with `events()`, once."""

    def __init__(self, turns: list[Turn]):
        self.turns = turns
        self.lead = turns[0]
        self.lock = self.lead.lock
        self.conversation = self.lead.conversation
        self.model = self.lead.model
        self.stop_requested: Callable[[], bool] = lambda: False  # `turns.detached` sets it, as for a turn
        self._cancelled = threading.Event()
        self._started = False
        for turn in turns:
            turn.gives_back_lock = turn.moves_head = False
            turn.stop_requested = lambda: self._cancelled.is_set() or self.stop_requested()

    @property
    def nodes(self) -> list[int]:
        return [node for turn in self.turns for node in turn.nodes]

    @property
    def recorded(self) -> dict[int, Node]:
        return {pk: node for turn in self.turns for pk, node in turn.recorded.items()}

    def events(self) -> Iterator[TurnEvent]:
        if self._started:
            return
        self._started = True
        arrived: queue.Queue = queue.Queue()
        with self.lock:  # renewed while any branch runs; given back when the last has ended
            try:
                compacted = self._compact_once()
            except compaction.SummaryFailed as stopped:  # a stop during the summary: every question kept, stopped
                ending = self._ending({index: turn.stopped_before_call(stopped.error)
                                       for index, turn in enumerate(self.turns)})
                yield ending  # the lock went back with the head's move
                return
            threads = [threading.Thread(target=_drive, args=(index, turn, arrived), daemon=True,
                                        name=f"arbor-turn-{self.conversation.pk}-{index}")
                       for index, turn in enumerate(self.turns)]
            for thread in threads:
                thread.start()
            endings: dict[int, TurnEvent] = {}
            running = len(threads)
            release_connection()  # held by nobody while the branches run (a JSON request waits here)
            try:
                if compacted is not None:  # once every branch is on its way: a close now stops them, each recorded
                    yield compacted
                while running:
                    index, event = arrived.get()
                    if event is _DONE:
                        running -= 1
                    elif event.type in ENDINGS:
                        endings[index] = event
                    else:
                        yield TurnEvent(event.type, {**event.data, "model": self.turns[index].model})
            except BaseException:
                # Closed (a stop that closes the run) or broken: every branch ends as stopped, and records
                # itself so, before the lock goes back.
                self._cancelled.set()
                deadline = time.monotonic() + settings.ARBOR_TURN_LOCK_SECONDS
                for thread in threads:
                    thread.join(timeout=max(0.0, deadline - time.monotonic()))
                raise
            ending = self._ending(endings)
        yield ending

    def _compact_once(self) -> TurnEvent | None:
        """C1, C2 once for every branch, with the first model, when any branch's call would pass its threshold:
        the answers then hang below one root, siblings still (each branch compacting on its own would hang each
        below a root of its own). A summary that failed, or could not be made, leaves every branch where it was,
        and none tries again; a stop during it raises its `SummaryFailed`."""
        if not any(turn.would_compact() for turn in self.turns):
            return None
        done = self.lead.compact_first()
        for turn in self.turns:
            if done is not None:
                turn.starts_below(done.root)
            elif self.lead.summary_failed:
                turn.skip_compaction()
        if done is None:
            return None
        if done.root.compacted_from_id == self.conversation.head_id:  # as a single turn's: the head moves at once
            services.head_move_held(conversation=self.conversation, to=done.root.id, lock=self.lock)
        return TurnEvent(EventType.COMPACTION, {"node": done.root.id, "summary_call": done.summary_call,
                                                "compacted_from": done.root.compacted_from_id,
                                                "model": self.lead.model})

    def _ending(self, endings: dict[int, TurnEvent]) -> TurnEvent:
        """Move the head where the first model's branch ended, giving the lock back in the same UPDATE; return
        that branch's ending, with every branch's outcome (`answers`) and every node written."""
        # Every branch sent its ending: a `Turn` ends with one on every path, and `_drive` says when one broke.
        answers = [_outcome(turn, endings[index]) for index, turn in enumerate(self.turns)]
        lead = endings[0]
        data = {**lead.data, "model": self.lead.model, "nodes": self.nodes, "answers": answers}
        target = _head_after(lead)
        if target is not None:
            moved = services.head_move_held(conversation=self.conversation, to=target, lock=self.lock, release=True)
            if not moved.count:  # it outlived its lock and another turn took over: every node is kept
                return TurnEvent(EventType.ERROR, {**data, "code": "turn_superseded", "head": None,
                                                   "message": "This turn ran past its lock and another took over; "
                                                              "its answers are kept as branches."})
        return TurnEvent(lead.type, {**data, "head": self.conversation.head_id} if lead.type == EventType.ERROR
                         else data)


def _head_after(ending: TurnEvent) -> int | None:
    """Where a turn's head goes once it has ended so (`Turn`: answered, waiting, or failed unless it overflowed)."""
    if ending.type == EventType.DONE:
        return ending.data["head"]
    if ending.type == EventType.APPROVAL_REQUIRED:
        return ending.data["node"]
    if ending.data.get("code") in (Node.FailureReason.CONTEXT_OVERFLOW, "turn_superseded"):
        return None
    return ending.data.get("node")


def _drive(index: int, turn: Turn, arrived: queue.Queue) -> None:
    """Run branch `index` here, handing its events to the group; its connection is closed when it ends."""
    try:
        for event in turn.events():
            arrived.put((index, event))
    except Exception as error:  # the branch recorded itself failed (the runner does): the group says so
        arrived.put((index, TurnEvent(EventType.ERROR, {"code": "server_error", "message": repr(error),
                                                     "node": turn.nodes[-1] if turn.nodes else None})))
    finally:
        connections.close_all()
        arrived.put((index, _DONE))


def _outcome(turn: Turn, ending: TurnEvent) -> dict:
    """One branch as the group's ending lists it."""
    data = ending.data
    outcome = {"model": turn.model, "ending": ending.type.value, "answer": None, "error": None}
    if ending.type == EventType.DONE:
        return {**outcome, "node": data["head"], "answer": data["answer"]}
    if ending.type == EventType.APPROVAL_REQUIRED:
        return {**outcome, "node": data["node"]}
    return {**outcome, "node": data.get("node"), "error": {"code": data.get("code", "server_error"),
                                                           "message": data.get("message", "")}}

