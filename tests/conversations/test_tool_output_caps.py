"""Issue 14, high 2: tool output has a size limit, applied while it is read, for every tool; a node has one too.

The attack that found it: `select zeroblob(1000000) from orders limit 20` (50 bytes of SQL) gave a 140 MB
tool result and a 140 MB node.
"""

from __future__ import annotations

import itertools
import json

import pytest

from conversations import items as it
from conversations.models import Node
from conversations.selectors import path_node
from conversations.tools import registry
from conversations.tools.output import TRUNCATED_KEY, capped_text
from conversations.tools.registry import Tool
from conversations.tools.runner import run_tool_call
from conversations.turns import calls
from tests.conversations.helpers import ask, head
from tests.support.trees import TreeBuilder

ZEROBLOB_ATTACK = "select zeroblob(1000000) as b from orders limit 20"


def _call(name: str, arguments: dict) -> it.Item:
    return it.tool_call("call_1", name, json.dumps(arguments))


@pytest.fixture
def endless_tool(monkeypatch):
    """A tool of any kind (not SQL) whose output never ends: what it gave, and whether it was closed."""
    seen = {"yielded": 0, "closed": False}

    def endless() -> dict:
        def lines():
            try:
                for n in itertools.count():
                    seen["yielded"] += 1
                    yield f"line {n} " + "x" * 100
            finally:
                seen["closed"] = True

        return {"lines": lines()}

    monkeypatch.setitem(registry._TOOLS, "endless", Tool("endless", "Never stops.", {"type": "object"}, endless))
    return seen


def test_high_2_the_zeroblob_attack_gives_a_capped_result_marked_truncated(settings):
    """The 140 MB query answers at most ARBOR_TOOL_OUTPUT_MAX_BYTES, as valid JSON that says it was cut;
    a binary value is described, never sent as bytes (NULs would also break PostgreSQL's jsonb)."""
    settings.ARBOR_TOOL_OUTPUT_MAX_BYTES = 5000
    result = run_tool_call(_call("sql_query", {"sql": ZEROBLOB_ATTACK}))
    assert not result["is_error"]
    assert len(result["content"].encode()) <= 5000
    shown = json.loads(result["content"])
    assert shown["rows"][0] == ["<binary data, 1000000 bytes>"]
    assert shown["row_count"] == 20 and TRUNCATED_KEY not in shown  # 20 descriptions fit in 5 kB

    settings.ARBOR_TOOL_OUTPUT_MAX_BYTES = 300
    shown = json.loads(run_tool_call(_call("sql_query", {"sql": ZEROBLOB_ATTACK}))["content"])
    assert 0 < len(shown["rows"]) < 20 and shown["row_count"] == len(shown["rows"])
    assert "300-byte limit" in shown[TRUNCATED_KEY]


def test_high_2_a_long_text_value_is_cut_per_cell_and_says_how_much_is_missing(settings):
    settings.ARBOR_TOOL_CELL_MAX_BYTES = 1000
    sql = "select replace(hex(zeroblob(10000)), '0', 'x') as long, 'short' as s"
    shown = json.loads(run_tool_call(_call("sql_query", {"sql": sql}))["content"])
    (long, short), = shown["rows"]
    assert long == "x" * 1000 + "…[19000 more bytes not shown]"
    assert short == "short"


def test_high_2_the_cap_lives_in_the_runner_and_stops_reading_any_tool(settings, endless_tool):
    """A tool that never stops is read only as far as the limit, then closed: the cap is not the tool's own."""
    settings.ARBOR_TOOL_OUTPUT_MAX_BYTES = 2000
    result = run_tool_call(_call("endless", {}))
    assert len(result["content"].encode()) <= 2000
    shown = json.loads(result["content"])
    assert 5 < len(shown["lines"]) < 20 and TRUNCATED_KEY in shown
    assert endless_tool["closed"] and endless_tool["yielded"] == len(shown["lines"]) + 1


def test_high_2_text_results_and_error_messages_are_capped_too(settings, monkeypatch):
    settings.ARBOR_TOOL_OUTPUT_MAX_BYTES = 300

    def shout(**_):
        return "é" * 1000

    def fail(**_):
        raise ValueError("no: " + "y" * 1000)

    monkeypatch.setitem(registry._TOOLS, "shout", Tool("shout", "Long text.", {"type": "object"}, shout))
    monkeypatch.setitem(registry._TOOLS, "fail", Tool("fail", "Raises.", {"type": "object"}, fail))
    text = run_tool_call(_call("shout", {}))["content"]
    assert len(text.encode()) <= 300
    assert text.startswith("é" * 100) and text.endswith("300-byte limit; the rest was not read]")
    error = run_tool_call(_call("fail", {}))
    assert error["is_error"] and error["content"].startswith("error: no: yyy") and "300-byte limit" in error["content"]


def test_capped_text_keeps_what_json_and_postgresql_cannot_hold_out():
    """NaN, NUL characters, lone surrogates and non-JSON values become text that jsonb stores."""
    text = capped_text({"nan": float("nan"), "nul": "a\x00b", "lone": "\ud800", "when": object, "n": [1, 2.5, None]},
                       cell_max=100, total_max=1000)
    shown = json.loads(text)
    assert shown["nan"] == "nan" and shown["nul"] == "a\ufffdb" and shown["lone"] == "?"
    assert shown["when"] == "<class 'object'>" and shown["n"] == [1, 2.5, None]
    assert capped_text(b"\xff\xfe", cell_max=10, total_max=100) == "<binary data, 2 bytes>"
    cut = json.loads(capped_text(["a" * 50, "b" * 50, "c" * 50], cell_max=100, total_max=250))
    assert cut == ["a" * 50, "[the tool's output passed the 250-byte limit; the rest was not read]"]


@pytest.mark.django_db
def test_high_2_a_turn_running_the_attack_stores_a_small_node(conversation, settings):
    """Through the real turn and the database (jsonb on PostgreSQL): the node that carries the result is
    small, and the model and the person both read that it was cut."""
    settings.ARBOR_TOOL_OUTPUT_MAX_BYTES = 64_000
    settings.ARBOR_NODE_MAX_BYTES = 1_000_000
    ask(conversation, f'#tool sql_query {{"sql": "{ZEROBLOB_ATTACK}"}}')
    last = head(conversation)
    (result,) = last.sent
    assert len(json.dumps(last.sent).encode()) < 70_000
    assert json.loads(result["content"])["row_count"] == 20
    stored = Node.objects.values_list("sent", flat=True).get(pk=last.pk)
    assert stored == last.sent


@pytest.mark.django_db
def test_high_2_a_rounds_results_share_the_nodes_limit(conversation, settings):
    """Many calls in one round (as a provider sends parallel calls): together their results stay within a
    quarter of ARBOR_NODE_MAX_BYTES, each one cut and marked."""
    settings.ARBOR_NODE_MAX_BYTES = 8000
    asked = [it.tool_call(f"call_{n}", "sql_query", json.dumps({"sql": ZEROBLOB_ATTACK})) for n in range(4)]
    node = TreeBuilder(conversation).node(sent=[it.user("four queries")], received=asked)
    results = calls.resolve(path_node(node), run=True, owner_id=conversation.owner_id)
    assert [r["call_id"] for r in results] == [f"call_{n}" for n in range(4)]
    assert all(len(r["content"].encode()) <= 500 for r in results)
    assert all(TRUNCATED_KEY in json.loads(r["content"]) for r in results)


@pytest.mark.django_db
def test_high_2_an_answer_longer_than_a_node_keeps_is_cut_and_kept(conversation, settings):
    """The model's answer is read up to half of ARBOR_NODE_MAX_BYTES; past it the call fails, its partial
    text kept (nothing is lost that was stored, and nothing unbounded is)."""
    settings.ARBOR_NODE_MAX_BYTES = 400
    ask(conversation, "word " * 200)
    node = Node.objects.filter(conversation=conversation).latest("pk")
    assert node.status == "failed" and node.failure_reason == "provider_error"
    assert "the most a node keeps" in node.failure_message
    kept = it.answer_text(node.received)
    assert kept.startswith("echo: word word") and 200 <= len(kept.encode()) < 400
