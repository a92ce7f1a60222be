"""Issue 32 on /v1: a Responses caller names an MCP server of Arbor's (`{"type": "mcp", "server_label": …}`, as
OpenAI's hosted MCP tool) and its tools that need no approval run here, round after round, coming back as
`mcp_call` items; a tool with effects never runs for a caller (F3, D4: only a person's click approves). Tested with
the official `openai` SDK (strict validation) against a live Arbor whose ARBOR_MCP_SERVERS names the fixture server
written with the official `mcp` SDK (tests/conversations/mcp/fixture_server.py), over stdio."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
from rest_framework.authtoken.models import Token

from config.errors import BadInput
from conversations.models import Conversation, Node
from tests.conversations.mcp.conftest import NOTES
from tests.support.browser import serving

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "arbor/echo"
SERVER = {"type": "mcp", "server_label": "notes", "require_approval": "never"}


@pytest.fixture(scope="module")
def mcp_server(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock(), serving(ARBOR_MCP_SERVERS=json.dumps({"notes": NOTES})) as server:
        yield server


@pytest.fixture
def client(mcp_server, user) -> openai.OpenAI:
    return openai.OpenAI(api_key=Token.objects.create(user=user).key, base_url=f"{mcp_server.url}/v1",
                         max_retries=0, _strict_response_validation=True)


def _node(response) -> Node:
    return Node.objects.get(pk=int(response.id.removeprefix("resp_")))


def _offered(node: Node) -> set[str]:
    return {tool["function"]["name"] for tool in node.call_settings.settings.get("tools", [])}


def test_issue_32_t4_a_named_servers_read_only_tool_runs_here_and_comes_back_as_an_mcp_call(client, user):
    response = client.responses.create(model=MODEL, input='#tool notes__lookup {"word": "oak"}', tools=[SERVER])
    assert response.status == "completed" and [item.type for item in response.output] == ["mcp_call", "message"]
    call = response.output[0]
    assert (call.server_label, call.name, json.loads(call.arguments)) == ("notes", "lookup", {"word": "oak"})
    assert call.output.startswith("oak: a word of 3 letters") and call.error is None and call.status == "completed"
    assert "tool:oak: a word of 3 letters" in response.output_text, "the second round saw the result (T4)"
    first = _node(response)
    (second,) = Node.objects.filter(parent=first)
    assert [i["type"] for i in second.sent] == ["tool_result"] and first.conversation.head_id == second.pk
    assert _offered(first) == {"notes__lookup", "notes__count_notes", "notes__slow", "notes__crash", "notes__big",
                               "notes__whoami", "notes__mixed", "notes__fail"}, "only tools that need no approval"
    assert response.usage.total_tokens == first.usage["total_tokens"] + second.usage["total_tokens"]

    again = client.responses.retrieve(response.id)
    assert again.model_dump()["output"] == response.model_dump()["output"]
    later = client.responses.create(model=MODEL, input="and then?", previous_response_id=response.id)
    assert _node(later).parent_id == second.pk, "a response of rounds is continued below its last round"
    assert client.responses.retrieve(later.id).previous_response_id == response.id
    with pytest.raises(openai.ConflictError):
        client.responses.delete(response.id)
    client.responses.delete(later.id)
    client.responses.delete(response.id)
    assert not Node.objects.filter(pk__in=[first.pk, second.pk]).exists(), "every round of it went"


def test_issue_32_a_streamed_response_says_each_mcp_call_as_openai_streams_it(client):
    with client.responses.stream(model=MODEL, input='#tool notes__lookup {"word": "elm"}', tools=[SERVER]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    called = kinds.index("response.mcp_call_arguments.delta")
    assert kinds[called - 1:called + 5] == ["response.output_item.added", "response.mcp_call_arguments.delta",
                                            "response.mcp_call_arguments.done", "response.mcp_call.in_progress",
                                            "response.mcp_call.completed", "response.output_item.done"]
    assert kinds.index("response.output_text.delta") > called, "the answer after the tool's result"
    assert [item.type for item in final.output] == ["mcp_call", "message"]
    assert final.output[0].output.startswith("elm: a word of 3 letters")
    stored = client.responses.retrieve(final.id)  # the stream helper's items carry `parsed`: compared apart
    assert stored.output[0].model_dump() == final.output[0].model_dump() and stored.output_text == final.output_text


def test_issue_32_f3_d4_a_tool_with_effects_or_one_not_allowed_never_runs_for_a_caller(client):
    wrote = client.responses.create(model=MODEL, input='#tool notes__write_note {"text": "sneaky"}', tools=[SERVER])
    call = wrote.output[0]
    assert call.type == "mcp_call" and call.status == "failed" and call.output is None
    assert "need no person's approval" in call.error.content[0]["text"], "an error is the call's result (C4)"
    narrowed = {**SERVER, "allowed_tools": ["count_notes"]}
    counted = client.responses.create(model=MODEL, input="#tool notes__count_notes {}", tools=[narrowed])
    assert counted.output[0].output.startswith("0 notes"), "the note was never written"
    assert _offered(_node(counted)) == {"notes__count_notes"}
    looked = client.responses.create(model=MODEL, input='#tool notes__lookup {"word": "x"}',
                                     tools=[{**SERVER, "allowed_tools": {"tool_names": ["count_notes"]}}])
    assert looked.output[0].status == "failed", "a tool the request did not allow is not run"
    never = {"type": "mcp", "server_label": "notes", "require_approval": {"never": {"tool_names": ["count_notes"]}}}
    listed = client.responses.create(model=MODEL, input="#tool notes__count_notes {}", tools=[never])
    assert _offered(_node(listed)) == {"notes__count_notes"}, "the others would ask: they are not offered"
    bare = client.responses.create(model=MODEL, input='#tool lookup {"word": "x"}', tools=[SERVER])
    assert (bare.output[0].type, bare.output[0].server_label, bare.output[0].status) == ("mcp_call", "arbor",
                                                                                         "failed"), \
        "a name no server has is refused here, and said as a call of the server's, never as the client's to run"
    with client.responses.stream(model=MODEL, input='#tool lookup {"word": "x"}', tools=[SERVER]) as stream:
        streamed = stream.get_final_response()
    assert streamed.output[0].model_dump() == client.responses.retrieve(streamed.id).output[0].model_dump()


def test_issue_32_a_caller_that_sends_its_function_output_and_names_a_server_stores_one_result(client):
    mine = {"type": "function", "name": "mine", "parameters": {"type": "object", "properties": {}}}
    asked = client.responses.create(model=MODEL, input="#tool mine {}", tools=[mine])
    (call,) = asked.output
    assert call.type == "function_call"
    then = client.responses.create(model=MODEL, previous_response_id=asked.id, tools=[SERVER], input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "42"}])
    assert [(item["call_id"], item["content"]) for item in _node(then).sent] == [(call.call_id, "42")], \
        "the caller's output is the call's one result (C4)"


def test_issue_32_a_resent_history_cannot_make_its_call_a_round_of_another_response(client):
    response = client.responses.create(model=MODEL, input='#tool notes__lookup {"word": "oak"}', tools=[SERVER])
    call = response.output[0].model_dump()
    forged = client.responses.create(model=MODEL, input=[
        {"role": "user", "content": '#tool notes__lookup {"word": "oak"}'}, {**call, "output": "FORGED"}])
    assert forged.id != response.id and _node(forged).parent_id == _node(response).pk, "a branch of its own"
    again = client.responses.retrieve(response.id)
    assert again.output[0].output.startswith("oak: a word") and "FORGED" not in again.output_text


@pytest.mark.parametrize(("tool", "says"), [
    ({"type": "mcp", "server_label": "elsewhere"}, "no MCP server of this Arbor's"),
    ({**SERVER, "server_url": "https://mcp.example.com/sse"}, "server_url"),
    ({**SERVER, "headers": {"Authorization": "Bearer x"}}, "headers"),
    ({**SERVER, "require_approval": "always"}, "person's click"),
    ({**SERVER, "require_approval": {"always": {"tool_names": ["lookup"]}}}, "person's click"),
    ({**SERVER, "allowed_tools": {"read_only": True}}, "read_only"),
    ({**SERVER, "allowed_tools": "lookup"}, "list of tool names"),
    ({**SERVER, "require_approval": {"never": 5}}, "person's click"),
    ({**SERVER, "require_approval": {"never": {}}}, "person's click"),
])
def test_issue_32_a_request_for_what_this_server_will_not_run_is_refused_and_changes_nothing(client, tool, says):
    with pytest.raises(openai.BadRequestError, match=says):
        client.responses.create(model=MODEL, input="hi", tools=[tool])
    mine = {"type": "function", "name": "mine", "parameters": {"type": "object", "properties": {}}}
    with pytest.raises(openai.BadRequestError, match="cannot be sent together"):
        client.responses.create(model=MODEL, input="hi", tools=[SERVER, mine])
    with pytest.raises(openai.BadRequestError, match="named twice"):
        client.responses.create(model=MODEL, input="hi", tools=[SERVER, SERVER])
    assert not Conversation.objects.exists() and not Node.objects.exists()


def test_issue_32_an_agent_with_openais_hosted_mcp_tool_runs_it_here_and_its_resent_history_continues(
        mcp_server, user):
    """openai-agents' HostedMCPTool, unchanged, on its Responses model: the first run's mcp_call comes back as the
    SDK's own item; the second run resends it in `input` (no previous_response_id), which matches the stored rounds,
    so only the new question is recorded, below the first run's last round."""
    from agents import Agent, HostedMCPTool, OpenAIResponsesModel, RunConfig, Runner, set_tracing_disabled

    set_tracing_disabled(True)  # the SDK would export its traces to OpenAI: nothing leaves this machine
    client = openai.AsyncOpenAI(api_key=Token.objects.create(user=user).key, base_url=f"{mcp_server.url}/v1",
                                max_retries=0)
    agent = Agent(name="librarian", instructions="Look words up.", model=OpenAIResponsesModel(
        model=MODEL, openai_client=client), tools=[HostedMCPTool(tool_config=SERVER)])
    config = RunConfig(tracing_disabled=True)

    async def two_runs():
        first = await Runner.run(agent, '#tool notes__lookup {"word": "ash"}', run_config=config)
        second = await Runner.run(agent, [*first.to_input_list(), {"role": "user", "content": "And beech?"}],
                                  run_config=config)
        return first, second

    first, second = asyncio.run(two_runs())
    assert "tool:ash: a word of 3 letters" in first.final_output
    assert [item.raw_item.type for item in first.new_items if hasattr(item.raw_item, "type")][0] == "mcp_call"
    assert "And beech?" in second.final_output and second.final_output.count("tool:ash: a word") == 1
    (conversation,) = Conversation.objects.filter(owner=user)
    nodes = list(Node.objects.filter(conversation=conversation).order_by("pk"))
    assert [n.parent_id for n in nodes] == [None, nodes[0].pk, nodes[1].pk], "one path: two rounds, then the next"
    assert nodes[2].sent == [{"type": "user", "text": "And beech?"}], "only what was new was recorded"


def test_issue_32_resent_mcp_calls_are_read_as_the_rounds_they_were():
    """Two calls of one round, then a call of the next round: each round's calls are one answer, each followed by
    its results (`shapes.history_messages`), and an error is the result's text (C4)."""
    from conversations.openai.shapes import history_messages

    def call(node, call_id, output=None, error=None):
        return {"type": "mcp_call", "id": f"mcp_{node}_{call_id}", "server_label": "notes", "name": "lookup",
                "arguments": "{}", "output": output, "error": error}

    failed = {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": "error: no"}]}
    messages, positions = history_messages([
        {"role": "user", "content": "look twice"}, call(7, "call_a", "A"), call(7, "call_b", error=failed),
        call(8, "call_c", "C"), {"type": "message", "role": "assistant", "content": "done"},
        {"role": "user", "content": "next"}])
    assert [(m["role"], [c["id"] for c in m.get("tool_calls", [])]) for m in messages] == [
        ("user", []), ("assistant", ["call_a", "call_b"]), ("tool", []), ("tool", []), ("assistant", ["call_c"]),
        ("tool", []), ("assistant", []), ("user", [])]
    assert [m["content"] for m in messages if m["role"] == "tool"] == ["A", "error: no", "C"]
    assert positions == [0, 1, 1, 2, 3, 3, 4, 5]
    with pytest.raises(BadInput, match="server_label"):
        history_messages([{"role": "user", "content": "q"}, {"type": "mcp_call", "id": "x"}])
    errors = [call(9, "call_d", error="boom"), call(9, "call_e", error={"type": "http_error", "code": 502,
                                                                        "message": "down"})]
    messages, _ = history_messages([{"role": "user", "content": "q"}, *errors, {"role": "user", "content": "r"}])
    assert [m["content"] for m in messages if m["role"] == "tool"] == ["boom", "down"], "every error's words"
