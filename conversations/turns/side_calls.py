"""A recorded call beside the conversation: a title (R4), a summary (C1), a playbook's draft or try.

Its node hangs below the node whose context it read, so the admin shows it where it happened, and it never
moves the head (`can_be_head` keeps it off every branch a person can switch to). It is read like a turn's
round (`ModelCall`), so a stop asked while it runs (a person's Stop during an automatic compaction) ends it at
once instead of waiting for the summary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from config.db import release_connection
from conversations import items as it
from conversations import llm
from conversations.context import PathNode
from conversations.models import Conversation, Node
from conversations.selectors import path_node
from conversations.turns import records
from conversations.turns.model_call import ModelCall


@dataclass(frozen=True)
class SideCall:
    node: Node
    result: llm.CallResult | None  # None: the call failed or was stopped; `error` says why
    error: llm.LLMError | None = None

    def path_node(self) -> PathNode:
        """The call as the last node of a path, so a follow-up call can hang below it."""
        return path_node(self.node)


def run_side_call(*, conversation: Conversation | None, parent: PathNode | None, kind: str, sent: list[it.Item],
                  messages: list[dict], model: str, instructions: str = "", keep_ephemeral: bool = False,
                  on_token: Callable[[str], None] | None = None, stop_requested: Callable[[], bool] | None = None,
                  **call_options) -> SideCall:
    """Record a pending node, make the call (`call_options` go to `llm.stream_call`), record how it ended.

    Only the node's own row is written. The node never stays pending: a failure, a stop, a bug or a closed
    caller (cancelled) is recorded before it goes on. `on_token` sees the answer's text as it streams (a
    playbook's draft shown as it is written); `stop_requested` is asked while it streams or is silent.
    """
    node = records.start(conversation=conversation, parent=parent, kind=kind, sent=sent, model=model,
                         instructions=instructions, keep_ephemeral=keep_ephemeral)
    release_connection()
    call = ModelCall(llm.stream_call(model=model, messages=messages, **call_options), stop_requested=stop_requested)
    try:
        for token in call.tokens():
            if on_token is not None:
                on_token(token)
    except llm.LLMError as error:
        records.fail(node, error)
        return SideCall(node=node, result=None, error=error)
    except BaseException as error:
        records.fail(node, records.stopped(error, partial=call.leave()))
        raise
    if call.stopped:
        error = llm.LLMError(Node.FailureReason.CANCELLED, "stopped by the user", partial=call.leave())
        records.fail(node, error)
        return SideCall(node=node, result=None, error=error)
    records.succeed(node, call.result)
    return SideCall(node=node, result=call.result)
