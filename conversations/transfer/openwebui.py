"""Open WebUI's chat export (Settings → Data Controls → Export chats): a list of chats, each with its messages in
`chat.history.messages` (`parentId`, `childrenIds`) and the one shown in `chat.history.currentId`; a bare `chat`
object is accepted as well, as Open WebUI's own import does. A regenerated answer or an edited question is a
sibling, as in Arbor.

An answer's `output` (newer versions) holds its reasoning, its function calls and their outputs, and its text, in
order; without it, reasoning is the `<details type="reasoning">` block at the start of `content`."""

from __future__ import annotations

import html
import re
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

PROVIDER = "openwebui"  # reasoning Open WebUI showed: kept and shown, never sent to a model (C4)
_DETAILS = re.compile(r'<details type="(\w+)"[^>]*>(.*?)</details>', re.S)
_SUMMARY = re.compile(r"<summary>.*?</summary>", re.S)


def entries(document: Any) -> list | None:
    """The chats of an Open WebUI export, or None if `document` is not one."""
    def chat(entry: Any) -> bool:
        return isinstance(entry, dict) and isinstance(entry.get("chat"), dict) and "history" in entry["chat"]
    if isinstance(document, list) and any(chat(e) for e in document):
        return document
    if isinstance(document, dict) and (chat(document) or isinstance(document.get("history"), dict)):
        return [document]
    return None


def plan(entry: Any, index: int) -> Plan:
    where = f"chats[{index}]"
    if not isinstance(entry, dict):
        raise ImportRefused(f"{where}: not an Open WebUI chat.")
    chat = entry.get("chat") if isinstance(entry.get("chat"), dict) else entry
    history = chat.get("history")
    messages = history.get("messages") if isinstance(history, dict) else None
    if not isinstance(messages, dict):
        raise ImportRefused(f"{where}.chat.history.messages: expected an object.")
    for key, message in messages.items():
        if not isinstance(message, dict):
            raise ImportRefused(f"{where}.chat.history.messages[{key!r}]: expected an object.")
    children = children_by_parent({key: messages[key].get("parentId")
                                   for key in sorted(messages, key=lambda k: messages[k].get("timestamp") or 0)})

    def read(key: str, at: At) -> list[Read]:
        return _read(messages[key])

    return tree_plan(children=children, read=read, total=len(messages), current=history.get("currentId"),
                     title=entry.get("title") or chat.get("title") or "", where=where)


def _read(message: dict) -> list[Read]:
    role, content = message.get("role"), message.get("content")
    text = content if isinstance(content, str) else ""
    if role == "user":
        files = [placeholder("file", f.get("name") or f.get("id", "")) for f in message.get("files") or []
                 if isinstance(f, dict)]
        question = capped("\n".join(x for x in (text, *files) if x))
        return [Read(SENT, (it.user(question),))] if question else []
    if role != "assistant":
        return [Read(None)]
    output = message.get("output")
    if isinstance(output, list) and output:
        return _output(output)
    thoughts = [_plain(body) for kind, body in _DETAILS.findall(text) if kind == "reasoning"]
    answer = _DETAILS.sub(lambda m: "" if m.group(1) == "reasoning" else _plain(m.group(2)), text).strip()
    items = [*({"type": "reasoning", "provider": PROVIDER, "text": capped(t), "data": None} for t in thoughts if t),
             *([it.text(capped(answer))] if answer else [])]
    return [Read(RECEIVED, tuple(items))]


def _plain(fragment: str) -> str:
    return html.unescape(_SUMMARY.sub("", fragment)).strip()


def _texts(parts: Any) -> str:
    return "".join(p.get("text", "") for p in parts if isinstance(p, dict)) if isinstance(parts, list) else ""


def _output(output: list) -> list[Read]:
    """An answer's `output` items, in order: reasoning, calls and text are received; a call's output is sent."""
    reads, names = [], {}
    for item in output:
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "reasoning":
            text = _texts(item.get("content")) or _texts(item.get("summary"))
            reads.append(Read(RECEIVED, ({"type": "reasoning", "provider": PROVIDER, "text": capped(text),
                                          "data": None},) if text else ()))
        elif kind == "function_call":
            call_id = str(item.get("call_id") or item.get("id") or f"call_{len(names)}")
            names[call_id] = str(item.get("name") or "tool")
            reads.append(Read(RECEIVED, (it.tool_call(call_id, names[call_id], str(item.get("arguments") or "{}")),)))
        elif kind == "function_call_output":
            call_id = str(item.get("call_id") or "")
            given = item.get("output")
            output_text = _texts(given) if isinstance(given, list) else str(given or "")
            if call_id in names:
                reads.append(Read(SENT, (it.tool_result(call_id, names[call_id], capped(output_text)),)))
            elif output_text:  # an output of no call here: shown, as the person saw it
                reads.append(Read(RECEIVED, (it.text(capped(output_text)),)))
        elif kind == "message":
            text = _texts(item.get("content"))
            reads.append(Read(RECEIVED, (it.text(capped(text)),) if text else ()))
    return reads
