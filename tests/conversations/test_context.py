"""Assembly is one pure function: path + new items -> messages (T5, T6, C4)."""

from __future__ import annotations

import logging

import pytest

from conversations import items as it
from conversations.context import PathNode, assemble


def node(node_id, sent, received=(), status="succeeded", parent=None, provider="openai"):
    return PathNode(id=node_id, parent_id=parent, kind="turn", status=status, sent=list(sent),
                    received=list(received), provider=provider, model="m")


CALL = it.tool_call("c1", "sql_query", '{"sql": "select 1"}')
RESULT = it.tool_result("c1", "sql_query", '{"rows": [[1]]}')


def test_t5_concatenates_sent_and_received_root_first_then_the_new_items():
    path = [node(1, [it.user("q1")], [it.text("a1")]), node(2, [it.user("q2")], [it.text("a2")], parent=1)]
    assert assemble(path, [it.user("q3")], instructions="Be brief.") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "q3"},
    ]


def test_t5_failed_and_pending_nodes_give_their_sent_items_only():
    path = [
        node(1, [it.user("q1")], [CALL]),
        node(2, [RESULT], [it.text("partial answer")], status="failed", parent=1),
    ]
    messages = assemble(path, [it.user("retry")])
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "user"]
    assert "partial answer" not in str(messages)
    pending = [node(1, [it.user("q1")], [it.text("never")], status="pending")]
    assert assemble(pending) == [{"role": "user", "content": "q1"}]


def test_t4_tool_calls_and_results_become_openai_messages_with_matching_ids():
    path = [node(1, [it.user("q")], [CALL]), node(2, [RESULT], [it.text("done")], parent=1)]
    messages = assemble(path)
    assert messages[1]["tool_calls"] == [
        {"id": "c1", "type": "function", "function": {"name": "sql_query", "arguments": '{"sql": "select 1"}'}}]
    assert messages[2] == {"role": "tool", "tool_call_id": "c1", "name": "sql_query", "content": '{"rows": [[1]]}'}


def test_t6_orphan_calls_and_results_are_dropped_with_a_warning(caplog):
    path = [node(1, [it.user("q")], [CALL, it.tool_call("c2", "x", "{}")]),
            node(2, [RESULT, it.tool_result("c9", "y", "stray")], [it.text("ok")], parent=1)]
    with caplog.at_level(logging.WARNING, logger="arbor.context"):
        messages = assemble(path)
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["c1"]
    assert [m["tool_call_id"] for m in messages if m["role"] == "tool"] == ["c1"]
    assert "c2" in caplog.text and "c9" in caplog.text


def test_t6_a_healthy_path_never_triggers_the_orphan_drop(caplog):
    path = [node(1, [it.user("q")], [CALL]), node(2, [RESULT], [it.text("a")], parent=1),
            node(3, [it.user("q2")], [it.text("a2")], parent=2)]
    with caplog.at_level(logging.WARNING, logger="arbor.context"):
        assemble(path, [it.user("q3")])
    assert caplog.records == []


def test_c4_reasoning_blocks_go_back_verbatim_only_to_the_provider_that_made_them():
    block = {"type": "thinking", "thinking": "hmm", "signature": "opaque-sig"}
    reasoning = {"type": "reasoning", "provider": "anthropic", "text": "hmm", "data": [block]}
    path = [node(1, [it.user("q")], [reasoning, it.text("a")], provider="anthropic")]
    same = assemble(path, provider="anthropic")
    assert same[1]["thinking_blocks"] == [block]
    assert same[1]["reasoning_content"] == "hmm"
    other = assemble(path, provider="openai")
    assert "thinking_blocks" not in other[1] and "reasoning_content" not in other[1]
    assert other[1]["content"] == "a"


@pytest.mark.parametrize("instructions", ["", "sys"])
def test_assembly_is_prefix_stable(instructions):
    """Turn k+1's context starts with exactly turn k's context plus its answer (prompt caches rely on it)."""
    path = [node(1, [it.user("q1")], [it.text("a1")])]
    first = assemble(path, [it.user("q2")], instructions=instructions)
    path.append(node(2, [it.user("q2")], [it.text("a2")], parent=1))
    second = assemble(path, [it.user("q3")], instructions=instructions)
    assert second[: len(first)] == first


def test_r2_ephemeral_items_are_read_once_and_dropped_later_unless_the_policy_keeps_them():
    retrieved = {**it.system("from another conversation: revenue was 42"), "ephemeral": True}
    new_call = assemble([], [retrieved, it.user("q1")])
    assert new_call[0]["content"].endswith("42"), "the call that retrieved it reads it"
    path = [node(1, [retrieved, it.user("q1")], [it.text("a1")])]
    later = assemble(path, [it.user("q2")])
    assert "42" not in str(later)
    kept = assemble(path, [it.user("q2")], keep_ephemeral=True)
    assert kept[0]["content"].endswith("42")
