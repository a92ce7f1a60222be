"""A model call beside the conversation: recorded as a node like every call (T1, T3), never moving the head.

Titles, summarising calls (compaction) and playbook conversions use it; its node hangs below the node
whose context it read, so the admin shows it where it happened, and `can_be_head` keeps it off every
branch a person can switch to.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.db import connection
from django.utils import timezone

from conversations import budget, llm
from conversations import items as it
from conversations.context import PathNode
from conversations.models import Conversation, Node
from conversations.selectors import path_node


@dataclass(frozen=True)
class SideCall:
    node: Node
    result: llm.CallResult | None  # None: the call failed; `node` says why

    def path_node(self) -> PathNode:
        """The call as the last node of a path, so a follow-up call can hang below it."""
        return path_node(self.node)


def run_side_call(*, conversation: Conversation | None, parent: PathNode | None, kind: str, sent: list[it.Item],
                  messages: list[dict], model: str, instructions: str = "", keep_ephemeral: bool = False,
                  keep_alive: Callable[[], None] = lambda: None, **call_options) -> SideCall:
    """Record a pending node, make the call (`call_options` go to `llm.stream_call`), record how it ended.

    Only the node's own row is written. `keep_alive` runs as tokens arrive (a turn lock's renewer). The
    node never stays pending: a failure, a bug or a closed turn (cancelled) is recorded before it goes on.
    """
    provider = llm.provider_of(model)
    tokens = budget.items_tokens(sent, model=model, provider=provider)
    node = Node.objects.create(
        parent_id=parent.id if parent else None, conversation=conversation, kind=kind, status=Node.Status.PENDING,
        sent=sent, provider=provider, model=model, instructions=instructions, keep_ephemeral=keep_ephemeral,
        tokens=tokens,
        path_tokens=(parent.stored_path_tokens if parent else 0) + tokens,
    )
    release_connection()
    stream = llm.stream_call(model=model, messages=messages, **call_options)
    try:
        result = _consume(stream, keep_alive)
    except llm.LLMError as error:
        _finish(node, status=Node.Status.FAILED, reason=error.reason, message=error.message, received=error.partial)
        return SideCall(node=node, result=None)
    except BaseException as error:
        stream.close()
        reason = Node.FailureReason.CANCELLED if isinstance(error, GeneratorExit) else Node.FailureReason.INTERRUPTED
        _finish(node, status=Node.Status.FAILED, reason=reason, message=f"the call stopped: {error!r}")
        raise
    received_tokens = budget.items_tokens(result.received, model=model, provider=result.provider)
    node.tokens += received_tokens
    node.path_tokens += received_tokens
    node.usage = result.usage
    node.provider, node.model = result.provider, result.model
    _finish(node, status=Node.Status.SUCCEEDED, received=result.received,
            extra=["usage", "tokens", "path_tokens", "provider", "model"])
    return SideCall(node=node, result=result)


def release_connection() -> None:
    """No database connection is held while a model thinks: back to the pool, checked out again later."""
    if not connection.in_atomic_block:
        connection.close()


def _consume(stream, keep_alive: Callable[[], None]) -> llm.CallResult:
    while True:
        try:
            next(stream)
        except StopIteration as stop:
            return stop.value
        keep_alive()


def _finish(node: Node, *, status: str, reason: str = "", message: str = "", received: list | None = None,
            extra: list[str] | None = None) -> None:
    node.status, node.failure_reason, node.failure_message = status, reason, message
    node.received = received or []
    node.finished_at = timezone.now()
    node.save(update_fields=["status", "failure_reason", "failure_message", "received", "finished_at", *(extra or [])])
