"""Issue 12's figures ("Durable turns"), measured on real server processes: `python manage.py bench_durable`.

Every figure comes from daphne processes started here against the database Django is configured with
(DATABASE_URL; SQLite by default, as the app), driven over HTTP as a client would:

1. `kill -9` of a server streaming a `#slow` arbor/echo answer (one word per 0.1 s), after 3 s of words;
   a second server is asked for a new turn on that conversation every 0.25 s until it accepts one. The
   time from the kill to that 201, min/median/max over `--repeat` runs.
2. The words lost to that crash, run by run: the words the client had received before the kill against
   the words kept on the dead node once it was failed/interrupted.
3. The time from `POST …/stop/` (a second client, through the second server) to the answer with the node
   failed/cancelled, (a) while the model is silent (a `#slow` call whose first word is a minute away) and
   (b) while a tool runs (an `sql_query` that would run for several seconds); a, b, a, b … with the order
   rotated each run.
4. Resume correctness: one turn's whole log read with `GET …/stream/`, then `--cuts` random cut points k,
   each resumed with `Last-Event-ID: k`; the first k events plus the resumed ones must be the whole log.
   Prints the events duplicated and missing, summed over the cut points.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/arbor_bench python manage.py migrate
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/arbor_bench python manage.py bench_durable --repeat 3 --cuts 1000

The servers get this process's environment (REDIS_URL, lease settings...) plus the bench's own: the word
pace of each role, the sql_query time limit of the stop server, and a per-user API rate high enough for the
resume check's ~1,000 requests. It writes conversations of the user `arbor-bench-durable` only, deletes them
when it starts and ends, and asserts nothing about time. A default run takes about two to three minutes.
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from rest_framework.authtoken.models import Token

from conversations import items as it
from conversations import services
from conversations.bench import processes
from conversations.bench.processes import database_url, free_port
from conversations.errors import TurnInProgress
from conversations.models import Conversation, Node
from conversations.tools.sales_db import ensure_sales_db

ROOT = Path(__file__).resolve().parents[2]
BENCH_USER = "arbor-bench-durable"
TITLE = "arbor-bench-durable:"

WORD_SECONDS = 0.1  # `#slow`: the default pace of arbor/echo
STREAM_BEFORE_KILL_SECONDS = 3.0  # words streamed before the kill, counted from the first word
ASK_EVERY_SECONDS = 0.25
ASK_GIVE_UP_SECONDS = 120
SLOW_QUESTION = "#slow " + " ".join(f"w{i}" for i in range(200))  # ~20 s of words: it never ends by itself
SILENT_WORD_SECONDS = 60  # the stop server's `#slow`: nothing comes for a minute
TOOL_QUERY_SECONDS = 6  # the stop server's sql_query time limit: the tool would run this long
SLOW_SQL = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
SETTLE_SECONDS = 0.5  # once the silent call or the tool is under way, this long before the stop
RESUME_QUESTION = "#slow " + " ".join(f"w{i}" for i in range(40))
START_TIMEOUT_SECONDS = 90
API_USER_RATE = "100000/min"  # the servers' per-user rate: the resume check alone asks ~1,000 times in seconds
CASES = {"silent": "while the model is silent", "tool": "while a tool runs"}

Event = tuple[int | None, str, object]  # (id, type, data) of one server-sent event


def spread(values: list[float], unit: str, digits: int = 1) -> str:
    def show(v: float) -> str:
        return f"{v:.{digits}f}{unit}"

    return (f"min {show(min(values))}, median {show(statistics.median(values))}, max {show(max(values))} "
            f"(n={len(values)})")


class Client(requests.Session):
    """A client of its own (its own connections) with the bench user's token. A 429 (the API's per-user
    rate; the bench asks faster than a person) is waited out as its Retry-After says and asked again."""

    throttled = 0  # 429s met, over every client

    def __init__(self, headers: dict[str, str]):
        super().__init__()
        self.headers.update(headers)

    def request(self, method, url, *args, **kwargs) -> requests.Response:
        while True:
            response = super().request(method, url, *args, **kwargs)
            if response.status_code != 429:
                return response
            Client.throttled += 1
            response.close()
            time.sleep(min(float(response.headers.get("Retry-After") or 1), 60))


def sse_events(response: requests.Response) -> Iterator[Event]:
    """The server-sent events of a streaming response, as they arrive."""
    if response.status_code != 200 or not response.headers.get("Content-Type", "").startswith("text/event-stream"):
        raise CommandError(f"expected an event stream, got {response.status_code} "
                           f"{response.headers.get('Content-Type')}: {response.text[:500]}")
    seq, kind, data = None, "", []
    for line in response.iter_lines(decode_unicode=True):
        if line:
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "id":
                seq = int(value)
            elif field == "event":
                kind = value
            elif field == "data":
                data.append(value)
            continue
        if kind or data:
            yield seq, kind or "message", json.loads("\n".join(data)) if data else None
        seq, kind, data = None, "", []


class Server:
    """One daphne process serving config.asgi against the bench's database."""

    def __init__(self, name: str, env: dict[str, str]):
        self.name = name
        self.port = free_port()
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - its stderr, closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port), "config.asgi:application"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=self.log)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def wait_ready(self, session: Client) -> Server:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise CommandError(f"server {self.name} exited with {self.process.returncode}:\n{self.tail()}")
            try:
                status = session.get(self.url("/api/conversations/"), timeout=5).status_code
            except requests.RequestException:
                status = None
            if status == 200:
                return self
            if status is not None and status >= 500:
                raise CommandError(f"server {self.name} answered {status}:\n{self.tail()}")
            time.sleep(0.2)
        raise CommandError(f"server {self.name} did not answer within {START_TIMEOUT_SECONDS} s:\n{self.tail()}")

    def kill9(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)

    def stop(self) -> None:
        processes.stop(self.process)
        self.log.close()

    def tail(self, chars: int = 3000) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-chars:]


class StreamReader(threading.Thread):
    """Asks for a turn's SSE answer and reads it to its end in the background, noting when each event
    arrived (the server may send nothing, not even its headers, while the model is silent)."""

    def __init__(self, ask: Callable[[], requests.Response]):
        super().__init__(daemon=True)
        self.ask = ask
        self.events: list[tuple[float, Event]] = []
        self.arrived = threading.Condition()
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            with self.ask() as response:
                for event in sse_events(response):
                    with self.arrived:
                        self.events.append((time.monotonic(), event))
                        self.arrived.notify_all()
        except requests.RequestException as error:
            self.error = error
        finally:
            with self.arrived:
                self.arrived.notify_all()

    def wait_for(self, kind: str, timeout: float) -> float:
        """When the first event of type `kind` arrived."""
        deadline = time.monotonic() + timeout
        with self.arrived:
            while True:
                found = next((at for at, (_, k, _) in self.events if k == kind), None)
                if found is not None:
                    return found
                if not self.is_alive() or time.monotonic() > deadline:
                    raise CommandError(f"no `{kind}` event; the stream gave {[e for _, e in self.events]}"
                                       f"{f' and failed: {self.error!r}' if self.error else ''}")
                self.arrived.wait(0.1)


class Command(BaseCommand):
    help = "Issue 12's figures on real server processes: kill -9 recovery, words lost, stop latency, resume."

    def add_arguments(self, parser):
        parser.add_argument("--repeat", type=int, default=3, help="runs of the kill and of each stop (default 3)")
        parser.add_argument("--cuts", type=int, default=1000, help="random resume cut points (default 1000)")
        parser.add_argument("--seed", type=int, default=12, help="seed of the cut points (default 12)")

    def handle(self, *args, repeat: int, cuts: int, seed: int, **options):
        if repeat < 1 or cuts < 1:
            raise CommandError("--repeat and --cuts must be at least 1.")
        self.check_database()
        Client.throttled = 0
        ensure_sales_db()  # built once here, not by the first sql_query in a server
        self.user, _ = get_user_model().objects.get_or_create(username=BENCH_USER)
        token = Token.objects.get_or_create(user=self.user)[0].key
        self.headers = {"Authorization": f"Token {token}"}
        self.delete_conversations()
        self.servers: list[Server] = []
        self.header()
        try:
            self.asker = self.serve("asker", ARBOR_ECHO_WORD_SECONDS=str(WORD_SECONDS))
            self.stop_target = self.serve("stop-target", ARBOR_ECHO_WORD_SECONDS=str(SILENT_WORD_SECONDS),
                                          ARBOR_SQL_TIME_LIMIT_SECONDS=str(TOOL_QUERY_SECONDS))
            self.wait_ready(self.asker, self.stop_target)
            self.kill_runs(repeat)
            self.stop_runs(repeat)
            self.resume_check(cuts, seed)
        finally:
            for server in self.servers:
                server.stop()
            self.delete_conversations()
        if Client.throttled:
            self.stdout.write(f"(the servers answered 429 {Client.throttled} times; each was waited out and asked "
                              "again)")

    # --- set-up -------------------------------------------------------------------------------------------

    def check_database(self) -> None:
        database_url()  # refuses another vendor
        executor = MigrationExecutor(connection)
        if executor.migration_plan(executor.loader.graph.leaf_nodes()):
            raise CommandError("the database is not migrated: run `python manage.py migrate` first.")

    def header(self) -> None:
        store = "Redis Streams (REDIS_URL)" if os.environ.get("REDIS_URL") else "the database"
        self.stdout.write(
            f"database: {connection.vendor} ({connection.settings_dict['NAME']}); turn log in {store}; servers: "
            f"daphne config.asgi, model arbor/echo; lease ARBOR_TURN_LOCK_SECONDS={settings.ARBOR_TURN_LOCK_SECONDS:g}"
            f", heartbeat {settings.ARBOR_TURN_HEARTBEAT_SECONDS:g} s, partial text saved every "
            f"{settings.ARBOR_PARTIAL_SAVE_SECONDS:g} s; the servers' per-user API rate set to {API_USER_RATE}")

    def serve(self, name: str, **env: str) -> Server:
        """Start a server (not yet waited for); its environment is this process's, with `env` on top."""
        server = Server(name, {**os.environ, "DATABASE_URL": database_url(), "DJANGO_DEBUG": "0",
                               "DJANGO_ALLOWED_HOSTS": "127.0.0.1", "ARBOR_API_USER_RATE": API_USER_RATE, **env})
        self.servers.append(server)
        return server

    def wait_ready(self, *servers: Server) -> None:
        with self.session() as session:
            for server in servers:
                server.wait_ready(session)

    def session(self) -> Client:
        return Client(self.headers)

    def conversation(self, name: str) -> Conversation:
        return services.conversation_create(owner=self.user, title=f"{TITLE}{name}", model="arbor/echo")

    def delete_conversations(self) -> None:
        left = 0
        for conversation in Conversation.objects.filter(owner=self.user):
            try:
                services.conversation_delete(conversation=conversation)
            except TurnInProgress:
                left += 1
        if left:
            self.stdout.write(f"({left} bench conversations still locked by a turn were left; a later run deletes "
                              "them)")

    # --- 1, 2: kill -9 mid-answer -------------------------------------------------------------------------

    def kill_runs(self, repeat: int) -> None:
        self.section(f"kill -9 of a server mid-answer: a #slow turn (one word per {WORD_SECONDS:g} s), killed after "
                     f"{STREAM_BEFORE_KILL_SECONDS:g} s of words; another server is asked for a turn every "
                     f"{ASK_EVERY_SECONDS:g} s until it accepts one")
        waits, lost = [], []
        victim = self.serve("victim-1", ARBOR_ECHO_WORD_SECONDS=str(WORD_SECONDS))
        for run in range(1, repeat + 1):
            self.wait_ready(victim)
            conversation = self.conversation(f"kill-{run}")
            killed_at, streamed, node_id = self.kill_mid_answer(victim, conversation)
            if run < repeat:  # the next victim boots while this run waits out the lease
                victim = self.serve(f"victim-{run + 1}", ARBOR_ECHO_WORD_SECONDS=str(WORD_SECONDS))
            accepted_after = self.ask_until_accepted(f"/api/conversations/{conversation.pk}/turns/", killed_at)
            dead = Node.objects.get(pk=node_id)
            kept, status = it.answer_text(dead.received), f"{dead.status}/{dead.failure_reason}"
            words_lost = len(streamed.split()) - len(kept.split())
            waits.append(accepted_after)
            lost.append(words_lost)
            prefix = "kept text is a prefix of what the client saw" if streamed.startswith(kept) else \
                "KEPT TEXT IS NOT A PREFIX OF WHAT THE CLIENT SAW"
            self.stdout.write(f"run {run}: next turn accepted {accepted_after:.1f} s after the kill; words received "
                              f"by the client {len(streamed.split())}, kept on the node {len(kept.split())}, lost "
                              f"{words_lost}; dead node {status}; {prefix}")
        self.stdout.write(f"kill -9 -> next accepted turn: {spread(waits, ' s')}")
        self.stdout.write(f"words lost to the crash (received before the kill - kept on the failed node): "
                          f"{spread(lost, '', 0)}; per run {', '.join(map(str, lost))}")

    def kill_mid_answer(self, victim: Server, conversation: Conversation) -> tuple[float, str, int]:
        """Stream a `#slow` answer from `victim` and kill it; return when, the text received, the node."""
        with self.session() as client:
            response = client.post(victim.url(f"/api/conversations/{conversation.pk}/turns/"),
                                   json={"content": SLOW_QUESTION}, stream=True, timeout=30,
                                   headers={"Accept": "text/event-stream"})
            streamed, node_id, first_word_at = "", None, None
            for _, kind, data in sse_events(response):
                if kind == "token":
                    streamed += data["text"]
                    node_id = data["node"]
                    first_word_at = first_word_at or time.monotonic()
                elif kind in ("done", "error"):
                    raise CommandError(f"the #slow turn ended before the kill: {kind} {data}")
                if first_word_at and time.monotonic() - first_word_at >= STREAM_BEFORE_KILL_SECONDS:
                    break
            victim.kill9()
            killed_at = time.monotonic()
            victim.process.wait(10)
            response.close()
        if node_id is None:
            raise CommandError("the #slow turn sent no words before the kill")
        return killed_at, streamed, node_id

    def ask_until_accepted(self, path: str, killed_at: float) -> float:
        with self.session() as client:
            while True:
                response = client.post(self.asker.url(path), json={"content": "still there?"}, timeout=60)
                if response.status_code != 409:
                    break
                if time.monotonic() - killed_at > ASK_GIVE_UP_SECONDS:
                    raise CommandError(f"no turn accepted within {ASK_GIVE_UP_SECONDS} s of the kill")
                time.sleep(ASK_EVERY_SECONDS)
            accepted_after = time.monotonic() - killed_at
        if response.status_code != 201:
            raise CommandError(f"the turn after the kill was answered {response.status_code}: {response.text[:500]}")
        return accepted_after

    # --- 3: stop ------------------------------------------------------------------------------------------

    def stop_runs(self, repeat: int) -> None:
        self.section(f"POST …/stop/ from a second client (through another server process) -> node failed/cancelled; "
                     f"asked {SETTLE_SECONDS:g} s after (a) a call that sends nothing for {SILENT_WORD_SECONDS} s "
                     f"began, (b) an sql_query tool that would run {TOOL_QUERY_SECONDS} s began; "
                     "order rotated each run")
        took: dict[str, list[float]] = {case: [] for case in CASES}
        order = list(CASES)
        for run in range(1, repeat + 1):
            shown = []
            for case in order:
                seconds, seen_by_reader = self.stop_once(case, run)
                took[case].append(seconds)
                shown.append(f"{case} {seconds:.2f} s (its own stream saw the ending {seen_by_reader:.2f} s after "
                             "the stop request)")
            self.stdout.write(f"run {run} ({', '.join(order)}): {'; '.join(shown)}")
            order = order[1:] + order[:1]
        for case, label in CASES.items():
            self.stdout.write(f"stop {label} -> failed/cancelled: {spread(took[case], ' s', 2)}")

    def stop_once(self, case: str, run: int) -> tuple[float, float]:
        conversation = self.conversation(f"stop-{case}-{run}")
        content = SLOW_QUESTION if case == "silent" else f"#tool sql_query {json.dumps({'sql': SLOW_SQL})}"
        with self.session() as client, self.session() as other:
            reader = StreamReader(lambda: client.post(
                self.stop_target.url(f"/api/conversations/{conversation.pk}/turns/"), json={"content": content},
                stream=True, timeout=(10, 120), headers={"Accept": "text/event-stream"}))
            if case == "silent":
                began = self.wait_for_pending_node(conversation)
            else:
                began = reader.wait_for("tool_call", timeout=30)
            time.sleep(max(0.0, began + SETTLE_SECONDS - time.monotonic()))
            asked = time.monotonic()
            stopped = other.post(self.asker.url(f"/api/conversations/{conversation.pk}/stop/"), timeout=60)
            took = time.monotonic() - asked
            reader.join(30)
        body = stopped.json() if stopped.headers.get("Content-Type", "").startswith("application/json") else {}
        if stopped.status_code != 200 or (body.get("status"), body.get("failure_reason")) != ("failed", "cancelled"):
            raise CommandError(f"stop ({case}) answered {stopped.status_code}: {stopped.text[:500]}")
        ending = next(((at, e) for at, e in reader.events if e[1] in ("done", "error")), None)
        if ending is None or ending[1][2].get("code") != "cancelled":
            raise CommandError(f"the stopped turn's own stream ended with {ending and ending[1]}")
        if case == "tool":  # its query goes on in the server until its time limit: let it end before going on
            time.sleep(max(0.0, began + TOOL_QUERY_SECONDS + 0.5 - time.monotonic()))
        return took, ending[0] - asked

    def wait_for_pending_node(self, conversation: Conversation) -> float:
        deadline = time.monotonic() + 30
        while not Node.objects.filter(conversation=conversation, status=Node.Status.PENDING).exists():
            if time.monotonic() > deadline:
                raise CommandError("the silent call never began")
            time.sleep(0.02)
        return time.monotonic()

    # --- 4: resume ----------------------------------------------------------------------------------------

    def resume_check(self, cuts: int, seed: int) -> None:
        conversation = self.conversation("resume")
        stream_path = f"/api/conversations/{conversation.pk}/stream/"
        with self.session() as client:
            live = list(sse_events(client.post(self.asker.url(f"/api/conversations/{conversation.pk}/turns/"),
                                               json={"content": RESUME_QUESTION}, stream=True, timeout=60,
                                               headers={"Accept": "text/event-stream"})))
            whole = list(sse_events(client.get(self.asker.url(stream_path), stream=True, timeout=60)))
            self.section(f"resume with Last-Event-ID: a #slow turn's log of {len(whole)} events, read whole with "
                         f"GET …/stream/, then {cuts} random cut points k (0..{len(whole)}) resumed")
            ids = [seq for seq, _, _ in whole]
            self.stdout.write(f"whole log: ids {ids[0]}..{ids[-1]}"
                              f"{' without gaps' if ids == list(range(1, len(ids) + 1)) else ' WITH GAPS'}, "
                              f"last `{whole[-1][1]}`; the live stream of the turn "
                              f"{'is the same' if live == whole else 'DIFFERS'} ({len(live)} events)")
            duplicated = missing = differing = 0
            rng = random.Random(seed)
            for _ in range(cuts):
                cut = rng.randint(0, len(whole))
                resumed = list(sse_events(client.get(self.asker.url(stream_path), stream=True, timeout=60,
                                                     headers={"Last-Event-ID": str(cut)})))
                joined = [seq for seq, _, _ in whole[:cut]] + [seq for seq, _, _ in resumed]
                duplicated += len(joined) - len(set(joined))
                missing += len(set(ids) - set(joined))
                differing += whole[:cut] + resumed != whole
        self.stdout.write(f"resume at {cuts} random cut points: duplicated={duplicated} missing={missing} "
                          f"(events, summed over the cut points); cut points whose first k events + resumed "
                          f"events differ from the whole log: {differing}")

    def section(self, title: str) -> None:
        self.stdout.write(f"\n== {title}")
