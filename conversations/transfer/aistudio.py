"""A Google AI Studio prompt file (its Download, or the copy it saves to Drive): `runSettings`, `systemInstruction`
(`{"parts": [{"text"}]}`, empty when unset) which becomes the conversation's instructions, and `chunkedPrompt.chunks`,
one chunk a message: `role` `user` or `model`, its `text`; a model chunk with `isThought` holds the model's thoughts
(kept as reasoning, shown, never sent to another model). A chunk holding a Drive file instead of text shows as a
placeholder. `pendingInputs` is a draft never sent, and left out. The file keeps one line of messages, no branches
and no title: the first question names it."""

from __future__ import annotations

from typing import Any

from conversations import items as it
from conversations.transfer.message_tree import RECEIVED, SENT, At, Read, capped, one_or_many, placeholder, tree_plan
from conversations.transfer.plan import ImportRefused, Plan

PROVIDER = "aistudio"
_DRIVE = (("driveImage", "image"), ("driveDocument", "file"), ("driveVideo", "video"))


def _is_one(entry: Any) -> bool:
    prompt = entry.get("chunkedPrompt") if isinstance(entry, dict) else None
    return isinstance(prompt, dict) and isinstance(prompt.get("chunks"), list)


def entries(document: Any) -> list | None:
    return one_or_many(document, _is_one)


def plan(entry: Any, index: int) -> Plan:
    where = f"[{index}]"
    if not _is_one(entry):
        raise ImportRefused(f"{where}: not a Google AI Studio prompt (chunkedPrompt.chunks).")
    chunks = entry["chunkedPrompt"]["chunks"]
    texts = [_text(chunk, f"{where}.chunkedPrompt.chunks[{number}]") for number, chunk in enumerate(chunks)]
    keys = list(range(len(chunks)))

    def read(key: int, at: At) -> list[Read]:
        return _read(chunks[key], texts[key])

    title = next((t for c, t in zip(chunks, texts, strict=True) if c.get("role") == "user" and t), "")
    return tree_plan(children={None: keys[:1], **{k - 1: [k] for k in keys[1:]}}, read=read, total=len(chunks),
                     current=keys[-1] if keys else None, title=" ".join(title.split())[:80], where=where,
                     instructions=_instructions(entry.get("systemInstruction"), f"{where}.systemInstruction"))


def _text(chunk: Any, where: str) -> str:
    """A chunk's text, or the Drive file it holds as a placeholder; a chunk that is not an object, or whose text
    is not text, is refused."""
    if not isinstance(chunk, dict):
        raise ImportRefused(f"{where}: expected an object.")
    text = chunk.get("text", "")
    if not isinstance(text, str):
        raise ImportRefused(f"{where}.text: expected text.")
    files = [placeholder(kind, str(chunk[key].get("id") or "")) for key, kind in _DRIVE
             if isinstance(chunk.get(key), dict)]
    return capped("\n".join(x for x in (text, *files) if x))


def _read(chunk: dict, text: str) -> list[Read]:
    if not text:
        return []
    if chunk.get("role") == "user":
        return [Read(SENT, (it.user(text),))]
    if chunk.get("role") != "model":
        return []
    if chunk.get("isThought") is True:
        return [Read(RECEIVED, ({"type": "reasoning", "provider": PROVIDER, "text": text, "data": None},))]
    return [Read(RECEIVED, (it.text(text),))]


def _instructions(value: Any, where: str) -> str:
    """`systemInstruction`: its parts' text; `{}` when unset."""
    if value is None or value == {}:
        return ""
    if not isinstance(value, dict):
        raise ImportRefused(f"{where}: expected an object.")
    parts = value.get("parts", [])
    if not isinstance(parts, list):
        raise ImportRefused(f"{where}.parts: expected a list.")
    texts = [p.get("text") for p in parts if isinstance(p, dict)]
    return capped("\n\n".join(t for t in texts if isinstance(t, str) and t))
