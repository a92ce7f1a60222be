"""Real providers (issue 15): per-provider settings, the answer reserve sent as max_tokens, and a true budget (C1)
for imported conversations, against loopback servers that speak OpenAI's and Anthropic's wire formats."""

from __future__ import annotations

import json

import pytest
from django.core.exceptions import ImproperlyConfigured

from config.settings import _providers
from conversations import budget, llm, services
from conversations.models import Node
from conversations.turns.seen import call_context
from tests.conversations.helpers import ask, head
from tests.support.anthropic_stub import AnthropicStub

pytestmark = pytest.mark.django_db

CLAUDE = "anthropic/claude-sonnet-4-5"


@pytest.fixture
def anthropic(settings, stub):
    """An Anthropic server beside the OpenAI stub; ARBOR_API_BASE (the OpenAI stub's) is set, as for a deployment
    that has a local OpenAI-compatible server and Anthropic."""
    with AnthropicStub(api_key="sk-ant-loopback") as server:
        settings.ARBOR_MODELS = [*settings.ARBOR_MODELS, CLAUDE]
        settings.ARBOR_PROVIDERS = {"anthropic": {"api_base": server.base_url, "api_key": "sk-ant-loopback"}}
        yield server


def test_issue_15_a_key_and_a_base_go_to_their_own_provider_only(conversation, settings, stub, anthropic):
    """ARBOR_API_BASE is the OpenAI-compatible server's: an Anthropic call never goes there (it used to, with the
    Anthropic key); each provider gets its own base and key, and a model's own entry wins over its provider's."""
    settings.ARBOR_PROVIDERS = {**settings.ARBOR_PROVIDERS, "openai": {"api_key": "sk-openai-own"},
                                "openai/other-model": {"api_key": "sk-for-one-model"}}
    services.conversation_update(conversation=conversation, model=CLAUDE)
    ask(conversation, "hello claude")
    assert head(conversation).status == Node.Status.SUCCEEDED
    (sent,) = anthropic.requests
    assert sent["path"] == "/v1/messages" and sent["headers"]["x-api-key"] == "sk-ant-loopback"
    assert stub.requests == []

    services.conversation_update(conversation=conversation, model="openai/stub-model")
    ask(conversation, "hello openai")
    assert stub.authorizations == ["Bearer sk-openai-own"]
    assert len(anthropic.requests) == 1
    assert llm.provider_options("openai/other-model")["api_key"] == "sk-for-one-model"
    assert llm.provider_options("openai/other-model")["api_base"] == stub.base_url
    assert "api_base" not in llm.provider_options(CLAUDE) or llm.provider_options(CLAUDE)["api_base"] != stub.base_url


def test_issue_15_c1_every_call_sends_the_reserve_the_budget_kept_as_max_tokens(conversation, settings, stub,
                                                                                anthropic):
    """C1: litellm would send Anthropic the model's whole output limit (64,000), and a context the budget let
    through was refused ("137122 + 64000 > 200000"). Every call sends the reserve: the model's output limit
    capped by ARBOR_ANSWER_RESERVE_TOKENS."""
    services.conversation_update(conversation=conversation, model=CLAUDE)
    ask(conversation, "one")
    settings.ARBOR_ANSWER_RESERVE_TOKENS = 1234
    ask(conversation, "two")
    assert [r["body"]["max_tokens"] for r in anthropic.requests] == [4096, 1234]
    assert budget.budget_for(CLAUDE).reserve == 1234
    services.conversation_update(conversation=conversation, model="openai/stub-model")
    ask(conversation, "three")
    assert stub.requests[-1]["max_tokens"] == budget.budget_for("openai/stub-model").reserve


def test_issue_15_the_reserve_is_the_models_output_limit_when_that_is_smaller(settings):
    """C1: litellm's model info knows each model's output limit; the reserve never exceeds it."""
    settings.ARBOR_ANSWER_RESERVE_TOKENS = 10**6
    assert llm.max_output_tokens("openai/gpt-4o") == 16384
    assert budget.budget_for("openai/gpt-4o").reserve == 16384
    assert llm.max_output_tokens("hosted_vllm/a-model-litellm-does-not-know") is None
    settings.ARBOR_MAX_INPUT_TOKENS = {"hosted_vllm/a-model-litellm-does-not-know": 8000}
    assert budget.budget_for("hosted_vllm/a-model-litellm-does-not-know").reserve == 2000  # a quarter


def test_issue_15_arbor_providers_must_be_an_object_of_objects():
    """A bad ARBOR_PROVIDERS stops the start with a sentence saying what it must be, not a call that fails later."""
    assert _providers("") == {}
    assert _providers('{"anthropic": {"api_key": "k"}}') == {"anthropic": {"api_key": "k"}}
    for bad in ("{not json", '["anthropic"]', '{"anthropic": "k"}'):
        with pytest.raises(ImproperlyConfigured, match="ARBOR_PROVIDERS"):
            _providers(bad)


def _long_chatgpt_export(turns: int, words: int) -> dict:
    """A linear ChatGPT conversations.json entry of `turns` question/answer pairs of `words` words each."""
    mapping = {"root": {"id": "root", "message": None, "parent": None, "children": []}}
    parent = "root"
    for i in range(turns * 2):
        key = f"m{i}"
        role = "user" if i % 2 == 0 else "assistant"
        text = " ".join(f"{role}{i}w{j}" for j in range(words))
        mapping[key] = {"id": key, "parent": parent, "children": [],
                        "message": {"id": key, "author": {"role": role}, "create_time": 1700000000 + i,
                                    "content": {"content_type": "text", "parts": [text]}}}
        mapping[parent]["children"].append(key)
        parent = key
    return {"title": "long", "mapping": mapping, "current_node": parent}


def test_issue_15_c1_a_long_imported_claude_conversation_compacts_before_the_provider_would_refuse_it(
        api, user, settings, anthropic):
    """C1, C2: an imported node's tokens are counted (they were 0, so a long import never compacted and every
    turn overflowed). Anthropic's server takes 3,000 tokens; the imported path holds about 2,600 words: the
    turn compacts first, and no call is refused."""
    settings.ARBOR_MAX_INPUT_TOKENS = {CLAUDE: 3000}
    anthropic.context_window = 3000
    response = api.post("/api/conversations/import/", data=json.dumps([_long_chatgpt_export(13, 100)]),
                        content_type="application/json")
    assert response.status_code == 201, response.content
    conversation = user.conversations.get(pk=response.json()["conversations"][0]["id"])
    services.conversation_update(conversation=conversation, model=CLAUDE)
    imported = head(conversation)
    assert imported.tokens > 100 and imported.path_tokens > budget.budget_for(CLAUDE).threshold

    events = ask(conversation, "and now?")

    assert events[-1].type == "done", events[-1]
    assert any(e.type == "compaction" for e in events)
    assert anthropic.refusals == []
    # The summaries go to the same server (a window at a time: the whole path does not fit one call), then
    # the question; every call with the reserve as max_tokens, a quarter of 3,000.
    *summaries, question = anthropic.requests
    assert summaries and all("Summarise the conversation" in json.dumps(r["body"]["messages"][-1]) for r in summaries)
    assert question["body"]["messages"][-1]["content"][0]["text"] == "and now?"
    assert {r["body"]["max_tokens"] for r in anthropic.requests} == {750}
    answered = head(conversation)
    assert answered.status == Node.Status.SUCCEEDED and answered.path_tokens < budget.budget_for(CLAUDE).threshold


def test_issue_15_c1_a_model_switch_recounts_every_node_for_the_new_model(api, user, settings, anthropic):
    """C1: counts are made for the model of their moment; after a switch the worker counts every node of the
    conversation again for the new model (litellm's counter), and each path's count is rebuilt from them."""
    from conversations.jobs import worker

    response = api.post("/api/conversations/import/", data=json.dumps([_long_chatgpt_export(3, 40)]),
                        content_type="application/json")
    conversation = user.conversations.get(pk=response.json()["conversations"][0]["id"])
    before = {n.pk: n.tokens for n in Node.objects.filter(conversation=conversation)}
    services.conversation_update(conversation=conversation, model=CLAUDE)
    worker.run_due()

    nodes = {n.pk: n for n in Node.objects.filter(conversation=conversation)}
    for node in nodes.values():
        counted = (budget.items_tokens(node.sent, model=CLAUDE, provider="anthropic")
                   + budget.items_tokens(node.received, model=CLAUDE, provider="anthropic"))
        assert node.tokens == counted
        assert node.path_tokens == node.tokens + (nodes[node.parent_id].path_tokens if node.parent_id else 0)
    assert {pk: n.tokens for pk, n in nodes.items()} != before, "echo's estimate and Claude's counter differ"


@pytest.mark.parametrize(("status", "error_type", "message", "reason"), [
    (529, "overloaded_error", "Overloaded", "provider_error"),
    (429, "rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit "
                              "(https://docs.anthropic.com/en/api/rate-limits); see the response headers for current "
                              "usage.", "rate_limit"),
    (400, "invalid_request_error", "prompt is too long: 205351 tokens > 200000 maximum", "context_overflow"),
    (401, "authentication_error", "invalid x-api-key", "provider_error"),
])
def test_issue_15_f1_f2_anthropics_real_error_bodies_become_recorded_failures(conversation, anthropic, status,
                                                                             error_type, message, reason):
    """F1, F2: Anthropic's real error answers (bodies quoted in public issues: see tests/support/anthropic_stub.py)
    are recorded as a failed node with the right reason, the provider's words kept in its message; an overflow
    leaves the head where it was (F2), anything else moves it to the failed node (F1)."""
    services.conversation_update(conversation=conversation, model=CLAUDE)
    ask(conversation, "first")
    before = head(conversation)
    anthropic.fail_next(status, error_type, message, {"retry-after": "4"} if status == 429 else None)
    events = ask(conversation, "second")
    assert events[-1].type == "error" and events[-1].data["code"] == reason
    failed = Node.objects.get(pk=events[-1].data["node"])
    assert (failed.status, failed.failure_reason) == (Node.Status.FAILED, reason)
    assert message.split(" (")[0] in failed.failure_message
    assert head(conversation).pk == (before.pk if reason == "context_overflow" else failed.pk)


def test_issue_15_a_claude_call_that_must_answer_below_tool_calls_declares_their_tools_not_a_dummy(
        conversation, settings, anthropic):
    """Issue 15: below tool calls, a call offered no tools (a turn's last round) got litellm's invisible
    "dummy_tool" on the way to Anthropic. It declares the tools its history called instead, with tool_choice none,
    so what the provider received is what Arbor sent."""
    ask(conversation, '#tool sql_query {"sql": "select count(*) as n from customers"}')  # arbor/echo's tool round
    services.conversation_update(conversation=conversation, model=CLAUDE)
    settings.ARBOR_MAX_ROUNDS_PER_TURN = 1  # the first round is the last: it may not call tools
    assert ask(conversation, "and now?")[-1].type == "done"
    (request,) = anthropic.requests
    assert [t["name"] for t in request["body"]["tools"]] == ["sql_query"]
    assert request["body"]["tool_choice"] == {"type": "none"}
    assert "dummy_tool" not in json.dumps(request["body"])


def test_issue_15_what_the_model_saw_is_what_anthropic_received_two_questions_in_a_row(conversation, anthropic):
    """Issue 15: a failed turn's question stays on the path (F1), so the next question follows it: two user
    messages in a row, which litellm merged into one on the way to Anthropic after "what the model saw" was
    recorded. The assembly merges them itself, each text a block: what the page shows is what was received."""
    ask(conversation, "#fail")  # arbor/echo fails: the question stays, with no answer
    services.conversation_update(conversation=conversation, model=CLAUDE)
    ask(conversation, "again, please")
    (request,) = anthropic.requests
    received = [{"role": m["role"], "texts": [b["text"] for b in m["content"]]} for m in request["body"]["messages"]]
    assert received == [{"role": "user", "texts": ["#fail", "again, please"]}]
    seen = call_context(head(conversation))
    assert [(m["role"], [b["text"] for b in m["content"]]) for m in seen] == [("user", ["#fail", "again, please"])]


def _as_anthropic_reads_it(messages: list[dict]) -> tuple[list[str], list[tuple[str, list[tuple]]]]:
    """"What the model saw" (OpenAI-format messages) in the Messages API's terms: system apart, a tool result a
    block of a user turn, texts and calls blocks of their role's turn. Only the wire's spelling differs."""
    system, turns = [], []
    for message in messages:
        role, content = message["role"], message.get("content")
        if role == "system":
            system.append(content)
            continue
        blocks = [("text", b["text"]) for b in ([{"text": content}] if isinstance(content, str) else content or ())]
        blocks += [("tool_use", c["id"], c["function"]["name"]) for c in message.get("tool_calls") or ()]
        if role == "tool":
            role, blocks = "user", [("tool_result", message["tool_call_id"], content)]
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(blocks)
        else:
            turns.append((role, blocks))
    return system, turns


def _received_by_anthropic(body: dict) -> tuple[list[str], list[tuple[str, list[tuple]]]]:
    def block(b):
        if b["type"] == "text":
            return ("text", b["text"])
        if b["type"] == "tool_use":
            return ("tool_use", b["id"], b["name"])
        content = b["content"] if isinstance(b["content"], str) else "".join(c["text"] for c in b["content"])
        return ("tool_result", b["tool_use_id"], content)

    system = [b["text"] for b in body.get("system") or ()] if not isinstance(body.get("system"), str) else [
        body["system"]]
    return system, [(m["role"], [block(b) for b in m["content"]]) for m in body["messages"]]


def test_issue_15_t5_anthropic_receives_exactly_what_the_model_saw_shows_nothing_added_or_merged_away(
        conversation, settings, anthropic):
    """Issue 15 (T5): a Claude call below instructions, a tool round, a failed question and a new one: the request
    Anthropic received holds the same texts, calls and results, in the same order, as "what the model saw", and
    nothing else (no "[System: Empty message content sanitised…]", no glued texts, no dummy tool)."""
    services.conversation_update(conversation=conversation, instructions="Be brief.")
    ask(conversation, '#tool sql_query {"sql": "select count(*) as n from customers"}')
    ask(conversation, "#fail")
    services.conversation_update(conversation=conversation, model=CLAUDE)
    settings.ARBOR_MAX_ROUNDS_PER_TURN = 1
    assert ask(conversation, "and now?")[-1].type == "done"
    (request,) = anthropic.requests
    seen = call_context(head(conversation))
    assert [m["role"] for m in seen] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert _received_by_anthropic(request["body"]) == _as_anthropic_reads_it(seen)
    assert "sanitised" not in json.dumps(request["body"])
