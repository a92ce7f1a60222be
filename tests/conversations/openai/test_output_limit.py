"""Issue 27: an answer the model stopped at its output limit says so on every surface, as each provider's own
SDK reads it (strict response validation, against the live server): chat completions' `finish_reason: "length"`,
a Responses object `incomplete` with `max_output_tokens` (and the stream's `response.incomplete`), Anthropic's
`stop_reason: "max_tokens"`. arbor/echo's `#cut` stops as a provider does at max_tokens (finish_reason "length")."""

from __future__ import annotations

import anthropic
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response

from conversations.models import Node
from tests.conversations.openai.test_gateway_agents import _key, live
from tests.conversations.openai.test_responses import MODEL, _client


@live
def test_issue_27_a_cut_answer_says_length_on_chat_completions(asgi_server, user):
    client = _client(asgi_server, _key(user))
    plain = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a long one #cut"}])
    assert ChatCompletion.model_validate(plain.model_dump()) == plain
    assert plain.choices[0].finish_reason == "length" and len(plain.choices[0].message.content.split()) == 5
    assert Node.objects.get(pk=int(plain.id.removeprefix("chatcmpl-"))).usage["finish_reason"] == "length"
    chunks = list(client.chat.completions.create(model=MODEL, stream=True,
                                                 messages=[{"role": "user", "content": "stream it #cut"}]))
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"] and all(ChatCompletionChunk.model_validate(c.model_dump()) == c for c in chunks)
    whole = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "not cut"}])
    assert whole.choices[0].finish_reason == "stop", "an answer that ended by itself stops"


@live
def test_issue_27_a_cut_answer_is_an_incomplete_response(asgi_server, user):
    client = _client(asgi_server, _key(user))
    response = client.responses.create(model=MODEL, input="a long one #cut")
    assert Response.model_validate(response.model_dump()).model_dump() == response.model_dump()
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens > 0 and response.output_text.startswith("echo:")
    with client.responses.stream(model=MODEL, input="stream it #cut") as stream:
        events = list(stream)
    assert events[-1].type == "response.incomplete" and events[-1].response.status == "incomplete"
    assert client.responses.retrieve(response.id).status == "incomplete", "as stored"


@live
def test_issue_27_a_cut_answer_stops_at_max_tokens_on_anthropic_messages(asgi_server, user):
    client = anthropic.Anthropic(api_key=_key(user), base_url=asgi_server.url, max_retries=0,
                                 _strict_response_validation=True)
    message = client.messages.create(model=MODEL, max_tokens=64,
                                     messages=[{"role": "user", "content": "a long one #cut"}])
    assert message.stop_reason == "max_tokens"
    with client.messages.stream(model=MODEL, max_tokens=64,
                                messages=[{"role": "user", "content": "stream it #cut"}]) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "max_tokens"
    whole = client.messages.create(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "whole"}])
    assert whole.stop_reason == "end_turn"


