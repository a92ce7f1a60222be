"""Whole turns through the one turn runner against the loopback OpenAI stub (R1, T1, T3-T5, F1, F2).

The conversation's model is `openai/stub-model`, so every call goes through litellm's real HTTP path.
"""

from __future__ import annotations

import json
import time

import pytest

from conversations import services
from conversations.context import assemble
from conversations.models import Bubble, Node
from conversations.selectors import node_path
from tests.conversations.helpers import answer, ask, head, owner_of
from tests.support.openai_stub import Reply

pytestmark = pytest.mark.django_db

SQL = '{"sql": "select count(*) from customers"}'


@pytest.fixture
def stub_conversation(conversation, stub):
    services.conversation_update(conversation=conversation, model="openai/stub-model")
    return conversation


def without_nulls(messages: list[dict]) -> list[dict]:
    """litellm leaves out `"content": null` on an assistant tool-call message; the two mean the same."""
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


def test_t1_t3_a_streamed_text_turn_stores_the_received_text_and_the_stubs_usage(stub_conversation, stub):
    """T1, T3: one call = one succeeded node with the provider's text, usage, provider and model."""
    stub.script(Reply.text("There are sixty customers.", prompt_tokens=13, completion_tokens=5))
    events = ask(stub_conversation, "how many customers?")
    node = head(stub_conversation)
    assert node.status == "succeeded"
    assert node.sent == [{"type": "user", "text": "how many customers?"}]
    assert node.received == [{"type": "text", "text": "There are sixty customers."}]
    assert node.usage == {"prompt_tokens": 13, "completion_tokens": 5, "total_tokens": 18}
    assert (node.provider, node.model) == ("openai", "openai/stub-model")
    # The wire's four pieces, in order: one event each, or (read while the turn was busy) joined, never split
    tokens = [e.data["text"] for e in events if e.type == "token"]
    pieces = ["There", " are", " sixty", " customers."]
    assert "".join(tokens) == "".join(pieces)
    bounds = {len("".join(pieces[:i])) for i in range(1, 5)}
    assert {len("".join(tokens[:i])) for i in range(1, len(tokens) + 1)} <= bounds
    assert events[-1].type == "done"
    assert answer(events) == "There are sixty customers."
    (request,) = stub.requests
    assert request["model"] == "stub-model"
    assert request["messages"] == [{"role": "user", "content": "how many customers?"}]
    assert list(Bubble.objects.filter(node=node).values_list("role", "content")) == [
        ("user", "how many customers?"), ("assistant", "There are sixty customers.")]


def test_t5_the_second_turn_sends_the_stored_path_and_the_model_saw_what_we_store(stub_conversation, stub):
    """T5: the next request is exactly the assembly of the stored path plus the new question."""
    stub.script(Reply.text("first answer"), Reply.text("second answer"))
    ask(stub_conversation, "first question")
    ask(stub_conversation, "second question")
    assert stub.requests[1]["messages"] == [
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "first answer"},
        {"role": "user", "content": "second question"},
    ]
    last = head(stub_conversation)
    stored = assemble(node_path(last.parent_id, owner=owner_of(last.parent_id)), last.sent, provider="openai")
    assert stub.requests[1]["messages"] == stored


def test_t3_t4_a_tool_round_stores_two_nodes_and_the_result_is_the_next_nodes_sent(stub_conversation, stub):
    """T3, T4: the tool call's node is the parent of the node whose sent items are its tool result,
    and the second request carries the assistant tool_calls message and the tool message, same id."""
    stub.script(
        Reply.tool_calls([("call_stub_1", "sql_query", SQL)]),
        Reply.text("We have 60 customers."),
    )
    events = ask(stub_conversation, "how many customers?")
    second = head(stub_conversation)
    first = second.parent
    assert Node.objects.count() == 2
    assert first.parent_id is None
    assert first.status == second.status == "succeeded"
    assert first.sent == [{"type": "user", "text": "how many customers?"}]
    assert first.received == [{"type": "tool_call", "id": "call_stub_1", "name": "sql_query", "arguments": SQL}]
    (result,) = second.sent
    assert result["type"] == "tool_result"
    assert result["call_id"] == "call_stub_1"
    assert result["name"] == "sql_query"
    assert not result["is_error"]
    assert json.loads(result["content"])["rows"] == [[60]]
    assert second.received == [{"type": "text", "text": "We have 60 customers."}]
    assert answer(events) == "We have 60 customers."

    first_request, second_request = stub.requests
    assert "sql_query" in [t["function"]["name"] for t in first_request["tools"]]
    assert first_request["messages"] == [{"role": "user", "content": "how many customers?"}]
    assistant, tool = second_request["messages"][1:]
    assert assistant["role"] == "assistant"
    assert assistant["tool_calls"] == [
        {"id": "call_stub_1", "type": "function", "function": {"name": "sql_query", "arguments": SQL}}]
    assert tool["role"] == "tool"
    assert tool["tool_call_id"] == "call_stub_1"
    assert tool["content"] == result["content"]
    stored = assemble(node_path(first.pk, owner=owner_of(first.pk)), second.sent, provider="openai")
    assert without_nulls(second_request["messages"]) == without_nulls(stored), "what we store is what it saw"


def test_t3_two_parallel_tool_calls_both_get_results_in_the_next_node(stub_conversation, stub):
    """T4, C4: every call of a round gets a result, in the next node's sent items, ids kept."""
    stub.script(
        Reply.tool_calls([("call_a", "sql_query", '{"sql": "select 1"}'),
                          ("call_b", "sql_query", '{"sql": "select 2"}')]),
        Reply.text("done"),
    )
    ask(stub_conversation, "two queries")
    last = head(stub_conversation)
    assert [(r["call_id"], json.loads(r["content"])["rows"]) for r in last.sent] == [
        ("call_a", [[1]]), ("call_b", [[2]])]
    tool_messages = [m for m in stub.requests[1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ["call_a", "call_b"]


def test_f1_a_500_fails_the_node_and_moves_the_head_to_it(stub_conversation, stub):
    """F1: a provider error is a failed node, the head moves to it, the events end with provider_error."""
    stub.script(Reply.text("first answer"), Reply.server_error("the GPUs are on fire"))
    ask(stub_conversation, "first question")
    before = head(stub_conversation)
    events = ask(stub_conversation, "second question")
    failed = head(stub_conversation)
    assert failed.pk != before.pk
    assert failed.parent_id == before.pk
    assert failed.status == "failed"
    assert failed.failure_reason == "provider_error"
    assert "the GPUs are on fire" in failed.failure_message
    assert failed.sent == [{"type": "user", "text": "second question"}]
    assert failed.received == []
    assert events[-1].type == "error"
    assert events[-1].data["code"] == "provider_error"
    assert events[-1].data["head"] == failed.pk
    assert len(stub.requests) == 2, "the failed call was not retried"
    assert Bubble.objects.get(node=failed, role="error").data["reason"] == "provider_error"


def test_f1_t5_after_a_500_the_next_turn_carries_the_failed_nodes_sent_items_only(stub_conversation, stub):
    """F1, T5: a failed node on the path contributes its sent items, never received ones."""
    stub.script(Reply.server_error(), Reply.text("recovered"))
    ask(stub_conversation, "lost question")
    ask(stub_conversation, "try again")
    assert stub.requests[1]["messages"] == [
        {"role": "user", "content": "lost question"},
        {"role": "user", "content": "try again"},
    ]
    assert head(stub_conversation).parent.failure_reason == "provider_error"


def test_f1_a_500_after_a_tool_round_keeps_the_paid_tool_result_on_the_path(stub_conversation, stub):
    """F1: the failed second round's sent tool result stays on the path; the next turn does not re-run it."""
    stub.script(
        Reply.tool_calls([("call_paid", "sql_query", SQL)]),
        Reply.server_error(),
        Reply.text("sixty"),
    )
    events = ask(stub_conversation, "how many customers?")
    failed = head(stub_conversation)
    assert events[-1].data["code"] == "provider_error"
    assert failed.status == "failed"
    assert failed.sent[0]["type"] == "tool_result"
    assert failed.sent[0]["call_id"] == "call_paid"
    ask(stub_conversation, "so?")
    roles = [(m["role"], m.get("tool_call_id")) for m in stub.requests[2]["messages"]]
    assert roles == [("user", None), ("assistant", None), ("tool", "call_paid"), ("user", None)]


def test_f2_a_400_overflow_leaves_a_failed_branch_and_the_head_where_it_was(stub_conversation, stub):
    """F2: a context-overflow failure is recorded but is not on the path; the head stays put."""
    stub.script(Reply.text("fine"), Reply.context_overflow(), Reply.text("next answer"))
    ask(stub_conversation, "small question")
    before = head(stub_conversation)
    events = ask(stub_conversation, "enormous question")
    assert head(stub_conversation) == before
    failed = Node.objects.get(status="failed")
    assert failed.failure_reason == "context_overflow"
    assert failed.parent_id == before.pk
    assert failed.sent == [{"type": "user", "text": "enormous question"}]
    assert events[-1].type == "error"
    assert events[-1].data["code"] == "context_overflow"
    assert events[-1].data["head"] == before.pk
    assert failed.pk not in [p.id for p in node_path(before.pk, owner=owner_of(before.pk))]
    ask(stub_conversation, "next question")
    contents = [m["content"] for m in stub.requests[2]["messages"]]
    assert contents == ["small question", "fine", "next question"], "the overflowing question never comes back"


def test_f2_an_overflow_on_the_first_turn_leaves_no_head(stub_conversation, stub):
    stub.script(Reply.context_overflow())
    ask(stub_conversation, "too big")
    assert head(stub_conversation) is None
    assert Node.objects.get().failure_reason == "context_overflow"


def test_t1_f1_a_timeout_fails_the_node_with_reason_timeout(stub_conversation, stub, settings):
    """T1, F1: a call that outlives ARBOR_LLM_TIMEOUT_SECONDS is a failed node, reason `timeout`, and head."""
    settings.ARBOR_LLM_TIMEOUT_SECONDS = 0.5
    stub.script(Reply.hang(10))
    started = time.monotonic()
    events = ask(stub_conversation, "are you there?")
    elapsed = time.monotonic() - started
    node = head(stub_conversation)
    assert node is not None
    assert node.status == "failed"
    assert node.failure_reason == "timeout"
    assert node.finished_at is not None
    assert events[-1].data["code"] == "timeout"
    assert elapsed < 5, f"took {elapsed:.1f}s against a 0.5 s timeout"
    assert len(stub.requests) == 1


def test_t1_a_429_fails_the_node_with_reason_rate_limit(stub_conversation, stub):
    stub.script(Reply.error(429, {"error": {"message": "Rate limit reached", "type": "requests",
                                            "code": "rate_limit_exceeded"}}))
    events = ask(stub_conversation, "hello")
    node = head(stub_conversation)
    assert node.failure_reason == "rate_limit"
    assert events[-1].data["code"] == "rate_limit"
    assert len(stub.requests) == 1


def test_c4_a_reasoning_block_is_stored_and_sent_back_to_the_same_provider(stub_conversation, stub):
    """C4: reasoning is stored as its own item, tagged 'openai', and shaped into the next openai call."""
    stub.script(Reply.reasoning("sixty", "count them"), Reply.text("ok"))
    ask(stub_conversation, "how many?")
    node = head(stub_conversation)
    assert node.received == [
        {"type": "reasoning", "provider": "openai", "text": "count them", "data": None},
        {"type": "text", "text": "sixty"},
    ]
    assert answer(ask(stub_conversation, "thanks")) == "ok"
    assistant = stub.requests[1]["messages"][1]
    assert assistant["content"] == "sixty"
    assert assistant["reasoning_content"] == "count them"


@pytest.mark.django_db
def test_c4_f1_a_model_that_asks_for_tools_past_the_round_limit_ends_the_turn_cleanly(stub, user, settings):
    """C4, F1: calls returned although no tools were offered are never run; they get 'not run' results in a
    failed node (reason round_limit) that becomes the head, so the next turn's context is whole."""
    from conversations import services
    from conversations.models import Node
    from conversations.selectors import node_path
    from tests.conversations.helpers import ask, head
    from tests.support.openai_stub import Reply

    settings.ARBOR_MAX_ROUNDS_PER_TURN = 1
    conversation = services.conversation_create(owner=user, model="openai/stub-model")
    stub.script(Reply.tool_calls([("call_x", "sql_query", '{"sql": "select 1"}')]), Reply.text("fine"))
    events = ask(conversation, "q")
    assert events[-1].type == "error" and events[-1].data["code"] == "round_limit"
    failed = head(conversation)
    assert failed.status == "failed" and failed.failure_reason == Node.FailureReason.ROUND_LIMIT
    (result,) = failed.sent
    assert result["call_id"] == "call_x" and result["is_error"] and result["content"].startswith("not run")
    assert "tools" not in stub.requests[0]
    assert ask(conversation, "next")[-1].type == "done"
    assert [m["role"] for m in stub.requests[1]["messages"]] == ["user", "assistant", "tool", "user"]
    assert len(node_path(head(conversation).pk, owner=conversation.owner_id)) == 3


def test_t1_usage_records_the_price_of_a_priced_model_and_none_for_unpriced_ones(stub):
    """T1: a node's usage carries the call's cost from litellm's bundled price list (the admin sums it)."""
    from conversations.llm import stream_call
    from tests.support.openai_stub import Reply

    stub.script(Reply.text("priced answer", prompt_tokens=1000, completion_tokens=100),
                Reply.text("unpriced", prompt_tokens=1000, completion_tokens=100))

    def usage_of(model):
        call = stream_call(model=model, messages=[{"role": "user", "content": "hi"}], api_base=stub.base_url)
        while True:
            try:
                next(call)
            except StopIteration as stop:
                return stop.value.usage

    priced = usage_of("openai/gpt-4o-mini")
    assert priced["prompt_tokens"] == 1000 and priced["cost_usd"] == pytest.approx(0.00021)
    assert "cost_usd" not in usage_of("openai/stub-model")
