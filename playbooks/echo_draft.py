"""arbor/echo drafts playbooks (P1): a deterministic answer to a conversion's request, so conversions run
offline and their tests can check each try. Registered with the echo model when the app is ready; the model
seam knows nothing about playbooks.

A last user message carrying `PLAYBOOK_DRAFT_MARKER` is answered with a JSON playbook drafted from the path's
last tool-using turn; `#draft-invalid N` in any earlier user message makes the first N drafts invalid,
`#draft-invalid always` every draft.
"""

from __future__ import annotations

import json
import re
from typing import Any

from conversations.llm.echo import TOOL_DIRECTIVE, text_of

# Put in the request item of a playbook conversion: arbor/echo answers it with a JSON draft.
PLAYBOOK_DRAFT_MARKER = "[arbor:playbook-draft]"
_DRAFT_INVALID = re.compile(r"#draft-invalid\s+(always|\d+)")
_MONTH_LITERAL = re.compile(r"'(\d{4}-\d{2})'")
_LIMIT = re.compile(r"\b(limit)\s+(\d+)\b", re.IGNORECASE)
_DOMESTIC_ONLY = re.compile(r"\b((?:\w+\.)?is_overseas)\s*=\s*0\b")


def _plain_question(text: str) -> str:
    """A question without its echo directives."""
    decoder, kept, position = json.JSONDecoder(), [], 0
    for match in TOOL_DIRECTIVE.finditer(text):
        if match.start() < position:
            continue
        kept.append(text[position:match.start()])
        try:
            position = decoder.raw_decode(text, match.end())[1]
        except json.JSONDecodeError:
            position = match.end()
    kept.append(text[position:])
    return " ".join(re.sub(r"#(fail|overflow|slow|draft-invalid\s+(always|\d+))\b", "", "".join(kept)).split())


def _parameterise_sql(sql: str, parameters: dict[str, dict[str, Any]]) -> str:
    """Turn the month, the row limit and a domestic-only filter into parameters (the seeds' sales question)."""
    month = _MONTH_LITERAL.search(sql)
    if month:
        parameters.setdefault("month", {"name": "month", "type": "string", "description": "The month, YYYY-MM.",
                                        "default": month.group(1), "pattern": r"^\d{4}-(0[1-9]|1[0-2])$"})
        sql = _MONTH_LITERAL.sub("'{{month}}'", sql)
    limit = _LIMIT.search(sql)
    if limit:
        parameters.setdefault("limit", {"name": "limit", "type": "integer", "description": "How many rows.",
                                        "default": int(limit.group(2))})
        sql = _LIMIT.sub(lambda m: f"{m.group(1)} {{{{limit}}}}", sql)
    if _DOMESTIC_ONLY.search(sql):
        parameters.setdefault("include_overseas", {"name": "include_overseas", "type": "boolean",
                                                   "description": "Count overseas customers too.",
                                                   "default": False})
        sql = _DOMESTIC_ONLY.sub(lambda m: f"({m.group(1)} = 0 OR {{{{include_overseas}}}})", sql)
    return sql


def _opener(messages: list[dict], users: list[int]) -> int | None:
    """The question of the path's last tool-using turn (the last question when no turn used tools)."""
    calling = [i for i, m in enumerate(messages) if m.get("role") == "assistant" and m.get("tool_calls")]
    return max((i for i in users if not calling or i < calling[-1]), default=None)


def _step(call: dict, parameters: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One tool call as a playbook step; a query's values become parameters."""
    try:
        arguments = json.loads(call["function"]["arguments"] or "{}")
    except json.JSONDecodeError:
        arguments = {}  # the validator then says what is missing, as it would to a model
    if not isinstance(arguments, dict):
        arguments = {}
    if call["function"]["name"] == "sql_query" and isinstance(arguments.get("sql"), str):
        arguments["sql"] = _parameterise_sql(arguments["sql"], parameters)
    return {"tool": call["function"]["name"], "arguments": arguments}


def _draft_invalid(messages: list[dict], users: list[int]) -> bool:
    """Whether this draft is one a `#draft-invalid N` asked to be invalid (N: the first N tries, or always)."""
    tries = sum(1 for m in messages if m.get("role") == "user" and PLAYBOOK_DRAFT_MARKER in text_of(m.get("content")))
    invalid = [match.group(1) for i in users for match in _DRAFT_INVALID.finditer(text_of(messages[i]["content"]))]
    return bool(invalid) and (invalid[-1] == "always" or tries <= int(invalid[-1]))


def draft(messages: list[dict]) -> str:
    """A deterministic playbook draft: one tool step per tool call of the path's last tool-using turn.

    The first N drafts of a conversion are invalid when a user message says `#draft-invalid N`
    (`always`: every draft): they gain a step that queries a column the sales database lacks.
    """
    users = [i for i, m in enumerate(messages)
             if m.get("role") == "user" and PLAYBOOK_DRAFT_MARKER not in text_of(m.get("content"))]
    opener = _opener(messages, users)
    question = _plain_question(text_of(messages[opener].get("content"))) if opener is not None else ""
    parameters: dict[str, dict[str, Any]] = {}
    turn = messages[opener + 1 if opener is not None else 0:]
    steps = [_step(call, parameters)
             for m in turn if m.get("role") == "assistant" for call in m.get("tool_calls") or []]
    steps.append({"instruction": "Answer the question from the results above." if steps else
                  f"Answer: {question or 'the question'}"})
    if _draft_invalid(messages, users):
        steps.insert(0, {"tool": "sql_query", "arguments": {"sql": "SELECT no_such_column FROM orders"}})
    draft = {"name": (question or "Playbook")[:80], "description": f"From the question: {question}",
             "parameters": list(parameters.values()), "steps": steps,
             "expected_output": f"The answer to: {question}" if question else "The answer."}
    return json.dumps(draft, ensure_ascii=False)


def answer(messages: list[dict], question: str) -> str | None:
    """The echo model's answer to a conversion's request, or None for any other question."""
    return draft(messages) if PLAYBOOK_DRAFT_MARKER in question else None
