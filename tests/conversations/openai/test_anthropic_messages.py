"""Issue 27: Anthropic's Messages API (`POST /v1/messages`) with the official `anthropic` SDK (requirements-dev.in)
against a live Arbor (Daphne in its own process, tests/support/browser.py). The SDK validates every response
strictly and never retries. A request resends the whole history, as Claude Code and Anthropic's agents do: it is
matched against the stored paths (T7), only what is new is recorded, tool results are the caller's (T4), and
thinking blocks are kept on the answer as its reasoning (C4)."""

from __future__ import annotations

import anthropic
import httpx
import pytest
from anthropic.types import Message
from rest_framework.authtoken.models import Token

from conversations import items as it
from conversations.models import Conversation, Node

pytestmark = pytest.mark.django_db(transaction=True)  # the live server reads what the test writes

MODEL = "arbor/echo"
WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture
def key(user) -> str:
    return Token.objects.create(user=user).key


@pytest.fixture
def client(asgi_server, key) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key=key, base_url=asgi_server.url, max_retries=0,
                               _strict_response_validation=True)


def _node(message_id: str) -> Node:
    return Node.objects.get(pk=int(message_id.removeprefix("msg_")))


def _blocks(message: Message) -> list[dict]:
    """A message's content as the next request sends it back."""
    return [block.model_dump(exclude_none=True) for block in message.content]


def test_issue_27_t4_t7_a_tool_loop_over_messages_records_one_path_and_only_what_is_new(client, user):
    question = {"role": "user", "content": '#tool get_weather {"city": "Paris"}'}
    asked = client.messages.create(model=MODEL, max_tokens=512, system="Answer with the weather.",
                                   tools=[WEATHER], messages=[question])
    assert asked.stop_reason == "tool_use" and asked.model == MODEL
    (use,) = [block for block in asked.content if block.type == "tool_use"]
    assert (use.name, use.input) == ("get_weather", {"city": "Paris"})
    first = _node(asked.id)
    assert first.instructions == "Answer with the weather." and first.received[-1]["client"] is True

    history = [question, {"role": "assistant", "content": _blocks(asked)},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                             "content": "18C and rain"}]}]
    answered = client.messages.create(model=MODEL, max_tokens=512, tools=[WEATHER], messages=history,
                                      system="Answer with the weather.")
    assert answered.stop_reason == "end_turn" and "tool:18C and rain" in answered.content[0].text
    second = _node(answered.id)
    assert second.parent_id == first.pk and second.sent == [it.tool_result(use.id, "get_weather", "18C and rain")]
    assert answered.usage.input_tokens > 0 and answered.usage.output_tokens > 0

    history += [{"role": "assistant", "content": _blocks(answered)}, {"role": "user", "content": "And tomorrow?"}]
    third = client.messages.create(model=MODEL, max_tokens=512, tools=[WEATHER], messages=history,
                                   system="Answer with the weather.")
    assert _node(third.id).parent_id == second.pk
    assert third.content[0].text.count("18C and rain") == 1, "the stored path was sent once"
    assert Conversation.objects.filter(owner=user).count() == 1 and Node.objects.count() == 3


def test_issue_27_a_streamed_message_arrives_as_anthropics_events_and_the_sdk_assembles_it(client):
    # `#slow`: the words come one by one (an instant answer comes as one piece: issue 34)
    with client.messages.stream(model=MODEL, max_tokens=256, messages=[{"role": "user", "content": "hello there #slow"}]
                                ) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(texts) > 1 and "".join(texts) == final.content[0].text
    assert final.content[0].text.startswith("echo: hello there") and final.stop_reason == "end_turn"
    assert final.usage.output_tokens > 0 and _node(final.id).status == Node.Status.SUCCEEDED

    with client.messages.stream(model=MODEL, max_tokens=256, tools=[WEATHER], messages=[
            {"role": "user", "content": '#tool get_weather {"city": "Seoul"}'}]) as stream:
        final = stream.get_final_message()
    (use,) = final.content
    assert (use.type, use.input, final.stop_reason) == ("tool_use", {"city": "Seoul"}, "tool_use")


def test_issue_27_c4_thinking_in_a_resent_history_is_kept_as_the_answers_reasoning(client, user):
    """A history that holds answers Arbor never stored (made elsewhere) is recorded as it was sent; an assistant
    turn's thinking blocks, signature and all, become the answer's reasoning for its provider (C4)."""
    thinking = {"type": "thinking", "thinking": "Paris is in France.", "signature": "c2lnbmF0dXJl"}
    made = client.messages.create(model=MODEL, max_tokens=256, messages=[
        {"role": "user", "content": "Where is Paris?"},
        {"role": "assistant", "content": [thinking, {"type": "text", "text": "In France."}]},
        {"role": "user", "content": "And Lyon?"}])
    supplied = _node(made.id).parent
    assert supplied.received == [
        {"type": "reasoning", "provider": "arbor", "text": "Paris is in France.", "data": [thinking]},
        it.text("In France.")]
    assert "Where is Paris?" in made.content[0].text and "In France." in made.content[0].text


def test_issue_27_bad_requests_are_anthropics_errors_and_record_nothing(client, asgi_server, key):
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        client.post("/v1/messages", cast_to=Message, body={"model": MODEL, "messages": [
            {"role": "user", "content": "hi"}]})
    with pytest.raises(anthropic.BadRequestError, match="only the caller's own tools"):
        client.messages.create(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hi"}],
                               tools=[{"type": "web_search_20250305", "name": "web_search"}])
    with pytest.raises(anthropic.BadRequestError, match=r"messages\[1\]\.content\[0\]: this server reads text"):
        client.messages.create(model=MODEL, max_tokens=64, messages=[
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]},
            {"role": "user", "content": "and?"}])
    with pytest.raises(anthropic.BadRequestError, match="answers no tool call"):
        client.messages.create(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_nope", "content": "x"}]}])
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-nothing", max_tokens=64, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(api_key="not-a-token", base_url=asgi_server.url, max_retries=0).messages.create(
            model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hi"}])
    assert not Node.objects.exists() and not Conversation.objects.exists()

    # Claude Code and older clients send the key as x-api-key; an error body is Anthropic's own shape.
    plain = httpx.post(f"{asgi_server.url}/v1/messages", headers={"x-api-key": key}, timeout=30,
                       json={"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]})
    assert plain.status_code == 200 and plain.json()["content"][0]["text"].startswith("echo: hi")
    refused = httpx.post(f"{asgi_server.url}/v1/messages", headers={"x-api-key": key}, timeout=30,
                         json={"model": MODEL, "max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]})
    assert refused.status_code == 400 and refused.json()["type"] == "error"
    assert refused.json()["error"]["type"] == "invalid_request_error" and refused.headers["x-should-retry"] == "false"


def test_issue_27_count_tokens_estimates_the_request_and_records_nothing(client):
    short = client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    longer = client.messages.count_tokens(model=MODEL, system="Be brief.", tools=[WEATHER],
                                          messages=[{"role": "user", "content": "hi " * 400}])
    assert 0 < short.input_tokens < longer.input_tokens
    assert not Node.objects.exists()


@pytest.mark.django_db
def test_issue_27_t4_a_tool_result_marked_is_error_is_recorded_as_an_error_result():
    """Anthropic's `tool_result.is_error` reaches the stored result: the model is told the tool failed (C4)."""
    from conversations.openai import chat, messages

    listed, positions = messages.chat_messages([
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "timed out",
                                      "is_error": True}]}])
    _, turns = chat.read_messages(listed, positions=positions)
    assert turns[-1].sent == [it.tool_result("toolu_1", "get_weather", "timed out", is_error=True)]
