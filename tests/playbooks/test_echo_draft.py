"""arbor/echo's playbook drafts: deterministic, from the path's last tool-using turn (P1 test support)."""

from __future__ import annotations

import json

from playbooks import echo_draft, schema
from playbooks.echo_draft import PLAYBOOK_DRAFT_MARKER

SQL = "SELECT customer_name, total FROM monthly_sales WHERE month = '2026-10' ORDER BY total DESC LIMIT 3"


def _call(sql: str) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "sql_query", "arguments": json.dumps({"sql": sql})}}]}


def _messages(*extra: dict) -> list[dict]:
    return [{"role": "user", "content": "Top 3 customers in 2026-10 #slow #tool sql_query {\"sql\": \"x\"}"},
            _call(SQL), {"role": "tool", "tool_call_id": "c1", "content": "{}"},
            {"role": "assistant", "content": "done"}, *extra,
            {"role": "user", "content": f"{PLAYBOOK_DRAFT_MARKER} convert"}]


def test_the_draft_is_deterministic_valid_and_parameterised():
    draft = echo_draft.draft(_messages())
    assert draft == echo_draft.draft(_messages())
    definition = json.loads(draft)
    assert schema.validate(definition) == []
    assert definition["name"] == "Top 3 customers in 2026-10"
    assert definition["steps"][0]["arguments"]["sql"] == (
        "SELECT customer_name, total FROM monthly_sales WHERE month = '{{month}}' ORDER BY total DESC LIMIT {{limit}}")
    assert {p["name"]: p["default"] for p in definition["parameters"]} == {"month": "2026-10", "limit": 3}


def test_the_last_tool_using_turn_gives_the_steps():
    later = [{"role": "user", "content": "only customers now"}, _call("SELECT name FROM customers"),
             {"role": "tool", "tool_call_id": "c1", "content": "{}"}, {"role": "assistant", "content": "ok"}]
    definition = json.loads(echo_draft.draft(_messages(*later)))
    assert definition["name"] == "only customers now" and definition["parameters"] == []
    assert definition["steps"][0] == {"tool": "sql_query", "arguments": {"sql": "SELECT name FROM customers"}}


def test_without_tool_calls_the_draft_is_one_instruction():
    definition = json.loads(echo_draft.draft([{"role": "user", "content": "hello"},
                                                 {"role": "assistant", "content": "hi"},
                                                 {"role": "user", "content": PLAYBOOK_DRAFT_MARKER}]))
    assert definition["steps"] == [{"instruction": "Answer: hello"}] and schema.validate(definition) == []
