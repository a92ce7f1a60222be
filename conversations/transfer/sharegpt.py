"""ShareGPT, the shape fine-tuning data and many chat tools export: `{"conversations": [{"from", "value"}]}`, a list
of those (or JSON Lines, one a line). `from` says who: `human`/`user` asked, `gpt`/`assistant` (and other models'
names) answered, `system` is the conversation's instructions, `function_call` is a call the model made (its
`value` is JSON: `name` and `arguments`), `observation` the call's output, sent back. One branch each."""

from __future__ import annotations

import json
from typing import Any

from conversations import items as it
from conversations.transfer.message_tree import RECEIVED, SENT, At, Read, capped, one_or_many, tree_plan
from conversations.transfer.plan import ImportRefused, Plan

QUESTION = frozenset({"human", "user"})
ANSWER = frozenset({"gpt", "assistant", "model", "chatgpt", "bard", "bing", "claude"})
SYSTEM = frozenset({"system"})
CALL, OUTPUT = "function_call", "observation"


def _is_one(entry: Any) -> bool:
    return (isinstance(entry, dict) and isinstance(entry.get("conversations"), list) and entry["conversations"]
            and all(isinstance(m, dict) and "from" in m and "value" in m for m in entry["conversations"]))


def entries(document: Any) -> list | None:
    return one_or_many(document, _is_one)


def plan(entry: Any, index: int) -> Plan:
    where = f"[{index}]"
    if not _is_one(entry):
        raise ImportRefused(f"{where}: not a ShareGPT conversation (conversations of from and value).")
    messages = entry["conversations"]
    keys = list(range(len(messages)))
    children: dict[Any, list[int]] = {None: keys[:1], **{k - 1: [k] for k in keys[1:]}}
    system = [capped(m["value"]) for m in messages if m["from"] in SYSTEM and isinstance(m["value"], str)]
    if isinstance(entry.get("system"), str) and entry["system"]:
        system.insert(0, capped(entry["system"]))

    def read(key: int, at: At) -> list[Read]:
        return _read(key, messages[key], at)

    title = next((m["value"] for m in messages if m["from"] in QUESTION and isinstance(m["value"], str)), "")
    return tree_plan(children=children, read=read, total=len(messages), current=keys[-1] if keys else None,
                     title=" ".join(title.split())[:80], where=where, instructions="\n\n".join(system))


def _read(key: int, message: dict, at: At) -> list[Read]:
    who, value = message["from"], message["value"]
    if not isinstance(value, str) or not value:
        return []
    if who in QUESTION:
        return [Read(SENT, (it.user(capped(value)),))]
    if who in ANSWER:
        return [Read(RECEIVED, (it.text(capped(value)),))]
    if who == CALL:
        name, arguments = _call(value)
        return [Read(RECEIVED, (it.tool_call(f"call_{key}", name, arguments),))]
    if who == OUTPUT and at.call is not None:
        return [Read(SENT, (it.tool_result(at.call["id"], at.call["name"], capped(value)),))]
    if who == OUTPUT:  # an output with no call before it: shown as what the tool said
        return [Read(SENT, (it.user(capped(f"[tool output] {value}")),))]
    return []


def _call(value: str) -> tuple[str, str]:
    """A call's name and its arguments as a JSON string; a value that is not such JSON is kept as arguments."""
    try:
        call = json.loads(value)
    except ValueError:
        return "function", value
    if not isinstance(call, dict):
        return "function", value
    name = call.get("name") if isinstance(call.get("name"), str) and call.get("name") else "function"
    arguments = call.get("arguments", {})
    return name[:200], arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
