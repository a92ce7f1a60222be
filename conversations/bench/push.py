"""`manage.py bench_push` (issue 34, push instead of polling): two real server processes on one PostgreSQL.

Prints, for each case measured interleaved in a shuffled order and repeated:
- `idle`: another person's quick GET on process B (p50, p95) and the statements the servers start a second;
- `followers`: the same while N `GET …/stream/` followers on B follow a streaming turn that runs on A; with the
  gaps between the followers' deliveries against the model's pacing (target ≤ 1.5×), whether every follower read
  every token, and the ratio of the GET's p95 to the idle one's in the same round (target ≤ 3×);
- `sockets`: the statements a second while N chat WebSockets stay open on B with nothing running (target ~0).

Statements are counted by sampling PostgreSQL's activity view every 5 ms (`statements_during`): a lower bound, but
a reader that polls shows as hundreds a second. The statistics counters would be exact, but an idle pooled
connection reports them up to 10 s late.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import requests
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.test import Client
from rest_framework.authtoken.models import Token

from conversations import services
from conversations.bench.processes import database_url, free_port, stop

ROOT = Path(__file__).resolve().parents[2]
ACTIVITY = ("SELECT pid, query_start FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND backend_type = 'client backend' AND query NOT LIKE 'LISTEN%'")
WORDS = 30
WORD_SECONDS = 0.2


def statements_during(seconds: float) -> int:
    """Statements the other connections to this database started over `seconds` (sampled every 5 ms)."""
    seen: set[tuple[int, object]] = set()
    db = connection.settings_dict
    with psycopg.connect(dbname=db["NAME"], user=db["USER"] or "postgres", password=db.get("PASSWORD") or None,
                         host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, autocommit=True) as sampler:
        first = set(sampler.execute(ACTIVITY).fetchall())
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            seen.update(sampler.execute(ACTIVITY).fetchall())
            time.sleep(0.005)
    return len(seen - first)


class _Server:
    """`daphne config.asgi:application` on a free port against this database."""

    def __init__(self):
        self.port = free_port()
        env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_DEBUG": "0",
               "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost", "ARBOR_ECHO_WORD_SECONDS": str(WORD_SECONDS),
               "ARBOR_MAX_STREAMS_PER_USER": "100000"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port), "config.asgi:application"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                requests.get(self.url("/api/"), timeout=5)
                return
            except requests.ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise CommandError("a bench server did not start") from None
                time.sleep(0.2)

    def url(self, path: str, scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"


def _p95(values: list[float]) -> float:
    return sorted(values)[max(0, int(len(values) * 0.95) - 1)]


class Command(BaseCommand):
    help = "Push instead of polling (issue 34): followers and idle tabs in another process, interleaved."

    def add_arguments(self, parser):
        parser.add_argument("--followers", type=int, default=200, help="stream followers on process B (200)")
        parser.add_argument("--sockets", type=int, default=200, help="idle chat sockets on process B (200)")
        parser.add_argument("--gets", type=int, default=40, help="quick GETs measured a case (40)")
        parser.add_argument("--repeat", type=int, default=3, help="rounds of every case, shuffled (3)")

    def handle(self, *args, **options):
        if connection.vendor != "postgresql":
            raise CommandError("bench_push needs PostgreSQL (its news travels by NOTIFY).")
        users = get_user_model()
        person, _ = users.objects.get_or_create(username="bench-push")
        other, _ = users.objects.get_or_create(username="bench-push-other")
        self.streamer = {"Authorization": f"Token {Token.objects.get_or_create(user=person)[0].key}",
                         "Accept": "text/event-stream"}
        self.reader = {"Authorization": f"Token {Token.objects.get_or_create(user=other)[0].key}"}
        self.read_path = f"/api/conversations/{services.conversation_create(owner=other, title='bench-push').pk}/"
        client = Client()
        client.force_login(person)
        self.cookie = f"sessionid={client.cookies['sessionid'].value}"
        self.person = person
        self.options = options
        servers = []
        try:
            servers = [_Server(), _Server()]
            self.a, self.b = servers
            results = asyncio.run(self._rounds())
        finally:
            for server in servers:
                stop(server.process)
        self._report(results)

    async def _rounds(self) -> list[dict]:
        cases = ["idle", "followers", "sockets"]
        results = []
        await asyncio.to_thread(requests.get, self.b.url(self.read_path), headers=self.reader)  # warm
        for round_number in range(self.options["repeat"]):
            order = random.sample(cases, len(cases))
            self.stdout.write(f"round {round_number + 1}: {', '.join(order)}")
            for case in order:
                results.append({"round": round_number, "case": case, **await getattr(self, f"_{case}")()})
        return results

    async def _gets(self, session) -> list[float]:
        took = []
        for _ in range(self.options["gets"]):
            began = time.perf_counter()
            async with session.get(self.b.url(self.read_path), headers=self.reader) as response:
                await response.read()
                if response.status != 200:
                    raise CommandError(f"a quick GET answered {response.status}")
            took.append((time.perf_counter() - began) * 1000)
            await asyncio.sleep(0.02)
        return took

    async def _idle(self) -> dict:
        import aiohttp

        async with aiohttp.ClientSession() as session:
            counting = asyncio.create_task(asyncio.to_thread(statements_during, 2.0))
            gets = await self._gets(session)
            return {"gets": gets, "statements_per_s": await counting / 2.0}

    async def _followers(self) -> dict:
        import aiohttp

        conversation = await asyncio.to_thread(services.conversation_create, owner=self.person, title="bench-push")
        count = self.options["followers"]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300),
                                         connector=aiohttp.TCPConnector(limit=0)) as session:
            started = await session.post(self.a.url(f"/api/conversations/{conversation.pk}/turns/"),
                                         json={"content": "#slow " + " ".join(f"w{i}" for i in range(WORDS))},
                                         headers=self.streamer)
            if started.status != 200:
                raise CommandError(f"the streamed turn answered {started.status}")
            opened, gaps, open_count = asyncio.Event(), [], [0]

            async def follow() -> str:
                async with session.get(self.b.url(f"/api/conversations/{conversation.pk}/stream/"),
                                       headers=self.streamer) as response:
                    open_count[0] += 1
                    if open_count[0] == count:
                        opened.set()
                    body, last = [], None
                    async for line in response.content:
                        text = line.decode()
                        if text.startswith("data: ") and '"text"' in text:
                            now = time.perf_counter()
                            if last is not None and now - last > 0.005:  # a new delivery, not the same burst
                                gaps.append((now - last) * 1000)
                            last = now
                        body.append(text)
                    return "".join(body)

            followers = [asyncio.create_task(follow()) for _ in range(count)]
            await asyncio.wait_for(opened.wait(), 120)
            counting = asyncio.create_task(asyncio.to_thread(statements_during, 2.0))
            gets = await self._gets(session)
            statements = await counting
            bodies = await asyncio.gather(*followers)
            await started.read()
        answer = "".join(json.loads(line.removeprefix("data: "))["text"] for line in bodies[0].splitlines()
                         if line.startswith("data: ") and '"text"' in line)
        whole = all("event: done" in body for body in bodies) and len({
            "".join(json.loads(line.removeprefix("data: "))["text"] for line in body.splitlines()
                    if line.startswith("data: ") and '"text"' in line) for body in bodies}) == 1
        return {"gets": gets, "statements_per_s": statements / 2.0, "gaps": gaps,
                "whole": whole and answer.startswith("echo: #slow w0")}

    async def _sockets(self) -> dict:
        import aiohttp

        count = self.options["sockets"]
        conversations = await asyncio.to_thread(lambda: [
            services.conversation_create(owner=self.person, title="bench-push tab").pk for _ in range(count)])
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            sockets = [await session.ws_connect(self.b.url(f"/ws/conversations/{pk}/", scheme="ws"),
                                                headers={"Cookie": self.cookie, "Origin": self.b.url("")})
                       for pk in conversations]
            await asyncio.sleep(1.0)  # the looks their connecting asked for are done
            statements = await asyncio.to_thread(statements_during, 3.0)
            for socket in sockets:
                await socket.close()
        return {"statements_per_s": statements / 3.0}

    def _report(self, results: list[dict]) -> None:
        by_case = {case: [r for r in results if r["case"] == case] for case in ("idle", "followers", "sockets")}
        self.stdout.write(f"\n== bench_push: {self.options['followers']} followers, {self.options['sockets']} "
                          f"sockets, {self.options['repeat']} shuffled rounds, {self.options['gets']} GETs a case")
        for case in ("idle", "followers"):
            gets = [g for r in by_case[case] for g in r["gets"]]
            rate = statistics.median(r["statements_per_s"] for r in by_case[case])
            self.stdout.write(f"{case}: another person's quick GET p50 {statistics.median(gets):.1f} ms, p95 "
                              f"{_p95(gets):.1f} ms; statements {rate:.0f}/s (median of rounds)")
        ratios = []
        for round_number in range(self.options["repeat"]):
            idle = [r for r in by_case["idle"] if r["round"] == round_number][0]
            busy = [r for r in by_case["followers"] if r["round"] == round_number][0]
            ratios.append(_p95(busy["gets"]) / _p95(idle["gets"]))
        gaps = [g for r in by_case["followers"] for g in r["gaps"]]
        self.stdout.write(f"followers' p95 GET / idle p95 GET, each round: {', '.join(f'{x:.2f}x' for x in ratios)}"
                          f" (target ≤ 3x)")
        if gaps:
            self.stdout.write(f"followers' gap between deliveries: p50 {statistics.median(gaps):.0f} ms, p95 "
                              f"{_p95(gaps):.0f} ms = {_p95(gaps) / (WORD_SECONDS * 1000):.2f}x the model's pacing of "
                              f"{WORD_SECONDS * 1000:.0f} ms a word (target ≤ 1.5x)")
        self.stdout.write(f"every follower read the whole answer, in order: "
                          f"{all(r['whole'] for r in by_case['followers'])}")
        rates = [r["statements_per_s"] for r in by_case["sockets"]]
        self.stdout.write(f"{self.options['sockets']} idle chat sockets: statements "
                          f"{', '.join(f'{x:.1f}' for x in rates)}/s by round (target ~0)")
