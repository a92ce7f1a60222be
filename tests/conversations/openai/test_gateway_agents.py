"""Issue 27, a gateway for agents: any OpenAI client and agent SDK works unchanged and records its calls as a tree.

The official `openai` SDK drives every test: against a live Arbor (Daphne in its own process, as in
test_responses.py) where only arbor/echo is needed, and in-process through an httpx WSGI transport where the call
must reach the loopback OpenAI-compatible stub (tests/support/openai_stub.py), which records what the provider was
sent. Response objects are parsed with the SDK's own pydantic types and compared field by field with what was sent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from django.utils import timezone
from openai.types import Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from conversations import items as it
from conversations import llm, services
from conversations.models import Conversation, Node
from conversations.openai import deletion
from conversations.turns.start import turn_compact
from playbooks.models import Playbook
from tests.conversations.helpers import ask, head
from tests.conversations.openai.test_responses import MODEL, WEATHER, _client
from tests.support.browser import SERVER_MODELS
from tests.support.openai_stub import Reply

pytestmark = pytest.mark.django_db

live = pytest.mark.django_db(transaction=True)  # what a test writes must be committed for the server to read

STUB = "openai/stub-model"
CHAT_WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                                 "parameters": WEATHER["parameters"]}}


def _key(user) -> str:
    return Token.objects.get_or_create(user=user)[0].key


@pytest.fixture
def client(asgi_server, user) -> openai.OpenAI:
    """The SDK against the live server (arbor/echo only: the server is another process)."""
    return _client(asgi_server, _key(user))


@pytest.fixture
def sdk(user) -> Iterator[openai.OpenAI]:
    """The SDK in this process (httpx's WSGI transport), so a call reaches the stub the test set up. As Django's
    test client does, a request neither opens nor closes the test's connection (it holds the test's transaction)."""
    transport = httpx.WSGITransport(app=get_wsgi_application())
    for signal in (signals.request_started, signals.request_finished):
        signal.disconnect(close_old_connections)
    yield openai.OpenAI(api_key=_key(user), base_url="http://testserver/v1", max_retries=0,
                        _strict_response_validation=True, http_client=httpx.Client(transport=transport))
    for signal in (signals.request_started, signals.request_finished):
        signal.connect(close_old_connections)


@pytest.fixture
def v1(user) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION="Bearer " + _key(user))
    return api


def _node(response_id: str) -> Node:
    return Node.objects.get(pk=int(response_id.removeprefix("resp_").removeprefix("chatcmpl-")))


def _tree() -> list[tuple]:
    """Everything a delete could change: every node and where it hangs, every conversation and its head."""
    return (list(Node.objects.order_by("pk").values_list("pk", "parent_id", "conversation_id", "status"))
            + list(Conversation.objects.order_by("pk").values_list("pk", "head_id", "version")))


# --- GET /v1/models/{id} -------------------------------------------------------------------------------------


@live
def test_issue_27_models_retrieve_answers_each_listed_model_and_404s_any_other(client, asgi_server, user):
    """Issue 27: `GET /v1/models/{id}` takes ids with slashes (the SDK sends `arbor%2Fecho`; a plain slash works
    too) and answers OpenAI's model object for each model `GET /v1/models` lists; any other id is the SDK's
    NotFoundError in OpenAI's error shape (`model_not_found`, param `model`)."""
    listed = list(client.models.list())
    assert [m.id for m in listed] == SERVER_MODELS
    for model in listed:
        found = client.models.retrieve(model.id)
        assert found == model and found.object == "model"
        assert found.owned_by == model.id.split("/")[0]
    raw = client.models.with_raw_response.retrieve(MODEL)
    body = raw.http_response.json()
    assert body == {"id": MODEL, "object": "model", "created": 0, "owned_by": "arbor"}
    assert Model.model_validate(body, strict=True) == client.models.retrieve(MODEL)
    plain = httpx.get(f"{asgi_server.url}/v1/models/{MODEL}", headers={"Authorization": f"Bearer {_key(user)}"})
    assert plain.status_code == 200 and plain.json() == body

    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("openai/gpt-nothing")
    assert missing.value.body == {"message": "The model 'openai/gpt-nothing' does not exist here; GET /v1/models "
                                             "lists the ones that do.", "type": "invalid_request_error",
                                  "param": "model", "code": "model_not_found"}


# --- DELETE /v1/responses/{id} -------------------------------------------------------------------------------


@live
def test_issue_27_t11_deleting_a_response_nothing_continues_removes_it_and_its_conversation_when_empty(client):
    """Issue 27 (T11): `responses.delete` removes a response nothing continues, answering OpenAI's
    `response.deleted` object; the head that rested on it moves to its parent, and it is a 404 from then on. The
    last response of a /v1 conversation takes the conversation with it."""
    first = client.responses.create(model=MODEL, input="first")
    second = client.responses.create(model=MODEL, input="second", previous_response_id=first.id)
    conversation = _node(first.id).conversation
    assert conversation.head_id == _node(second.id).pk

    deleted = client.responses.with_raw_response.delete(second.id)
    assert deleted.http_response.status_code == 200
    assert deleted.http_response.json() == {"id": second.id, "object": "response.deleted", "deleted": True}
    assert deleted.parse() is None, "the SDK's own delete reads it"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(second.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(second.id)
    conversation.refresh_from_db()
    assert conversation.head_id == _node(first.id).pk and not Node.objects.filter(pk=int(second.id[5:])).exists()
    fork = client.responses.create(model=MODEL, input="again", previous_response_id=first.id)
    assert "user:first" in fork.output_text and "second" not in fork.output_text

    assert client.responses.delete(fork.id) is None
    assert client.responses.delete(first.id) is None
    assert not Conversation.objects.exists() and not Node.objects.exists()


@live
def test_issue_27_p3_a_response_something_continues_is_a_409_saying_what_and_nothing_changes(client, user):
    """Issue 27 (T11, P3, C3): a response with a call below it, one that another conversation's head rests on
    (a fork, X5), and one a compaction was made from are refused with 409 naming what continues it (the SDK's
    ConflictError); the tree is exactly as it was."""
    first = client.responses.create(model=MODEL, input="first")
    second = client.responses.create(model=MODEL, input="second", previous_response_id=first.id)
    before = _tree()
    with pytest.raises(openai.ConflictError) as continued:
        client.responses.delete(first.id)
    assert continued.value.body["message"] == f"{first.id} cannot be deleted: {second.id} continues it."
    assert continued.value.body["code"] == "response_continued"
    assert _tree() == before

    fork = services.conversation_create(owner=user)
    Conversation.objects.filter(pk=fork.pk).update(head=_node(second.id))
    before = _tree()
    with pytest.raises(openai.ConflictError, match=f"conversation {fork.pk} goes on from it"):
        client.responses.delete(second.id)
    assert _tree() == before


def test_issue_27_c3_a_response_a_compaction_was_made_from_is_kept_and_retrieve_names_it_as_previous(v1, user,
                                                                                                    settings):
    """Issue 27 (C2, C3): the response a compaction root was made from cannot be deleted (409, nothing changes);
    the call after the compaction names that response, not the compaction root, as its `previous_response_id`."""
    settings.ARBOR_COMPACTION_KEEP_TURNS = 1
    conversation = services.conversation_create(owner=user)
    for question in ("first question " + "words " * 30, "second question", "third question"):
        ask(conversation, question)
    root = turn_compact(user=user, conversation_id=conversation.pk)
    ask(conversation, "after the compaction")
    after = head(conversation)
    assert after.parent_id == root.pk
    body = v1.get(f"/v1/responses/resp_{after.pk}").json()
    assert Response.model_validate(body).previous_response_id == f"resp_{root.compacted_from_id}"
    first = Node.objects.filter(conversation=conversation, parent__isnull=True, kind=Node.Kind.TURN).get()
    assert v1.get(f"/v1/responses/resp_{first.pk}").json()["previous_response_id"] is None

    before = _tree()
    refused = v1.delete(f"/v1/responses/resp_{root.compacted_from_id}")
    assert refused.status_code == 409 and "was made from it" in refused.json()["error"]["message"]
    assert _tree() == before


def test_issue_27_a_title_call_below_a_response_is_kept_on_its_parent(v1, user):
    """Issue 27 (R4): a title call hung below a response continues nothing: the response is deleted and the title
    call (with what it cost) is hung on the response's parent."""
    first = v1.post("/v1/responses", {"model": MODEL, "input": "first"}, format="json").json()
    second = v1.post("/v1/responses", {"model": MODEL, "input": "second", "previous_response_id": first["id"]},
                     format="json").json()
    parent = _node(second["id"])
    title = Node.objects.create(conversation_id=parent.conversation_id, parent=parent, kind=Node.Kind.TITLE,
                                status=Node.Status.SUCCEEDED, usage={"total_tokens": 9})
    assert v1.delete(f"/v1/responses/{second['id']}").json()["deleted"] is True
    title.refresh_from_db()
    assert title.parent_id == _node(first["id"]).pk and title.usage == {"total_tokens": 9}


def test_issue_27_t9_f3_deletes_refused_while_a_turn_runs_or_a_record_keeps_it_change_nothing(v1, user, other_user):
    """Issue 27 (T9, P3): no delete while a turn holds the conversation (409 `turn_in_progress`); a response a
    playbook keeps is a 409 naming it; another person's response and a missing one are 404s. Nothing changes."""
    made = v1.post("/v1/responses", {"model": MODEL, "input": "kept"}, format="json").json()
    node = _node(made["id"])
    Conversation.objects.filter(pk=node.conversation_id).update(
        turn_token="00000000-0000-0000-0000-000000000001", turn_expires_at=timezone.now() + timezone.timedelta(60))
    before = _tree()
    running = v1.delete(f"/v1/responses/{made['id']}")
    assert running.status_code == 409 and running.json()["error"]["code"] == "turn_in_progress"
    assert _tree() == before
    Conversation.objects.filter(pk=node.conversation_id).update(turn_token=None, turn_expires_at=None)

    Playbook.objects.create(owner=user, name="kept", source_head=node, conversion_node=node, definition={})
    before = _tree()
    kept = v1.delete(f"/v1/responses/{made['id']}")
    assert kept.status_code == 409 and kept.json()["error"]["message"] == (
        f"{made['id']} cannot be deleted: a playbook keeps it.")
    assert _tree() == before

    theirs = APIClient()
    theirs.credentials(HTTP_AUTHORIZATION="Bearer " + _key(other_user))
    assert theirs.delete(f"/v1/responses/{made['id']}").status_code == 404
    assert v1.delete("/v1/responses/resp_999999999").status_code == 404
    assert _tree() == before


@live
def test_issue_27_a_call_that_began_below_a_response_meanwhile_makes_the_database_refuse_its_delete(v1, monkeypatch):
    """Issue 27 (T11): if a call came to hang below the response after the check (a race the check cannot see),
    the database's own foreign keys refuse the delete at commit: a 409, and the response is still there."""
    first = v1.post("/v1/responses", {"model": MODEL, "input": "first"}, format="json").json()
    v1.post("/v1/responses", {"model": MODEL, "input": "second", "previous_response_id": first["id"]}, format="json")
    monkeypatch.setattr(deletion, "continued_by", lambda node: None)  # the check misses the call below
    before = _tree()
    raced = v1.delete(f"/v1/responses/{first['id']}")
    assert raced.status_code == 409, raced.content
    assert "another call now goes on from it" in raced.json()["error"]["message"]
    assert _tree() == before


# --- what a response says back, and what the model call gets -------------------------------------------------

SENT = {"temperature": 0.3, "top_p": 0.9, "max_output_tokens": 64, "parallel_tool_calls": False,
        "tool_choice": {"type": "function", "name": "get_weather"}, "metadata": {"run": "a1", "step": "2"},
        "truncation": "auto", "user": "agent-7", "safety_identifier": "person-1", "prompt_cache_key": "k1",
        "text": {"format": {"type": "json_schema", "name": "weather", "strict": True,
                            "schema": {"type": "object", "properties": {"city": {"type": "string"}}}}}}

# What OpenAI returns on every response object (and the SDK's Response models).
ALWAYS = {"id", "object", "created_at", "completed_at", "status", "model", "output", "error", "incomplete_details",
          "instructions", "previous_response_id", "temperature", "top_p", "max_output_tokens", "tool_choice", "tools",
          "parallel_tool_calls", "metadata", "text", "truncation", "usage", "store", "background", "reasoning",
          "service_tier", "top_logprobs", "max_tool_calls", "user", "safety_identifier", "prompt_cache_key"}


def test_issue_27_a_response_says_back_every_field_sent_and_the_provider_got_the_options(sdk, stub):
    """Issue 27: a Responses create passes `temperature`, `top_p`, `max_output_tokens` (as `max_tokens`),
    `tool_choice`, `parallel_tool_calls` and `text.format` (as `response_format`) to the model call, and its
    response object, parsed by the SDK's own Response type, says back each field as sent, with every field OpenAI
    returns present. A retrieve says OpenAI's defaults for what a node does not keep."""
    stub.script(Reply.text("first answer"), Reply.text('{"city": "Oslo"}'))
    first = sdk.responses.create(model=STUB, input="hello")
    raw = sdk.responses.with_raw_response.create(model=STUB, input="Weather in Oslo?", instructions="Be terse.",
                                                 tools=[WEATHER], previous_response_id=first.id, store=True, **SENT)
    body = raw.http_response.json()
    assert set(body) >= ALWAYS, ALWAYS - set(body)
    response = Response.model_validate(body)
    assert response == raw.parse()
    for name, value in SENT.items():
        assert body[name] == value, name
    assert (response.previous_response_id, response.instructions, response.store) == (first.id, "Be terse.", True)
    assert body["tools"] == [WEATHER] and response.status == "completed" and response.model == STUB
    assert response.output_text == '{"city": "Oslo"}' and response.usage.total_tokens > 0
    assert response.created_at <= response.completed_at

    sent = stub.requests[-1]
    assert (sent["temperature"], sent["top_p"], sent["max_tokens"]) == (0.3, 0.9, 64)
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert sent["parallel_tool_calls"] is False
    assert sent["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "weather", "strict": True, "schema": SENT["text"]["format"]["schema"]}}
    assert "temperature" not in stub.requests[0], "a call that sent none gets the provider's own"

    again = sdk.responses.retrieve(response.id)  # parsed strictly by the SDK's own Response type
    assert (again.id, again.previous_response_id, again.instructions) == (response.id, first.id, "Be terse.")
    # A retrieve says the options the call went out with (kept on its node); what a node cannot say (the
    # request's metadata, its asked-for limit) is OpenAI's default.
    assert (again.temperature, again.top_p, again.parallel_tool_calls) == (0.3, 0.9, False)
    assert again.tool_choice.name == "get_weather" and [tool.name for tool in again.tools] == ["get_weather"]
    assert again.text.format.type == "json_schema" and again.text.format.name == "weather"
    assert (again.metadata, again.store, again.max_output_tokens) == ({}, True, None)
    plain = sdk.responses.retrieve(first.id)
    assert (plain.temperature, plain.tool_choice, plain.tools) == (None, "auto", [])


def test_issue_27_chat_options_reach_the_provider_and_the_completion_is_the_sdks_type(sdk, stub):
    """Issue 27: a chat completion passes `temperature`, `top_p`, `max_completion_tokens` (or the older
    `max_tokens`, the smaller of both), `tool_choice`, `parallel_tool_calls` and `response_format` to the model
    call; its body parses as the SDK's ChatCompletion."""
    stub.script(Reply.tool_calls([("call_1", "get_weather", '{"city": "Oslo"}')]), Reply.text('{"ok": true}'))
    raw = sdk.chat.completions.with_raw_response.create(
        model=STUB, messages=[{"role": "user", "content": "Oslo?"}], tools=[CHAT_WEATHER], temperature=1.5,
        top_p=0.5, max_completion_tokens=40, max_tokens=50, tool_choice="required", parallel_tool_calls=False)
    completion = ChatCompletion.model_validate(raw.http_response.json())
    assert completion == raw.parse() and completion.id == f"chatcmpl-{_node(completion.id).pk}"
    assert completion.choices[0].message.tool_calls[0].function.name == "get_weather"
    sent = stub.requests[-1]
    assert (sent["temperature"], sent["top_p"], sent["max_tokens"]) == (1.5, 0.5, 40)
    assert (sent["tool_choice"], sent["parallel_tool_calls"]) == ("required", False)

    named = {"type": "function", "function": {"name": "get_weather"}}
    sdk.chat.completions.create(model=STUB, messages=[{"role": "user", "content": "json please"}],
                                tools=[CHAT_WEATHER], tool_choice=named, max_tokens=30,
                                response_format={"type": "json_object"})
    sent = stub.requests[-1]
    assert (sent["tool_choice"], sent["max_tokens"], sent["response_format"]) == (named, 30, {"type": "json_object"})


def test_issue_27_tool_options_go_only_with_tools_and_the_answer_limit_never_passes_the_reserve(sdk, stub):
    """Issue 27 (C1): a `tool_choice` sent without tools does not reach the provider (which would refuse it), a
    `text` answer format is no `response_format`, and a `max_output_tokens` above the reserve the budget keeps
    for the answer is sent as that reserve."""
    stub.script(Reply.text("one"), Reply.text("two"))
    sdk.chat.completions.create(model=STUB, messages=[{"role": "user", "content": "hi"}], tool_choice="none",
                                response_format={"type": "text"})
    assert "tool_choice" not in stub.requests[-1] and "response_format" not in stub.requests[-1]
    response = sdk.responses.create(model=STUB, input="long answer", max_output_tokens=10**6, tool_choice="auto",
                                    text={"format": {"type": "json_object"}})
    assert stub.requests[-1]["max_tokens"] == llm.answer_reserve(STUB)
    assert stub.requests[-1]["response_format"] == {"type": "json_object"}
    assert (response.max_output_tokens, response.tool_choice, response.text.format.type) == (10**6, "auto",
                                                                                            "json_object")


@live
def test_issue_27_streamed_objects_are_the_sdks_types_with_the_fields_sent(client):
    """Issue 27: a streamed response's `response.created` and `response.completed` carry the fields sent, and
    parse as the SDK's Response; every streamed chat chunk parses as ChatCompletionChunk with the call's id."""
    with client.responses.stream(model=MODEL, input="stream me", temperature=0.2, metadata={"a": "b"},
                                 max_output_tokens=100) as stream:
        events = list(stream)
    created, completed = events[0].response, events[-1].response
    for response in (created, completed):
        assert Response.model_validate(response.model_dump()).model_dump() == response.model_dump()
        assert (response.temperature, response.metadata, response.max_output_tokens) == (0.2, {"a": "b"}, 100)
    assert (created.status, completed.status) == ("in_progress", "completed")

    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "chunks"}],
                                                 stream=True, stream_options={"include_usage": True}))
    node = Node.objects.get(sent__0__text="chunks")
    for chunk in chunks:
        assert ChatCompletionChunk.model_validate(chunk.model_dump()) == chunk and chunk.id == f"chatcmpl-{node.pk}"
    assert chunks[-1].usage.total_tokens == node.usage["total_tokens"]


RESPONSES_REFUSED = [
    ("temperature", 2.5), ("temperature", -0.1), ("temperature", "hot"), ("temperature", True), ("top_p", 1.5),
    ("max_output_tokens", 15), ("max_output_tokens", 1.5), ("max_output_tokens", True),
    ("tool_choice", "sometimes"), ("tool_choice", {"type": "function", "name": "nope"}),
    ("tool_choice", {"type": "file_search"}), ("parallel_tool_calls", "no"), ("metadata", {"a": 1}),
    ("metadata", {str(i): "v" for i in range(17)}), ("metadata", "x"), ("text", {"format": {"type": "xml"}}),
    ("text", "json"), ("text", {"format": {"type": "json_schema", "name": "x"}}), ("truncation", "middle"),
    ("store", "yes"), ("user", 5),
]
CHAT_REFUSED = [
    ("max_tokens", 0), ("max_completion_tokens", -1), ("temperature", 3), ("top_p", -1),
    ("tool_choice", {"type": "function", "function": {"name": "nope"}}), ("tool_choice", {"type": "function"}),
    ("response_format", {"type": "yaml"}), ("response_format", {"type": "json_schema", "json_schema": "x"}),
]


@pytest.mark.parametrize(("field", "value"), RESPONSES_REFUSED)
def test_issue_27_an_out_of_range_response_option_is_a_400_naming_it_and_records_nothing(v1, stub, field, value):
    """Issue 27: an option OpenAI would refuse is a 400 in OpenAI's error shape whose `param` names the field; no
    model is called and nothing is recorded."""
    body = {"model": STUB, "input": "hi", "tools": [WEATHER], field: value}
    response = v1.post("/v1/responses", body, format="json")
    assert response.status_code == 400, (field, value, response.content)
    error = response.json()["error"]
    assert error["param"].split(".")[0] == field and error["type"] == "invalid_request_error", error
    assert not stub.requests and not Node.objects.exists() and not Conversation.objects.exists()


@pytest.mark.parametrize(("field", "value"), CHAT_REFUSED)
def test_issue_27_an_out_of_range_chat_option_is_a_400_naming_it_and_records_nothing(v1, stub, field, value):
    """Issue 27: as for Responses, a chat completion's option out of range is a 400 naming it, nothing recorded."""
    body = {"model": STUB, "messages": [{"role": "user", "content": "hi"}], "tools": [CHAT_WEATHER], field: value}
    response = v1.post("/v1/chat/completions", body, format="json")
    assert response.status_code == 400, (field, value, response.content)
    assert response.json()["error"]["param"].split(".")[0] == field
    assert not stub.requests and not Node.objects.exists()


def test_issue_27_tool_choice_required_without_tools_is_refused(sdk, stub):
    """Issue 27: `tool_choice: required` with no tools to call is the SDK's BadRequestError; nothing recorded."""
    with pytest.raises(openai.BadRequestError, match="needs `tools`") as refused:
        sdk.responses.create(model=STUB, input="hi", tool_choice="required")
    assert refused.value.param == "tool_choice"
    assert not stub.requests and not Node.objects.exists()
    assert json.loads(refused.value.response.text)["error"]["code"] == "bad_input"


# --- OpenAI's manual-history pattern: earlier turns resent in `input`, no previous_response_id --------------------


def _as_input(response) -> list[dict]:
    """A response's output items sent back as input, as the SDK's docs and openai-agents do."""
    return [item.model_dump(exclude_none=True) for item in response.output]


def test_issue_27_t7_resent_history_is_matched_and_only_the_new_call_recorded(sdk, user):
    """Issue 27 (OpenAI's manual-history pattern, T7): a Responses input that resends earlier turns (the question,
    the previous response's function_call items, their function_call_output, then the answer and a next
    question) with no `previous_response_id` continues the stored path it extends: each request records one
    node, hung below the call it follows, in the same conversation; the model sees the whole history once."""
    question = {"role": "user", "content": '#tool get_weather {"city": "Paris"}'}
    asked = sdk.responses.create(model=MODEL, input=[question], tools=[WEATHER])
    (call,) = [item for item in asked.output if item.type == "function_call"]
    history = [question, *_as_input(asked),
               {"type": "function_call_output", "call_id": call.call_id, "output": "18C and rain"}]
    answered = sdk.responses.create(model=MODEL, input=history, tools=[WEATHER])
    assert answered.previous_response_id is None, "said back as sent"
    assert "tool:18C and rain" in answered.output_text
    first, second = _node(asked.id), _node(answered.id)
    assert second.parent_id == first.pk and second.conversation_id == first.conversation_id
    assert second.sent == [{"type": "tool_result", "call_id": call.call_id, "name": "get_weather",
                            "content": "18C and rain", "is_error": False}], "only what is new is recorded"

    history += [*_as_input(answered), {"role": "user", "content": "and tomorrow?"}]
    third = sdk.responses.create(model=MODEL, input=history, tools=[WEATHER])
    node = _node(third.id)
    assert node.parent_id == second.pk and Node.objects.filter(conversation=first.conversation).count() == 3
    assert third.output_text.count("18C and rain") == 1, "the model saw the result once, from the stored path"
    assert Conversation.objects.filter(owner=user).count() == 1


def test_issue_27_t2_resent_history_that_differs_branches_where_it_differs(sdk, user):
    """Issue 27 (T2): a resent history whose tool output differs from the stored one records that turn as it
    was sent (a sibling of the stored one) and the new call below it; the stored branch is untouched and never
    seen by the new call."""
    question = {"role": "user", "content": '#tool get_weather {"city": "Oslo"}'}
    asked = sdk.responses.create(model=MODEL, input=[question], tools=[WEATHER])
    (call,) = [item for item in asked.output if item.type == "function_call"]
    stored = sdk.responses.create(model=MODEL, tools=[WEATHER], input=[
        question, *_as_input(asked), {"type": "function_call_output", "call_id": call.call_id, "output": "sun"}])
    before = Node.objects.count()
    edited = sdk.responses.create(model=MODEL, tools=[WEATHER], input=[
        question, *_as_input(asked), {"type": "function_call_output", "call_id": call.call_id, "output": "snow"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "It snows."}]},
        {"role": "user", "content": "Should I ski?"}])
    assert Node.objects.count() == before + 2, "the differing turn as sent, then the new call"
    new = _node(edited.id)
    supplied = new.parent
    assert supplied.parent_id == _node(asked.id).pk and supplied.pk != _node(stored.id).pk
    assert it.answer_text(supplied.received) == "It snows."
    assert "snow" in edited.output_text and "tool:sun" not in edited.output_text


def test_issue_27_resent_history_errors_name_the_input_item_and_record_nothing(v1, user):
    """Bad input: an output for a call the history never made, an assistant answer first, or a function call
    without its arguments is a 400 naming the input item; nothing is written."""
    bad = [
        ([{"role": "user", "content": "q"}, {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
          {"type": "function_call_output", "call_id": "c2", "output": "x"}], "input[2].tool_call_id"),
        ([{"role": "assistant", "content": "hi"}, {"role": "user", "content": "q"}], "input[0]: an assistant"),
        ([{"role": "user", "content": "q"}, {"type": "function_call", "call_id": "c1", "name": "f"},
          {"type": "function_call_output", "call_id": "c1", "output": "x"}], "input[1]: a function_call has"),
        ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "The last message must be"),
    ]
    for items, needle in bad:
        response = v1.post("/v1/responses", {"model": MODEL, "input": items}, format="json")
        assert response.status_code == 400 and needle in response.json()["error"]["message"], response.json()
    assert not Node.objects.exists() and not Conversation.objects.exists()


# --- OpenAI's Conversations API: an Arbor conversation is an OpenAI conversation --------------------------------


def test_issue_27_t2_conversations_api_create_continue_at_the_head_and_list_items(sdk, user):
    """Create a conversation with metadata and a first item; `responses.create(conversation=…)` sends the waiting
    item first and hangs each call below the head (T2), one path; items list what the path holds, root first
    (asc) or newest first (desc, OpenAI's default), paged with `after`; every object is the SDK's own type."""
    conv = sdk.conversations.create(metadata={"topic": "weather"},
                                    items=[{"type": "message", "role": "user", "content": "Hello!"}])
    assert conv.id.startswith("conv_") and conv.metadata == {"topic": "weather"}
    stored = Conversation.objects.get(pk=int(conv.id[5:]))
    assert (stored.owner, stored.origin, stored.head_id) == (user, Conversation.Origin.API, None)
    (waiting,) = sdk.conversations.items.list(conv.id).data
    assert waiting.type == "message" and waiting.content[0].text == "Hello!"

    first = sdk.responses.create(model=MODEL, input="What is the weather?", conversation=conv.id)
    assert first.conversation.id == conv.id
    node = _node(first.id)
    assert [item["text"] for item in node.sent] == ["Hello!", "What is the weather?"], "the waiting item went first"
    second = sdk.responses.create(model=MODEL, input="And tomorrow?", conversation={"id": conv.id})
    assert _node(second.id).parent_id == node.pk and Conversation.objects.get(pk=stored.pk).head_id == int(
        second.id[5:])
    assert "Hello!" in second.output_text and Conversation.objects.filter(owner=user).count() == 1

    ascending = sdk.conversations.items.list(conv.id, order="asc", limit=100).data
    assert [(i.type, getattr(i, "role", None)) for i in ascending] == [
        ("message", "user"), ("message", "user"), ("message", "assistant"), ("message", "user"),
        ("message", "assistant")]
    assert ascending[-1].content[0].text == second.output_text
    newest = sdk.conversations.items.list(conv.id, limit=2)
    assert [i.id for i in newest.data] == [ascending[-1].id, ascending[-2].id] and newest.has_more
    rest = sdk.conversations.items.list(conv.id, after=newest.last_id, limit=100)
    assert [i.id for i in rest.data] == [i.id for i in reversed(ascending[:-2])] and not rest.has_more
    assert sdk.conversations.items.retrieve(ascending[0].id, conversation_id=conv.id).id == ascending[0].id

    updated = sdk.conversations.update(conv.id, metadata={"topic": "rain"})
    assert sdk.conversations.retrieve(conv.id).metadata == {"topic": "rain"} == updated.metadata


def test_issue_27_p3_conversation_items_added_wait_for_the_next_call_and_recorded_ones_stay(sdk, user):
    """Added items wait for the next call (listed after the path, deletable while they wait); an item a call sent
    is part of the tree (P3): deleting it is a 409 and nothing changes. An answer cannot be added."""
    conv = sdk.conversations.create()
    asked = sdk.responses.create(model=MODEL, input="first", conversation=conv.id)
    added = sdk.conversations.items.create(conv.id, items=[
        {"type": "message", "role": "user", "content": "note one"},
        {"type": "message", "role": "user", "content": "note two"}])
    assert [i.content[0].text for i in added.data] == ["note one", "note two"]
    sdk.conversations.items.delete(added.data[0].id, conversation_id=conv.id)
    recorded = sdk.conversations.items.list(conv.id, order="asc").data[0]
    with pytest.raises(openai.ConflictError, match="the tree keeps"):
        sdk.conversations.items.delete(recorded.id, conversation_id=conv.id)
    with pytest.raises(openai.BadRequestError, match="an answer is recorded by the call"):
        sdk.conversations.items.create(conv.id, items=[{"type": "message", "role": "assistant", "content": "x"}])
    before = _tree()
    then = sdk.responses.create(model=MODEL, input="second", conversation=conv.id)
    assert [i["text"] for i in _node(then.id).sent] == ["note two", "second"]
    assert _node(then.id).parent_id == _node(asked.id).pk
    assert Conversation.objects.get(pk=int(conv.id[5:])).pending_input == [], "taken by the call that sent them"
    assert len(_tree()) == len(before) + 1


def test_issue_27_conversations_api_errors_are_404s_and_409s_that_change_nothing(sdk, v1, other_user):
    conv = sdk.conversations.create(metadata={"k": "v"})
    theirs = services.conversation_create(owner=other_user)
    for call in (lambda: sdk.conversations.retrieve(f"conv_{theirs.pk}"),
                 lambda: sdk.conversations.items.list(f"conv_{theirs.pk}"),
                 lambda: sdk.conversations.delete("conv_nope"),
                 lambda: sdk.responses.create(model=MODEL, input="x", conversation=f"conv_{theirs.pk}")):
        with pytest.raises(openai.NotFoundError):
            call()
    first = sdk.responses.create(model=MODEL, input="x", conversation=conv.id)
    with pytest.raises(openai.BadRequestError, match="not both"):
        sdk.responses.create(model=MODEL, input="y", conversation=conv.id, previous_response_id=first.id)
    with pytest.raises(openai.BadRequestError, match="metadata"):
        sdk.conversations.update(conv.id, metadata={"k": "v" * 600})
    with pytest.raises(openai.BadRequestError, match="items"):
        sdk.conversations.create(items=[{"role": "user", "content": "x"}] * 21)
    assert sdk.conversations.retrieve(conv.id).metadata == {"k": "v"}
    assert Node.objects.count() == 1 and Conversation.objects.count() == 2

    gone = sdk.conversations.delete(conv.id)
    assert (gone.id, gone.deleted) == (conv.id, True) and not Node.objects.exists()


def test_issue_27_d1_conversations_api_bad_requests_are_400s_and_404s_that_change_nothing(v1, user, monkeypatch):
    from conversations.openai import conversations as conversations_api

    cid = v1.post("/v1/conversations", {"metadata": {"k": "v"}}, format="json").json()["id"]
    assert v1.post(f"/v1/conversations/{cid}", {"name": "x"}, format="json").status_code == 400, "no metadata"
    for query, status in (({"order": "sideways"}, 400), ({"limit": "lots"}, 400), ({"limit": 0}, 400),
                          ({"after": "msg_nope"}, 404)):
        assert v1.get(f"/v1/conversations/{cid}/items", query).status_code == status, query
    assert v1.get(f"/v1/conversations/{cid}/items/msg_nope").status_code == 404
    assert v1.delete(f"/v1/conversations/{cid}/items/pending_nope").status_code == 404
    monkeypatch.setattr(conversations_api, "MAX_PENDING", 3)
    two = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    assert v1.post(f"/v1/conversations/{cid}/items", {"items": two}, format="json").status_code == 200
    assert v1.post(f"/v1/conversations/{cid}/items", {"items": two}, format="json").status_code == 413
    stored = Conversation.objects.get(pk=int(cid[5:]))
    assert len(stored.pending_input) == 2 and stored.metadata == {"k": "v"}


def test_issue_27_an_unexpected_error_on_v1_messages_is_a_500_and_nothing_is_recorded(user, monkeypatch):
    """An error no handler knows is Django's 500 (the Anthropic shape is for the errors Arbor decides)."""
    from conversations.openai import messages

    def broken(value):
        raise RuntimeError("boom")

    monkeypatch.setattr(messages, "chat_messages", broken)
    api = APIClient(raise_request_exception=False)
    api.credentials(HTTP_X_API_KEY=_key(user))
    response = api.post("/v1/messages", {"model": "arbor/echo", "max_tokens": 9, "messages": []}, format="json")
    assert response.status_code == 500 and not Node.objects.exists()
