"""chatbot-ui's export (Settings → Export data): `{version, history: [conversations], folders, prompts}`, or, from
its first version, the bare list of conversations. A conversation's `messages` are one branch of `user` and
`assistant` messages; its `prompt` (the system prompt it ran with) becomes the conversation's instructions."""

from __future__ import annotations

from typing import Any

from conversations import items as it
from conversations.transfer.message_tree import RECEIVED, SENT, At, Read, capped, tree_plan
from conversations.transfer.plan import ImportRefused, Plan


def _conversation(entry: Any) -> bool:
    return (isinstance(entry, dict) and isinstance(entry.get("messages"), list) and "name" in entry
            and all(isinstance(m, dict) and "role" in m for m in entry["messages"]))


def entries(document: Any) -> list | None:
    if isinstance(document, dict) and isinstance(document.get("history"), list) and (
            "version" in document or "folders" in document):
        return document["history"]
    if isinstance(document, list) and document and any(_conversation(e) for e in document):
        return document
    return None


def plan(entry: Any, index: int) -> Plan:
    where = f"history[{index}]"
    if not _conversation(entry):
        raise ImportRefused(f"{where}: not a chatbot-ui conversation (name and messages).")
    messages = entry["messages"]
    keys = [str(position) for position in range(len(messages))]
    children: dict[Any, list[str]] = {None: keys[:1], **{keys[i - 1]: [keys[i]] for i in range(1, len(keys))}}

    def read(key: str, at: At) -> list[Read]:
        message = messages[int(key)]
        text = capped(message.get("content") if isinstance(message.get("content"), str) else "")
        if not text:
            return []
        if message["role"] == "user":
            return [Read(SENT, (it.user(text),))]
        return [Read(RECEIVED, (it.text(text),))] if message["role"] == "assistant" else []

    prompt = entry.get("prompt")
    return tree_plan(children=children, read=read, total=len(messages), current=keys[-1] if keys else None,
                     title=entry.get("name") or "", where=where,
                     instructions=capped(prompt) if isinstance(prompt, str) else "")
