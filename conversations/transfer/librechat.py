"""LibreChat's conversation export (the Export menu, JSON): `messages` as a flat list (`parentMessageId` links
them) or, exported "recursive", `messagesTree` with each message's `children`. Siblings are the branches; the
file does not say which one was shown, so the newest message's branch is the head.

A message's text is `text`; newer versions keep an answer's parts in `content` (text, `think`, `tool_call` with
its output), which are read in order when present."""

from __future__ import annotations

import json
from typing import Any

from conversations import items as it
from conversations.transfer.message_tree import (
    RECEIVED,
    SENT,
    At,
    Read,
    capped,
    children_by_parent,
    one_or_many,
    tree_plan,
)
from conversations.transfer.plan import ImportRefused, Plan

PROVIDER = "librechat"  # reasoning LibreChat showed: kept and shown, never sent to a model (C4)


def entries(document: Any) -> list | None:
    def conversation(entry: Any) -> bool:
        # The id is read as the schema declares it (text): `{"conversationId": 16, ...}` is no LibreChat file.
        return (isinstance(entry, dict) and isinstance(entry.get("conversationId"), str)
                and ("messages" in entry or "messagesTree" in entry))
    return one_or_many(document, conversation)


def plan(entry: Any, index: int) -> Plan:
    where = f"conversations[{index}]"
    if not isinstance(entry, dict):
        raise ImportRefused(f"{where}: not a LibreChat conversation.")
    # The recursive export's tree wins over a flat list beside it; an entry of a list with neither (beside
    # others that are conversations) is refused as missing its messages.
    named = [key for key in ("messagesTree", "messages") if key in entry]
    for key in named or ["messages"]:
        if not isinstance(entry.get(key), list):
            raise ImportRefused(f"{where}.{key}: expected a list.")
    listed = entry[named[0]]
    messages: dict[str, dict] = {}  # in the file's order, replies after their message
    stack = list(reversed(listed))
    while stack:  # the recursive export nests replies in `children`
        message = stack.pop()
        if not isinstance(message, dict) or not isinstance(message.get("messageId"), str):
            raise ImportRefused(f"{where}.messages: a message without a messageId.")
        messages[message["messageId"]] = message
        stack.extend(reversed(message.get("children") or []))
    order = {key: (str(m.get("createdAt") or ""), position) for position, (key, m) in enumerate(messages.items())}
    children = children_by_parent({key: messages[key].get("parentMessageId")
                                   for key in sorted(messages, key=order.__getitem__)})
    # No mark says which branch was shown: the newest reply's (by its time, then by its place in the file).
    leaves = [key for key in messages if key not in children]
    newest = max(leaves, key=order.__getitem__, default=None)

    def read(key: str, at: At) -> list[Read]:
        return _read(messages[key])

    return tree_plan(children=children, read=read, total=len(messages), current=newest,
                     title=entry.get("title") or "", where=where)


def _read(message: dict) -> list[Read]:
    text = message.get("text") if isinstance(message.get("text"), str) else ""
    if message.get("isCreatedByUser"):
        return [Read(SENT, (it.user(capped(text)),))] if text else []
    parts = message.get("content")
    if not isinstance(parts, list) or not parts:
        return [Read(RECEIVED, (it.text(capped(text)),))] if text else []
    reads = []
    for index, part in enumerate(p for p in parts if isinstance(p, dict)):
        reads += _part(part, fallback_id=f"call_{message['messageId']}_{index}")
    return reads or ([Read(RECEIVED, (it.text(capped(text)),))] if text else [])


def _part(part: dict, *, fallback_id: str) -> list[Read]:
    """One content part of an answer: text, thinking, or a tool call with its output (T4)."""
    kind = part.get("type")
    value = part.get(kind) if kind in part else part.get("text")
    value = value.get("value", "") if isinstance(value, dict) and kind != "tool_call" else value
    if kind == "text" and value:
        return [Read(RECEIVED, (it.text(capped(str(value))),))]
    if kind == "think" and value:
        return [Read(RECEIVED, ({"type": "reasoning", "provider": PROVIDER, "text": capped(str(value)),
                                 "data": None},))]
    if kind != "tool_call" or not isinstance(value, dict):
        return []
    call_id, name, arguments = str(value.get("id") or fallback_id), str(value.get("name") or "tool"), value.get("args")
    reads = [Read(RECEIVED, (it.tool_call(call_id, name, arguments if isinstance(arguments, str)
                                          else json.dumps(arguments or {})),))]
    if value.get("output") is not None:
        reads.append(Read(SENT, (it.tool_result(call_id, name, capped(str(value["output"]))),)))
    return reads
