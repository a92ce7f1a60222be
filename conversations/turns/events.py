"""The turn pipeline's vocabulary: the events a turn emits, and how it ended.

Every reader of a turn (the JSON API, the SSE stream, the WebSocket, playbook runs, the chat page's
script) reads these names and this outcome instead of re-deriving them from the last event's fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from conversations.errors import FAILURE_STATUS


class EventType(StrEnum):
    TOKEN = "token"  # {"text", "node"}
    TOOL_CALL = "tool_call"  # {"call_id", "name", "arguments", "node"}
    TOOL_RESULT = "tool_result"  # {"call_id", "name", "content", "is_error"}
    COMPACTION = "compaction"  # {"node", "summary_call", "compacted_from"}: compacted before this call (C2)
    APPROVAL_REQUIRED = "approval_required"  # {"node", "calls"}: the turn waits for a person (F3); ends it
    DONE = "done"  # {"answer", "head", "nodes"}: ends it
    ERROR = "error"  # {"code", "message", "node"?, "head"?, "nodes"?}: ends it


ENDINGS = frozenset({EventType.APPROVAL_REQUIRED, EventType.DONE, EventType.ERROR})


@dataclass(frozen=True)
class TurnEvent:
    type: EventType
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TurnOutcome:
    """How a turn ended: answered, waiting for an approval, or failed; and the HTTP status that says so."""

    ending: EventType
    head: int | None
    nodes: list[int]
    answer: str | None = None
    approval_required: list[dict[str, Any]] = field(default_factory=list)
    error: dict[str, Any] | None = None  # {"code", "message"}
    failed_node: int | None = None  # the node whose call failed, when one was recorded (F1, F2)
    answers: list[dict[str, Any]] | None = None  # issue 33: each model's branch, when several were asked at once

    @classmethod
    def of(cls, events: list[TurnEvent]) -> TurnOutcome:
        """The outcome of a finished turn's events (a turn waiting for approval rests on the waiting node)."""
        last = events[-1] if events else TurnEvent(EventType.ERROR, {"code": "server_error",
                                                                     "message": "the turn sent no event"})
        nodes = sorted({e.data["node"] for e in events if "node" in e.data} | set(last.data.get("nodes", [])))
        answers = last.data.get("answers")
        if last.type == EventType.DONE:
            return cls(EventType.DONE, head=last.data["head"], nodes=nodes, answer=last.data["answer"],
                       answers=answers)
        if last.type == EventType.APPROVAL_REQUIRED:
            return cls(EventType.APPROVAL_REQUIRED, head=last.data["node"], nodes=nodes,
                       approval_required=last.data["calls"], answers=answers)
        return cls(EventType.ERROR, head=last.data.get("head"), nodes=nodes, failed_node=last.data.get("node"),
                   error={"code": last.data.get("code", "server_error"), "message": last.data.get("message", "")},
                   answers=answers)

    @property
    def http_status(self) -> int:
        if self.ending == EventType.DONE:
            return 201
        if self.ending == EventType.APPROVAL_REQUIRED:
            return 202
        return FAILURE_STATUS.get(self.error["code"], 502)
