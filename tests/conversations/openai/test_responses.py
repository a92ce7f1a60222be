"""Issue 17: the official `openai` SDK against a live Arbor (Daphne, tests/support/browser.py's server) through
/v1/: create, stream, fork with `previous_response_id`, retrieve, input items, models, and errors raised as the
SDK's own exceptions. The client validates every response strictly and never retries (a retried create would
ask again)."""

from __future__ import annotations

import json

import openai
import pytest
from rest_framework.authtoken.models import Token

from conversations.models import Conversation, Node
from tests.support.browser import SERVER_MODELS, AsgiServer

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "arbor/echo"


def _client(server: AsgiServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(api_key=key, base_url=f"{server.url}/v1", max_retries=0, _strict_response_validation=True)


@pytest.fixture
def client(asgi_server, user) -> openai.OpenAI:
    return _client(asgi_server, Token.objects.create(user=user).key)


def test_issue_17_a_response_is_a_node_of_a_new_conversation_and_retrieves_with_its_input(client, user):
    response = client.responses.create(model=MODEL, input="Hello there", instructions="Be brief.")
    assert response.status == "completed" and response.output_text.startswith("echo: Hello there")
    node = Node.objects.get(pk=int(response.id.removeprefix("resp_")))
    assert node.conversation.owner == user and node.sent == [{"type": "user", "text": "Hello there"}]
    assert node.instructions == "Be brief." and "seen: system:Be brief." in response.output_text
    assert response.previous_response_id is None and response.usage.total_tokens > 0

    again = client.responses.retrieve(response.id)
    assert (again.id, again.output_text) == (response.id, response.output_text)
    (item,) = client.responses.input_items.list(response.id).data
    assert (item.role, item.content[0].text) == ("user", "Hello there")


def test_issue_17_t7_previous_response_id_continues_and_an_older_one_forks_without_the_newer_branch(client):
    first = client.responses.create(model=MODEL, input="first question")
    second = client.responses.create(model=MODEL, input="second question", previous_response_id=first.id)
    assert "user:first question" in second.output_text
    fork = client.responses.create(model=MODEL, input="another direction", previous_response_id=first.id)
    assert "user:first question" in fork.output_text and "second question" not in fork.output_text
    assert fork.previous_response_id == first.id == second.previous_response_id
    (conversation,) = Conversation.objects.all()
    assert Node.objects.filter(conversation=conversation, parent_id=int(first.id[5:])).count() == 2, "a branch"
    assert conversation.head_id == int(fork.id[5:])


def test_issue_17_a_streamed_response_arrives_in_deltas_and_the_sdk_assembles_it(client):
    with client.responses.stream(model=MODEL, input="#slow stream me please") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds.count("response.output_text.delta") > 2 and kinds[-1] == "response.completed"
    assert final.output_text.startswith("echo: #slow stream me please")
    assert client.responses.retrieve(final.id).output_text == final.output_text


def test_issue_17_models_lists_what_this_server_offers(client):
    assert [m.id for m in client.models.list()] == SERVER_MODELS


def test_issue_17_errors_are_the_sdks_own_exceptions_and_change_nothing(client, asgi_server, other_user):
    with pytest.raises(openai.BadRequestError, match="does not exist here"):
        client.responses.create(model="gpt-nothing", input="hi")
    with pytest.raises(openai.BadRequestError, match="input"):
        client.responses.create(model=MODEL, input="")
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="hi", previous_response_id="resp_999999")
    with pytest.raises(openai.AuthenticationError):
        _client(asgi_server, "not-a-token").models.list()
    assert not Conversation.objects.exists(), "a refused request creates nothing"

    mine = client.responses.create(model=MODEL, input="mine")
    theirs = _client(asgi_server, Token.objects.create(user=other_user).key)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.create(model=MODEL, input="x", previous_response_id=mine.id)

    with pytest.raises(openai.InternalServerError) as failed:
        client.responses.create(model=MODEL, input="#fail", previous_response_id=mine.id)
    assert failed.value.response.headers["x-should-retry"] == "false"
    assert failed.value.body["code"] == "provider_error"
    (node,) = Node.objects.filter(status=Node.Status.FAILED)
    assert node.parent_id == int(mine.id[5:]), "F1: the failed call is recorded"


WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def test_issue_17_t4_function_tools_are_the_callers_their_outputs_are_the_next_calls_sent_items(client):
    """The model calls the caller's tool: the response returns the call (Arbor runs nothing); the caller sends
    `function_call_output` with `previous_response_id`, which becomes the next node's sent items (T4), and the
    model answers having seen the result. An output for a call that was not made, or a call left without its
    output, is a 400 that records nothing."""
    asked = client.responses.create(model=MODEL, input='#tool get_weather {"city": "Paris"}', tools=[WEATHER])
    (call,) = [item for item in asked.output if item.type == "function_call"]
    assert (call.name, call.arguments) == ("get_weather", '{"city": "Paris"}') and asked.output_text == ""
    with pytest.raises(openai.BadRequestError, match="every call gets its output"):
        client.responses.create(model=MODEL, input="and?", previous_response_id=asked.id, tools=[WEATHER])
    with pytest.raises(openai.BadRequestError, match="no function call of the previous response"):
        client.responses.create(model=MODEL, previous_response_id=asked.id, tools=[WEATHER], input=[
            {"type": "function_call_output", "call_id": "call_nope", "output": "x"}])
    before = Node.objects.count()

    answered = client.responses.create(model=MODEL, previous_response_id=asked.id, tools=[WEATHER], input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "18C and rain"}])
    assert Node.objects.count() == before + 1
    node = Node.objects.get(pk=int(answered.id[5:]))
    assert node.sent == [{"type": "tool_result", "call_id": call.call_id, "name": "get_weather",
                          "content": "18C and rain", "is_error": False}]
    assert "tool:18C and rain" in answered.output_text
    (item,) = client.responses.input_items.list(answered.id).data
    assert (item.type, item.output) == ("function_call_output", "18C and rain")


def test_issue_17_a_streamed_function_call_comes_as_an_item_with_its_arguments(client):
    with client.responses.stream(model=MODEL, input='#tool get_weather {"city": "Seoul"}', tools=[WEATHER]) as s:
        kinds = [event.type for event in s]
        final = s.get_final_response()
    assert "response.function_call_arguments.done" in kinds and kinds[-1] == "response.completed"
    (call,) = [item for item in final.output if item.type == "function_call"]
    assert json.loads(call.arguments) == {"city": "Seoul"}
