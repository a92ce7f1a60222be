"""Provider-neutral items: the parts of messages that nodes store as `sent` and `received`.

An item is a plain dict with a `type`:
- `user` / `system`: `text`
- `text`: assistant text
- `tool_call`: `id`, `name`, `arguments` (the JSON text exactly as the model produced it)
- `tool_result`: `call_id`, `name`, `content`, `is_error`
- `reasoning`: `provider`, `text`, `data` (the provider's opaque block, kept verbatim)
- `summary`: what a compaction root holds first (C2): `text`, or a provider-native opaque compaction
  result, `provider` and `data`, that only that provider can read (C3)
Any item may carry `ephemeral: true` (R2). Opaque provider fields are never rewritten here.
"""

from __future__ import annotations

from typing import Any

Item = dict[str, Any]

ASSISTANT_TYPES = frozenset({"text", "tool_call", "reasoning"})


def user(text: str) -> Item:
    return {"type": "user", "text": text}


def system(text: str) -> Item:
    return {"type": "system", "text": text}


def text(value: str) -> Item:
    return {"type": "text", "text": value}


def tool_call(call_id: str, name: str, arguments: str) -> Item:
    return {"type": "tool_call", "id": call_id, "name": name, "arguments": arguments}


def summary(value: str, *, provider: str | None = None, data: Any = None) -> Item:
    item: Item = {"type": "summary", "text": value}
    if provider:
        item.update(provider=provider, data=data)
    return item


def tool_result(call_id: str, name: str, content: str, *, is_error: bool = False) -> Item:
    return {"type": "tool_result", "call_id": call_id, "name": name, "content": content, "is_error": is_error}


def question_of(items: list[Item]) -> str | None:
    """Return the user text that these sent items open a turn with, if they do."""
    for item in items:
        if item.get("type") == "user":
            return item.get("text", "")
    return None


def answer_text(items: list[Item]) -> str:
    return "".join(item["text"] for item in items if item.get("type") == "text")


def tool_calls(items: list[Item]) -> list[Item]:
    return [item for item in items if item.get("type") == "tool_call"]
