"""Context assembly: the one place that turns a path into the messages a model receives (T5, T6, C4).

Pure functions: no database, no settings, no litellm. The turn runner and the context endpoint call
`assemble`; every later view of "what the model saw" must call it too, never rebuild it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from conversations.items import ASSISTANT_TYPES, Item

logger = logging.getLogger("arbor.context")


class PathNode(NamedTuple):
    """The columns of a node that assembly needs, read by the one path query.

    A NamedTuple: the path query builds thousands of these positionally on the hot path.
    """

    id: int
    parent_id: int | None
    kind: str
    status: str
    sent: list[Item]
    received: list[Item]
    provider: str = ""
    model: str = ""


def path_items(path: Sequence[PathNode], *, keep_ephemeral: bool = False) -> list[Item]:
    """Concatenate root-first each node's sent items, and received items where the call succeeded (T5).

    Items marked ephemeral (R2: retrieval results) were for the call that sent them; later calls
    drop them unless the conversation's policy keeps them.
    """
    items: list[Item] = []
    for node in path:
        items.extend(node.sent)
        if node.status == "succeeded":
            items.extend(node.received)
    if keep_ephemeral:
        return items
    return [item for item in items if not item.get("ephemeral")]


def drop_orphan_tool_items(items: list[Item]) -> list[Item]:
    """Drop tool calls without a result and results without a call (T6); log it, it is a defect upstream."""
    call_ids = {item["id"] for item in items if item.get("type") == "tool_call"}
    result_ids = {item["call_id"] for item in items if item.get("type") == "tool_result"}
    orphans = call_ids ^ result_ids
    if not orphans:
        return items
    logger.warning("assembly dropped tool items with no partner: %s", sorted(orphans))
    return [
        item
        for item in items
        if not (
            (item.get("type") == "tool_call" and item["id"] in orphans)
            or (item.get("type") == "tool_result" and item["call_id"] in orphans)
        )
    ]


def _assistant_message(items: list[Item], provider: str | None) -> dict[str, Any]:
    """One assistant message from one run of assistant items, in a single pass (this is the hot loop)."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    thoughts: list[str] = []
    blocks: list[Any] = []
    for item in items:
        kind = item["type"]
        if kind == "text":
            texts.append(item["text"])
        elif kind == "tool_call":
            calls.append({"id": item["id"], "type": "function",
                          "function": {"name": item["name"], "arguments": item["arguments"]}})
        elif item.get("provider") == provider:  # C4: reasoning is opaque to every other provider
            thoughts.append(item.get("text") or "")
            data = item.get("data")
            blocks.extend(data if isinstance(data, list) else [data] if data else [])
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or (None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    if blocks:
        message["thinking_blocks"] = blocks
    if any(thoughts):
        message["reasoning_content"] = "".join(thoughts)
    return message


def to_messages(items: Iterable[Item], *, provider: str | None = None) -> list[dict[str, Any]]:
    """Convert items into OpenAI-format messages (litellm's lingua franca), shaped for `provider`."""
    messages: list[dict[str, Any]] = []
    pending_assistant: list[Item] = []

    def flush() -> None:
        if pending_assistant:
            messages.append(_assistant_message(pending_assistant, provider))
            pending_assistant.clear()

    for item in items:
        kind = item.get("type")
        if kind in ASSISTANT_TYPES:
            pending_assistant.append(item)
            continue
        flush()
        if kind == "user":
            messages.append({"role": "user", "content": item["text"]})
        elif kind == "system":
            messages.append({"role": "system", "content": item["text"]})
        elif kind == "tool_result":
            messages.append(
                {"role": "tool", "tool_call_id": item["call_id"], "name": item.get("name", ""),
                 "content": item["content"]}
            )
        else:
            logger.warning("assembly skipped an item of unknown type %r", kind)
    flush()
    # A reasoning-only assistant message from another provider would be empty: leave it out.
    return [m for m in messages if not (m["role"] == "assistant" and m["content"] == "" and "tool_calls" not in m
                                       and "thinking_blocks" not in m and "reasoning_content" not in m)]


def assemble(
    path: Sequence[PathNode],
    new_items: Sequence[Item] = (),
    *,
    instructions: str = "",
    provider: str | None = None,
    keep_ephemeral: bool = False,
) -> list[dict[str, Any]]:
    """Return the message list for a call whose parent is the last node of `path` (T5, T6, C4, R2)."""
    items = path_items(path, keep_ephemeral=keep_ephemeral)
    items.extend(new_items)
    items = drop_orphan_tool_items(items)
    messages = to_messages(items, provider=provider)
    if instructions:
        messages.insert(0, {"role": "system", "content": instructions})
    return messages
