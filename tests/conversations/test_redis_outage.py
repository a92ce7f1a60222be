"""Issue 12, with `REDIS_URL` set and Redis stopped and restarted mid-stream: two real server processes (one
runs the turn, the other follows it through the store), a throwaway redis-server on a port of its own, and
a chat socket left idle on the second server all along. Nothing is lost, nothing repeated, no socket closed.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
import requests
import websocket
from rest_framework.authtoken.models import Token

from conversations import items as it
from conversations.models import Node
from tests.conversations.test_turn_log_stores import ThrowawayRedis
from tests.support.servers import Server
from tests.support.sockets import session_cookie

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WORDS = [f"w{i}" for i in range(70)]


def _sse(response) -> list[tuple[int | None, str, dict]]:
    """A whole SSE answer as (id, event, data)."""
    events, seq, kind = [], None, None
    for line in response.iter_lines(decode_unicode=True):
        if line.startswith("id:"):
            seq = int(line[3:])
        elif line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            events.append((seq, kind, json.loads(line[5:])))
            if kind in ("done", "error", "approval_required"):
                break
    return events


def test_issue_12_redis_stopped_mid_stream_loses_nothing_and_closes_no_socket(conversation, user):
    redis = ThrowawayRedis().start()
    env = {"REDIS_URL": redis.url, "ARBOR_ECHO_WORD_SECONDS": "0.1"}
    try:
        with Server(**env) as runner, Server(**env) as other:
            headers = {"Authorization": f"Token {Token.objects.get_or_create(user=user)[0].key}",
                       "Accept": "text/event-stream"}
            idle = websocket.create_connection(
                other.url(f"/ws/conversations/{conversation.pk}/", "ws"), timeout=30,
                origin=other.url(""), cookie=session_cookie(user).decode())
            started = requests.post(runner.url(f"/api/conversations/{conversation.pk}/turns/"),
                                    json={"content": "#slow " + " ".join(WORDS)}, headers=headers,
                                    stream=True, timeout=60)
            assert started.status_code == 200
            own: list = []
            reading = threading.Thread(target=lambda: own.extend(_sse(started)))
            reading.start()
            time.sleep(1)
            followed = requests.get(other.url(f"/api/conversations/{conversation.pk}/stream/"), headers=headers,
                                    stream=True, timeout=60)
            assert followed.status_code == 200
            elsewhere: list = []
            following = threading.Thread(target=lambda: elsewhere.extend(_sse(followed)))
            following.start()
            time.sleep(1)
            redis.stop()
            time.sleep(3)
            redis.start()
            reading.join(60)
            following.join(60)

            for events in (own, elsewhere):
                assert events[-1][1] == "done", events[-3:]
                assert [seq for seq, _, _ in events] == list(range(1, len(events) + 1)), "no gap, no repeat"
            assert own == elsewhere
            node = Node.objects.get(conversation=conversation)
            answer = "".join(data["text"] for _, kind, data in own if kind == "token")
            assert node.status == "succeeded" and answer == it.answer_text(node.received)
            assert "w68 w69" in answer

            # The idle socket joined the turn on the other server, saw it to its end, and is still open.
            seen = []
            while not seen or seen[-1]["type"] != "done":
                seen.append(json.loads(idle.recv()))
            assert seen[0]["type"] == "joined"
            assert "".join(m.get("text", "") for m in seen if m["type"] == "token") == answer
            idle.send("not json")
            assert json.loads(idle.recv())["code"] == "bad_input", "the socket still answers"
            idle.close()
    finally:
        redis.stop()
