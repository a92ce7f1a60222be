"""What the model saw, and what it would see next: both from the one assembly (T5), never stored twice."""

from __future__ import annotations

from typing import Any

from conversations import llm
from conversations.context import assemble, is_compaction_root
from conversations.models import Conversation, Node
from conversations.selectors import context_path, instructions_for, node_path, path_node
from conversations.turns import calls


def next_context(conversation: Conversation) -> list[dict[str, Any]]:
    """What the next call from the head would send: the path, then results for calls still open."""
    provider = llm.provider_of(conversation.effective_model)
    path = context_path(node_path(conversation.head_id), provider)
    tip = path[-1] if path else None
    waiting = calls.resolve(tip, run=False, note="pending: waiting for a person's decision") if tip else []
    return assemble(path, waiting, instructions=instructions_for(conversation), provider=provider,
                    keep_ephemeral=conversation.keep_retrieved)


def call_context(node: Node) -> list[dict[str, Any]]:
    """What the call of `node` was sent: its parent's path, its own items, its instructions ("what the model saw").

    A compaction root sent nothing itself: its context is what the next call below it starts with.
    """
    provider = node.provider or None
    if is_compaction_root(node):
        return assemble([path_node(node)], (), instructions=node.instructions, provider=provider,
                        keep_ephemeral=node.keep_ephemeral)
    return assemble(context_path(node_path(node.parent_id), provider), node.sent, instructions=node.instructions,
                    provider=provider, keep_ephemeral=node.keep_ephemeral)
