"""Issue 27, Anthropic's Messages API at its edges (in process, arbor/echo): every refusal is a 400 in Anthropic's
shape naming the field and records nothing (D1: bad input changes nothing); every option Anthropic defines is
read; a stored answer's thinking and tool calls read back as Anthropic's blocks, in a message and in its stream."""

from __future__ import annotations

import asyncio
import json

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from conversations import items as it
from conversations.models import Conversation, Node
from conversations.openai import messages
from conversations.turns.events import EventType, TurnEvent

pytestmark = pytest.mark.django_db

MODEL = "arbor/echo"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def v1(user) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_X_API_KEY=Token.objects.create(user=user).key)
    return api


BAD = [
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content: expected text"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "send the image as base64"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                 "content": [{"type": "image"}]}]}]}, "only text is read"),
    ({"messages": [*HI, {"role": "assistant", "content": [{"type": "tool_use", "name": "f"}]}, *HI]},
     "a tool_use block has an id"),
    ({"messages": "hi"}, "`messages` must be a non-empty list"),
    ({"messages": [{"role": "system", "content": "x"}]}, "expected user or assistant"),
    ({"messages": HI, "tools": {"name": "f"}}, "`tools` must be a list"),
    ({"messages": HI, "tools": [{"name": "f", "description": 5}]}, "input_schema must be a JSON schema"),
    ({"messages": HI, "stop_sequences": ["ok", ""]}, "stop_sequences"),
    ({"messages": HI, "metadata": "x"}, "`metadata` must be an object"),
    ({"messages": HI, "temperature": 1.5}, "`temperature` must be a number from 0 to 1"),
    ({"messages": HI, "top_k": 2.5}, "`top_k` must be a whole number"),
    ({"messages": HI, "tool_choice": {"type": "any"}}, "`tool_choice: any` needs `tools`"),
    ({"messages": HI, "tool_choice": {"type": "tool", "name": "nope"}}, "naming one of `tools`"),
    ({"messages": HI, "thinking": {"type": "enabled", "budget_tokens": 10}}, "`thinking` must be"),
    ({"messages": HI, "system": [{"type": "image"}]}, "system.content[0]: only text"),
]


@pytest.mark.parametrize(("body", "needle"), BAD)
def test_issue_27_d1_a_bad_messages_request_is_a_400_in_anthropics_shape_and_records_nothing(v1, body, needle):
    response = v1.post("/v1/messages", {"model": MODEL, "max_tokens": 64, **body}, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["type"] == "error" and response.json()["error"]["type"] == "invalid_request_error"
    assert needle in response.json()["error"]["message"]
    assert not Node.objects.exists() and not Conversation.objects.exists()


def test_issue_27_every_anthropic_option_is_read_and_a_bare_body_is_refused(v1):
    tool = {"name": "get_weather", "input_schema": {"type": "object", "properties": {}}}
    for options in ({"tool_choice": {"type": "any", "disable_parallel_tool_use": True}, "tools": [tool]},
                    {"tool_choice": {"type": "tool", "name": "get_weather"}, "tools": [tool]},
                    {"tool_choice": {"type": "none"}, "tools": [tool], "thinking": {"type": "adaptive"}},
                    {"thinking": {"type": "disabled"}, "top_k": 5, "top_p": 0.5, "temperature": 0.2,
                     "stop_sequences": ["END"], "metadata": {"user_id": "u1"}},
                    {"thinking": {"type": "enabled", "budget_tokens": 2048}, "system": [{"type": "text",
                                                                                        "text": "Be brief."}]}):
        response = v1.post("/v1/messages", {"model": MODEL, "max_tokens": 64, "messages": HI, **options},
                           format="json")
        assert response.status_code == 200, (options, response.content)
    assert v1.post("/v1/messages", [1], format="json").status_code == 400
    assert v1.post("/v1/messages/count_tokens", [1], format="json").status_code == 400
    assert Node.objects.filter(instructions="Be brief.").count() == 1, "system blocks are the call's instructions"


def _answer_node(received: list) -> Node:
    return Node(pk=7, received=received, usage={"prompt_tokens": 3, "completion_tokens": 2}, status="succeeded")


def test_issue_27_c4_a_stored_answers_thinking_and_calls_read_back_as_anthropics_blocks():
    signed = {"type": "thinking", "thinking": "Plan.", "signature": "c2ln"}
    redacted = {"type": "redacted_thinking", "data": "opaque"}
    node = _answer_node([
        {"type": "reasoning", "provider": "anthropic", "text": "Plan.", "data": [signed, redacted]},
        {"type": "reasoning", "provider": "deepseek", "text": "bare thoughts"},  # no blocks of its own
        it.text("Done."), it.tool_call("toolu_1", "f", "not json"), it.tool_call("toolu_2", "g", "[1, 2]")])
    content = messages.content_of(node)
    assert content[:3] == [signed, redacted, {"type": "thinking", "thinking": "bare thoughts", "signature": ""}]
    assert content[3] == {"type": "text", "text": "Done."}
    assert content[4]["input"] == {"arguments": "not json"} and content[5]["input"] == {"value": [1, 2]}
    assert messages.message_of(node, model=MODEL)["stop_reason"] == "tool_use"


def test_issue_27_a_streams_thinking_comes_as_blocks_and_an_error_ends_it():
    node = _answer_node([{"type": "reasoning", "provider": "anthropic", "text": "Plan.", "data": [
        {"type": "thinking", "thinking": "Plan.", "signature": "c2ln"}, {"type": "redacted_thinking", "data": "x"}]},
        it.text("Done.")])

    async def read_node(pk):
        return node

    async def stream(events):
        translator = messages.MessageEvents(MODEL, read_node)
        return b"".join([await translator.translate(event) for event in events]).decode()

    said = asyncio.run(stream([TurnEvent(EventType.TOKEN, {"node": 7, "text": "Done."}),
                               TurnEvent(EventType.COMPACTION, {"node": 1}),
                               TurnEvent(EventType.DONE, {"head": 7})]))
    kinds = [json.loads(line[6:])["type"] for line in said.splitlines() if line.startswith("data: ")]
    assert kinds[:2] == ["message_start", "ping"] and kinds[-2:] == ["message_delta", "message_stop"]
    assert '"signature_delta"' in said and '"redacted_thinking"' in said and '"thinking_delta"' in said
    failed = asyncio.run(stream([TurnEvent(EventType.ERROR, {"code": "provider_error", "message": "down"})]))
    assert failed.startswith("event: error") and '"type": "api_error"' in failed and '"down"' in failed
