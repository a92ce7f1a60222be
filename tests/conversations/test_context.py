"""Assembly is one pure function: path + new items -> messages (T5, T6, C4)."""

from __future__ import annotations

import logging
import re

import pytest

from conversations import items as it
from conversations.context import PathNode, assemble, readable_by, to_messages


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


# --- send-time shaping (C4) and compaction summaries (C2, C3) ---------------------------------------

LONG_ID = "toolu_01.weird:id/" + "x" * 40


def _tool_path(call_id: str) -> list[PathNode]:
    return [node(1, [it.user("q")], [it.tool_call(call_id, "sql_query", "{}")]),
            node(2, [it.tool_result(call_id, "sql_query", "rows")], [it.text("done")], parent=1)]


@pytest.mark.parametrize(("provider", "valid"), [
    ("anthropic", r"[a-zA-Z0-9_-]{1,64}"),
    ("openai", r".{1,40}"),
    ("mistral", r"[a-zA-Z0-9]{9}"),
    ("hosted_vllm", r"[a-zA-Z0-9_-]{1,40}"),
])
def test_c4_tool_call_ids_are_made_valid_for_the_target_and_stay_paired(provider, valid):
    """C4: an id the target refuses is mapped, the same way for the call and its result, every time."""
    messages = assemble(_tool_path(LONG_ID), [it.user("next")], provider=provider)
    call_id = messages[1]["tool_calls"][0]["id"]
    assert re.fullmatch(valid, call_id) and call_id != LONG_ID
    assert messages[2]["tool_call_id"] == call_id
    assert assemble(_tool_path(LONG_ID), [it.user("next")], provider=provider) == messages
    valid_already = assemble(_tool_path("call_abc123"), (), provider=provider)
    expected = "call_abc123" if provider != "mistral" else valid_already[1]["tool_calls"][0]["id"]
    assert valid_already[1]["tool_calls"][0]["id"] == expected


def test_c4_anthropic_gets_a_cache_marker_on_the_last_message_of_the_stable_prefix():
    """C4: `cache_control` on what came from the path (the previous call's context and answer), not on
    the new question; other providers get no marker."""
    path = [node(1, [it.user("q1")], [it.text("a1")], provider="anthropic")]
    messages = assemble(path, [it.user("q2")], instructions="Be brief.", provider="anthropic")
    assert messages[2] == {"role": "assistant", "content": [
        {"type": "text", "text": "a1", "cache_control": {"type": "ephemeral"}}]}
    assert messages[3] == {"role": "user", "content": "q2"}
    assert "cache_control" not in str(assemble(path, [it.user("q2")], provider="openai"))
    first_call = assemble([], [it.user("q1")], instructions="Be brief.", provider="anthropic")
    assert first_call[0]["content"][0]["cache_control"] == {"type": "ephemeral"}, "only the instructions are stable"


def test_c4_a_stable_prefix_ending_in_tool_calls_marks_the_last_text_before_them():
    path = [node(1, [it.user("q1")], [it.tool_call("c1", "sql_query", "{}")], provider="anthropic")]
    messages = assemble(path, [it.tool_result("c1", "sql_query", "rows")], provider="anthropic")
    assert messages[0]["content"][0]["cache_control"] == {"type": "ephemeral"}
    assert messages[1]["content"] is None and messages[2]["content"] == "rows"


def test_c2_c3_a_summary_is_read_as_text_by_anyone_and_opaque_only_by_its_provider(caplog):
    """C2: a text summary opens the compacted context; C3: an opaque one goes only to its own provider."""
    text_root = PathNode(id=9, parent_id=None, kind="compaction", status="succeeded",
                         sent=[it.summary("facts [user]"), it.user("kept q")], received=[])
    # (Anthropic gets the summary, the kept question and the new one as one user message, a block each: issue 15)
    assert assemble([text_root], [it.user("new")], provider="anthropic")[0]["content"][0]["text"].endswith(
        "facts [user]")
    assert readable_by(text_root.sent, "openai")
    opaque = it.summary("", provider="arbor", data="<arbor-compaction:abc>")
    assert readable_by([opaque], "arbor") and not readable_by([opaque], "openai")
    root = text_root._replace(sent=[opaque, it.user("kept q")])
    assert assemble([root], (), provider="arbor")[0] == {"role": "user", "content": "<arbor-compaction:abc>"}
    with caplog.at_level(logging.WARNING, logger="arbor.context"):
        assert assemble([root], (), provider="openai") == [{"role": "user", "content": "kept q"}]
    assert "cannot read" in caplog.text


def test_prefix_stability_holds_across_turns_for_every_provider_shape():
    """Turn k+1's context starts with exactly turn k's context plus its answer, ids mapped and all
    (the Anthropic cache marker moves to the end of the new prefix, so compare without it)."""
    for provider in ("openai", "anthropic", "mistral"):
        path: list[PathNode] = []
        previous: list[dict] = []
        for k in range(1, 6):
            sent = [it.user(f"q{k}")]
            messages = _unmarked(assemble(path, sent, provider=provider))
            assert messages[: len(previous)] == previous
            received = [it.tool_call(f"odd.id/{k}", "sql_query", "{}")] if k % 2 else [it.text(f"a{k}")]
            path = [*path, node(k, sent, received, parent=k - 1 or None, provider=provider)]
            if k % 2:
                path.append(node(100 + k, [it.tool_result(f"odd.id/{k}", "sql_query", "r")], [it.text("ok")],
                                 parent=k, provider=provider))
            previous = _unmarked(assemble(path, (), provider=provider))


def _unmarked(messages: list[dict]) -> list[dict]:
    return [{**m, "content": m["content"][0]["text"]} if isinstance(m.get("content"), list) else m
            for m in messages]


def test_issue_15_consecutive_assistant_texts_reach_the_model_as_paragraphs_not_glued():
    """Issue 15: a partial answer kept from a failed call, then the retry's answer, are one assistant message
    (C4); the model read "…compute this.My apologies…". They are joined as separate paragraphs."""
    items = [{"type": "user", "text": "compute it"}, {"type": "text", "text": "Let me compute this."},
             {"type": "text", "text": "My apologies, the sum is 4."}]
    assert to_messages(items, provider="openai")[1] == {
        "role": "assistant", "content": "Let me compute this.\n\nMy apologies, the sum is 4."}
