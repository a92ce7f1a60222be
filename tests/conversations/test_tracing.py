"""Issue 31: OpenTelemetry spans after the GenAI conventions, received by an OTLP/HTTP receiver over a real socket
(tests/support/otlp_receiver.py): a `chat` span per node, an `execute_tool` span per tool run, and ids made from
the tree, so a node's span is its parent node's span's child and an edit is a sibling span."""

from __future__ import annotations

import json

import pytest

from conversations import tracing
from conversations.models import Node
from conversations.turns import records, recovery
from conversations.turns.detached import run_here
from conversations.turns.start import turn_edit
from tests.conversations.helpers import ask, head
from tests.support.otlp_receiver import OtlpReceiver

pytestmark = pytest.mark.django_db(transaction=True)  # a span is sent once its node's ending has committed


@pytest.fixture
def receiver(settings):
    received = OtlpReceiver()
    settings.ARBOR_OTEL_ENDPOINT = received.url
    yield received
    tracing.flush()
    received.stop()


def _spans(receiver) -> dict[int, dict]:
    tracing.flush()
    return {span["attributes"]["arbor.node.id"]: span for span in receiver.spans if span["name"].startswith("chat")}


def test_issue_31_each_call_is_a_chat_span_and_the_tree_is_the_traces_shape(receiver, conversation):
    ask(conversation, "first question")
    first = head(conversation)
    ask(conversation, '#tool sql_query {"sql": "SELECT 1 AS one"}')
    answer = head(conversation)
    events = run_here(turn_edit(user=conversation.owner, conversation_id=conversation.pk, node_id=first.pk,
                                content="first question, edited"))
    assert events[-1].type == "done"
    edited = head(conversation)
    spans = _spans(receiver)
    nodes = {node.pk: node for node in Node.objects.filter(conversation=conversation)}
    assert set(spans) == set(nodes), "one span a call"
    span = spans[first.pk]
    assert span["attributes"]["gen_ai.operation.name"] == "chat"
    assert span["attributes"]["gen_ai.request.model"] == "arbor/echo"
    assert span["attributes"]["gen_ai.provider.name"] == first.provider
    assert span["attributes"]["gen_ai.usage.input_tokens"] == first.usage["prompt_tokens"] > 0
    assert span["attributes"]["gen_ai.usage.output_tokens"] == first.usage["completion_tokens"]
    assert span["attributes"]["gen_ai.conversation.id"] == str(conversation.pk)
    assert span["resource"]["service.name"] == "arbor" and span["start"] <= span["end"]
    assert "gen_ai.input.messages" not in span["attributes"], "no message content unless the setting says so"
    assert len({s["trace_id"] for s in spans.values()}) == 1, "a conversation is one trace"
    for node_id, node_span in spans.items():
        node = nodes[node_id]
        if node.parent_id is None:
            assert node_span["parent_span_id"] == "" and node_span["links"] == []
        else:
            assert node_span["parent_span_id"] == spans[node.parent_id]["span_id"], "the parent node's span"
            assert node_span["links"] == [{"trace_id": node_span["trace_id"],
                                           "span_id": spans[node.parent_id]["span_id"]}]
            assert node_span["attributes"]["arbor.parent_node.id"] == node.parent_id
    assert spans[edited.pk]["parent_span_id"] == spans[first.pk]["parent_span_id"] == "", \
        "an edit of the first question is a sibling of the first call, not its child"
    (tool,) = [s for s in receiver.spans if s["name"] == "execute_tool sql_query"]
    tool_asker = Node.objects.get(pk=answer.parent_id)
    assert tool["attributes"]["gen_ai.tool.name"] == "sql_query"
    assert tool["parent_span_id"] == spans[tool_asker.pk]["span_id"], "the run is the asking call's child"


def test_issue_31_a_failed_call_is_an_error_span_and_content_only_when_asked(receiver, conversation, monkeypatch):
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    ask(conversation, "#fail please")
    failed = head(conversation)
    assert failed.status == Node.Status.FAILED
    span = _spans(receiver)[failed.pk]
    assert span["status"] == 2 and span["attributes"]["error.type"] == failed.failure_reason  # STATUS_CODE_ERROR
    assert "#fail please" in json.loads(span["attributes"]["gen_ai.input.messages"])[0]["text"]


def test_issue_31_tracing_is_off_without_an_endpoint(settings, conversation):
    settings.ARBOR_OTEL_ENDPOINT = ""
    assert tracing.tracer() is None
    ask(conversation, "untraced")
    assert head(conversation).status == Node.Status.SUCCEEDED


def test_issue_31_wrong_opentelemetry_settings_never_cost_a_turn(settings, conversation, monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "-5")
    settings.ARBOR_OTEL_ENDPOINT = "http://127.0.0.1:9/wrong-settings"
    assert tracing.tracer() is None, "tracing is off, and says why in the log"
    events = ask(conversation, '#tool sql_query {"sql": "SELECT 1 AS one"}')
    assert events[-1].type == "done" and head(conversation).status == Node.Status.SUCCEEDED


def test_issue_31_a_call_its_process_left_pending_gets_its_span_when_the_sweep_fails_it(receiver, conversation):
    node = records.start(conversation=conversation, parent=None, kind=Node.Kind.TURN,
                         sent=[{"type": "user", "text": "hello"}], model="arbor/echo")
    records.save_partial(node, "half an answ")
    node.refresh_from_db()
    assert records.interrupt(node, recovery._interrupted(node))
    span = _spans(receiver)[node.pk]
    assert span["status"] == 2 and span["attributes"]["error.type"] == Node.FailureReason.INTERRUPTED
    assert span["attributes"]["arbor.node.status"] == Node.Status.FAILED
