"""Issue 34, push instead of polling: two real server processes behind one PostgreSQL. Followers in one process
of a turn that runs in the other share one reader, woken by PostgreSQL's NOTIFY (`config.news`), instead of each
asking the database ten times a second; idle chat sockets cost no query; a turn started through one process
reaches the open tabs of the other at once."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from rest_framework.authtoken.models import Token

from conversations import services
from conversations.bench.push import statements_during
from conversations.models import Bubble
from tests.support.servers import Server
from tests.support.sockets import session_cookie

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

FOLLOWERS = 100
WORDS = [f"w{i}" for i in range(12)]


async def _counted(seconds: float) -> int:
    """Statements the servers start over `seconds` (`bench_push`'s sampler of PostgreSQL's activity view)."""
    return await asyncio.to_thread(statements_during, seconds)


def test_issue_34_followers_in_another_process_share_one_reader_woken_by_news(user):
    """Issue 34 (push, not poll): 100 `GET …/stream/` followers on process B of a turn running on process A all
    read it whole, in order, to its ending, while the database sees a handful of statements a second (before, each
    follower polled it ten times a second: about a thousand)."""
    import aiohttp

    conversation = services.conversation_create(owner=user, title="followed elsewhere")
    mine = {"Authorization": f"Token {Token.objects.get_or_create(user=user)[0].key}",
            "Accept": "text/event-stream"}

    async def scenario(a: Server, b: Server) -> tuple[list[str], int]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120),
                                         connector=aiohttp.TCPConnector(limit=0)) as session:
            started = await session.post(a.url(f"/api/conversations/{conversation.pk}/turns/"),
                                         json={"content": "#slow " + " ".join(WORDS)}, headers=mine)
            assert started.status == 200
            opened = asyncio.Event()
            count = 0

            async def follow() -> str:
                nonlocal count
                async with session.get(b.url(f"/api/conversations/{conversation.pk}/stream/"),
                                       headers=mine) as response:
                    assert response.status == 200, await response.text()
                    count += 1
                    if count == FOLLOWERS:
                        opened.set()
                    return (await response.read()).decode()

            followers = [asyncio.create_task(follow()) for _ in range(FOLLOWERS)]
            await asyncio.wait_for(opened.wait(), 60)
            window = await _counted(2.0)
            bodies = await asyncio.gather(*followers)
            started.close()
            return bodies, window

    environment = {"ARBOR_ECHO_WORD_SECONDS": "0.4", "ARBOR_MAX_STREAMS_PER_USER": str(FOLLOWERS + 1)}
    with Server(**environment) as a, Server(**environment) as b:
        bodies, window = asyncio.run(scenario(a, b))
    answer = Bubble.objects.get(conversation=conversation, role=Bubble.Role.ASSISTANT).content
    assert answer.startswith("echo: #slow " + " ".join(WORDS))
    for body in bodies:
        texts = [json.loads(line.removeprefix("data: "))["text"] for line in body.splitlines()
                 if line.startswith("data: ") and '"text"' in line]
        assert "".join(texts) == answer, "every token, once, in order"
        assert "event: done" in body
    print(f"\n{FOLLOWERS} followers in another process: {window} statements seen in 2 s (both processes)")
    assert window < 100, f"{window} statements in 2 s: followers poll the database"


def test_issue_34_idle_tabs_cost_no_query_and_a_turn_started_elsewhere_reaches_them_at_once(user):
    """Issue 34 (push, not poll), issue 26.10: 30 chat sockets open on process B cost (almost) no query while
    nothing happens; a quick turn asked through process A's API reaches every one of them (joined, then its
    ending) well before B's fallback look, which comes only every 5 s."""
    import aiohttp

    conversations = [services.conversation_create(owner=user, title=f"tab {i}") for i in range(30)]
    asked = conversations[0]
    cookie = session_cookie(user).decode()
    token = {"Authorization": f"Token {Token.objects.get_or_create(user=user)[0].key}"}

    async def scenario(a: Server, b: Server) -> tuple[int, float, list[list[str]]]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            sockets = []
            for conversation in conversations:
                sockets.append(await session.ws_connect(
                    b.url(f"/ws/conversations/{conversation.pk}/", scheme="ws"),
                    headers={"Cookie": cookie, "Origin": b.url("")}))
            sockets += [await session.ws_connect(b.url(f"/ws/conversations/{asked.pk}/", scheme="ws"),
                                                 headers={"Cookie": cookie, "Origin": b.url("")})
                        for _ in range(4)]
            await asyncio.sleep(1.5)  # the first look, and the listener's own, are done
            idle = await _counted(3.0)

            async def until_ended(socket) -> list[str]:
                seen = []
                while not seen or seen[-1] not in {"done", "error", "ended"}:
                    message = await socket.receive_json(timeout=30)
                    seen.append(message["type"])
                return seen

            watching = [asyncio.create_task(until_ended(s)) for s in [sockets[0], *sockets[-4:]]]
            began = time.monotonic()
            response = await session.post(a.url(f"/api/conversations/{asked.pk}/turns/"),
                                          json={"content": "hello"}, headers=token)
            assert response.status == 201
            seen = await asyncio.gather(*watching)
            took = time.monotonic() - began
            for socket in sockets:
                await socket.close()
            return idle, took, seen

    with Server() as a, Server() as b:
        idle, took, seen = asyncio.run(scenario(a, b))
    print(f"\n34 idle sockets: {idle} statements seen in 3 s; a turn asked elsewhere reached 5 tabs in {took:.2f} s")
    assert all(kinds[0] == "joined" and kinds[-1] == "done" for kinds in seen), seen
    assert took < 4, f"the other process's tabs heard of the turn after {took:.1f} s: they waited for a look"
    assert idle <= 2, f"{idle} statements in 3 s from idle sockets"
