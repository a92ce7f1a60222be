"""Issue 17, the edges of the OpenAI-compatible /v1/ surface as a client meets them.

The official `openai` SDK against a live Arbor (Daphne, as in test_responses.py) for what a client sees on the
wire: request shapes OpenAI's API accepts (a text or a list of items, `input_text` parts, system and developer
messages, function tools, `function_call` items sent back, `function_call_output` as text parts), streamed events
in order, errors raised as the SDK's own exceptions. The DRF test client in-process (a Bearer key) for the long
tables of refusals, where a setting must be small, and for streams read late through Django's ASGI handler. Every
refusal is checked to record nothing (a refused request changes nothing).
"""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import openai
import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from conversations import services
from conversations.jobs import worker
from conversations.models import Conversation, Node, TurnRun
from conversations.openai import views
from conversations.turns.start import turn_compact
from tests.conversations.helpers import ask, head
from tests.conversations.openai.test_responses import MODEL, WEATHER, _client
from tests.support.asgi_client import ServerAsyncClient
from tests.support.async_db import in_own_thread
from tests.support.openai_stub import Reply

pytestmark = pytest.mark.django_db

live = pytest.mark.django_db(transaction=True)  # what a test writes must be committed for the server to read

CHAT_WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                                 "parameters": WEATHER["parameters"]}}


def _key(user) -> str:
    return Token.objects.get_or_create(user=user)[0].key


@pytest.fixture
def client(asgi_server, user) -> openai.OpenAI:
    return _client(asgi_server, _key(user))


@pytest.fixture
def v1(user) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION="Bearer " + _key(user))
    return api


def _nothing_recorded():
    return not Conversation.objects.exists() and not Node.objects.exists()


def _node(response_or_completion_id: str) -> Node:
    return Node.objects.get(pk=int(response_or_completion_id.rsplit("_", 1)[-1].rsplit("-", 1)[-1]))


def _assert_openai_error(response, status: int, needle: str) -> dict:
    """An error in OpenAI's format: the SDK reads `error.message/type/param/code`; a create is never retried."""
    assert response.status_code == status, (response.status_code, response.content)
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert needle in error["message"], error
    assert error["type"] == ("server_error" if status >= 500 else "invalid_request_error")
    assert response["x-should-retry"] == "false"
    return error


# --- paths and keys ------------------------------------------------------------------------------------------


@live
def test_issue_17_a_path_this_server_does_not_serve_is_the_sdks_not_found(client, asgi_server, user):
    """Issue 17: every other /v1/ path answers 404 in OpenAI's error format (`not_found`), so a client reaching
    for an endpoint Arbor does not serve gets the SDK's NotFoundError, not an HTML page."""
    with pytest.raises(openai.NotFoundError) as missing:
        client.files.list()
    assert missing.value.body == {"message": "Unknown path /v1/files on this server.",
                                  "type": "invalid_request_error", "param": None, "code": "not_found"}
    raw = httpx.get(f"{asgi_server.url}/v1/batches/batch_1", headers={"Authorization": f"Bearer {_key(user)}"})
    assert raw.status_code == 404 and raw.headers["content-type"] == "application/json"
    assert raw.json()["error"]["code"] == "not_found"


@live
def test_issue_17_a_post_to_a_path_this_server_does_not_serve_is_a_404_too(client):
    """Issue 17: a POST to an endpoint Arbor does not serve (embeddings) is the same 404 in OpenAI's format as a
    GET; the SDK raises NotFoundError (as config.api.not_found does for /api/: csrf_exempt)."""
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model=MODEL, input="hello")


@live
def test_issue_17_bearer_auth_errors_are_401s_in_openais_format(asgi_server, user, other_user):
    """Issue 17 (auth): /v1/ reads `Authorization: Bearer <the API token>` only. No header, an empty or two-part
    Bearer value, the API's own `Token` scheme, an unknown key and an inactive person's key are each a 401 the
    SDK raises as AuthenticationError, in OpenAI's format; a signed-in browser session is no credential here."""
    url = f"{asgi_server.url}/v1/models"
    key = _key(user)
    for headers in ({}, {"Authorization": "Bearer"}, {"Authorization": f"Bearer {key} extra"},
                    {"Authorization": f"Token {key}"}, {"Authorization": "Bearer not-a-key"}):
        response = httpx.get(url, headers=headers)
        assert response.status_code == 401, (headers, response.text)
        error = response.json()["error"]
        assert error["type"] == "authentication_error" and error["message"] and "param" in error, (headers, error)
        assert response.headers["www-authenticate"].startswith("Bearer"), "says which scheme it reads"

    browser = Client()
    browser.force_login(user)
    session = httpx.get(url, cookies={"sessionid": browser.cookies["sessionid"].value})
    assert session.status_code == 401, "a session never authenticates /v1/ (no cross-site request rides on it)"

    other_key = _key(other_user)
    other_user.is_active = False
    other_user.save()
    with pytest.raises(openai.AuthenticationError, match="inactive"):
        _client(asgi_server, other_key).models.list()
    assert httpx.get(url, headers={"Authorization": f"Bearer {key}"}).status_code == 200


def test_issue_17_an_error_the_apis_handler_leaves_unhandled_stays_unhandled(v1, monkeypatch):
    """Issue 17 (errors.exception_handler keeps DRF's handler contract): when the API's own handler answers
    None for an exception (DRF's "not mine": it re-raises it), the gateway's reshaping answers None too, so the
    exception propagates as it is, never as an empty OpenAI error body. Today config.api's handler answers
    every exception itself (a 500 at worst), so only a handler that leaves one is can reach this guard: the
    stand-in below is that handler, not the code under test."""
    from config.errors import ArborError
    from conversations.openai import errors

    monkeypatch.setattr(errors, "api_exception_handler", lambda exc, context: None)
    with pytest.raises(ArborError, match="does not exist here") as raised:
        v1.post("/v1/responses", {"model": "gpt-nothing", "input": "hi"}, format="json")
    assert raised.value.code == "model_not_found", "the view's own exception, untouched"
    assert _nothing_recorded()


def test_issue_17_the_v1_surface_is_not_in_arbors_own_schema(api):
    """Issue 17: OpenAI's own schema describes /v1/; Arbor's OpenAPI schema (and the fuzzing run against it)
    documents its API only, so no /v1/ path appears there."""
    response = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    paths = json.loads(response.content)["paths"]
    assert paths and not [path for path in paths if path.startswith("/v1/")]


# --- Responses: what a caller may send ----------------------------------------------------------------------


@live
def test_issue_17_input_items_with_text_parts_and_developer_messages_are_the_calls_sent_items(client):
    """Issue 17 (T1): `input` as a list of messages with `input_text` parts: system and developer messages and
    the user's question are the node's sent items in the order sent (parts joined by lines); `input_items`
    lists them newest first by default and in order with `order=asc`."""
    response = client.responses.create(model=MODEL, input=[
        {"role": "developer", "content": "Answer in French."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Bonjour"},
                                                        {"type": "input_text", "text": "ca va ?"}]},
    ])
    node = _node(response.id)
    assert node.sent == [{"type": "system", "text": "Answer in French."}, {"type": "user", "text": "Bonjour\nca va ?"}]
    assert response.output_text.startswith("echo: Bonjour\nca va ?")
    assert "system:Answer in French." in response.output_text, "the model read the developer message"

    newest_first = client.responses.input_items.list(response.id)
    assert [(i.role, i.content[0].text) for i in newest_first.data] == [("user", "Bonjour\nca va ?"),
                                                                         ("system", "Answer in French.")]
    in_order = client.responses.input_items.list(response.id, order="asc")
    assert [i.role for i in in_order.data] == ["system", "user"]
    assert (in_order.first_id, in_order.last_id) == (in_order.data[0].id, in_order.data[-1].id)
    assert in_order.has_more is False


@live
def test_issue_17_t4_a_call_sent_back_and_its_output_as_text_parts_stream_an_answer_that_read_them(client):
    """Issue 17 (T4): a client that sends the previous response's `function_call` item back with its
    `function_call_output` (here as a list of `input_text` parts) records the output once, joined, as the next
    node's sent items; streamed, the tool result (not part of OpenAI's stream) adds no event, and the stream
    opens with `response.created` and ends with `response.completed`."""
    asked = client.responses.create(model=MODEL, input='#tool get_weather {"city": "Oslo"}', tools=[WEATHER])
    (call,) = [item for item in asked.output if item.type == "function_call"]
    before = Node.objects.count()
    with client.responses.stream(model=MODEL, previous_response_id=asked.id, tools=[WEATHER], input=[
            call.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": call.call_id,
             "output": [{"type": "input_text", "text": "2C"}, {"type": "input_text", "text": " and snow"}]}]) as s:
        kinds = [event.type for event in s]
        final = s.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert set(kinds) <= {"response.created", "response.in_progress", "response.output_item.added",
                          "response.content_part.added", "response.output_text.delta", "response.output_text.done",
                          "response.content_part.done", "response.output_item.done", "response.completed"}, kinds
    assert kinds.count("response.completed") == 1
    assert "tool:2C and snow" in final.output_text
    assert Node.objects.count() == before + 1, "the call sent back is not stored again"
    assert _node(final.id).sent == [{"type": "tool_result", "call_id": call.call_id, "name": "get_weather",
                                     "content": "2C and snow", "is_error": False}]
    assert final.previous_response_id == asked.id


@live
def test_issue_17_f1_a_streamed_call_that_fails_ends_with_response_failed_and_is_recorded(client):
    """Issue 17 (F1): a streamed call whose provider fails opens the response, then ends with
    `response.failed` carrying the failure (never `response.completed`); the failed node is recorded and
    `GET /v1/responses/{id}` shows it failed with the same error."""
    with client.responses.stream(model=MODEL, input="#fail please") as s:
        events = list(s)
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.failed"
    assert "response.completed" not in kinds
    failed = events[-1].response
    assert failed.status == "failed" and failed.error.code == "server_error" and failed.usage is None
    assert "provider error" in failed.error.message
    node = _node(failed.id)
    assert (node.status, node.failure_reason) == ("failed", "provider_error")
    again = client.responses.retrieve(failed.id)
    assert again.status == "failed" and again.error.message == failed.error.message


@live
def test_issue_17_another_persons_response_is_not_found_everywhere(client, asgi_server, other_user):
    """Issue 17 (a caller sees only its own): another person's response is a 404 for retrieve, input items and
    as `previous_response_id`; so is their conversation named in a chat list's metadata. Nothing is written."""
    mine = client.responses.create(model=MODEL, input="mine only")
    theirs = _client(asgi_server, _key(other_user))
    with pytest.raises(openai.NotFoundError):
        theirs.responses.input_items.list(mine.id)
    with pytest.raises(openai.NotFoundError):
        theirs.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                       metadata={"conversation": str(_node(mine.id).conversation_id)})
    assert Node.objects.count() == 1 and Conversation.objects.count() == 1


def test_issue_17_c2_a_compaction_node_is_no_response(v1, user, settings):
    """Issue 17 (C2): a compaction root is a node of the caller's tree but not a call's response: its id (and
    its summarising call's) is a 404 for retrieve, input items and `previous_response_id`, and nothing is
    written."""
    settings.ARBOR_COMPACTION_KEEP_TURNS = 1
    conversation = services.conversation_create(owner=user)
    for question in ("first question " + "words " * 30, "second question", "third question"):
        ask(conversation, question)
    root = turn_compact(user=user, conversation_id=conversation.pk)
    assert root.kind == Node.Kind.COMPACTION
    summary = Node.objects.filter(conversation=conversation).exclude(kind=Node.Kind.TURN).exclude(pk=root.pk)
    before = Node.objects.count()
    for node_id in (root.pk, *summary.values_list("pk", flat=True)):
        _assert_openai_error(v1.get(f"/v1/responses/resp_{node_id}"), 404, "No response with id")
        _assert_openai_error(v1.get(f"/v1/responses/resp_{node_id}/input_items"), 404, "No response with id")
        _assert_openai_error(v1.post("/v1/responses", {"model": MODEL, "input": "on",
                                                       "previous_response_id": f"resp_{node_id}"}, format="json"),
                             404, "previous_response_id")
    assert Node.objects.count() == before


def _asked_with_retrieval(user) -> Conversation:
    """A conversation with retrieval on (R2), asked a question another of the person's conversations answers (its
    notes are indexed first, so the call reads them as a hit)."""
    notes = services.conversation_create(owner=user, title="Pricing notes")
    ask(notes, "Our enterprise tier costs 900 dollars per seat")
    worker.run_due()
    conversation = services.conversation_create(owner=user)
    services.conversation_update(conversation=conversation, retrieval=True)
    ask(conversation, "What does the enterprise tier cost?")
    return conversation


def test_issue_17_r2_retrieved_hits_are_not_the_callers_input_items(v1, user):
    """Issue 17 (R2): a call that read retrieved hits (ephemeral items from the person's other conversations)
    lists only what was sent as its input items: the question, not the hits."""
    node = head(_asked_with_retrieval(user))
    assert any(item.get("ephemeral") for item in node.sent), "the call did read a hit"
    listed = v1.get(f"/v1/responses/resp_{node.pk}/input_items")
    assert listed.status_code == 200
    assert [(i["role"], i["content"][0]["text"]) for i in listed.json()["data"]] == [
        ("user", "What does the enterprise tier cost?")]


def test_issue_27_r2_a_resent_list_goes_on_in_a_conversation_with_retrieval_beside_one_that_asked_the_same(v1, user):
    """Issue 27 (R2): a resent list is matched against the roots that asked its first question and against those of
    conversations with retrieval on, whose first call sent its found items before the question (issue 34 reads the
    two apart, by index, and merges them newest first). The list goes on where its answer is: in the retrieval
    conversation, not in the older one that asked the same and was answered otherwise."""
    older = services.conversation_create(owner=user, title="asked first")
    ask(older, "What does the enterprise tier cost?")
    retrieving = _asked_with_retrieval(user)
    root = head(retrieving)
    assert root.sent[0].get("ephemeral"), "its first call sent a found item before the question"
    listed = [{"role": "user", "content": "What does the enterprise tier cost?"},
              {"role": "assistant", "content": "".join(i["text"] for i in root.received if i["type"] == "text")},
              {"role": "user", "content": "And the team tier?"}]
    count = Conversation.objects.count()
    reply = v1.post("/v1/chat/completions", {"model": MODEL, "messages": listed}, format="json")
    assert reply.status_code == 200, reply.content
    assert Conversation.objects.count() == count, "no new conversation"
    assert head(retrieving).parent_id == root.pk, "the call hangs below the retrieval conversation's first call"
    assert head(older).parent_id is None, "the older conversation is left as it was"


def _too_long(settings):
    return "x" * (settings.ARBOR_MAX_CONTENT_CHARS + 1)


RESPONSES_REFUSED = [
    # (body without model, status, words the message holds)
    pytest.param(["not", "an", "object"], 400, "must be a JSON object", id="body-is-a-list"),
    pytest.param({"input": "hi", "stream": "yes"}, 400, "`stream` must be true or false", id="stream-not-bool"),
    pytest.param({"input": "hi", "instructions": "i" * 20001}, 413, "`instructions` is longer", id="instructions-long"),
    pytest.param({"input": "hi", "tools": WEATHER}, 400, "`tools` must be a list", id="tools-not-a-list"),
    pytest.param({"input": "hi", "tools": [{"type": "web_search_preview"}]}, 400, "tools[0]: only function tools",
                 id="tool-not-a-function"),
    pytest.param({"input": "hi", "tools": [{"type": "function", "name": "f", "description": 5}]}, 400,
                 "tools[0].description", id="tool-description-not-text"),
    pytest.param({"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": "loose"}]}, 400,
                 "tools[0].parameters", id="tool-parameters-not-a-schema"),
    pytest.param({"input": 5}, 400, "`input` must be a text or a non-empty list", id="input-a-number"),
    pytest.param({"input": []}, 400, "`input` must be a text or a non-empty list", id="input-empty-list"),
    pytest.param({"input": "   "}, 400, "`input` is empty", id="input-blank"),
    pytest.param({"input": [5]}, 400, "input[0]: this server reads messages", id="item-not-an-object"),
    pytest.param({"input": [{"type": "reasoning", "summary": []}, {"role": "user", "content": "q"}]}, 400,
                 "(got 'reasoning')", id="item-reasoning"),
    pytest.param({"input": [{"role": "assistant", "content": "earlier answer"}, {"role": "user", "content": "q"}]},
                 400, "input[0]: an assistant message answers the messages before it", id="assistant-first"),
    pytest.param({"input": [{"role": "developer", "content": "rules only"}]}, 400, "holds no user message",
                 id="no-user-message"),
    pytest.param({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]},
                 400, "input[0].content[0]: send the file's bytes as a data URL", id="remote-image"),
    pytest.param({"input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]}, 400,
                 "input[0].content[0]", id="text-part-not-text"),
    pytest.param({"input": [{"role": "user", "content": 5}]}, 400, "input[0].content: expected text",
                 id="content-a-number"),
    pytest.param({"input": "hi", "previous_response_id": "resp_abc"}, 404, "previous_response_id", id="id-not-digits"),
    pytest.param({"input": "hi", "previous_response_id": "msg_12"}, 404, "previous_response_id", id="id-not-resp"),
    pytest.param({"input": "hi", "previous_response_id": 12}, 404, "previous_response_id", id="id-a-number"),
    pytest.param({"input": "hi", "previous_response_id": "resp_" + "9" * 20}, 404, "previous_response_id",
                 id="id-past-int64"),
]


@pytest.mark.parametrize(("body", "status", "needle"), RESPONSES_REFUSED)
def test_issue_17_responses_malformed_bodies_are_openai_errors_and_record_nothing(v1, body, status, needle):
    """Issue 17 (D5, a refused request changes nothing): each shape the Responses API would not take, or this
    server does not serve, is answered in OpenAI's error format with a message naming the field, and no
    conversation or node is written."""
    if isinstance(body, dict):
        body = {"model": MODEL, **body}
    _assert_openai_error(v1.post("/v1/responses", body, format="json"), status, needle)
    assert _nothing_recorded()


def test_issue_17_d5_a_text_past_the_limit_is_a_413_wherever_it_is_sent(v1, settings):
    """Issue 17 (D5): a message, a function call's output, a chat message and a listed call's arguments past
    ARBOR_MAX_CONTENT_CHARS are each a 413 in OpenAI's format; nothing is stored whole, or at all."""
    settings.ARBOR_MAX_CONTENT_CHARS = 50
    long = "x" * 51
    asked = v1.post("/v1/responses", {"model": MODEL, "tools": [WEATHER], "input": "#tool get_weather {}"},
                    format="json").json()
    call = next(item for item in asked["output"] if item["type"] == "function_call")
    before = Node.objects.count()
    for body in ({"input": [{"role": "user", "content": [{"type": "input_text", "text": long}]}]},
                 {"previous_response_id": asked["id"], "tools": [WEATHER],
                  "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": long}]}):
        _assert_openai_error(v1.post("/v1/responses", {"model": MODEL, **body}, format="json"), 413, "longer than 50")
    for messages in ([{"role": "user", "content": long}],
                     [{"role": "user", "content": "q"},
                      {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
                          "name": "f", "arguments": {"text": long}}}]},
                      {"role": "tool", "tool_call_id": "c1", "content": "r"}]):
        _assert_openai_error(v1.post("/v1/chat/completions", {"model": MODEL, "messages": messages}, format="json"),
                             413, "longer than 50")
    assert Node.objects.count() == before and Conversation.objects.count() == 1


def test_issue_17_t4_a_function_output_must_be_text(v1):
    """Issue 17 (T4): a `function_call_output` whose output is neither text nor a list of text parts is a 400
    naming `output`; the call stays open and nothing is written."""
    asked = v1.post("/v1/responses", {"model": MODEL, "tools": [WEATHER], "input": "#tool get_weather {}"},
                    format="json").json()
    call_id = next(item for item in asked["output"] if item["type"] == "function_call")["call_id"]
    before = Node.objects.count()
    for output in (5, {"text": "x"}, [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": 7}]):
        response = v1.post("/v1/responses", {"model": MODEL, "previous_response_id": asked["id"], "input": [
            {"type": "function_call_output", "call_id": call_id, "output": output}]}, format="json")
        _assert_openai_error(response, 400, "input[0].output: expected text")
    assert Node.objects.count() == before


def test_issue_17_a_response_a_client_made_elsewhere_has_no_usage(v1):
    """Issue 17: a call the client made elsewhere and sent as history (a chat list's answered turn this server
    never saw) is a stored response: retrievable, completed, with `usage` null (unknown), not invented zeros."""
    listed = [{"role": "user", "content": "asked elsewhere"}, {"role": "assistant", "content": "answered elsewhere"},
              {"role": "user", "content": "and here"}]
    completion = v1.post("/v1/chat/completions", {"model": MODEL, "messages": listed}, format="json").json()
    new = Node.objects.get(pk=int(completion["id"].removeprefix("chatcmpl-")))
    supplied = v1.get(f"/v1/responses/resp_{new.parent_id}").json()
    assert supplied["status"] == "completed" and supplied["usage"] is None
    assert supplied["output"][0]["content"][0]["text"] == "answered elsewhere"
    assert v1.get(f"/v1/responses/resp_{new.pk}").json()["usage"]["total_tokens"] > 0, "Arbor's own call is counted"


# --- Chat Completions: what a caller may send ---------------------------------------------------------------


CHAT_REFUSED = [
    # (body without model, status, words the message holds)
    pytest.param({"messages": "hi"}, 400, "`messages` must be a non-empty list", id="messages-a-text"),
    pytest.param({"messages": []}, 400, "`messages` must be a non-empty list", id="messages-empty"),
    pytest.param({"messages": ["hi"]}, 400, "messages[0].role", id="message-not-an-object"),
    pytest.param({"messages": [{"role": "function", "name": "f", "content": "x"}]}, 400, "messages[0].role",
                 id="role-function"),
    pytest.param({"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content: expected text",
                 id="content-a-number"),
    pytest.param({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
                 400, "this server fetches nothing from a URL", id="remote-image"),
    pytest.param({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": {"id": "c"}},
                               {"role": "user", "content": "b"}]}, 400, "messages[1].tool_calls: expected a list",
                 id="tool-calls-not-a-list"),
    pytest.param({"messages": [{"role": "user", "content": "a"},
                               {"role": "assistant", "tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]},
                               {"role": "tool", "tool_call_id": "c", "content": "b"}]}, 400,
                 "messages[1].tool_calls[0]: expected an id and a function with a name", id="tool-call-without-name"),
    pytest.param({"messages": [{"role": "user", "content": "a"}], "stream": "true"}, 400, "`stream`",
                 id="stream-not-bool"),
    pytest.param({"messages": [{"role": "user", "content": "a"}], "metadata": {"conversation": "twelve"}}, 400,
                 "named by its id", id="conversation-not-digits"),
    pytest.param({"messages": [{"role": "user", "content": "a"}], "metadata": {"conversation": "9" * 19}}, 404,
                 "No conversation", id="conversation-past-int64"),
    pytest.param({"messages": [{"role": "user", "content": "a"}], "metadata": {"conversation": "987654"}}, 404,
                 "No conversation", id="conversation-unknown"),
    pytest.param({"messages": [{"role": "user", "content": "a"}], "tools": {"type": "function"}}, 400,
                 "`tools` must be a list", id="tools-not-a-list"),
]


@pytest.mark.parametrize(("body", "status", "needle"), CHAT_REFUSED)
def test_issue_17_chat_malformed_bodies_are_openai_errors_and_record_nothing(v1, body, status, needle):
    """Issue 17 (a refused request changes nothing): a message list or option Chat Completions would not take,
    or that names no conversation of the caller's, is an error in OpenAI's format and writes nothing."""
    _assert_openai_error(v1.post("/v1/chat/completions", {"model": MODEL, **body}, format="json"), status, needle)
    assert _nothing_recorded()


def test_issue_17_the_conversation_header_names_it_as_metadata_does(v1, user):
    """Issue 17: `X-Arbor-Conversation` names the conversation a list continues, as `metadata.conversation`
    does; a name that is not an id is a 400 and writes nothing."""
    conversation = services.conversation_create(owner=user)
    response = v1.post("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "in it"}]},
                       format="json", HTTP_X_ARBOR_CONVERSATION=str(conversation.pk))
    assert response.status_code == 200
    assert Node.objects.get().conversation_id == conversation.pk and Conversation.objects.count() == 1
    refused = v1.post("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
                      format="json", HTTP_X_ARBOR_CONVERSATION="-1")
    _assert_openai_error(refused, 400, "named by its id")
    assert Node.objects.count() == 1


def test_issue_17_text_parts_and_object_arguments_are_read_as_openai_sends_them(v1):
    """Issue 17: a message's content as a list of `text` parts is its lines; a listed tool call whose arguments
    came as an object (some clients send them decoded) is stored as their JSON text; an assistant message with
    no content is the call alone."""
    messages = [{"role": "system", "content": [{"type": "text", "text": "Be"}, {"type": "text", "text": "brief."}]},
                {"role": "user", "content": [{"type": "text", "text": "Weather"},
                                             {"type": "text", "text": "in Rome?"}]},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_r", "type": "function", "function": {"name": "get_weather",
                                                                      "arguments": {"city": "Rome"}}}]},
                {"role": "tool", "tool_call_id": "call_r", "content": [{"type": "text", "text": "25C"}]}]
    response = v1.post("/v1/chat/completions", {"model": MODEL, "messages": messages, "tools": [CHAT_WEATHER]},
                       format="json")
    answer = response.json()["choices"][0]["message"]["content"]
    assert "system:Be\nbrief." in answer and "tool:25C" in answer
    supplied = Node.objects.get(parent__isnull=True)
    assert supplied.sent == [{"type": "user", "text": "Weather\nin Rome?"}]
    assert [(c["name"], json.loads(c["arguments"])) for c in supplied.received if c["type"] == "tool_call"] == [
        ("get_weather", {"city": "Rome"})]
    assert Node.objects.exclude(pk=supplied.pk).get().instructions == "Be\nbrief."


def _chat(v1, messages, **body) -> dict:
    response = v1.post("/v1/chat/completions", {"model": MODEL, "messages": messages, **body}, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def test_issue_17_two_conversations_that_began_alike_a_list_goes_on_in_the_newest(v1):
    """Issue 17 (longest match): two conversations asked the same first question and got the same answer; a
    list that extends neither beyond that turn goes on in the newest, recording its later answered turn there
    once; the older conversation gets nothing."""
    first = [{"role": "user", "content": "Hello"}]
    older = _chat(v1, first)
    newer = _chat(v1, first)
    assert Conversation.objects.count() == 2, "an unanswered list starts a conversation of its own"
    answer = older["choices"][0]["message"]["content"]
    assert newer["choices"][0]["message"]["content"] == answer
    listed = [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": "asked elsewhere"},
              {"role": "assistant", "content": "answered elsewhere"}, {"role": "user", "content": "now here"}]
    reply = _chat(v1, listed)
    new = Node.objects.get(pk=int(reply["id"].removeprefix("chatcmpl-")))
    newer_root = Node.objects.get(pk=int(newer["id"].removeprefix("chatcmpl-")))
    supplied = Node.objects.get(pk=new.parent_id)
    assert (supplied.parent_id, supplied.provider) == (newer_root.pk, "client")
    assert new.conversation_id == newer_root.conversation_id
    older_conversation = Node.objects.get(pk=int(older["id"].removeprefix("chatcmpl-"))).conversation_id
    assert Node.objects.filter(conversation_id=older_conversation).count() == 1


def test_issue_17_a_list_whose_first_answer_was_altered_does_not_continue_the_stored_call(v1):
    """Issue 17 (longest match): a list whose first question matches a stored root but whose answer the client
    changed does not extend that path: what the client sent is recorded as its own (provider `client`) in a
    new conversation, and the stored conversation gets nothing."""
    stored = _chat(v1, [{"role": "user", "content": "Hello"}])
    reply = _chat(v1, [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "an edited answer"},
                       {"role": "user", "content": "go on"}])
    new = Node.objects.get(pk=int(reply["id"].removeprefix("chatcmpl-")))
    supplied = Node.objects.get(pk=new.parent_id)
    assert supplied.parent_id is None and supplied.provider == "client"
    assert supplied.received == [{"type": "text", "text": "an edited answer"}]
    original = Node.objects.get(pk=int(stored["id"].removeprefix("chatcmpl-")))
    assert new.conversation_id != original.conversation_id and not Node.objects.filter(parent=original).exists()
    assert "assistant:an edited answer" in reply["choices"][0]["message"]["content"]


# --- Chat Completions over the wire -------------------------------------------------------------------------


@live
def test_issue_17_f1_a_failed_chat_completion_is_the_sdks_server_error_never_retried(client):
    """Issue 17 (F1): a call whose provider fails is a 5xx the SDK raises as InternalServerError with the
    failure's code, `x-should-retry: false` (a retry would ask again); the failed node is recorded."""
    with pytest.raises(openai.InternalServerError) as failed:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "#fail now"}])
    assert failed.value.status_code == 502 and failed.value.body["code"] == "provider_error"
    assert failed.value.body["type"] == "server_error"
    assert failed.value.response.headers["x-should-retry"] == "false"
    (node,) = Node.objects.all()
    assert (node.status, node.failure_reason) == ("failed", "provider_error")


@live
def test_issue_17_a_streamed_tool_call_comes_as_a_delta_and_finishes_with_tool_calls(client):
    """Issue 17 (T4): streamed, the caller's tool call arrives as a `tool_calls` delta (index, id, name,
    arguments), the last choice chunk finishes with `tool_calls`, and the SDK's stream helper assembles it."""
    question = {"role": "user", "content": '#tool get_weather {"city": "Lima"}'}
    with client.chat.completions.stream(model=MODEL, messages=[question], tools=[CHAT_WEATHER]) as stream:
        chunks = [event.chunk for event in stream if event.type == "chunk"]
        final = stream.get_final_completion()
    deltas = [c.choices[0].delta for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert len(deltas) == 1 and deltas[0].tool_calls[0].index == 0
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    (call,) = final.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Lima"})
    assert final.choices[0].finish_reason == "tool_calls"

    listed = [question, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
              {"role": "tool", "tool_call_id": call.id, "content": "14C"}]
    stream = client.chat.completions.create(model=MODEL, messages=listed, tools=[CHAT_WEATHER], stream=True)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "tool:14C" in text, "the result (logged as an event of its own) adds no chunk; the answer read it"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert Node.objects.count() == 2


@live
def test_issue_17_f1_a_streamed_chat_failure_is_the_sdks_api_error_mid_stream(client):
    """Issue 17 (F1): a streamed call whose provider fails sends the role chunk, then an `error` object in
    OpenAI's format, which the SDK raises as APIError while iterating; no `[DONE]` pretends it finished."""
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "#fail"}],
                                            stream=True)
    seen = []
    with pytest.raises(openai.APIError, match="#fail asked for a provider error") as failed:
        seen.extend(stream)
    assert failed.value.body["code"] == "provider_error" and failed.value.body["type"] == "server_error"
    assert [c.choices[0].delta.role for c in seen] == ["assistant"]
    (node,) = Node.objects.all()
    assert node.status == "failed"


@live
def test_issue_17_a_streamed_completion_has_the_id_of_its_node(client):
    """Issue 17, issue 27 (API.md): a streamed chat completion has the same id as a plain one,
    `chatcmpl-<node id>`, so a client can find the call it streamed."""
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "id?"}],
                                                 stream=True))
    (node,) = Node.objects.all()
    assert {c.id for c in chunks} == {f"chatcmpl-{node.pk}"}


@live
def test_issue_17_a_refused_list_names_its_param(client):
    """Issue 17: OpenAI's errors name the request field at fault in `param`; a message list that is not one is
    refused with `param: "messages"`, which the SDK exposes as `error.param`."""
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=[])
    assert refused.value.param == "messages"


def test_issue_17_the_callers_tool_choice_reaches_the_model(v1, stub):
    """Issue 17, issue 27: `tool_choice: "none"` offers the tools but forbids calling them; the model call
    carries it."""
    stub.script(Reply.text("no tools"))
    response = v1.post("/v1/chat/completions", {"model": "openai/stub-model", "tools": [CHAT_WEATHER],
                                                "tool_choice": "none",
                                                "messages": [{"role": "user", "content": "hi"}]}, format="json")
    assert response.status_code == 200, response.content
    assert stub.requests[-1].get("tool_choice") == "none"


# --- streams read late, and runs that died ------------------------------------------------------------------


def BearerClient(key: str) -> ServerAsyncClient:  # noqa: N802 (read as the client class it makes)
    """An ASGI client handled as the server handles requests, with the Bearer key on every request. A streamed
    body is read only when the test reads it: a client that reads late."""
    return ServerAsyncClient(("authorization", f"Bearer {key}"))


@pytest.fixture
def keys(user) -> str:
    return _key(user)


@pytest.fixture
async def shared_thread_closed():
    """The streams read stored calls on ASGI's shared sync thread: close its connection after the test."""
    yield
    await sync_to_async(connections.close_all)()


async def _settled_conversation() -> int:
    """The only conversation, once its call has succeeded and its lock is given back."""
    for _ in range(300):
        state = await in_own_thread(
            lambda: list(Conversation.objects.values_list("pk", "turn_token", "head__status")))()
        if state and state[0][1] is None and state[0][2] == Node.Status.SUCCEEDED:
            return state[0][0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"the call never settled: {state}")


def _data_lines(chunks: list[bytes]) -> list[str]:
    return [line.removeprefix("data: ") for block in b"".join(chunks).decode().split("\n\n") for line in
            block.splitlines() if line.startswith("data: ")]


@live
@pytest.mark.usefixtures("shared_thread_closed")
async def test_issue_17_a_chat_stream_read_after_its_conversation_was_deleted_ends_with_an_error(keys):
    """Issue 17: the call goes on whether or not its stream is read; a client that deletes the conversation
    before reading the stream's end (its usage chunk reads the stored call) gets an `error` object in OpenAI's
    format as the stream's last data, not a cut connection and not `[DONE]`."""
    client = BearerClient(keys)
    response = await client.post("/v1/chat/completions", {"model": MODEL, "stream": True,
                                                          "stream_options": {"include_usage": True},
                                                          "messages": [{"role": "user", "content": "read me late"}]},
                                 content_type="application/json")
    assert response.status_code == 200 and response["Content-Type"] == "text/event-stream"
    conversation_id = await _settled_conversation()
    deleted = await client.delete(f"/api/conversations/{conversation_id}/", headers={"authorization": f"Token {keys}"})
    assert deleted.status_code == 204
    lines = _data_lines([chunk async for chunk in response.streaming_content])
    assert "[DONE]" not in lines
    chunks = [json.loads(line) for line in lines]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1] if c.get("choices"))
    assert text.startswith("echo: read me late")
    error = chunks[-1]["error"]
    assert (error["type"], error["code"]) == ("server_error", "server_error") and error["message"]


@live
@pytest.mark.usefixtures("shared_thread_closed")
async def test_issue_17_a_responses_stream_read_after_its_conversation_was_deleted_ends_with_an_error(keys):
    """Issue 17: as for chat: a Responses stream first read after its conversation was deleted cannot open the
    response (its node is gone); it sends one `error` event in OpenAI's format (the SDK raises it) and ends."""
    client = BearerClient(keys)
    response = await client.post("/v1/responses", {"model": MODEL, "stream": True, "input": "read me late"},
                                 content_type="application/json")
    assert response.status_code == 200
    conversation_id = await _settled_conversation()
    await in_own_thread(
        lambda: services.conversation_delete(conversation=Conversation.objects.get(pk=conversation_id)))()
    events = [json.loads(line) for line in _data_lines([chunk async for chunk in response.streaming_content])]
    assert [event["type"] for event in events] == ["error"]
    (event,) = events
    assert event["code"] == "server_error" and event["sequence_number"] == 1
    assert event["error"]["type"] == "server_error" and event["error"]["message"] == event["message"]


@live
@pytest.mark.usefixtures("shared_thread_closed")
async def test_issue_17_d3_a_stream_of_a_run_whose_process_died_ends_without_claiming_success(user):
    """Issue 17 (D3): a stream that follows a run whose process died before it wrote anything (no lock, no
    event) ends once the run is plainly orphaned, instead of waiting for ever; it never claims the call
    finished (no `stop` finish, no `[DONE]`, no `response.completed`, no `message_stop`); every API's stream says
    so as an error (issue 27: the chat stream sends no chunk, having no call whose id it could carry)."""
    def orphan():
        conversation = services.conversation_create(owner=user)
        return TurnRun.objects.create(id=uuid.uuid4(), conversation=conversation).pk

    run_id = await in_own_thread(orphan)()
    chat = await asyncio.wait_for(_collect(views._translated(run_id, user.pk, views._ChatChunks(MODEL, True, user.pk),
                                                             "chat")), timeout=30)
    lines = _data_lines(chat)
    (line,) = lines  # no chunk: no call was made to give one its id (issue 27: chatcmpl-<node id>)
    assert json.loads(line)["error"]["message"].startswith("The call ended without an answer")
    assert "[DONE]" not in lines and not any('"finish_reason": "stop"' in line for line in lines)
    events = await asyncio.wait_for(_collect(views._translated(run_id, user.pk, views._ResponsesEvents({}, user.pk),
                                                               "responses")), timeout=30)
    (event,) = [json.loads(line) for line in _data_lines(events)]  # one stream loop for every API: the same end
    assert event["type"] == "error" and event["message"].startswith("The call ended without an answer")
    anthropic = await asyncio.wait_for(_collect(views._translated(
        run_id, user.pk, views.messages.MessageEvents(MODEL, None), "messages")), timeout=30)
    assert b"event: error" in b"".join(anthropic) and b"message_stop" not in b"".join(anthropic)


async def _collect(stream) -> list[bytes]:
    return [chunk async for chunk in stream]
