"""Under ASGI a turn never holds up the server (T9, R3), and SSE streams a turn as it happens.

These tests go through Arbor's ASGI handler (`config.pooled_http`, as the server runs it): each request's view
runs in a pool thread of its own, so a turn running in one makes no other request wait for it.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from rest_framework.authtoken.models import Token

from conversations import services
from conversations.models import Conversation, Node
from tests.support.asgi_client import ServerAsyncClient
from tests.support.async_db import in_own_thread, settled_node

pytestmark = pytest.mark.django_db(transaction=True)

SLOW_QUESTION = "#slow " + " ".join(f"w{i}" for i in range(30))


@pytest.fixture(autouse=True)
async def _close_shared_thread_connections():
    """Test clients keep connections open (they unhook close_old_connections); close the shared thread's."""
    yield
    await sync_to_async(connections.close_all)()


def TokenClient(token: str) -> ServerAsyncClient:  # noqa: N802 (read as the client class it makes)
    """An ASGI client handled as the server handles requests, with the token on every request."""
    return ServerAsyncClient(("authorization", f"Token {token}"))


@pytest.fixture
def setup(user):
    token, _ = Token.objects.get_or_create(user=user)
    conversation = services.conversation_create(owner=user)
    return TokenClient(token.key), conversation


def _parse_sse(chunks: list[bytes]) -> list[tuple[str, dict]]:
    events = []
    for block in b"".join(chunks).decode().split("\n\n"):
        if block.strip():
            lines = dict(line.split(": ", 1) for line in block.splitlines())
            events.append((lines["event"], json.loads(lines["data"])))
    return events


async def _wait_for_pending_node(conversation_id: int) -> int:
    for _ in range(200):
        node_id = await in_own_thread(
            lambda: Node.objects.filter(conversation_id=conversation_id, status="pending")
            .values_list("id", flat=True).first()
        )()
        if node_id:
            return node_id
        await asyncio.sleep(0.05)
    raise AssertionError("the turn never started")


async def test_t9_an_edit_gets_its_409_at_once_while_a_json_turn_runs(setup):
    """T9: while a (non-streamed) turn runs, an edit is refused immediately, not after the turn ends."""
    client, conversation = setup
    first = await client.post(f"/api/conversations/{conversation.pk}/turns/", {"content": "q1"},
                              content_type="application/json")
    assert first.status_code == 201, first.content
    head = first.json()["head"]
    turn = asyncio.create_task(client.post(f"/api/conversations/{conversation.pk}/turns/",
                                           {"content": SLOW_QUESTION}, content_type="application/json"))
    pending = await _wait_for_pending_node(conversation.pk)
    edit = await client.post(f"/api/conversations/{conversation.pk}/edit/", {"node": head, "content": "x"},
                             content_type="application/json")
    assert edit.status_code == 409 and edit.json()["error"]["code"] == "turn_in_progress"
    assert not turn.done(), "the edit was answered while the turn was still running"
    status = await in_own_thread(lambda: Node.objects.get(pk=pending).status)()
    assert status == "pending"
    listing = await client.get("/api/conversations/")
    assert listing.status_code == 200 and not turn.done()
    finished = await turn
    assert finished.status_code == 201
    assert await in_own_thread(lambda: Conversation.objects.get(pk=conversation.pk).head_id)() == pending


async def test_sse_streams_tokens_then_done_and_other_requests_are_served_meanwhile(setup):
    """SSE: `token` events arrive one by one, `done` carries answer, head and nodes; a 409 comes meanwhile."""
    client, conversation = setup
    response = await client.post(f"/api/conversations/{conversation.pk}/turns/", {"content": SLOW_QUESTION},
                                 content_type="application/json", headers={"accept": "text/event-stream"})
    assert response.status_code == 200 and response["Content-Type"] == "text/event-stream"
    stream = aiter(response.streaming_content)
    chunks = [await anext(stream)]
    busy = await client.post(f"/api/conversations/{conversation.pk}/turns/", {"content": "again"},
                             content_type="application/json")
    assert busy.status_code == 409
    chunks.extend([chunk async for chunk in stream])
    events = _parse_sse(chunks)
    kinds = [kind for kind, _ in events]
    assert kinds.count("token") > 10 and kinds[-1] == "done"
    done = events[-1][1]
    assert done["answer"].startswith("echo: #slow w0 w1") and done["head"] == done["nodes"][-1]
    assert "".join(data["text"] for kind, data in events if kind == "token") == done["answer"]


async def test_sse_error_event_for_a_failed_turn_f1(setup):
    client, conversation = setup
    response = await client.post(f"/api/conversations/{conversation.pk}/turns/", {"content": "#fail"},
                                 content_type="application/json", headers={"accept": "text/event-stream"})
    events = _parse_sse([chunk async for chunk in response.streaming_content])
    assert events[-1][0] == "error" and events[-1][1]["code"] == "provider_error"
    node = await in_own_thread(lambda: Node.objects.get(pk=events[-1][1]["node"]))()
    assert node.status == "failed"


async def test_issue_12_a_client_that_disconnects_mid_stream_does_not_end_its_turn(setup, user):
    """Issue 12: a client that goes away after the first tokens does not cancel its turn: it completes,
    succeeded with the whole answer; `/stream/` replays it (numbered events); the conversation is free.

    Driven through the project's ASGI application, so the disconnect is the server's own.
    """
    from config.asgi import application

    client, conversation = setup
    body = json.dumps({"content": SLOW_QUESTION}).encode()
    inbox: asyncio.Queue = asyncio.Queue()
    await inbox.put({"type": "http.request", "body": body, "more_body": False})
    sent: list[dict] = []
    first_chunk = asyncio.Event()

    async def receive():
        return await inbox.get()

    async def send(message):
        sent.append(message)
        if message["type"] == "http.response.body" and message.get("body"):
            first_chunk.set()

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": f"/api/conversations/{conversation.pk}/turns/", "raw_path": b"", "query_string": b"",
        "root_path": "", "client": ("127.0.0.1", 1234), "server": ("testserver", 80),
        "headers": [(b"host", b"testserver"), (b"content-type", b"application/json"),
                    (b"accept", b"text/event-stream"), (b"authorization", client.header[1].encode()),
                    (b"content-length", str(len(body)).encode())],
    }
    server = asyncio.create_task(application(scope, receive, send))
    await asyncio.wait_for(first_chunk.wait(), timeout=30)
    await inbox.put({"type": "http.disconnect"})
    await asyncio.wait_for(server, timeout=30)
    node = await settled_node(conversation)
    assert node.status == "succeeded"
    answer = node.received[0]["text"]
    assert answer.startswith(f"echo: {SLOW_QUESTION}")
    replay = await client.get(f"/api/conversations/{conversation.pk}/stream/")
    chunks = [chunk async for chunk in replay.streaming_content]
    events = _parse_sse(chunks)
    assert events[-1][0] == "done" and "".join(d["text"] for kind, d in events if kind == "token") == answer
    ids = [int(line[4:]) for chunk in chunks for line in chunk.decode().splitlines() if line.startswith("id: ")]
    assert ids == list(range(1, len(events) + 1))
    resumed = await client.get(f"/api/conversations/{conversation.pk}/stream/", headers={"last-event-id": "2"})
    rest = _parse_sse([chunk async for chunk in resumed.streaming_content])
    assert rest == events[2:]
    again = await client.post(f"/api/conversations/{conversation.pk}/turns/", {"content": "after"},
                              content_type="application/json")
    assert again.status_code == 201
