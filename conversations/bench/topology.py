"""Issue 34's topology figures, on real processes behind a real load balancer: `python manage.py bench_topology`.

`scripts/topology N` is started once for each process count of `--processes` (default 1, 2 and 4; all of them at
once, each with its HAProxy on a port of its own, so the runs are interleaved without a restart between them):
N uvicorn servers as scripts/serve runs them, one arbor_worker and HAProxy in front, on the database Django is
configured with (PostgreSQL: DATABASE_URL) and REDIS_URL (default redis://127.0.0.1:6379/0). Two loads go
through each topology's HAProxy, driven from this process (aiohttp, one event loop):

- quick: `--users` users, each asking plain JSON turns (`POST …/turns/`, arbor/echo, no `#slow`) one after
  another for `--seconds`;
- streamed: the same, each turn streamed over SSE (`Accept: text/event-stream`) and read to its `done`.

Every user has an account (and a conversation per load) of its own, so per-user and per-conversation limits never
cap the load (the servers get high ones anyway). Each run holds every (process count, load) pair once, in an order
shuffled from `--seed`; `--repeat` runs. Printed: each measurement (turns/s, latency p50/p95, errors, which
servers answered, the CPU of the servers, of HAProxy, of the worker, of this client and of the whole machine),
then the mean turns/s of each pair over the runs, the ratio to 1 process, and what the ratio can be here: the
machine's cores divided by the cores the 1-process load kept busy (every process on the machine counted:
PostgreSQL, HAProxy, the worker, this client, and anything else running).

Between two measurements it waits until the turns' after-commit jobs are done (the workers of every topology
share the outbox), so one load's jobs never run in the next one's window. It writes users named
`arbor-topology-*` and their conversations, and deletes the conversations when it starts and ends. Nothing is
asserted about time.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/arbor_bench python manage.py migrate
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/arbor_bench python manage.py bench_topology
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from rest_framework.authtoken.models import Token

from conversations.bench.load import (
    DEFAULT_REDIS_URL,
    check_redis,
    machine_cpu_seconds,
    percentile,
    proc_cpu_seconds,
    sse_events,
)
from conversations.bench.processes import database_url, delete_conversations, parse_counts
from conversations.models import Conversation, OutboxJob

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "topology"
HAPROXY = Path("/usr/sbin/haproxy")
USER_PREFIX = "arbor-topology-"
TITLE = "arbor-bench-topology:"
START_TIMEOUT_SECONDS = 240  # every topology boots at once: on 2 busy cores, 7 servers take a while
STOP_TIMEOUT_SECONDS = 20
JOBS_TIMEOUT_SECONDS = 120
TURN_TIMEOUT_SECONDS = 60
HIGH = "1000000"
QUESTION = "a quick question about the topology: how many rows?"
LOADS = {"json": "quick JSON", "sse": "streamed SSE"}
LINE = re.compile(r"^topology: (?P<name>app-\d+|worker-\d+|haproxy) pid (?P<pid>\d+)(?: (?P<url>http://\S+))?")
READY = re.compile(r"^topology: ready at (?P<url>http://\S+?)/? ")


# --- the topology: scripts/topology in a process group of its own ----------------------------------------------

def alive(pid: int) -> bool:
    """Whether a process is running (a zombie, ended but not yet reaped, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Topology:
    """`scripts/topology N` with `env` on top of this process's environment, on free ports; `url(path)` goes
    through its HAProxy. `apps` maps app-K to (pid, its own URL); `pids` has the worker and HAProxy too."""

    def __init__(self, processes: int, env: dict[str, str]):
        self.processes, self.env = processes, env
        self.out = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop()
        self.err = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop()
        self.base = ""
        self.apps: dict[str, tuple[int, str]] = {}
        self.pids: dict[str, int] = {}
        self.process = subprocess.Popen(
            [str(SCRIPT), str(processes)], cwd=ROOT, stdout=self.out, stderr=self.err, start_new_session=True,
            env={**os.environ, "PORT": "0", "TOPOLOGY_SETUP": "0", **env})

    def wait_ready(self, timeout: float = START_TIMEOUT_SECONDS) -> Topology:
        deadline = time.monotonic() + timeout
        while not self.base:
            for line in self._read(self.out).splitlines():
                if match := LINE.match(line):
                    self.pids[match["name"]] = int(match["pid"])
                    if match["url"]:
                        self.apps[match["name"]] = (int(match["pid"]), match["url"].rstrip("/"))
                elif match := READY.match(line):
                    self.base = match["url"].rstrip("/")
            if self.base:
                break
            if self.process.poll() is not None:
                raise CommandError(f"scripts/topology {self.processes} exited with {self.process.returncode}:\n"
                                   f"{self.tail()}")
            if time.monotonic() > deadline:
                raise CommandError(f"scripts/topology {self.processes} was not ready within {timeout:.0f} s:\n"
                                   f"{self.tail()}")
            time.sleep(0.2)
        return self

    def url(self, path: str, scheme: str = "http") -> str:
        return f"{scheme}{self.base.removeprefix('http')}{path}"

    def kill9(self, app: str) -> None:
        os.kill(self.apps[app][0], signal.SIGKILL)

    def stop(self) -> None:
        """TERM to the script's process group (it stops what it started), then KILL to whatever is left."""
        pids = [self.process.pid, *self.pids.values()]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)
        self.out.close()
        self.err.close()

    def tail(self, chars: int = 3000) -> str:
        return (self._read(self.out) + self._read(self.err))[-chars:]

    @staticmethod
    def _read(file) -> str:
        return os.pread(file.fileno(), os.fstat(file.fileno()).st_size, 0).decode(errors="replace")


# --- the loads -----------------------------------------------------------------------------------------------

@dataclass
class Measurement:
    processes: int
    load: str
    run: int
    wall: float = 0.0
    latencies: list[float] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)
    answered_by: Counter = field(default_factory=Counter)  # X-Arbor-Server of the answers
    cpu: dict[str, float] = field(default_factory=dict)  # share of one core, by role

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.wall if self.wall else 0.0


async def _turn(http: aiohttp.ClientSession, topology: Topology, load: str, token: str, conversation: int,
                measurement: Measurement) -> None:
    headers = {"Authorization": f"Token {token}"}
    if load == "sse":
        headers["Accept"] = "text/event-stream"
    began = time.monotonic()
    try:
        async with asyncio.timeout(TURN_TIMEOUT_SECONDS), http.post(
                topology.url(f"/api/conversations/{conversation}/turns/"), json={"content": QUESTION},
                headers=headers) as response:
            measurement.answered_by[response.headers.get("X-Arbor-Server", "?")] += 1
            if load == "json":
                await response.read()
                ending = "done" if response.status == 201 else f"HTTP {response.status}"
            else:
                ending = f"HTTP {response.status}, no ending"
                async for kind, _ in sse_events(response):
                    if kind in ("done", "error"):
                        ending = kind
                        break
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as error:
        ending = type(error).__name__
    if ending == "done":
        measurement.latencies.append(time.monotonic() - began)
    else:
        measurement.errors[ending] += 1


async def drive(topology: Topology, load: str, people: list[tuple[str, int]], seconds: float,
                measurement: Measurement) -> None:
    """Every person asks one turn after another until `seconds` have passed; the window ends with the last."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     cookie_jar=aiohttp.DummyCookieJar()) as http:
        start = time.monotonic()

        async def person(token: str, conversation: int) -> None:
            while time.monotonic() - start < seconds:
                await _turn(http, topology, load, token, conversation, measurement)

        await asyncio.gather(*(person(token, conversation) for token, conversation in people))
        measurement.wall = time.monotonic() - start


# --- the command ---------------------------------------------------------------------------------------------

class Command(BaseCommand):
    help = "Issue 34's figures: turns/s through HAProxy with 1, 2 and 4 app processes (scripts/topology)."

    def add_arguments(self, parser):
        parser.add_argument("--processes", default="1,2,4", help="app processes of each topology (default 1,2,4)")
        parser.add_argument("--users", type=int, default=32, help="concurrent users of each load (default 32)")
        parser.add_argument("--seconds", type=float, default=10, help="length of each measurement (default 10)")
        parser.add_argument("--repeat", type=int, default=3, help="runs, each of every pair once (default 3)")
        parser.add_argument("--seed", type=int, default=34, help="seed of the shuffled order (default 34)")

    def handle(self, *args, processes: str, users: int, seconds: float, repeat: int, seed: int, **options):
        counts = parse_counts(processes)
        if min(users, repeat) < 1 or seconds <= 0:
            raise CommandError("--users and --repeat must be at least 1, --seconds above 0.")
        if not HAPROXY.exists():
            raise CommandError(f"{HAPROXY} missing: install Debian's haproxy (apt-get install haproxy).")
        if connection.vendor != "postgresql":
            raise CommandError("bench_topology runs on PostgreSQL (DATABASE_URL): processes share turns through it.")
        executor = MigrationExecutor(connection)
        if executor.migration_plan(executor.loader.graph.leaf_nodes()):
            raise CommandError("the database is not migrated: run `python manage.py migrate` first.")
        self.redis_url = settings.REDIS_URL or DEFAULT_REDIS_URL
        check_redis(self.redis_url)
        self.counts, self.users, self.seconds = counts, users, seconds
        self.delete_conversations()
        self.tokens = self.make_users(users)
        env = {"DATABASE_URL": database_url(), "REDIS_URL": self.redis_url, "DJANGO_DEBUG": "0",
               "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost", "ARBOR_MAX_CONCURRENT_TURNS_PER_USER": HIGH,
               "ARBOR_API_USER_RATE": f"{HIGH}/min", "ARBOR_MAX_STREAMS_PER_USER": HIGH}
        topologies = {count: Topology(count, env) for count in counts}
        try:
            started = time.monotonic()
            for topology in topologies.values():
                topology.wait_ready()
            self.header(topologies, time.monotonic() - started, repeat, seed)
            results = self.runs(topologies, repeat, seed)
        finally:
            for topology in topologies.values():
                topology.stop()
            self.delete_conversations()
        self.summary(results)

    # --- set-up -------------------------------------------------------------------------------------------

    def make_users(self, count: int) -> list[str]:
        model = get_user_model()
        tokens = []
        for i in range(count):
            user, created = model.objects.get_or_create(username=f"{USER_PREFIX}{i:03d}")
            if created:
                user.set_unusable_password()
                user.save()
            tokens.append(Token.objects.get_or_create(user=user)[0].key)
        return tokens

    def conversations(self, label: str) -> list[tuple[str, int]]:
        """A fresh conversation for each user."""
        owners = list(get_user_model().objects.filter(username__startswith=USER_PREFIX).order_by("username"))
        made = Conversation.objects.bulk_create([
            Conversation(owner=owner, title=f"{TITLE}{label}", model="arbor/echo") for owner in owners[:self.users]])
        return list(zip(self.tokens, [c.pk for c in made], strict=True))

    def delete_conversations(self) -> None:
        """The bench users' conversations with their nodes and after-turn jobs, in bulk (as bench_load does)."""
        delete_conversations(Conversation.objects.filter(owner__username__startswith=USER_PREFIX))

    def header(self, topologies: dict[int, Topology], took: float, repeat: int, seed: int) -> None:
        db = connection.settings_dict
        self.stdout.write(
            f"database: PostgreSQL {db['NAME']}; turn logs and cache: Redis {self.redis_url}; {os.cpu_count()} CPUs; "
            f"scripts/topology {', '.join(map(str, topologies))} (uvicorn config.asgi x N, 1 arbor_worker, HAProxy "
            f"round robin), all up in {took:.0f} s; model arbor/echo")
        self.stdout.write(
            f"loads through HAProxy: {self.users} users, each asking turns one after another for {self.seconds:g} s "
            f"(a fresh conversation per user and load): {' and '.join(LOADS.values())}; {repeat} run(s), each pair "
            f"once, order shuffled (seed {seed}); the outbox drained between measurements")

    # --- the runs -----------------------------------------------------------------------------------------

    def runs(self, topologies: dict[int, Topology], repeat: int, seed: int) -> list[Measurement]:
        rng = random.Random(seed)
        pairs = [(count, load) for count in topologies for load in LOADS]
        for topology in topologies.values():  # one turn of each load on each server first (the first imports)
            for app in topology.apps:
                self.warm_up(topology, app)
        results = []
        for run in range(1, repeat + 1):
            order = rng.sample(pairs, len(pairs))
            self.stdout.write(f"\n== run {run} of {repeat}: "
                              f"{', '.join(f'{LOADS[load]} {count}p' for count, load in order)}")
            for count, load in order:
                results.append(self.measure(topologies[count], load, run))
                self.stdout.write(self.line(results[-1]))
        return results

    def warm_up(self, topology: Topology, app: str) -> None:
        token, conversation = self.conversations(f"warm-up {app}")[0]
        for load in LOADS:
            headers = {"Authorization": f"Token {token}", "X-Arbor-Server": app}
            if load == "sse":
                headers["Accept"] = "text/event-stream"
            response = requests.post(topology.url(f"/api/conversations/{conversation}/turns/"),
                                     json={"content": QUESTION}, headers=headers, timeout=TURN_TIMEOUT_SECONDS)
            if response.status_code not in (200, 201) or response.headers.get("X-Arbor-Server") != app:
                raise CommandError(f"warm-up {load} turn on {app} ({topology.processes}p) answered "
                                   f"{response.status_code} from {response.headers.get('X-Arbor-Server')}: "
                                   f"{response.text[:300]}\n{topology.tail()}")

    def measure(self, topology: Topology, load: str, run: int) -> Measurement:
        self.wait_for_jobs()
        people = self.conversations(f"{LOADS[load]} {topology.processes}p run {run}")
        connection.close()
        roles = {"servers": [pid for pid, _ in topology.apps.values()],
                 "haproxy": [topology.pids["haproxy"]],
                 "worker": [pid for name, pid in topology.pids.items() if name.startswith("worker")]}
        before = {role: sum(proc_cpu_seconds(pid) for pid in pids) for role, pids in roles.items()}
        client = time.process_time()
        machine = machine_cpu_seconds()
        measurement = Measurement(topology.processes, load, run)
        asyncio.run(drive(topology, load, people, self.seconds, measurement))
        wall = measurement.wall
        measurement.cpu = {role: (sum(proc_cpu_seconds(pid) for pid in pids) - before[role]) / wall
                           for role, pids in roles.items()}
        measurement.cpu["client"] = (time.process_time() - client) / wall
        measurement.cpu["machine"] = (machine_cpu_seconds() - machine) / wall
        return measurement

    def wait_for_jobs(self) -> None:
        """Until the bench's after-commit jobs are done (at most JOBS_TIMEOUT_SECONDS)."""
        deadline = time.monotonic() + JOBS_TIMEOUT_SECONDS
        ids = list(Conversation.objects.filter(owner__username__startswith=USER_PREFIX).values_list("pk", flat=True))
        pending = OutboxJob.objects.filter(status=OutboxJob.Status.PENDING, payload__conversation__in=ids)
        while pending.exists():
            if time.monotonic() > deadline:
                self.stdout.write(f"({pending.count()} after-turn jobs still pending; going on)")
                break
            time.sleep(0.5)
        connection.close()

    # --- what it prints -----------------------------------------------------------------------------------

    def line(self, m: Measurement) -> str:
        errors = sum(m.errors.values())
        shown = "; ".join(f"{n}x {what}" for what, n in m.errors.most_common(3))
        answered = ", ".join(f"{app} {n}" for app, n in sorted(m.answered_by.items()))
        cpu = ", ".join(f"{role} {share:.0%}" for role, share in m.cpu.items())
        return (f"{LOADS[m.load]} {m.processes}p: {len(m.latencies)} turns in {m.wall:.1f} s = {m.rate:.1f} turns/s; "
                f"latency p50/p95 {self.ms(percentile(m.latencies, 50))}/{self.ms(percentile(m.latencies, 95))} ms; "
                f"errors {errors}{f' ({shown})' if errors else ''}; answered by {answered}; CPU {cpu} "
                f"(of {os.cpu_count() * 100}%)")

    @staticmethod
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1000:.0f}"

    def summary(self, results: list[Measurement]) -> None:
        cores = os.cpu_count() or 1
        self.stdout.write("\n== mean over the runs (turns/s; per run in brackets), and the ratio to 1 process")
        for load, name in LOADS.items():
            rates = {count: [m.rate for m in results if m.processes == count and m.load == load]
                     for count in self.counts}
            base = statistics.mean(rates[self.counts[0]])
            for count in self.counts:
                mean = statistics.mean(rates[count])
                ratio = f"{mean / base:.2f}x {self.counts[0]}p" if base else "-"
                self.stdout.write(f"{name} {count}p: {mean:.1f} turns/s "
                                  f"[{', '.join(f'{r:.1f}' for r in rates[count])}]; {ratio}")
            first = [m for m in results if m.processes == self.counts[0] and m.load == load]
            use = {role: statistics.mean(m.cpu[role] for m in first) for role in first[0].cpu}
            busy = use["machine"]
            self.stdout.write(
                f"what the ratio can be here ({name}): at {self.counts[0]}p the machine's {cores} cores were "
                f"{busy:.2f} busy (app servers {use['servers']:.2f}, HAProxy {use['haproxy']:.2f}, worker "
                f"{use['worker']:.2f}, this client {use['client']:.2f}; the rest PostgreSQL and anything else "
                f"running). With nothing else running, more processes add turns/s only on idle cores: at most "
                f"{cores}/{busy:.2f} = {f'{cores / busy:.2f}x' if busy else '-'} here, whatever their count; a ratio "
                "above it is CPU taken from other work on the machine")
        self.stdout.write(f"(on this {cores}-core machine the app servers, PostgreSQL, HAProxy, the worker and this "
                          "client share the same cores: once one process keeps them busy, a second has nothing to run "
                          "on; the same command on a bigger machine measures what the processes add there)")
