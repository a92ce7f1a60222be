"""The chat WebSocket through the project's real ASGI application (routing, sessions, origin check)."""

from __future__ import annotations

import asyncio
import threading

import pytest
from channels.testing import WebsocketCommunicator

from conversations import services
from conversations.models import Conversation, Node
from conversations.web import consumer
from tests.support.async_db import in_own_thread, settled_node
from tests.support.sockets import chat_socket, receive_until, session_cookie

pytestmark = pytest.mark.django_db(transaction=True)

SLOW = "#slow " + " ".join(f"w{i}" for i in range(30))


async def _socket_with_a_running_turn(conversation, cookie) -> WebsocketCommunicator:
    """A connected socket whose slow turn has started streaming (its first token has arrived)."""
    socket = chat_socket(conversation.pk, cookie)
    await socket.connect()
    await socket.send_json_to({"type": "ask", "content": SLOW})
    first = await socket.receive_json_from(timeout=30)
    assert first["type"] == "token"
    return socket


@pytest.fixture
def chat(user):
    conversation = services.conversation_create(owner=user)
    return conversation, session_cookie(user)


async def test_a_question_streams_tokens_in_several_batches_then_done(chat):
    conversation, cookie = chat
    socket = chat_socket(conversation.pk, cookie)
    connected, _ = await socket.connect()
    assert connected
    await socket.send_json_to({"type": "ask", "content": SLOW})
    messages = await receive_until(socket, "done")
    tokens = [m for m in messages if m["type"] == "token"]
    assert len(tokens) > 3, "tokens arrive as they come, in small batches"
    assert len(tokens) < 60, "batched: fewer frames than words"
    assert "".join(m["text"] for m in tokens) == messages[-1]["answer"]
    assert messages[-1]["head"] == await in_own_thread(lambda: Conversation.objects.get(pk=conversation.pk).head_id)()
    await socket.disconnect()


async def test_issue_13_a_token_goes_out_on_the_batch_timer_without_waiting_for_the_next():
    """Uneven pacing: two tokens 10 ms apart, then the model is silent for a second. The second token goes
    out on the batch's timer (within TOKEN_BATCH_SECONDS), not when the model speaks again."""
    from conversations.turns.events import EventType, TurnEvent

    sent: list[tuple[float, dict]] = []
    loop = asyncio.get_running_loop()

    class Socket(consumer.ChatConsumer):
        def __init__(self):
            self.turn_ended = False

        async def send_json(self, content, close=False):
            sent.append((loop.time(), content))

    silence_began = {}

    async def events():
        for text in ("a", "b"):
            yield 0, TurnEvent(EventType.TOKEN, {"text": text, "node": 1})
            await asyncio.sleep(0.01)
        silence_began["at"] = loop.time()
        await asyncio.sleep(1)
        yield 0, TurnEvent(EventType.TOKEN, {"text": "c", "node": 1})
        yield 0, TurnEvent(EventType.DONE, {"answer": "abc", "head": 1, "nodes": [1]})

    await Socket()._forward(events())
    tokens = [(at, m["text"]) for at, m in sent if m["type"] == "token"]
    assert "".join(text for _, text in tokens) == "abc"
    b_sent_at = next(at for at, text in tokens if "b" in text)
    assert b_sent_at - silence_began["at"] < 0.5, "sent on the timer, during the silence"
    assert sent[-1][1]["type"] == "done"


async def test_stop_cancels_the_turn_keeps_the_node_and_frees_the_conversation(chat):
    """Stop: the turn's ending (`error`, cancelled) and then `stopped` come once the node is written
    failed/cancelled (F1: the head is on it); asking goes on."""
    conversation, cookie = chat
    socket = await _socket_with_a_running_turn(conversation, cookie)
    await socket.send_json_to({"type": "stop"})
    ending = (await receive_until(socket, "stopped"))[-1]
    assert ending["type"] == "error" and ending["code"] == "cancelled"
    assert await socket.receive_json_from(timeout=30) == {"type": "stopped"}
    node, head_id = await in_own_thread(
        lambda: (Node.objects.get(conversation=conversation), Conversation.objects.get(pk=conversation.pk).head_id))()
    assert node.status == "failed" and node.failure_reason == "cancelled" and head_id == node.pk
    await socket.send_json_to({"type": "ask", "content": "again"})
    messages = await receive_until(socket, "done")
    assert messages[-1]["type"] == "done" and messages[-1]["answer"].startswith("echo: again")
    await socket.disconnect()


async def test_retry_calls_the_model_again_from_the_stopped_node_adding_nothing(chat):
    """F1: retry runs a turn whose parent is the failed node at the head and whose sent items are empty, so the
    question is on the path once."""
    conversation, cookie = chat
    socket = await _socket_with_a_running_turn(conversation, cookie)
    await socket.send_json_to({"type": "stop"})
    await receive_until(socket, "stopped")
    await socket.send_json_to({"type": "retry"})
    done = (await receive_until(socket, "done"))[-1]
    assert done["type"] == "done" and done["answer"].startswith(f"echo: {SLOW}\nseen: user:#slow w0")
    retried = await in_own_thread(lambda: Node.objects.get(pk=done["head"]))()
    stopped = await in_own_thread(lambda: Node.objects.get(pk=retried.parent_id))()
    assert retried.sent == [] and stopped.failure_reason == "cancelled"
    await socket.send_json_to({"type": "retry"})
    refused = (await receive_until(socket, "never"))[-1]
    assert refused["code"] == "bad_input", "nothing to retry once the head succeeded"
    await socket.disconnect()


async def test_issue_12_a_socket_that_closes_mid_answer_does_not_end_the_turn(chat):
    """Issue 12: a closed tab stops reading, never the turn: the answer completes and is recorded whole."""
    conversation, cookie = chat
    socket = await _socket_with_a_running_turn(conversation, cookie)
    await socket.disconnect()
    node = await settled_node(conversation)
    assert node.status == "succeeded" and node.received[0]["text"].startswith(f"echo: {SLOW}")


async def test_issue_12_a_socket_dropped_the_moment_its_question_is_sent_keeps_the_question(chat, monkeypatch):
    """The socket goes (the consumer's task cancelled) while the question is being started: the turn is
    started and launched in one step in a thread, so the cancelled wait loses nothing; the question and
    its answer are recorded."""
    conversation, cookie = chat
    entered, leave = threading.Event(), threading.Event()
    begin_and_launch = consumer._begin_and_launch

    def held(begin, **sending):
        entered.set()
        leave.wait(10)  # until the consumer has been cancelled
        return begin_and_launch(begin, **sending)

    monkeypatch.setattr(consumer, "_begin_and_launch", held)
    socket = chat_socket(conversation.pk, cookie)
    await socket.connect()
    await socket.send_json_to({"type": "ask", "content": "typed with care"})
    assert await asyncio.to_thread(entered.wait, 10)
    await socket.disconnect(timeout=0.001)  # cancels the consumer mid-await
    leave.set()
    node = await settled_node(conversation)
    assert node.status == "succeeded" and node.sent[-1]["text"] == "typed with care"
    assert node.received[0]["text"].startswith("echo: typed with care")


async def test_issue_12_stop_from_another_tab_ends_the_turn_it_did_not_start(chat):
    """Issue 12: a second socket on the same conversation stops the first one's turn."""
    conversation, cookie = chat
    first = await _socket_with_a_running_turn(conversation, cookie)
    second = chat_socket(conversation.pk, cookie)
    await second.connect()
    assert (await second.receive_json_from(timeout=30))["type"] == "joined", "it shows the running turn too"
    await second.send_json_to({"type": "stop"})
    seen = (await receive_until(second, "stopped"))[-1]
    assert seen["type"] == "error" and seen["code"] == "cancelled", "the joined turn's ending"
    assert await second.receive_json_from(timeout=30) == {"type": "stopped"}
    ending = (await receive_until(first, "error"))[-1]
    assert ending["code"] == "cancelled"
    node = await settled_node(conversation)
    assert (node.status, node.failure_reason) == ("failed", "cancelled")
    await first.disconnect()
    await second.disconnect()


async def test_a_second_question_while_one_runs_is_refused(chat):
    conversation, cookie = chat
    socket = await _socket_with_a_running_turn(conversation, cookie)
    await socket.send_json_to({"type": "ask", "content": "two"})
    messages = await receive_until(socket, "never")
    assert messages[-1]["type"] == "error" and messages[-1]["code"] == "turn_in_progress"
    await socket.send_json_to({"type": "stop"})
    await socket.disconnect()


async def test_another_users_conversation_and_anonymous_sockets_are_refused(chat, other_user):
    conversation, _ = chat
    other_cookie = await in_own_thread(lambda: session_cookie(other_user))()
    for conversation_id, cookie in ((conversation.pk, other_cookie), (conversation.pk, None), (999999, other_cookie)):
        socket = chat_socket(conversation_id, cookie)
        connected, _ = await socket.connect()
        assert connected, "accepted, then closed with a reason a browser can read"
        assert await socket.receive_output() == {"type": "websocket.close", "code": 4404}


async def test_bad_messages_get_clear_errors_and_change_nothing(chat):
    conversation, cookie = chat
    socket = chat_socket(conversation.pk, cookie)
    await socket.connect()
    for payload, code in [({"content": "x"}, "bad_input"), ({"type": "dance"}, "bad_input"),
                          ({"type": "ask", "content": ""}, "bad_input"),
                          ({"type": "edit", "node": 999999, "content": "x"}, "not_found")]:
        await socket.send_json_to(payload)
        reply = await socket.receive_json_from(timeout=30)
        assert reply["type"] == "error" and reply["code"] == code, (payload, reply)
    assert await in_own_thread(lambda: Node.objects.count())() == 0
    await socket.disconnect()


async def test_issue_12_a_socket_opened_mid_answer_joins_it_with_nothing_missing_or_repeated(chat):
    """A reloaded page or a second tab: its socket joins the running turn, gets the answer so far and then
    the rest live; the tokens it gets are the whole answer, once."""
    conversation, cookie = chat
    first = await _socket_with_a_running_turn(conversation, cookie)
    late = chat_socket(conversation.pk, cookie)
    await late.connect()
    messages = await receive_until(late, "done")
    assert messages[0] == {"type": "joined"} and messages[-1]["type"] == "done"
    joined_text = "".join(m["text"] for m in messages if m["type"] == "token")
    assert joined_text == messages[-1]["answer"] and joined_text.startswith(f"echo: {SLOW}")
    own = await receive_until(first, "done")
    assert own[-1] == messages[-1]
    await late.send_json_to({"type": "ask", "content": "and the late tab asks on"})
    assert (await receive_until(late, "done"))[-1]["answer"].startswith("echo: and the late tab asks on")
    await first.disconnect()
    await late.disconnect()


async def test_issue_12_a_joined_run_whose_process_is_gone_ends_with_ended(chat):
    """A run is under way on the conversation but nobody holds its lock (its process died before it wrote
    anything): the socket joins it, and once it is plainly orphaned says `ended`, so the page's controls
    come back."""
    import uuid

    from conversations.models import TurnRun

    conversation, cookie = chat
    await in_own_thread(lambda: TurnRun.objects.create(id=uuid.uuid4(), conversation=conversation))()
    socket = chat_socket(conversation.pk, cookie)
    await socket.connect()
    assert await socket.receive_json_from(timeout=10) == {"type": "joined"}
    assert await socket.receive_json_from(timeout=15) == {"type": "ended"}
    await socket.disconnect()


async def test_issue_13_a_socket_signs_in_and_asks_while_the_shared_sync_thread_is_busy(chat):
    """The handshake's session and user, the ownership check and the turn's start run in the turn pool, not on
    the one thread ASGI shares between sync calls: with that thread held, a socket still connects and its
    question is answered (they used to queue there behind every other socket's)."""
    from asgiref.sync import sync_to_async

    conversation, cookie = chat
    release = threading.Event()
    holding = asyncio.ensure_future(sync_to_async(release.wait, thread_sensitive=True)())
    try:
        socket = chat_socket(conversation.pk, cookie)
        connected, _ = await socket.connect(timeout=20)
        assert connected
        await socket.send_json_to({"type": "ask", "content": "hello"})
        messages = await receive_until(socket, "done")
        assert messages[-1]["type"] == "done", messages
        assert not holding.done()  # all of it while the shared thread was still held
        await socket.disconnect()
    finally:
        release.set()
        await holding


async def test_issue_26_another_tab_sees_a_turn_that_starts_and_ends_between_two_looks(chat, settings):
    """Issue 26: a quick turn made elsewhere (another tab, the API) often started and ended between the watch's
    looks (every 0.5 s) and was never shown in an open tab (6 of 6). Now a tab open when it began joins it and
    replays it to its end; a tab opened after it ended is not sent it again (its page already shows it)."""
    from conversations.turns.detached import run_here
    from conversations.turns.start import turn_ask

    conversation, cookie = chat
    settings.ARBOR_ECHO_WORD_SECONDS = 0
    watching = chat_socket(conversation.pk, cookie)
    await watching.connect()
    await asyncio.sleep(0.1)  # the socket is registered with the watch
    events = await in_own_thread(lambda: run_here(turn_ask(user=conversation.owner, conversation_id=conversation.pk,
                                                            content="a quick one")))()
    assert events[-1].type == "done"
    messages = await receive_until(watching, "done")
    assert messages[0] == {"type": "joined"} and messages[-1]["answer"] == events[-1].data["answer"]
    later = chat_socket(conversation.pk, cookie)
    await later.connect()
    assert await later.receive_nothing(timeout=2), "a tab opened after the turn ended is not sent it again"
    await watching.disconnect()
    await later.disconnect()


async def test_issue_26_a_tab_signed_out_elsewhere_can_no_longer_ask(chat):
    """Issue 26: after signing out in one tab, an already open chat tab could still send messages, and the model
    calls were recorded. Every message now reads the session again: signed out, the socket says so and closes,
    and nothing is written."""
    from django.contrib.sessions.models import Session

    conversation, cookie = chat
    socket = chat_socket(conversation.pk, cookie)
    assert (await socket.connect())[0]
    session_key = cookie.decode().split("=", 1)[1]
    await in_own_thread(lambda: Session.objects.filter(session_key=session_key).delete())()  # signed out elsewhere
    await socket.send_json_to({"type": "ask", "content": "still there?"})
    reply = await socket.receive_json_from(timeout=10)
    assert reply["type"] == "error" and reply["code"] == "signed_out"
    assert (await socket.receive_output(timeout=5))["type"] == "websocket.close"
    assert await in_own_thread(lambda: Node.objects.count())() == 0
