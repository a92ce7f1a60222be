"""SillyTavern's chat file: JSON Lines, a header line (`user_name`, `character_name`, `chat_metadata`), then one
message a line: `mes` the text shown, `is_user` whether the person wrote it, `is_system` a note the model never
sees (left out), `extra.reasoning` the model's thoughts (shown, never sent to another model). A message's `swipes`
are the other answers the model gave there, `swipe_id` the one shown: each becomes a sibling answer (T8), and the
conversation goes on from the shown one. The character's greeting often comes before any question."""

from __future__ import annotations

from typing import Any

from conversations import items as it
from conversations.transfer.message_tree import RECEIVED, SENT, At, Read, capped, tree_plan
from conversations.transfer.plan import ImportRefused, Plan

PROVIDER = "sillytavern"
_HEADER_KEYS = frozenset({"user_name", "character_name", "chat_metadata", "create_date"})


def _is_message(line: Any) -> bool:
    return isinstance(line, dict) and "mes" in line and "is_user" in line


def entries(document: Any) -> list | None:
    """One chat: the file's lines (a header, then messages)."""
    if (isinstance(document, list) and len(document) >= 1 and isinstance(document[0], dict)
            and _HEADER_KEYS & document[0].keys() and "mes" not in document[0]
            and all(_is_message(line) for line in document[1:])):
        return [document]
    return None


def plan(entry: Any, index: int) -> Plan:
    header, lines = entry[0], entry[1:]
    messages = [m for m in lines if not m.get("is_system")]
    keys: list[str] = []
    children: dict[Any, list[str]] = {}
    texts: dict[str, tuple[bool, str, str]] = {}  # key: (the person's, text, reasoning)
    parent = None
    for position, message in enumerate(messages):
        if not isinstance(message.get("mes"), str):
            raise ImportRefused(f"line {position + 2}: `mes` is not text.")
        shown = f"{position}"
        siblings = [shown]
        reasoning = (message.get("extra") or {}).get("reasoning") if isinstance(message.get("extra"), dict) else ""
        texts[shown] = (bool(message["is_user"]), message["mes"], reasoning if isinstance(reasoning, str) else "")
        swipes = message.get("swipes")
        if not message["is_user"] and isinstance(swipes, list) and len(swipes) > 1:
            chosen = message.get("swipe_id") if isinstance(message.get("swipe_id"), int) else -1
            for number, swipe in enumerate(swipes):
                if number != chosen and isinstance(swipe, str) and swipe and swipe != message["mes"]:
                    texts[f"{position}.{number}"] = (False, swipe, "")
                    siblings.insert(len(siblings) - 1, f"{position}.{number}")  # the shown one last: newest
        children.setdefault(parent, []).extend(siblings)
        keys += siblings
        parent = shown

    def read(key: str, at: At) -> list[Read]:
        mine, text, reasoning = texts[key]
        if not text:
            return []
        if mine:
            return [Read(SENT, (it.user(capped(text)),))]
        thought = {"type": "reasoning", "provider": PROVIDER, "text": capped(reasoning), "data": None}
        thoughts = (thought,) if reasoning else ()
        return [Read(RECEIVED, (*thoughts, it.text(capped(text))))]

    name = header.get("character_name")
    title = f"Chat with {name}" if isinstance(name, str) and name else "SillyTavern chat"
    return tree_plan(children=children, read=read, total=len(keys), where="chat", title=title,
                     current=parent)
