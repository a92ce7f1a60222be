"""Issue 27: OpenAI's Agents SDK (openai-agents, requirements-dev.in) unchanged against a live Arbor, on both of its
model classes, over two turns of an agent with a function tool. The Responses model resends the whole history in
`input` with no `previous_response_id` (OpenAI's manual-history pattern); the Chat Completions model resends the
message list. Either way the recorded tree is one path of one conversation, one node per model call, checked
through Arbor's own API after each turn."""

from __future__ import annotations

import asyncio

import openai
import pytest
from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from django.db import connection
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from conversations.models import Conversation

pytestmark = pytest.mark.django_db(transaction=True)  # the live server reads what the test writes

MODEL = "arbor/echo"
set_tracing_disabled(True)  # the SDK would export its traces to OpenAI: nothing leaves this machine


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"18C and rain in {city}"


def _agent(model_class, server, key: str) -> Agent:
    client = openai.AsyncOpenAI(api_key=key, base_url=f"{server.url}/v1", max_retries=0)
    return Agent(name="forecaster", instructions="Answer with the weather.", tools=[get_weather],
                 model=model_class(model=MODEL, openai_client=client))


def _path(api: APIClient, conversation: Conversation) -> list[dict]:
    """The conversation's tree as Arbor's API shows it (`/nodes/`), checked to be one path: root first."""
    response = api.get(f"/api/conversations/{conversation.pk}/nodes/")
    assert response.status_code == 200, response.content
    nodes = response.json()
    nodes = nodes["results"] if isinstance(nodes, dict) else nodes
    assert [n["parent"] for n in nodes] == [None, *(n["id"] for n in nodes[:-1])], "one path, no branch"
    return nodes


def _closing(check):
    """`check` in a thread of its own, whose database connection is closed after (the test database is dropped
    at the end only when no connection is left open)."""
    def checked(*args):
        try:
            check(*args)
        finally:
            connection.close()
    return checked


async def _two_turns(agent: Agent, check_first) -> tuple:
    """Two runs of the agent in one event loop (its client's connections belong to the loop): a question that
    calls the tool, then the first run's history with a next question, as the SDK's docs continue a chat."""
    config = RunConfig(tracing_disabled=True)
    first = await Runner.run(agent, '#tool get_weather {"city": "Paris"}', run_config=config)
    await asyncio.to_thread(_closing(check_first), first)
    second = await Runner.run(agent, first.to_input_list() + [{"role": "user", "content": "And tomorrow?"}],
                              run_config=config)
    return first, second


@pytest.mark.parametrize("model_class", [OpenAIResponsesModel, OpenAIChatCompletionsModel],
                         ids=["responses", "chat-completions"])
def test_issue_27_t7_an_agent_with_a_tool_over_two_turns_records_one_path(asgi_server, user, model_class):
    agent = _agent(model_class, asgi_server, Token.objects.create(user=user).key)
    api = APIClient()
    api.force_authenticate(user)
    seen = {}

    def check_first(first):
        assert "18C and rain in Paris" in first.final_output, "the tool ran in the agent; the model saw its result"
        (seen["conversation"],) = Conversation.objects.filter(owner=user)
        seen["path"] = _path(api, seen["conversation"])
        assert len(seen["path"]) == 2, "the call that asked for the tool, then the call that read its result"

    _, second = asyncio.run(_two_turns(agent, check_first))
    assert "And tomorrow?" in second.final_output
    assert second.final_output.count("18C and rain in Paris") == 1, "the history was seen once"
    assert Conversation.objects.filter(owner=user).count() == 1, "the resent history continued the conversation"
    longer = _path(api, seen["conversation"])
    assert len(longer) == 3 and [n["id"] for n in longer[:2]] == [n["id"] for n in seen["path"]], \
        "only the new call was recorded, below the first turn's"
