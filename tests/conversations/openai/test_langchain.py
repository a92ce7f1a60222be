"""Issue 27: LangChain's OpenAI chat model (`langchain-openai`'s `ChatOpenAI`, unchanged) against a live Arbor, on
both of OpenAI's APIs, over two turns with a function tool the caller runs itself (T4): Chat Completions with the
whole list resent, Responses with the history resent as items (LangChain's default) and with
`use_previous_response_id`. After each, the recorded tree is read back through Arbor's own API: one conversation,
each call a node below the one it continues, only what was new recorded (T5), the tool's call and result on the
path."""

from __future__ import annotations

import json

import langsmith
import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from conversations.models import Conversation, Node

pytestmark = pytest.mark.django_db(transaction=True)  # committed, for the server in its own process to read


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def _chat(server, user, **options) -> ChatOpenAI:
    key = Token.objects.get_or_create(user=user)[0].key
    return ChatOpenAI(model="arbor/echo", base_url=f"{server.url}/v1", api_key=key, max_retries=0, **options)


@pytest.fixture(autouse=True)
def _no_langsmith(monkeypatch):
    """Nothing leaves this machine: LangSmith's tracing is off whatever the environment says."""
    for name in ("LANGSMITH_TRACING", "LANGSMITH_TRACING_V2", "LANGCHAIN_TRACING", "LANGCHAIN_TRACING_V2",
                 "LANGSMITH_API_KEY", "LANGCHAIN_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with langsmith.tracing_context(enabled=False):
        yield


def _two_turns_with_a_tool(model) -> tuple[str, str]:
    """Ask, run the tool the model called, send its result, ask again: LangChain's own tool loop."""
    bound = model.bind_tools([get_weather])
    messages = [HumanMessage('#tool get_weather {"city": "Paris"}')]
    called = bound.invoke(messages)
    assert [(c["name"], c["args"]) for c in called.tool_calls] == [("get_weather", {"city": "Paris"})]
    if getattr(model, "use_responses_api", False):  # LangChain names a previous response only by this prefix
        assert called.response_metadata["id"].startswith("resp_")
    call = called.tool_calls[0]
    messages += [called, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]
    answered = bound.invoke(messages)
    assert "sunny in Paris" in answered.text, "the tool's result reached the model"
    messages += [answered, HumanMessage("and tomorrow?")]
    again = bound.invoke(messages)
    return answered.text, again.text


def _recorded(api: APIClient) -> list[dict]:
    (conversation,) = Conversation.objects.all()
    body = api.get(f"/api/conversations/{conversation.pk}/nodes/").json()
    return sorted(body["results"] if isinstance(body, dict) else body, key=lambda n: n["id"])


@pytest.mark.parametrize("options", [{}, {"use_responses_api": True},
                                     {"use_responses_api": True, "use_previous_response_id": True}],
                         ids=["chat-completions", "responses-resent", "responses-previous-id"])
def test_issue_27_langchain_openai_runs_a_tool_loop_and_records_one_chain(asgi_server, user, api, options):
    _, last = _two_turns_with_a_tool(_chat(asgi_server, user, **options))
    assert "and tomorrow?" in last

    nodes = _recorded(api)
    assert len(nodes) == 3, "three calls, three nodes: nothing resent was recorded again (T5)"
    assert [n["parent"] for n in nodes] == [None, nodes[0]["id"], nodes[1]["id"]], "each below the one it continues"
    first, second, third = (Node.objects.get(pk=n["id"]) for n in nodes)
    assert [item["type"] for item in first.received] == ["tool_call"]
    assert first.received[0]["name"] == "get_weather" and json.loads(first.received[0]["arguments"]) == \
        {"city": "Paris"}
    assert [(i["type"], i["content"]) for i in second.sent] == [("tool_result", "sunny in Paris")], \
        "T4: the caller's result is the next call's sent item"
    assert [(i["type"], i["text"]) for i in third.sent] == [("user", "and tomorrow?")]
