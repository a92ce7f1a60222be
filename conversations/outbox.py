"""The outbox (R4): work after the commit, queued in the turn's own transaction; each kind's handler is a module
of `jobs/`.

An app adds a kind with `register`; a kind registered `after_turn` is queued by every committed turn (and
import) through `enqueue_after_turn`. This app registers `title` (`jobs/title.py`); the search app registers
`index` and `embed`. The worker (`jobs/worker.py`) runs them at least once, so every handler is idempotent.

A sweep (`register_sweep`) is background work no turn queues (embedding what a new embedding model has not
seen): the worker calls it when it starts and every `every_seconds`, and again at once while it finds work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from config.together import Together, Written, together
from conversations.models import OutboxJob

Handler = Callable[[dict[str, Any]], None]

_handlers: dict[str, Handler] = {}
_after_turn: list[str] = []
_sweeps: dict[str, tuple[Callable[[], bool], float]] = {}


def register(kind: str, handler: Handler, *, after_turn: bool = False) -> None:
    _handlers[kind] = handler
    if after_turn and kind not in _after_turn:
        _after_turn.append(kind)


def register_sweep(name: str, sweep: Callable[[], bool], *, every_seconds: float) -> None:
    """`sweep()` does a share of background work and says whether there was any."""
    _sweeps[name] = (sweep, every_seconds)


def sweeps() -> dict[str, tuple[Callable[[], bool], float]]:
    return dict(_sweeps)


def payload_nodes(payload: dict[str, Any]) -> list[int] | None:
    """The nodes an after-turn job's turn wrote (None: look at the whole conversation). A bad value is an error
    of the job, retried and then kept failed, as a bad conversation id is."""
    nodes = payload.get("nodes")
    return None if nodes is None else [int(node) for node in nodes]


def handler_for(kind: str) -> Handler | None:
    return _handlers.get(kind)


def enqueue(*, kind: str, payload: dict[str, Any]) -> OutboxJob:
    """Queue one job; called inside the caller's transaction so it commits (or not) with its data."""
    return OutboxJob.objects.create(kind=kind, payload=payload)


def enqueue_after_turn(*, conversation_id: int, head: int | None, nodes: list[int] | None = None,
                       writes: Together | None = None, when: Written | None = None) -> None:
    """Queue every after-turn kind for a conversation whose turn (or import) just committed; with `writes`,
    in that batch (only if `when` wrote a row). `nodes`: the nodes the turn wrote, whose bubbles are all a job
    need look at (`payload_nodes`); None (an import, a recovered turn): the whole conversation."""
    payload: dict[str, Any] = {"conversation": conversation_id, "head": head}
    if nodes is not None:
        payload["nodes"] = list(nodes)
    with together(writes) as batch:
        for kind in _after_turn:
            batch.insert(OutboxJob(kind=kind, payload=payload), when=when)
