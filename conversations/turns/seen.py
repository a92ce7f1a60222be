"""What the model saw, and what it would see next: both from the one assembly (T5), never stored twice."""

from __future__ import annotations

from typing import Any

from conversations import items as it
from conversations import llm
from conversations.context import assemble, is_compaction_root
from conversations.models import Conversation, Node
from conversations.selectors import context_path, instructions_for, node_path, path_node
from conversations.turns import calls
from files import attached


def next_context(conversation: Conversation) -> list[dict[str, Any]]:
    """What the next call from the head would send: the path, then results for calls still open."""
    provider = llm.provider_of(conversation.effective_model)
    path = context_path(node_path(conversation.head_id, owner=conversation.owner_id), provider,
                        owner=conversation.owner_id)
    tip = path[-1] if path else None
    waiting = calls.resolve(tip, run=False, owner_id=conversation.owner_id,
                            note="pending: waiting for a person's decision") if tip else []
    return assemble(path, waiting, instructions=instructions_for(conversation), provider=provider,
                    keep_ephemeral=conversation.keep_retrieved, attached=attached.contents(
                        conversation.owner_id, path, images_linked=True, recorded={}))  # by words: no provider call


def call_context(node: Node) -> list[dict[str, Any]]:
    """What the call of `node` was sent: its parent's path, its own items, its instructions ("what the model saw").

    A compaction root sent nothing itself: its context is what the next call below it starts with.
    """
    provider = node.provider or None
    if is_compaction_root(node):
        return assemble([path_node(node)], (), instructions=node.instructions, provider=provider,
                        keep_ephemeral=node.keep_ephemeral)
    path = context_path(node_path(node.parent_id, owner=node.owner_id), provider, owner=node.owner_id)
    return assemble(path, node.sent, instructions=node.instructions, provider=provider,
                    keep_ephemeral=node.keep_ephemeral, attached=_attached(node, path))


def _attached(node: Node, path: list) -> dict[int, dict[str, Any]]:
    """The files `node`'s call got, for a person to read (images as links); no query for a call without any."""
    if not any(it.file_ids(p.sent) for p in [*path, node]):
        return {}
    return attached.contents(node.owner_id, path, node.sent, images_linked=True, recorded=node.file_parts or {})


def context_diff(a: Node, b: Node) -> dict[str, Any]:
    """Issue 33: where the contexts of two calls part, message by message (each from `call_context`, the one
    assembly): how many they share from the start, the rest of each, and what each answered."""
    first, second = call_context(a), call_context(b)
    common = next((index for index, (x, y) in enumerate(zip(first, second, strict=False)) if x != y),
                  min(len(first), len(second)))
    return {"common": common, "a": first[common:], "b": second[common:],
            "answers": {"a": it.answer_text(a.received), "b": it.answer_text(b.received)}}
