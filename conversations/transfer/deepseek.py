"""DeepSeek's data export (`conversations.json`, from the web app's "Export all chats"): a list of conversations,
each with `title`, `inserted_at` and a `mapping` of messages by id: `parent`, `children`, and a `message` (null for
the root) whose `fragments` say what it holds: `REQUEST` the person's question, `THINK` the model's thoughts (kept
as reasoning, shown, never sent to another model), `RESPONSE` the answer. Other fragments (`SEARCH` results, tool
cards) are what the app drew around the answer and are left out, as are uploaded files (the export keeps no text of
them). A regenerated answer or an edited question is a second child of one message: each becomes a sibling (T8).
The export names no current message: the conversation goes on from the newest tip, where the app leaves it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from conversations import items as it
from conversations.transfer.message_tree import RECEIVED, SENT, At, Read, capped, one_or_many, tree_plan
from conversations.transfer.plan import ImportRefused, Plan

PROVIDER = "deepseek"


def _is_one(entry: Any) -> bool:
    """A conversation of DeepSeek's: a `mapping` (as ChatGPT's) whose messages are made of `fragments`."""
    mapping = entry.get("mapping") if isinstance(entry, dict) else None
    return isinstance(mapping, dict) and any(
        isinstance(node, dict) and isinstance(node.get("message"), dict) and "fragments" in node["message"]
        for node in mapping.values())


def entries(document: Any) -> list | None:
    return one_or_many(document, _is_one)


def plan(entry: Any, index: int) -> Plan:
    where = f"conversations[{index}]"
    if not _is_one(entry):
        raise ImportRefused(f"{where}: not a DeepSeek conversation (a mapping of messages made of fragments).")
    mapping = entry["mapping"]
    children = _children(mapping, where)

    def read(key: str, at: At) -> list[Read]:
        return _read(mapping[key].get("message"), f"{where}.mapping[{key!r}].message")

    title = entry.get("title") if isinstance(entry.get("title"), str) else ""
    return tree_plan(children=children, read=read, total=len(mapping), where=where, title=title,
                     current=_newest_tip(mapping, children))


def _children(mapping: dict[str, Any], where: str) -> dict[Any, list[str]]:
    """Children by parent (None: the roots), from each message's own `parent`; one that names no message of the
    file is refused."""
    children: dict[Any, list[str]] = {}
    for key, node in mapping.items():
        if not isinstance(node, dict):
            raise ImportRefused(f"{where}.mapping[{key!r}]: expected an object.")
        parent = node.get("parent")
        if parent is not None and (not isinstance(parent, str) or parent not in mapping):
            raise ImportRefused(f"{where}.mapping[{key!r}]: its parent {parent!r} is not in the file.")
        children.setdefault(parent, []).append(key)
    return children


def _read(message: Any, where: str) -> list[Read]:
    """What one message is: its fragments, in order, as what the node sent or received."""
    if message is None:
        return []
    if not isinstance(message, dict) or not isinstance(message.get("fragments"), list):
        raise ImportRefused(f"{where}.fragments: expected a list.")
    reads = []
    for number, fragment in enumerate(message["fragments"]):
        content = fragment.get("content") if isinstance(fragment, dict) else None
        if content is not None and not isinstance(content, str):
            raise ImportRefused(f"{where}.fragments[{number}].content: expected text.")
        if content:
            reads.append(_fragment(fragment.get("type"), capped(content)))
    return reads


def _fragment(kind: Any, content: str) -> Read:
    if kind == "REQUEST":
        return Read(SENT, (it.user(content),))
    if kind == "THINK":
        return Read(RECEIVED, ({"type": "reasoning", "provider": PROVIDER, "text": content, "data": None},))
    if kind == "RESPONSE":
        return Read(RECEIVED, (it.text(content),))
    return Read(None)  # SEARCH results, tool cards: drawn around the answer, no part of it


def _newest_tip(mapping: dict[str, Any], children: dict[Any, list[str]]) -> str | None:
    """The tip the app shows: the message without children written last (`inserted_at`; ties and messages with
    no readable time go by their place in the file)."""
    tips = [key for key in mapping if key not in children and isinstance(mapping[key].get("message"), dict)]
    if not tips:
        return None
    return max(enumerate(tips), key=lambda pair: (_when(mapping[pair[1]]["message"]), pair[0]))[1]


def _when(message: dict) -> float:
    value = message.get("inserted_at")
    try:
        return datetime.fromisoformat(value).timestamp() if isinstance(value, str) else float("-inf")
    except ValueError:
        return float("-inf")
