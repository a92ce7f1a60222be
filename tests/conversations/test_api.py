"""The REST API of ../shared/API.md: shapes, errors, ownership, and that refused requests change nothing."""

from __future__ import annotations

import json

import pytest

from conversations.models import Bubble, Conversation, Node

pytestmark = pytest.mark.django_db


def _create(api, **body):
    response = api.post("/api/conversations/", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def _turn(api, conversation_id, content, **extra):
    return api.post(f"/api/conversations/{conversation_id}/turns/", {"content": content, **extra}, format="json")


def _state(conversation_id):
    conversation = Conversation.objects.get(pk=conversation_id)
    return conversation.head_id, conversation.version, Node.objects.count(), Bubble.objects.count()


def test_create_list_read_update_delete(api):
    created = _create(api, title="Sales", instructions="Answer in Korean.")
    assert created["model"] == "arbor/echo" and created["head"] is None
    assert {"id", "title", "model", "instructions", "head"} <= created.keys()
    second = _create(api)
    listed = api.get("/api/conversations/").json()
    assert [c["id"] for c in listed["results"]] == [second["id"], created["id"]], "newest first"
    patched = api.patch(f"/api/conversations/{created['id']}/", {"title": "Sales 2"}, format="json").json()
    assert patched["title"] == "Sales 2"
    assert api.delete(f"/api/conversations/{created['id']}/").status_code == 204
    assert api.get(f"/api/conversations/{created['id']}/").status_code == 404


def test_turn_returns_answer_head_and_nodes(api):
    conversation = _create(api)
    response = _turn(api, conversation["id"], "hello")
    assert response.status_code == 201
    body = response.json()
    assert body["answer"] == "echo: hello\nseen: user:hello"
    (node,) = body["nodes"]
    assert body["head"] == node["id"]
    assert {"id", "parent", "kind", "status", "failure_reason", "sent", "received", "provider", "model",
            "usage"} <= node.keys()
    node_detail = api.get(f"/api/nodes/{node['id']}/").json()
    assert node_detail["sent"] == [{"type": "user", "text": "hello"}]


def test_bubbles_context_and_nodes_endpoints(api):
    conversation = _create(api, instructions="Be brief.")
    cid = conversation["id"]
    _turn(api, cid, "q1")
    head = _turn(api, cid, "q2").json()["head"]
    api.post(f"/api/conversations/{cid}/edit/", {"node": head, "content": "q2 edited"}, format="json")
    page = api.get(f"/api/conversations/{cid}/bubbles/").json()
    assert page["next"] is None and page["previous"] is None, "issue 13: a short conversation is one page"
    bubbles = page["results"]
    assert [(b["role"], b["content"][:9]) for b in bubbles] == [
        ("user", "q1"), ("assistant", "echo: q1\n"), ("user", "q2 edited"), ("assistant", "echo: q2 ")]
    assert bubbles[2]["branch"] == {"index": 2, "count": 2, "siblings": [head, bubbles[2]["node"]]}
    assert bubbles[0]["branch"]["count"] == 1
    context = api.get(f"/api/conversations/{cid}/context/").json()["messages"]
    assert [m["role"] for m in context] == ["system", "user", "assistant", "user", "assistant"]
    assert context[3]["content"] == "q2 edited"
    nodes = api.get(f"/api/conversations/{cid}/nodes/").json()["results"]
    assert len(nodes) == 3 and {n["kind"] for n in nodes} == {"turn"}


def test_switch_and_regenerate_over_http(api):
    cid = _create(api)["id"]
    first = _turn(api, cid, "q1").json()["head"]
    regenerated = api.post(f"/api/conversations/{cid}/regenerate/", {}, format="json")
    assert regenerated.status_code == 201
    assert regenerated.json()["head"] != first
    switched = api.post(f"/api/conversations/{cid}/switch/", {"node": first}, format="json")
    assert switched.status_code == 200 and switched.json()["head"] == first


def test_clear_empties_head_and_bubbles_t11(api):
    """T11: after clear nothing is shown and nothing is remembered."""
    cid = _create(api)["id"]
    _turn(api, cid, "secret")
    cleared = api.post(f"/api/conversations/{cid}/clear/").json()
    assert cleared["head"] is None
    assert api.get(f"/api/conversations/{cid}/bubbles/").json()["results"] == []
    assert api.get(f"/api/conversations/{cid}/context/").json() == {"messages": []}
    assert "secret" not in _turn(api, cid, "what did I say?").json()["answer"]


def test_failed_turn_answers_with_the_error_and_keeps_the_node_f1(api):
    cid = _create(api)["id"]
    response = _turn(api, cid, "#fail")
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == "provider_error" and error["message"]
    assert Node.objects.get(pk=error["node"]).status == "failed"
    assert Conversation.objects.get(pk=cid).head_id == error["node"]


def test_overflow_answers_with_context_overflow_and_keeps_the_head_f2(api):
    cid = _create(api)["id"]
    head = _turn(api, cid, "q1").json()["head"]
    response = _turn(api, cid, "#overflow")
    assert response.status_code == 502 and response.json()["error"]["code"] == "context_overflow"
    assert Conversation.objects.get(pk=cid).head_id == head


def test_approval_flow_over_http_f3(api):
    cid = _create(api)["id"]
    paused = _turn(api, cid, '#tool send_email {"to": "a@example.com", "subject": "s", "body": "b"}')
    assert paused.status_code == 202
    (call,) = paused.json()["approval_required"]
    busy = _turn(api, cid, "next")
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "approval_pending"
    unknown = api.post(f"/api/conversations/{cid}/approvals/", {"tool_call_id": "nope", "approve": True},
                       format="json")
    assert unknown.status_code == 404
    done = api.post(f"/api/conversations/{cid}/approvals/", {"tool_call_id": call["call_id"], "approve": True},
                    format="json")
    assert done.status_code == 201 and done.json()["answer"].startswith("echo:")


def test_another_users_conversation_is_a_404_everywhere(api, other_api):
    cid = _create(api)["id"]
    node = _turn(api, cid, "mine").json()["head"]
    before = _state(cid)
    for method, url, body in [
        ("get", f"/api/conversations/{cid}/", None),
        ("patch", f"/api/conversations/{cid}/", {"title": "x"}),
        ("delete", f"/api/conversations/{cid}/", None),
        ("post", f"/api/conversations/{cid}/turns/", {"content": "x"}),
        ("post", f"/api/conversations/{cid}/edit/", {"node": node, "content": "x"}),
        ("post", f"/api/conversations/{cid}/regenerate/", {}),
        ("post", f"/api/conversations/{cid}/switch/", {"node": node}),
        ("post", f"/api/conversations/{cid}/clear/", None),
        ("get", f"/api/conversations/{cid}/context/", None),
        ("get", f"/api/conversations/{cid}/bubbles/", None),
        ("get", f"/api/conversations/{cid}/nodes/", None),
        ("get", f"/api/nodes/{node}/", None),
    ]:
        response = getattr(other_api, method)(url, body, format="json")
        assert response.status_code == 404, (method, url, response.content)
        assert response.json()["error"]["code"] == "not_found"
    assert other_api.get("/api/conversations/").json()["results"] == []
    assert _state(cid) == before


def test_unauthenticated_requests_are_refused(client):
    response = client.get("/api/conversations/")
    assert response.status_code in (401, 403)
    assert "error" in response.json()


@pytest.mark.parametrize(
    ("path", "body", "status", "code"),
    [
        ("turns", b"{not json", 400, "malformed_json"),
        ("turns", {}, 400, "bad_input"),
        ("turns", {"content": 5}, 400, "bad_input"),
        ("turns", {"content": ""}, 400, "bad_input"),
        ("turns", {"content": "   "}, 400, "bad_input"),
        ("turns", ["content"], 400, "bad_input"),
        ("turns", {"content": "x" * 2001}, 413, "too_large"),
        ("edit", {"content": "x"}, 400, "bad_input"),
        ("edit", {"node": "abc", "content": "x"}, 400, "bad_input"),
        ("edit", {"node": 999999, "content": "x"}, 404, "not_found"),
        ("edit", {"node": "ANSWER", "content": "x"}, 400, "bad_input"),
        ("switch", {"node": 999999}, 404, "not_found"),
        ("switch", {"node": True}, 400, "bad_input"),
        ("approvals", {"tool_call_id": "x", "approve": "yes"}, 400, "bad_input"),
        ("approvals", {"tool_call_id": "x", "approve": True}, 404, "not_found"),
        ("regenerate", {"node": "OTHER"}, 404, "not_found"),
        ("switch", {"node": "OTHER"}, 404, "not_found"),
    ],
)
def test_bad_input_gets_a_clear_error_and_changes_nothing(api, other_api, settings, path, body, status, code):
    settings.ARBOR_MAX_CONTENT_CHARS = 2000
    cid = _create(api)["id"]
    ask_response = _turn(api, cid, '#tool sql_query {"sql": "select 1"}').json()
    answer_node = ask_response["head"]
    other_cid = _create(other_api)["id"]
    other_node = _turn(other_api, other_cid, "theirs").json()["head"]
    if isinstance(body, dict) and body.get("node") == "ANSWER":
        body = {**body, "node": answer_node}
    if isinstance(body, dict) and body.get("node") == "OTHER":
        body = {**body, "node": other_node}
    before = _state(cid)
    url = f"/api/conversations/{cid}/{path}/"
    if isinstance(body, bytes):
        response = api.post(url, body, content_type="application/json")
    else:
        response = api.post(url, json.dumps(body), content_type="application/json")
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert error["code"] == code and error["message"]
    assert _state(cid) == before


def test_a_text_longer_than_the_schema_allows_is_refused_even_when_its_ends_are_spaces(api):
    """The schema's maxLength counts the text as sent; DRF's own check counted it after trimming the ends, so
    20,000 characters plus four leading spaces were taken (schemathesis ST201 found it)."""
    response = api.post("/api/conversations/", {"instructions": "    " + "x" * 20000}, format="json")
    assert response.status_code == 400, response.content
    assert "instructions" in response.json()["error"]["message"]
    assert Conversation.objects.count() == 0
    assert api.post("/api/conversations/", {"instructions": "x" * 20000}, format="json").status_code == 201


def test_unknown_model_is_refused(api):
    response = api.post("/api/conversations/", {"model": "nope/none"}, format="json")
    assert response.status_code == 400 and "Unknown model" in response.json()["error"]["message"]
    assert Conversation.objects.count() == 0


def test_openapi_schema_and_docs_are_served(api):
    schema = api.get("/api/schema/?format=json")
    assert schema.status_code == 200
    paths = json.loads(schema.content)["paths"]
    assert "/api/conversations/{conversation_id}/turns/" in paths
    assert "/api/conversations/{conversation_id}/approvals/" in paths
    assert api.get("/api/docs/").status_code == 200


def test_an_oversized_body_is_refused_with_413(api, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    cid = _create(api)["id"]
    before = _state(cid)
    response = _turn(api, cid, "x" * 20_000)
    assert response.status_code == 413 and response.json()["error"]["code"] == "too_large"
    assert _state(cid) == before


def test_a_non_json_body_is_refused(api):
    cid = _create(api)["id"]
    before = _state(cid)
    response = api.post(f"/api/conversations/{cid}/turns/", "content=hi", content_type="text/plain")
    assert response.status_code == 415 and response.json()["error"]["code"] == "unsupported_media_type"
    assert _state(cid) == before


def test_shared_history_nodes_stay_readable_by_the_conversation_that_passes_through_them(api, other_api, user):
    """T11, P3: after the source is deleted, a kept node is still the caller's through its other path."""
    from conversations import services

    source = _create(api)["id"]
    shared = _turn(api, source, "shared").json()["head"]
    other = services.conversation_create(owner=user)
    services.head_move(conversation=other, to=shared)
    assert api.delete(f"/api/conversations/{source}/").status_code == 204
    assert api.get(f"/api/nodes/{shared}/").status_code == 200
    assert other_api.get(f"/api/nodes/{shared}/").status_code == 404


@pytest.mark.django_db(transaction=True)
def test_a_stream_whose_client_leaves_before_it_starts_still_runs_its_turn(api, user):
    """Issue 12, T9/R3: a client that leaves before reading a byte does not cancel its turn: it runs to its
    end (the whole answer recorded, replayable from the log), then gives the lock back."""
    from conversations.turns import log

    cid = _create(api)["id"]
    response = api.post(f"/api/conversations/{cid}/turns/", {"content": "hi"}, format="json",
                        HTTP_ACCEPT="text/event-stream")
    assert response.status_code == 200 and response["Content-Type"] == "text/event-stream"
    response.close()
    events = [event for _, event in log.follow(response.run_id, owner=user.pk)]
    assert events[-1].type == "done" and events[-1].data["answer"].startswith("echo: hi")
    assert Node.objects.get(pk=events[-1].data["head"]).status == "succeeded"
    assert _turn(api, cid, "again").status_code == 201


def test_an_unexpected_error_is_answered_in_the_error_format(api, monkeypatch):
    from conversations.apis import views

    def broken(**kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(views, "bubbles_after", broken)
    api.raise_request_exception = False
    cid = _create(api)["id"]
    response = api.get(f"/api/conversations/{cid}/bubbles/")
    assert response.status_code == 500
    assert response.json() == {"error": {"code": "server_error", "message": "Something went wrong on the server."}}


def test_context_while_an_approval_waits_shows_the_pending_call_without_dropping_it(api, caplog):
    """T6: a call waiting for approval is a healthy state: the context shows it with a pending result."""
    import logging

    cid = _create(api)["id"]
    _turn(api, cid, '#tool send_email {"to": "a@example.com", "subject": "s", "body": "b"}')
    with caplog.at_level(logging.WARNING, logger="arbor.context"):
        messages = api.get(f"/api/conversations/{cid}/context/").json()["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[2]["content"].startswith("pending")
    assert not [r for r in caplog.records if r.name == "arbor.context"]


def test_issue_34_a_node_is_written_as_drf_would_write_it(conversation):
    """Issue 34: NodeOut writes its body itself (DRF's per-field machinery took ~3 ms of every turn's answer); what it
    writes is what DRF's ModelSerializer writes for the same fields, for a succeeded and a failed node,
    and with its times in the current time zone as DRF writes them (`Z` for UTC)."""
    from django.utils import timezone as tz
    from rest_framework import serializers as drf

    from conversations.apis.serializers import NodeOut
    from tests.conversations.helpers import ask

    ask(conversation, "hello")
    ask(conversation, "#fail")
    nodes = list(Node.objects.filter(conversation=conversation))
    assert {n.status for n in nodes} == {"succeeded", "failed"}
    written = [NodeOut(node).data for node in nodes]
    assert written == [drf.ModelSerializer.to_representation(NodeOut(), node) for node in nodes]
    assert written[0]["created_at"].endswith("Z") and written[0]["parent"] is None
    with tz.override("Asia/Seoul"):
        assert [NodeOut(node).data for node in nodes] == [drf.ModelSerializer.to_representation(NodeOut(), node)
                                                          for node in nodes]


def test_issue_34_a_turns_answer_shows_its_nodes_as_recorded_without_reading_them_back(api, conversation):
    """Issue 34: a turn answers with the nodes it holds, as it wrote them, not read back; they are what the database
    then holds, for an answer, a tool round and a failure."""
    from django.core.serializers.json import DjangoJSONEncoder
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from conversations.apis.serializers import NodeOut

    base = f"/api/conversations/{conversation.pk}/turns/"
    for content in ("hello", '#tool sql_query {"sql": "SELECT 1"}', "#fail"):
        with CaptureQueriesContext(connection) as queries:
            body = api.post(base, {"content": content}, format="json").json()
        nodes = body.get("nodes") or body["error"]["nodes"]
        assert nodes and [n["id"] for n in nodes] == sorted(n["id"] for n in nodes)
        stored = Node.objects.filter(pk__in=[n["id"] for n in nodes]).order_by("id")
        assert nodes == json.loads(json.dumps([NodeOut(n).data for n in stored], cls=DjangoJSONEncoder)), content
        assert not any(sql["sql"].startswith('SELECT "conversations_node"."id"') for sql in queries.captured_queries)
