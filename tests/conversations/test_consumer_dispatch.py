"""The chat WebSocket's dispatch: every message type reaches the same turn start as the API, its fields
checked by the API's serializers, through the project's real ASGI application (T7, T9, F1, F3)."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from channels.testing import WebsocketCommunicator
from django.core import mail

from conversations import items as it
from conversations import services
from conversations.llm import echo
from conversations.models import Bubble, Conversation, Node, ToolApproval
from tests.conversations.helpers import ask, head
from tests.support.async_db import in_own_thread
from tests.support.openai_stub import Reply
from tests.support.sockets import chat_socket, receive_until, session_cookie

pytestmark = pytest.mark.django_db(transaction=True)

STUB = "openai/stub-model"
EMAIL = '#tool send_email {"to": "a@example.com", "subject": "s", "body": "b"}'


async def _connected(conversation_id: int, cookie: bytes) -> WebsocketCommunicator:
    """A socket whose connect handler has finished (its ownership check included): a message round trip."""
    socket = chat_socket(conversation_id, cookie)
    connected, _ = await socket.connect()
    assert connected
    await socket.send_json_to({"type": "stop"})
    assert await socket.receive_json_from(timeout=30) == {"type": "stopped"}
    return socket


async def _settled(socket, conversation_id: int) -> None:
    """Wait until the socket's last turn has fully ended, not just sent `done`.

    `done` goes out while the turn's thread still holds the turn lock and the socket's generation task is
    still winding down, so a message sent at once may be refused as `turn_in_progress`. A `stop` waits for
    the task; the lock is then polled (bounded), as `settled_node` does.
    """
    await socket.send_json_to({"type": "stop"})
    assert await socket.receive_json_from(timeout=30) == {"type": "stopped"}
    for _ in range(200):
        if await _read(lambda: Conversation.objects.get(pk=conversation_id).turn_token) is None:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the turn lock was never released")


def _read(function):
    return in_own_thread(function)()


def _state(conversation_id: int):
    conversation = Conversation.objects.get(pk=conversation_id)
    return (conversation.head_id, conversation.version, conversation.turn_token, Node.objects.count(),
            Bubble.objects.count(), ToolApproval.objects.count())


@pytest.fixture
def cookie(user) -> bytes:
    return session_cookie(user)


@pytest.fixture
def two_turns(conversation):
    """A conversation with two answered questions; return their nodes."""
    ask(conversation, "q1")
    q1 = head(conversation)
    ask(conversation, "q2")
    return q1, head(conversation)


@pytest.fixture
def gate(monkeypatch):
    """`#slow` words wait for the test to open the gate: a turn is running for as long as the test needs."""
    opened = threading.Event()
    monkeypatch.setattr(echo, "pause", lambda seconds: opened.wait(timeout=30))
    yield opened
    opened.set()


# --- the same turn starts as the API --------------------------------------------------------------------


async def test_t7_edit_over_the_socket_branches_from_the_turn_before(conversation, cookie, two_turns):
    q1, q2 = two_turns
    socket = await _connected(conversation.pk, cookie)
    await socket.send_json_to({"type": "edit", "node": q2.pk, "content": "q2 edited"})
    done = (await receive_until(socket, "done"))[-1]
    assert done["type"] == "done" and done["answer"].startswith("echo: q2 edited")
    assert "echo: q2\n" not in done["answer"], "T7: the old answer never reaches the edited question"
    edited, old = await _read(lambda: (Node.objects.get(pk=done["head"]), Node.objects.get(pk=q2.pk)))
    assert edited.parent_id == q1.pk and edited.sent == [{"type": "user", "text": "q2 edited"}]
    assert old.parent_id == q1.pk and old.status == "succeeded", "the old branch is kept"
    assert await _read(lambda: Conversation.objects.get(pk=conversation.pk).head_id) == edited.pk
    await socket.disconnect()


async def test_t7_regenerate_over_the_socket_reruns_the_last_or_a_chosen_question(conversation, cookie, two_turns):
    q1, q2 = two_turns
    socket = await _connected(conversation.pk, cookie)
    await socket.send_json_to({"type": "regenerate"})
    again = (await receive_until(socket, "done"))[-1]
    assert again["type"] == "done"
    sibling = await _read(lambda: Node.objects.get(pk=again["head"]))
    assert sibling.pk != q2.pk and sibling.parent_id == q1.pk and sibling.sent == q2.sent
    await _settled(socket, conversation.pk)
    await socket.send_json_to({"type": "regenerate", "node": q1.pk})
    first = (await receive_until(socket, "done"))[-1]
    rerun = await _read(lambda: Node.objects.get(pk=first["head"]))
    assert rerun.parent_id is None and rerun.sent == [{"type": "user", "text": "q1"}]
    assert await _read(lambda: Node.objects.filter(parent__isnull=True).count()) == 2
    await socket.disconnect()


@pytest.fixture
def two_emails(conversation, stub):
    """The stub model asks for two emails in one call; both wait for a person."""
    services.conversation_update(conversation=conversation, model=STUB)
    email = json.dumps({"to": "a@example.com", "subject": "s", "body": "b"})
    stub.script(Reply.tool_calls([("call_a", "send_email", email), ("call_b", "send_email", email)]),
                Reply.text("both decided"))
    assert ask(conversation, "send both")[-1].type == "approval_required"
    paused = head(conversation)
    return paused, [c["id"] for c in it.tool_calls(paused.received)]


async def test_f3_approve_over_the_socket_records_each_decision_and_resumes_after_the_last(conversation, cookie,
                                                                                          two_emails):
    paused, (first, second) = two_emails
    socket = await _connected(conversation.pk, cookie)
    await socket.send_json_to({"type": "approve", "tool_call_id": first, "approve": True})
    assert await socket.receive_json_from(timeout=30) == {"type": "approval_recorded"}
    decided, nodes, locked = await _read(lambda: (
        list(ToolApproval.objects.values_list("call_id", "approved")), Node.objects.count(),
        Conversation.objects.get(pk=conversation.pk).turn_token))
    assert decided == [(first, True)] and nodes == 1 and locked is None and mail.outbox == []
    await socket.send_json_to({"type": "approve", "tool_call_id": second, "approve": False})
    messages = await receive_until(socket, "done")
    results = [m for m in messages if m["type"] == "tool_result"]
    assert [(m["call_id"], m["is_error"]) for m in results] == [(first, False), (second, True)]
    assert messages[-1]["type"] == "done" and messages[-1]["answer"] == "both decided"
    resumed = await _read(lambda: Node.objects.get(pk=messages[-1]["head"]))
    assert resumed.parent_id == paused.pk
    assert await _read(lambda: ToolApproval.objects.count()) == 2
    assert len(mail.outbox) == 1, "only the approved email went out"
    await socket.disconnect()


# --- refusals that change nothing ---------------------------------------------------------------------------


async def test_bad_fields_and_bad_messages_are_refused_with_bad_input_and_change_nothing(conversation, cookie):
    await _read(lambda: ask(conversation, EMAIL))
    call_id = await _read(lambda: head(conversation).received[0]["id"])
    before = await _read(lambda: _state(conversation.pk))
    socket = await _connected(conversation.pk, cookie)
    for payload in [
        {"type": "edit", "node": "x", "content": "y"},
        {"type": "edit", "content": "y"},
        {"type": "edit", "node": True, "content": "y"},
        {"type": "regenerate", "node": "x"},
        {"type": "approve", "tool_call_id": call_id, "approve": "yes"},
        {"type": "approve", "approve": True},
        {"type": "ask", "content": 5},
        {"type": "dance"},
        {"type": 5},
        [1, 2],
        "ask",
    ]:
        await socket.send_json_to(payload)
        reply = await socket.receive_json_from(timeout=30)
        assert reply["type"] == "error" and reply["code"] == "bad_input" and reply["message"], (payload, reply)
    assert await _read(lambda: _state(conversation.pk)) == before
    await socket.send_json_to({"type": "approve", "tool_call_id": "call_unknown", "approve": True})
    assert (await socket.receive_json_from(timeout=30))["code"] == "not_found"
    assert await _read(lambda: _state(conversation.pk)) == before
    await socket.disconnect()


async def test_t9_every_turn_start_is_refused_while_a_turn_runs_on_the_socket(conversation, cookie, two_turns, gate):
    q1, q2 = two_turns
    socket = await _connected(conversation.pk, cookie)
    await socket.send_json_to({"type": "ask", "content": "#slow held open"})
    for payload in [{"type": "ask", "content": "two"}, {"type": "edit", "node": q2.pk, "content": "x"},
                    {"type": "regenerate"}, {"type": "retry"},
                    {"type": "approve", "tool_call_id": "call_x", "approve": True}]:
        await socket.send_json_to(payload)
        reply = await socket.receive_json_from(timeout=30)
        assert reply["type"] == "error" and reply["code"] == "turn_in_progress", (payload, reply)
    gate.set()
    done = (await receive_until(socket, "done"))[-1]
    assert done["type"] == "done" and done["answer"].startswith("echo: #slow held open")
    assert await _read(lambda: Node.objects.count()) == 3, "only the running turn wrote a node"
    await socket.disconnect()


async def test_stop_with_no_turn_running_answers_stopped_and_changes_nothing(conversation, cookie):
    socket = await _connected(conversation.pk, cookie)
    await socket.send_json_to({"type": "stop"})
    assert await socket.receive_json_from(timeout=30) == {"type": "stopped"}
    assert await _read(lambda: Node.objects.count()) == 0
    await socket.disconnect()


# --- access revoked while the socket is open -----------------------------------------------------------------


def _give_away(conversation, other_user):
    return lambda: Conversation.objects.filter(pk=conversation.pk).update(owner=other_user)


def _delete(conversation, other_user):
    return lambda: services.conversation_delete(conversation=Conversation.objects.get(pk=conversation.pk))


@pytest.mark.parametrize("revoke", [_give_away, _delete], ids=["given_to_another_owner", "deleted"])
async def test_access_revoked_after_connect_is_not_found_and_closes_the_socket(conversation, cookie, other_user,
                                                                                revoke):
    socket = await _connected(conversation.pk, cookie)
    await _read(revoke(conversation, other_user))
    await socket.send_json_to({"type": "ask", "content": "still mine?"})
    assert await socket.receive_json_from(timeout=30) == {"type": "error", "code": "not_found",
                                                          "message": "No such conversation."}
    assert await socket.receive_output(timeout=30) == {"type": "websocket.close", "code": 4404}
    assert await _read(lambda: Node.objects.count()) == 0, "nothing was asked"


@pytest.mark.asyncio
async def test_t9_a_question_sent_the_moment_done_arrives_is_taken_not_refused(user):
    """T9: `done` means the turn is over: the socket and the turn lock take the next question at once
    (before, `done` went out while the lock was still held, and an immediate ask was refused)."""
    conversation = await in_own_thread(lambda: services.conversation_create(owner=user, title="t"))()
    cookie = await in_own_thread(lambda: session_cookie(user))()
    socket = await _connected(conversation.pk, cookie)
    for round_number in range(5):
        await socket.send_json_to({"type": "ask", "content": f"question {round_number}"})
        while True:
            message = await socket.receive_json_from(timeout=30)
            assert message["type"] != "error", message
            if message["type"] == "done":
                break
    await socket.disconnect()
    texts = await in_own_thread(lambda: [it.question_of(n.sent) for n in Node.objects.filter(
        conversation=conversation).order_by("id")])()
    assert texts == [f"question {n}" for n in range(5)]
