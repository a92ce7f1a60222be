"""Grok's (x.ai) data export, `prod-grok-backend.json`: `{"conversations": [{"conversation": {...}, "responses":
[{"response": {...}}]}]}`. A response is one message: `_id`, `sender` (`human`, else the model: `assistant`,
`ASSISTANT` or a model's name), `message` its text, `parent_response_id` the message it follows, `thinking_trace`
the model's thoughts (kept as reasoning, shown, never sent to another model), `generated_image_urls` and
`file_attachments` (shown as placeholders). Two responses with one parent are a regenerated answer or an edited
question: siblings (T8). The conversation's `leaf_response_id` is the tip the app shows, so it is the head; without
it, the newest tip."""

from __future__ import annotations

from typing import Any

from conversations import items as it
from conversations.transfer.message_tree import (
    RECEIVED,
    SENT,
    At,
    Read,
    capped,
    children_by_parent,
    placeholder,
    tree_plan,
)
from conversations.transfer.plan import ImportRefused, Plan

PROVIDER = "grok"


def _is_one(entry: Any) -> bool:
    return (isinstance(entry, dict) and isinstance(entry.get("conversation"), dict)
            and isinstance(entry.get("responses"), list))


def entries(document: Any) -> list | None:
    """The conversations of a `prod-grok-backend.json` (its `projects`, `tasks` and `media_posts` are no
    conversations), or None if `document` is not one."""
    if not isinstance(document, dict) or not isinstance(document.get("conversations"), list):
        return None
    conversations = document["conversations"]
    return conversations if any(_is_one(e) for e in conversations) else None


def plan(entry: Any, index: int) -> Plan:
    where = f"conversations[{index}]"
    if not _is_one(entry):
        raise ImportRefused(f"{where}: not a Grok conversation (a conversation and its responses).")
    responses = _responses(entry["responses"], where)
    parents = {key: r.get("parent_response_id") for key, r in responses.items()}

    def read(key: str, at: At) -> list[Read]:
        return _read(responses[key], f"{where}.responses[{key!r}]")

    conversation = entry["conversation"]
    leaf = conversation.get("leaf_response_id")
    current = leaf if isinstance(leaf, str) and leaf in responses else _newest_tip(responses, parents)
    title = conversation.get("title") if isinstance(conversation.get("title"), str) else ""
    return tree_plan(children=children_by_parent(parents), read=read, total=len(responses), where=where,
                     title=title, current=current)


def _responses(wrappers: list, where: str) -> dict[str, dict]:
    """The responses by id, in the file's order; one that is not a response, or an id used twice, is refused."""
    responses: dict[str, dict] = {}
    for number, wrapper in enumerate(wrappers):
        response = wrapper.get("response") if isinstance(wrapper, dict) else None
        if not isinstance(response, dict):
            raise ImportRefused(f"{where}.responses[{number}]: expected an object with a response.")
        key = response.get("_id") if isinstance(response.get("_id"), str) else f"#{number}"
        if key in responses:
            raise ImportRefused(f"{where}.responses[{number}]: the id {key!r} is used twice.")
        responses[key] = response
    return responses


def _read(response: dict, where: str) -> list[Read]:
    text, thoughts = response.get("message", ""), response.get("thinking_trace")
    if not isinstance(text, str):
        raise ImportRefused(f"{where}.message: expected text.")
    human = str(response.get("sender", "")).lower() == "human"
    shown = "\n".join(x for x in (text, *_attachments(response, human)) if x)
    if human:
        return [Read(SENT, (it.user(capped(shown)),))] if shown else []
    received = []
    if isinstance(thoughts, str) and thoughts:
        received.append({"type": "reasoning", "provider": PROVIDER, "text": capped(thoughts), "data": None})
    if shown:
        received.append(it.text(capped(shown)))
    return [Read(RECEIVED, tuple(received))] if received else []


def _attachments(response: dict, human: bool) -> list[str]:
    """Uploaded files (asset ids) and generated images (their addresses), as a person and a model can read."""
    field, kind = ("file_attachments", "file") if human else ("generated_image_urls", "image")
    values = response.get(field)
    return [placeholder(kind, str(v)) for v in values if v] if isinstance(values, list) else []


def _newest_tip(responses: dict[str, dict], parents: dict[str, Any]) -> str | None:
    """The response without replies written last (its `create_time`, `{"$date": {"$numberLong": ms}}`); ties go
    by the file's order."""
    parented = {p for p in parents.values() if p in responses}
    tips = [key for key in responses if key not in parented]
    return max(enumerate(tips), key=lambda pair: (_when(responses[pair[1]]), pair[0]))[1] if tips else None


def _when(response: dict) -> int:
    created = response.get("create_time")
    value = ((created.get("$date") or {}) if isinstance(created, dict) else {})
    value = value.get("$numberLong") if isinstance(value, dict) else value
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1
