"""Issue 27's and 34's gateway figure: what `/v1/` adds to a call over the same instant upstream called directly,
with the same client: `python manage.py bench_gateway`.

An OpenAI-compatible upstream that answers at once (`_Upstream`: Chat Completions, plain and streamed, a fixed
short answer and usage) runs in a thread here; one Arbor server process (uvicorn, as `scripts/serve` runs it, or
`--server daphne`) serves `/v1/` against this database with the model `openai/bench-upstream` pointed at it. The
official `openai` SDK calls, one request at a time and paced at `--rate` a second:

- direct: the upstream itself (`chat.completions.create`, plain or `stream=True`);
- new: Arbor's `/v1/chat/completions`, one message, so every call makes a conversation (the worst case);
- continued: the same, naming one conversation (`X-Arbor-Conversation`), as a caller that continues one does;
- resent: a list that resends a stored question and its answer with a new question, as an agent SDK's second turn
  does (Arbor finds the stored path it extends, issue 27);
- seam (streamed only): Arbor's model seam alone, `llm.stream_call` (litellm) called in this process with no server
  around it: the share of what the gateway adds that is litellm's over the `openai` SDK of the direct case.

The caller has `--history` earlier conversations (10,000 by default, each an answered question), made before the
calls: an API caller makes one a call, so a year's use leaves many, and a call's statements must not read them all
(issue 34).

Each round runs every (kind, plain or streamed) case once, `--batch` calls each, in an order shuffled per round
(`--seed`); `--repeat` rounds. It prints p50/p95/p99 of each case (a streamed call: to its last chunk, and to its
first token), and what the gateway adds at each percentile over the direct call of the same round set. A call's
node is recorded before its answer returns (plain) or its last chunk (streamed): the figure includes it. It asserts
nothing about time; it writes the user `bench-gateway` and deletes its conversations when it starts and ends.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import openai
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from rest_framework.authtoken.models import Token

from conversations import items as it
from conversations import llm, services
from conversations.bench.processes import database_url, delete_conversations, free_port, stop
from conversations.models import Conversation, Node

ROOT = Path(__file__).resolve().parents[2]
MODEL = "openai/bench-upstream"
ANSWER = ["The ", "answer ", "is ", "four."]


class _UpstreamHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a provider's endpoint

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        base = {"id": "chatcmpl-upstream", "created": int(time.time()), "model": body.get("model", "m")}
        usage = {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}
        if body.get("stream"):
            chunks = [{**base, "object": "chat.completion.chunk", "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": word}, "finish_reason": None}]}
                for word in ANSWER]
            chunks.append({**base, "object": "chat.completion.chunk", "choices": [
                {"index": 0, "delta": {}, "finish_reason": "stop"}]})
            chunks.append({**base, "object": "chat.completion.chunk", "choices": [], "usage": usage})
            payload = b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"
            kind = "text/event-stream"
        else:
            payload = json.dumps({**base, "object": "chat.completion", "usage": usage, "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "".join(ANSWER)},
                 "finish_reason": "stop"}]}).encode()
            kind = "application/json"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


class _Upstream:
    def __init__(self):
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _UpstreamHandler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


class _Seam:
    """Arbor's model seam called here, without a server: `llm.stream_call` to the upstream, as a turn calls it."""

    def __init__(self, upstream: _Upstream):
        self.url = upstream.url

    def call(self, messages: list[dict]) -> tuple[float, float]:
        started, first = time.perf_counter(), None
        stream = llm.stream_call(model=MODEL, messages=messages, api_base=self.url, options={"api_key": "sk-bench"})
        try:
            while True:
                if next(stream) and first is None:
                    first = time.perf_counter() - started
        except StopIteration as done:
            received = done.value.received
        if not received:
            raise CommandError("the seam's call to the upstream received nothing")
        return time.perf_counter() - started, first if first is not None else float("nan")


class _Arbor:
    """One Arbor server process on a free port, `/v1/` with the upstream's model."""

    def __init__(self, server: str, upstream: _Upstream):
        self.port = free_port()
        env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_DEBUG": "0",
               "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost", "ARBOR_MODELS": f"arbor/echo,{MODEL}",
               "ARBOR_API_BASE": upstream.url, "OPENAI_API_KEY": "sk-bench", "ARBOR_API_USER_RATE": "1000000/min",
               "ARBOR_MAX_CONCURRENT_TURNS_PER_USER": "1000"}
        argv = ([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port), "config.asgi:application"]
                if server == "daphne" else
                [sys.executable, "-m", "uvicorn", "--host", "127.0.0.1", "--port", str(self.port), "--no-access-log",
                 "--lifespan", "off", "--timeout-keep-alive", "75", "config.asgi:application"])
        self.process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 90
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{self.port}/v1/models", timeout=5)
                return
            except httpx.TransportError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    stop(self.process)
                    said = self.process.stderr.read().decode()[-2000:]
                    raise CommandError(f"the Arbor server did not start:\n{said}") from None
                time.sleep(0.2)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


def _cases(clients: dict) -> list[tuple[str, bool]]:
    """(kind, streamed) of every case; the seam streams only, as every call of Arbor's does."""
    return [(kind, streamed) for kind in clients for streamed in (False, True) if kind != "seam" or streamed]


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


def _figures(values: list[float]) -> tuple[float, float, float]:
    return tuple(_percentile(values, share) * 1000 for share in (0.50, 0.95, 0.99))


class Command(BaseCommand):
    help = "What /v1/ adds over an instant upstream called directly (issues 27 and 34), interleaved and shuffled."

    def add_arguments(self, parser):
        parser.add_argument("--batch", type=int, default=20, help="calls of one case in a row (20)")
        parser.add_argument("--repeat", type=int, default=10, help="rounds of every case, shuffled (10)")
        parser.add_argument("--rate", type=float, default=20.0, help="calls a second at most, one at a time (20)")
        parser.add_argument("--seed", type=int, default=27, help="seed of the shuffled order (27)")
        parser.add_argument("--server", choices=("uvicorn", "daphne"), default="uvicorn")
        parser.add_argument("--history", type=int, default=10_000,
                            help="earlier conversations of the caller, each an answered question (10,000)")

    def handle(self, *args, batch: int, repeat: int, rate: float, seed: int, server: str, history: int, **options):
        if connection.vendor != "postgresql":
            raise CommandError("bench_gateway runs on PostgreSQL (DATABASE_URL), as a deployment does.")
        if min(batch, repeat) < 1 or rate <= 0 or history < 0:
            raise CommandError("--batch and --repeat must be at least 1, --rate above 0, --history at least 0.")
        user, _ = get_user_model().objects.get_or_create(username="bench-gateway")
        self._clear(user)
        self._history(user, history)
        key = Token.objects.get_or_create(user=user)[0].key
        named = services.conversation_create(owner=user, model=MODEL, origin=Conversation.Origin.API)
        upstream = _Upstream()
        arbor = _Arbor(server, upstream)
        try:
            clients = {
                "direct": openai.OpenAI(api_key="sk-bench", base_url=upstream.url, max_retries=0),
                "new": openai.OpenAI(api_key=key, base_url=arbor.url, max_retries=0),
                "continued": openai.OpenAI(api_key=key, base_url=arbor.url, max_retries=0,
                                           default_headers={"X-Arbor-Conversation": str(named.pk)}),
                "resent": openai.OpenAI(api_key=key, base_url=arbor.url, max_retries=0),
                "seam": _Seam(upstream),
            }
            for kind, streamed in _cases(clients):  # connections open and both servers warm before anything counts
                self._call(clients[kind], streamed, [{"role": "user", "content": "warm up"}])
            stored = [{"role": "user", "content": "What is the stored question?"}]
            answer = clients["resent"].chat.completions.create(model=MODEL, messages=stored).choices[0].message
            earlier = [*stored, {"role": "assistant", "content": answer.content}]
            totals, firsts = self._measure(clients, earlier, batch, repeat, rate, seed)
        finally:
            stop(arbor.process)
            upstream.close()
            self._clear(user)
        self._report(totals, firsts, batch, repeat, rate, server, history)

    def _clear(self, user) -> None:
        delete_conversations(Conversation.objects.filter(owner=user))

    def _history(self, user, count: int) -> None:
        """`count` earlier conversations of `user`, each one answered question, written in bulk."""
        for start in range(0, count, 2_000):
            made = Conversation.objects.bulk_create([
                Conversation(owner=user, model=MODEL, origin=Conversation.Origin.API, title=f"earlier {start + i}")
                for i in range(min(2_000, count - start))])
            Node.objects.bulk_create([
                Node(conversation=c, owner=user, kind=Node.Kind.TURN, status=Node.Status.SUCCEEDED,
                     sent=[it.user(f"Earlier question {start + i}?")],
                     received=[it.text(f"Earlier answer {start + i}.")])
                for i, c in enumerate(made)])
        with connection.cursor() as cursor:  # the planner's statistics, as autovacuum keeps them in a deployment
            cursor.execute("ANALYZE conversations_conversation, conversations_node")

    @staticmethod
    def _call(client: openai.OpenAI | _Seam, streamed: bool, messages: list[dict]) -> tuple[float, float]:
        """One call: (seconds to the end, seconds to the first token)."""
        if isinstance(client, _Seam):
            return client.call(messages)
        started = time.perf_counter()
        if not streamed:
            answer = client.chat.completions.create(model=MODEL, messages=messages)
            assert answer.choices[0].message.content
            took = time.perf_counter() - started
            return took, took
        first = None
        with client.chat.completions.create(model=MODEL, messages=messages, stream=True) as stream:
            for chunk in stream:
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.perf_counter() - started
        return time.perf_counter() - started, first if first is not None else float("nan")

    def _measure(self, clients, earlier: list[dict], batch, repeat, rate, seed):
        """Every case's calls, in rounds shuffled by `seed`; `earlier`: the stored turn the resent case resends."""
        cases = _cases(clients)
        order = random.Random(seed)
        totals, firsts = defaultdict(list), defaultdict(list)
        interval, number = 1.0 / rate, 0
        for round_number in range(repeat):
            order.shuffle(cases)
            self.stdout.write(f"round {round_number + 1}/{repeat}: " + ", ".join(
                f"{kind}{' streamed' if streamed else ''}" for kind, streamed in cases))
            for kind, streamed in cases:
                for _ in range(batch):
                    number += 1
                    started = time.perf_counter()
                    question = {"role": "user", "content": f"call {number}: what is 2 + 2?"}
                    total, first = self._call(clients[kind], streamed,
                                              [*earlier, question] if kind == "resent" else [question])
                    totals[kind, streamed].append(total)
                    firsts[kind, streamed].append(first)
                    time.sleep(max(0.0, interval - (time.perf_counter() - started)))
        return totals, firsts

    def _report(self, totals, firsts, batch, repeat, rate, server, history) -> None:
        self.stdout.write(f"\n{batch * repeat} calls a case, one at a time, at most {rate:g}/s; one {server} "
                          f"process, PostgreSQL; the caller has {history:,} earlier conversations; ms")
        for streamed in (False, True):
            direct = _figures(totals["direct", streamed])
            self.stdout.write(f"\n{'streamed (to the last chunk)' if streamed else 'plain'}:")
            self.stdout.write(f"  {'case':<10} {'p50':>8} {'p95':>8} {'p99':>8}   added over direct p50/p95/p99")
            for kind in ("direct", "new", "continued", "resent", *(("seam",) if streamed else ())):
                p50, p95, p99 = _figures(totals[kind, streamed])
                added = "" if kind == "direct" else (f"   +{p50 - direct[0]:.1f} / +{p95 - direct[1]:.1f} / "
                                                     f"+{p99 - direct[2]:.1f}")
                self.stdout.write(f"  {kind:<10} {p50:8.1f} {p95:8.1f} {p99:8.1f}{added}")
            if streamed:
                for kind in ("direct", "new", "continued", "resent", "seam"):
                    p50, p95, _ = _figures([v for v in firsts[kind, True] if v == v])
                    self.stdout.write(f"  first token, {kind:<10} p50 {p50:.1f}  p95 {p95:.1f}")
                self.stdout.write("  seam: Arbor's model seam alone (llm.stream_call, litellm) in this process, no "
                                  "server: its added figure is litellm's share of the gateway's")
        mean = statistics.mean(sum(totals.values(), [])) * 1000
        self.stdout.write("\nTargets (issue 27/34): the gateway adds p50 ≤ 5 ms and p99 ≤ 15 ms, the node recorded "
                          f"inside that; mean of every call here: {mean:.1f}")
