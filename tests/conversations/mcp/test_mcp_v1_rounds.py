"""Issue 32 on /v1, in process: a response whose turn ran MCP rounds is named by its first call, also when a
compaction (C1, C2) was made before that call; and Arbor's own tools' calls, shown as mcp_call items, come back in
a resent history as the calls they were."""

from __future__ import annotations

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from conversations.models import Node
from tests.conversations.mcp.conftest import NOTES

pytestmark = pytest.mark.django_db

SERVER = {"type": "mcp", "server_label": "notes", "require_approval": "never"}


@pytest.fixture
def v1(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer " + Token.objects.create(user=user).key)
    return client


def _create(v1: APIClient, **body) -> dict:
    response = v1.post("/v1/responses", {"model": "arbor/echo", **body}, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def test_issue_32_c2_a_response_compacted_before_its_first_call_is_still_named_by_that_call(
        mcp_servers, v1, settings):
    mcp_servers({"notes": NOTES})
    settings.ARBOR_ECHO_MAX_INPUT_TOKENS = 600  # a few long questions pass the threshold
    previous = None
    for number in range(8):
        asked = _create(v1, input=f'#tool notes__lookup {{"word": "w{number}"}} ' + "filler " * 60,
                        tools=[SERVER], **({"previous_response_id": previous} if previous else {}))
        node = Node.objects.get(pk=int(asked["id"].removeprefix("resp_")))
        assert node.kind == Node.Kind.TURN and node.first_round_id is None, "named by the turn's first call"
        assert [item["type"] for item in asked["output"]] == ["mcp_call", "message"]
        previous = asked["id"]
        if Node.objects.filter(kind=Node.Kind.COMPACTION).exists() and node.parent.kind == Node.Kind.COMPACTION:
            break
    else:
        pytest.fail("no compaction was made before a call")
    later = node.later_rounds.get()
    assert later.first_round_id == node.pk and _create(v1, input="and?", previous_response_id=previous)


def test_issue_32_arbors_own_tool_calls_resent_as_mcp_calls_match_the_stored_turns(v1, api, user):
    conversation = api.post("/api/conversations/", {"title": "db"}, format="json").json()["id"]
    asked = api.post(f"/api/conversations/{conversation}/turns/",
                     {"content": '#tool sql_query {"sql": "SELECT 1 AS one"}'}, format="json")
    assert asked.status_code == 201, asked.content
    first = Node.objects.filter(conversation_id=conversation, parent__isnull=True).get()
    shown = v1.get(f"/v1/responses/resp_{first.pk}").json()
    call = shown["output"][0]
    assert (call["type"], call["server_label"], call["name"], call["status"]) == ("mcp_call", "arbor", "sql_query",
                                                                                "completed")
    history = [{"role": "user", "content": '#tool sql_query {"sql": "SELECT 1 AS one"}'}, *shown["output"],
               {"role": "user", "content": "thanks"}]
    again = _create(v1, input=history)
    assert Node.objects.get(pk=int(again["id"].removeprefix("resp_"))).parent_id == first.later_rounds.get().pk, \
        "the resent history matched both stored rounds: only the new question was recorded"
