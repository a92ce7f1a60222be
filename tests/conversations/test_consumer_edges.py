"""The chat WebSocket's edges, through the project's real ASGI application (origin check, sessions, routing):
frames that are not messages, actions it does not know, a socket that is refused, decisions that contradict
each other, a stop whose run's process is gone, and how token batches leave (issues 12 and 13, F3, D3, D4, D5).
Every refusal is answered with a clear error on a socket that stays open, and changes nothing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from conversations import items as it
from conversations import services
from conversations.models import Bubble, Conversation, Node, ToolApproval, TurnRun
from conversations.turns import recovery
from conversations.turns.events import EventType, TurnEvent
from conversations.web import consumer, run_watch
from tests.conversations.helpers import ask, head
from tests.support.async_db import in_own_thread
from tests.support.openai_stub import Reply
from tests.support.sockets import chat_socket, session_cookie

pytestmark = pytest.mark.django_db(transaction=True)

STUB = "openai/stub-model"


def _read(function):
    return in_own_thread(function)()


def _state(conversation_id: int):
    conversation = Conversation.objects.get(pk=conversation_id)
    return (conversation.head_id, conversation.version, conversation.turn_token, Node.objects.count(),
            Bubble.objects.count(), ToolApproval.objects.count(), TurnRun.objects.count())


@pytest.fixture
def cookie(user) -> bytes:
    return session_cookie(user)


async def _connected(conversation_id: int, cookie: bytes | None):
    """A socket whose connect handler has finished (a `stop` round trip: nothing runs, so it only says so)."""
    socket = chat_socket(conversation_id, cookie)
    connected, _ = await socket.connect()
    assert connected
    await socket.send_json_to({"type": "stop"})
    assert await socket.receive_json_from(timeout=30) == {"type": "stopped"}
    return socket


# --- frames that are not messages, and actions it does not know ------------------------------------------------


@pytest.mark.parametrize(("frame", "expected"), [
    pytest.param({"text_data": "ask me"}, {"message": "Send a JSON object with a type."}, id="not-json"),
    pytest.param({"text_data": "null"}, {"message": "Send a JSON object with a type."}, id="json-null"),
    pytest.param({"bytes_data": b'{"type": "ask", "content": "hi"}'}, {"message": "Send a JSON object with a type."},
                 id="binary-frame"),
    pytest.param({"text_data": "[" * 40 + "]" * 40}, {"message": "The JSON nests deeper than 32 levels."},
                 id="nested-too-deep"),
    pytest.param({"text_data": '{"type": "ask", "content": "a\\u0000b"}'}, {"path": "$.content"}, id="nul-character"),
    pytest.param({"text_data": '{"type": "edit", "node": 99999999999999999999999, "content": "x"}'},
                 {"path": "$.node"}, id="number-past-int64"),
    pytest.param({"text_data": json.dumps({"type": "switch", "node": 1})},
                 {"message": "Unknown message type 'switch'."}, id="unknown-action"),
    pytest.param({"text_data": json.dumps({"type": "STOP"})}, {"message": "Unknown message type 'STOP'."},
                 id="action-names-are-exact"),
])
async def test_d5_a_frame_that_is_no_message_gets_bad_input_and_the_socket_stays_usable(conversation, cookie, frame,
                                                                                        expected):
    """D5 (frames are read like API bodies): a frame that is not JSON, binary, nested too deep, holding a NUL or
    a number no column can hold, or naming an action the socket does not know, is answered `bad_input` (naming
    the value's path where there is one); nothing changes and the same socket still asks and is answered."""
    before = await _read(lambda: _state(conversation.pk))
    socket = await _connected(conversation.pk, cookie)
    await socket.send_to(**frame)
    reply = await socket.receive_json_from(timeout=30)
    assert reply["type"] == "error" and reply["code"] == "bad_input" and reply["message"], reply
    if "message" in expected:
        assert expected["message"] in reply["message"], reply
    if "path" in expected:
        assert reply["path"] == expected["path"] and reply["message"].startswith(expected["path"] + ": "), reply
    else:
        assert "path" not in reply, reply
    assert await _read(lambda: _state(conversation.pk)) == before
    await socket.send_json_to({"type": "ask", "content": "still here?"})
    while (message := await socket.receive_json_from(timeout=30))["type"] != "done":
        assert message["type"] == "token", message
    assert message["answer"].startswith("echo: still here?")
    await socket.disconnect()


async def test_issue_13_a_channel_message_with_no_handler_is_an_error_as_in_channels(conversation, cookie):
    """Issue 13 (the consumer's own `dispatch`, without Channels' per-message connection cleanup): a message of a
    type no handler takes still fails loudly, as Channels' dispatch does, instead of being dropped."""
    socket = await _connected(conversation.pk, cookie)
    await socket.send_input({"type": "chat.unheard_of"})
    with pytest.raises(ValueError, match="No handler for message type chat.unheard_of"):
        await socket.receive_output(timeout=10)


# --- sockets that are refused -----------------------------------------------------------------------------------


async def test_issue_13_a_refused_socket_is_never_watched_and_an_accepted_one_stops_being_watched(conversation,
                                                                                                 cookie, other_user):
    """Issue 13 (one query for every idle socket): a logged-out socket, or one on another person's conversation,
    is closed with 4404 and never joins the run watch, so it costs no query and is told of no turn; its
    disconnect is clean. The owner's socket is watched while open, and no longer once it disconnects."""
    other_cookie = await _read(lambda: session_cookie(other_user))
    watched = run_watch.watch()._sockets
    for refused_cookie in (None, other_cookie):
        socket = chat_socket(conversation.pk, refused_cookie)
        connected, _ = await socket.connect()
        assert connected
        assert await socket.receive_output(timeout=10) == {"type": "websocket.close", "code": 4404}
        assert conversation.pk not in watched
        await socket.disconnect()
    owner = await _connected(conversation.pk, cookie)
    assert len(watched[conversation.pk]) == 1
    await owner.disconnect()
    assert conversation.pk not in watched


# --- decisions (F3, D4) -------------------------------------------------------------------------------------------


@pytest.fixture
def two_emails(conversation, stub):
    """The stub model asks for two emails in one call; both wait for a person."""
    services.conversation_update(conversation=conversation, model=STUB)
    email = json.dumps({"to": "a@example.com", "subject": "s", "body": "b"})
    stub.script(Reply.tool_calls([("call_a", "send_email", email), ("call_b", "send_email", email)]),
                Reply.text("both decided"))
    assert ask(conversation, "send both")[-1].type == "approval_required"
    return [c["id"] for c in it.tool_calls(head(conversation).received)]


async def test_f3_d4_a_decision_contradicting_an_earlier_one_is_refused_and_changes_nothing(conversation, cookie,
                                                                                            two_emails):
    """F3, D4: a person's approval, sent by `call_id` (the name the approval_required event uses), is recorded;
    refusing the same call afterwards is `bad_input` naming the earlier decision and changes nothing; the same
    decision again is taken (a client that lost the answer may resend it) and recorded once. No email goes out
    while a call still waits."""
    first, second = two_emails
    socket = await _connected(conversation.pk, cookie)
    await socket.send_json_to({"type": "approve", "call_id": first, "approve": True})
    assert await socket.receive_json_from(timeout=30) == {"type": "approval_recorded"}
    decided = await _read(lambda: _state(conversation.pk))

    await socket.send_json_to({"type": "approve", "tool_call_id": first, "approve": False})
    reply = await socket.receive_json_from(timeout=30)
    assert reply == {"type": "error", "code": "bad_input", "message": f"Tool call {first!r} was already approved."}
    assert await _read(lambda: _state(conversation.pk)) == decided

    await socket.send_json_to({"type": "approve", "call_id": first, "approve": True})
    assert await socket.receive_json_from(timeout=30) == {"type": "approval_recorded"}
    assert await _read(lambda: _state(conversation.pk)) == decided
    assert await _read(lambda: list(ToolApproval.objects.values_list("call_id", "approved"))) == [(first, True)]
    assert mail.outbox == [] and second not in await _read(lambda: list(ToolApproval.objects.values_list(
        "call_id", flat=True)))
    await socket.disconnect()


async def test_f3_a_decision_or_a_step_with_nothing_to_act_on_is_refused_and_changes_nothing(conversation, cookie,
                                                                                             other_user):
    """F3, T7, F1: approving when no call waits is `not_found`; an edit of a node of another person's
    conversation is `not_found` (never theirs to branch from); regenerate and retry on an empty conversation
    are refused; the socket stays open and nothing is written."""
    theirs = await _read(lambda: services.conversation_create(owner=other_user))
    await _read(lambda: ask(theirs, "their question"))
    their_node = await _read(lambda: head(theirs).pk)
    before = await _read(lambda: _state(conversation.pk))
    socket = await _connected(conversation.pk, cookie)
    for payload, code, words in [
        ({"type": "approve", "call_id": "call_1", "approve": True}, "not_found", "is waiting for approval"),
        ({"type": "edit", "node": their_node, "content": "mine now"}, "not_found", f"No node {their_node} in this"),
        ({"type": "regenerate"}, "bad_input", "no question to regenerate"),
        ({"type": "retry"}, "bad_input", "Nothing to retry"),
    ]:
        await socket.send_json_to(payload)
        reply = await socket.receive_json_from(timeout=30)
        assert reply["type"] == "error" and reply["code"] == code and words in reply["message"], (payload, reply)
    assert await _read(lambda: _state(conversation.pk)) == before
    assert await _read(lambda: Node.objects.filter(conversation=theirs).count()) == 1
    await socket.disconnect()


# --- stop, when the run's process is gone (D3) -------------------------------------------------------------------


async def test_d3_stop_on_a_run_whose_process_died_waits_bounded_then_returns_once_it_is_swept(conversation, cookie,
                                                                                              monkeypatch):
    """D3, issue 12: a socket joins a run under way on its conversation whose process died before writing
    anything (no lock, no event) and says `ended` once it is plainly orphaned. A `stop` then asks the run to stop
    through the database and waits for it to end: not for ever (STOP_WAIT_SECONDS), still answering `stopped`;
    and as soon as the sweep ends the run (D3), a second `stop` returns at once. No node is written."""
    long_ago = timezone.now() - timedelta(hours=1)
    run_id = await _read(lambda: TurnRun.objects.create(id=uuid.uuid4(), conversation=conversation,
                                                        started_at=long_ago).pk)
    socket = chat_socket(conversation.pk, cookie)
    await socket.connect()
    assert await socket.receive_json_from(timeout=10) == {"type": "joined"}
    assert await socket.receive_json_from(timeout=20) == {"type": "ended"}

    monkeypatch.setattr(consumer, "STOP_WAIT_SECONDS", 0.5)
    started = time.monotonic()
    await socket.send_json_to({"type": "stop"})
    assert await socket.receive_json_from(timeout=10) == {"type": "stopped"}
    assert 0.4 <= time.monotonic() - started < 5, "it waited for the run, but not for ever"
    run = await _read(lambda: TurnRun.objects.get(pk=run_id))
    assert run.stop_requested and run.ended_at is None, "asked to stop; only the sweep can end a dead run"

    monkeypatch.setattr(consumer, "STOP_WAIT_SECONDS", 30)
    swept = threading.Timer(0.3, lambda: _swept())
    started = time.monotonic()
    await socket.send_json_to({"type": "stop"})
    swept.start()
    try:
        assert await socket.receive_json_from(timeout=40) == {"type": "stopped"}
    finally:
        swept.join()
    assert time.monotonic() - started < 10, "it returned once the run had ended, not after STOP_WAIT_SECONDS"
    assert await _read(lambda: TurnRun.objects.get(pk=run_id).ended_at) is not None
    assert await _read(lambda: Node.objects.count()) == 0
    await socket.disconnect()


def _swept():
    from django.db import connections

    try:
        recovery.sweep()
    finally:
        connections.close_all()


# --- how tokens leave (issue 13) -----------------------------------------------------------------------------------


class _Recorder(consumer.ChatConsumer):
    """The consumer's forwarding alone, its frames recorded instead of written to a socket."""

    def __init__(self, sent: list[dict]):
        self.turn_ended = False
        self.sent = sent

    async def send_json(self, content, close=False):
        self.sent.append(content)


async def test_issue_13_t1_a_token_batch_never_mixes_two_calls_tokens():
    """Issue 13, T1: tokens go out in batches, but a batch holds one call's tokens: when the next token is of
    another node, the batch so far leaves first, so each frame's text belongs to the node it names."""
    sent: list[dict] = []

    async def events():
        for text, node in (("a", 1), ("b", 1), ("c", 2), ("d", 2)):
            yield 0, TurnEvent(EventType.TOKEN, {"text": text, "node": node})
        yield 0, TurnEvent(EventType.DONE, {"answer": "cd", "head": 2, "nodes": [1, 2]})

    recorder = _Recorder(sent)
    await recorder._forward(events())
    assert sent == [{"type": "token", "text": "ab", "node": 1}, {"type": "token", "text": "cd", "node": 2},
                    {"type": "done", "answer": "cd", "head": 2, "nodes": [1, 2]}]
    assert recorder.turn_ended


async def test_issue_13_a_reader_stopped_mid_batch_sends_nothing_afterwards():
    """Issue 13 (a closed socket stops reading): a reader cancelled while a batch waits for its timer cancels
    the timer too: nothing is sent after the socket went away."""
    sent: list[dict] = []
    reached = asyncio.Event()

    async def events():
        yield 0, TurnEvent(EventType.TOKEN, {"text": "half", "node": 1})
        reached.set()
        await asyncio.sleep(30)  # the model is silent; the socket closes meanwhile
        yield 0, TurnEvent(EventType.TOKEN, {"text": " never", "node": 1})

    reading = asyncio.ensure_future(_Recorder(sent)._forward(events()))
    await asyncio.wait_for(reached.wait(), timeout=5)
    reading.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reading
    await asyncio.sleep(consumer.TOKEN_BATCH_SECONDS * 4)
    assert sent == [], "the batch's timer went with its reader"
