"""Issue 13's figures ("Capacity and scale-out"), measured on real server processes: `python manage.py bench_load`.

It runs against PostgreSQL and Redis, never SQLite: the database is `--database-url`, else DATABASE_URL when
that names PostgreSQL, else postgres://postgres@127.0.0.1:5432/arbor_load (created if missing, then migrated);
when that is not the database this process is configured with, the command runs itself again in a child
process configured with it. The turn logs go to REDIS_URL (default redis://127.0.0.1:6379/0).

Two server processes (uvicorn as `scripts/serve` runs it, or `--server daphne`; config.asgi, model arbor/echo)
serve on loopback for the whole run; a load "on 1 process" sends everything to the first, a load "on 2
processes" alternates the two ports (client-side round robin: user i's turn j goes to port (i + j) mod 2).
Every simulated user has an account of its own (a token, and a session for the WebSocket), and every turn a
fresh conversation, so per-user and per-conversation limits never cap the load (the servers get a high
ARBOR_MAX_CONCURRENT_TURNS_PER_USER and API rate anyway). The loads:

- streaming: N = `--users` users at once (their first turns spread over RAMP_SECONDS), each asking `--turns`
  `#slow` questions whose answers are `--words` words, one word every ARBOR_ECHO_WORD_SECONDS (the model's
  pacing), read over SSE (`POST …/turns/`, `Accept: text/event-stream`) and over the chat WebSocket;
- quick: `--quick-users` users each asking `--quick-turns` plain JSON turns (no `#slow`), one after another;
- idle: nothing for IDLE_SECONDS, to measure a quick GET when the servers are idle.

All the loads on every process count are run `--repeat` times, interleaved: each run holds every load once, the
order rotated by a share of the list from one run to the next (never all of A, then all of B). Throughout, a
separate process asks `GET /api/conversations/{id}/` of the first server every PROBE_SECONDS (its own user),
and a thread here samples `pg_stat_activity` and the servers' /proc/<pid>/status every SAMPLE_SECONDS.

For each load it prints turns/s, turn latency p50/p95/p99 (question sent -> `done`, or the JSON answer), the
wait for the response's headers (SSE, JSON) or the socket's handshake (WS), time to the first token p50/p95, the
gap between token messages p50/p95 against the model's pacing (and the share of gaps under half of it: tokens
that arrive bunched), errors (count and the most frequent, with the phase they happened in), the servers' peak
database connections, peak RSS and thread count, the CPU of the servers, of the PostgreSQL backends serving them,
of this client and of the whole machine (Redis and anything else running too), and the probe's GET p95
meanwhile. Then the loads pooled over the runs, the issue's targets as PASS/MISSED with the measured ratios,
where server-1's threads were during the heaviest 1-process streaming loads and the 1-process quick load
(`--stacks` dumps: every thread's on SIGUSR1, from a Python handler; the main thread's on SIGUSR2, faulthandler), and
what the servers wrote to stderr. It asserts nothing about time. It writes users named `arbor-load-*` and their
conversations, and deletes the conversations when it starts and ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import dj_database_url
import psycopg
import redis
import requests
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from psycopg import sql
from rest_framework.authtoken.models import Token

from conversations.bench import processes
from conversations.bench.processes import delete_conversations, free_port, parse_counts
from conversations.llm.echo import make_plan
from conversations.models import Conversation, TurnRun

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/arbor_load"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
USER_PREFIX = "arbor-load-"
PROBE_USER = "arbor-load-probe"
TITLE = "arbor-bench-load:"
SERVER_APP = "arbor-load-server-"  # PGAPPNAME of the servers' database connections: how they are counted
BENCH_APP = "arbor-bench-load"
CHILD_ENV = "ARBOR_BENCH_LOAD_CHILD"

RAMP_SECONDS = 1.0  # a streaming load's users start their first turn spread over this long
IDLE_SECONDS = 5.0
PROBE_SECONDS = 0.1
SAMPLE_SECONDS = 0.1
SETTLE_SECONDS = 0.5  # between loads, once no turn runs
TURN_TIMEOUT_SECONDS = 120
START_TIMEOUT_SECONDS = 90
HIGH = "1000000"  # the per-user limits given to the servers: never reached here
ERRORS_SHOWN = 3

GAP_TARGET = 1.2  # targets of issue 13
FIRST_TOKEN_TARGET = 2.0
GET_TARGET = 2.0
SCALE_TARGET = 1.8

TRANSPORTS = {"sse": "SSE", "ws": "WebSockets"}
STAMP = re.compile(r"^\d{4}-\d\d-\d\d[ T][\d:.,]+\s*")
PROBLEM = re.compile(r"\b(WARNING|ERROR|CRITICAL)\b|Exception|Error\b|timed? ?out|refused|too many")

# daphne, writing stacks to stderr: every thread's on SIGUSR1, the thread that takes the signal on SIGUSR2 (the main
# thread, which runs the event loop; faulthandler): where a busy server spends time. Every thread's stack is read by
# a Python handler under the GIL (sys._current_frames), in faulthandler's format: faulthandler's own all-threads
# dump reads other threads' frames without the GIL and killed a server with SIGSEGV in CI when a thread ended
# during the dump.
SERVE = """
import faulthandler, os, signal, sys
def dump_threads(signum, frame):
    lines = []
    for ident, top in sys._current_frames().items():
        lines.append(f"Thread 0x{ident:016x} (most recent call first):")
        while top is not None:
            lines.append(f'  File "{top.f_code.co_filename}", line {top.f_lineno} in {top.f_code.co_name}')
            top = top.f_back
        lines.append("")
    os.write(2, ("\\n".join(lines) + "\\n").encode())
signal.signal(signal.SIGUSR1, dump_threads)
faulthandler.register(signal.SIGUSR2, all_threads=False)
"""
# As scripts/serve: longer than a client's or load balancer's idle keep-alive (aiohttp 15 s, nginx and cloud
# balancers 60 s), or the client reuses a connection the server has just closed, and its request is reset.
KEEP_ALIVE_SECONDS = 75
# How each server is started (after SERVE), and its arguments on a port: `--server` chooses.
SERVERS = {
    "daphne": ("from daphne.cli import CommandLineInterface; CommandLineInterface.entrypoint()",
               lambda port: ["-b", "127.0.0.1", "-p", str(port), "config.asgi:application"]),
    # uvloop and httptools (uvicorn[standard]); websockets for the chat socket. Idle connections are kept as
    # scripts/serve keeps them (KEEP_ALIVE_SECONDS).
    "uvicorn": ("import uvicorn; uvicorn.main()",
                lambda port: ["--host", "127.0.0.1", "--port", str(port), "--no-access-log", "--lifespan", "off",
                              "--timeout-keep-alive", str(KEEP_ALIVE_SECONDS), "--log-level", "warning",
                              "config.asgi:application"]),
}
MAIN_THREAD = "<string>:<module>"  # the frame every server's main thread starts from (SERVE runs as `-c`)
STACK_SECONDS = 2.0  # between two stack dumps of a load
LOOP_SAMPLES = 10  # the loop thread's stack, this many times a dump, LOOP_EVERY apart
LOOP_EVERY = 0.03
FRAME = re.compile(r'^\s+File "(.+)", line \d+ in (\S+)')
PROJECT = ("conversations/", "config/", "playbooks/", "search/")
DUMPED = re.compile(  # the lines of a stack dump
    r'(Thread 0x|Current thread 0x|Stack \(most recent|<no Python frame>|\.\.\.$|.*", line \d+ in \S+$)')

# The GET probe: a process of its own (stdlib only), so neither its timing nor its requests wait for this one.
PROBE_SCRIPT = r"""
import http.client, sys, time
port, path, token, every = int(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
conn = None
while True:
    started = time.monotonic()
    try:
        if conn is None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", path, headers={"Authorization": "Token " + token})
        response = conn.getresponse()
        response.read()
        status = response.status
    except Exception:
        conn, status = None, 0
    took = time.monotonic() - started
    print(f"{started:.6f} {took:.6f} {status}", flush=True)
    time.sleep(max(0.0, every - took))
"""


# --- figures ---------------------------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank percentile; None without values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def seconds(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


@dataclass(frozen=True)
class Case:
    """One load: `kind` sse, ws (streaming), json (quick) or idle; N users; on the first `processes` servers."""

    kind: str
    users: int
    processes: int

    @property
    def label(self) -> str:
        if self.kind == "idle":
            return "idle"
        name = {"sse": "SSE", "ws": "WS", "json": "quick JSON"}[self.kind]
        return f"{name} {self.processes}p N={self.users}"

    @property
    def streaming(self) -> bool:
        return self.kind in TRANSPORTS


@dataclass
class TurnResult:
    """One turn as the client saw it (times from the moment the question was sent)."""

    error: str = ""
    latency: float | None = None
    accepted: float | None = None  # to the response's headers (SSE, JSON) or the socket's handshake (WS)
    first_token: float | None = None
    gaps: list[float] = field(default_factory=list)
    words: int = 0
    messages: int = 0
    failed_after: float | None = None  # from the first request (a socket's: its handshake) to the failure


@dataclass
class Machine:
    """What the sampler saw of the servers during a load."""

    connections: int = 0  # peak, all servers together
    connections_each: list[int] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)  # peak per server
    rss_before_mb: list[float] = field(default_factory=list)
    threads: list[int] = field(default_factory=list)  # peak per server
    server_cpu: float = 0.0  # share of one core, servers together
    client_cpu: float = 0.0
    db_cpu: float = 0.0  # the PostgreSQL backends serving the servers (any server: they share the database)
    machine_cpu: float = 0.0  # every process's: PostgreSQL, Redis and anything else running meanwhile too


@dataclass
class LoadResult:
    case: Case
    run: int
    turns: list[TurnResult]
    wall: float
    machine: Machine
    probe: list[float]  # GET latencies during the load
    probe_errors: int = 0

    @property
    def done(self) -> list[TurnResult]:
        return [t for t in self.turns if not t.error]

    @property
    def rate(self) -> float:
        return len(self.done) / self.wall if self.wall else 0.0


def _mean(values: list[float]) -> float:
    return statistics.mean(values) if values else 0.0


def _turn_figures(done: list) -> dict:
    """The finished turns' timings and sizes."""
    messages = sum(t.messages for t in done)
    return {
        "latency": [t.latency for t in done], "accepted": [t.accepted for t in done if t.accepted is not None],
        "first_token": [t.first_token for t in done if t.first_token],
        "gaps": [g for t in done for g in t.gaps],
        "words": _mean([t.words for t in done]),
        "per_message": sum(t.words for t in done) / messages if messages else 0,
    }


def pooled(results: list[LoadResult]) -> dict:
    """The repeats of one configuration as one: every turn's figures together, the rates and loads averaged."""
    done = [t for r in results for t in r.done]
    return {
        "turns": sum(len(r.turns) for r in results), "done": len(done),
        "errors": [(t.error, t.failed_after) for r in results for t in r.turns if t.error],
        "rate": _mean([r.rate for r in results]), **_turn_figures(done),
        "probe": [p for r in results for p in r.probe], "probe_errors": sum(r.probe_errors for r in results),
        **{cpu: _mean([getattr(r.machine, cpu) for r in results])
           for cpu in ("server_cpu", "db_cpu", "client_cpu", "machine_cpu")},
    }


def error_summary(errors: list[tuple[str, float | None]]) -> str:
    """The count, and the most frequent errors with how long after the first request they came."""
    if not errors:
        return "errors 0"
    shown = []
    for message, n in Counter(m for m, _ in errors).most_common(ERRORS_SHOWN):
        after = [a for m, a in errors if m == message and a is not None]
        when = f" after {min(after):.1f}-{max(after):.1f} s" if after else ""
        shown.append(f"{n}x{when} {message}")
    return f"errors {len(errors)} ({'; '.join(shown)})"


# --- the database, the servers, the sampler ------------------------------------------------------------------

def database_url(option: str | None) -> str:
    url = option or os.environ.get("DATABASE_URL", "")
    return url if url.startswith(("postgres://", "postgresql://")) else DEFAULT_DATABASE_URL


def _where(url: str) -> tuple[str, str, str]:
    db = dj_database_url.parse(url)
    return db["HOST"] or "127.0.0.1", str(db["PORT"] or 5432), db["NAME"]


def is_current_database(url: str) -> bool:
    """Whether this process's Django database is the one `url` names."""
    db = connection.settings_dict
    return connection.vendor == "postgresql" and (
        (db["HOST"] or "127.0.0.1", str(db["PORT"] or 5432), db["NAME"]) == _where(url))


def connect(url: str, *, dbname: str | None = None) -> psycopg.Connection:
    db = dj_database_url.parse(url)
    return psycopg.connect(host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, user=db["USER"] or None,
                           password=db["PASSWORD"] or None, dbname=dbname or db["NAME"], connect_timeout=5,
                           autocommit=True, application_name=BENCH_APP)


def ensure_database(url: str) -> None:
    """Create the database `url` names if it is missing (as `createdb` would)."""
    name = dj_database_url.parse(url)["NAME"]
    try:
        with connect(url, dbname="postgres") as admin:
            if not admin.execute("select 1 from pg_database where datname = %s", [name]).fetchone():
                admin.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
    except psycopg.OperationalError as error:
        host, port, _ = _where(url)
        raise CommandError(f"PostgreSQL is not reachable at {host}:{port} ({error}).") from error


def check_redis(url: str) -> None:
    try:
        redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3).ping()
    except redis.RedisError as error:
        raise CommandError(f"Redis is not reachable at {url} ({error}).") from error


def raise_open_files(want: int) -> int:
    """Raise this process's open-file limit (the servers inherit it); return the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < want:
        with contextlib.suppress(ValueError, OSError):  # only a privileged process may raise the hard limit
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
            return want
    target = want if hard == resource.RLIM_INFINITY else min(max(soft, want), hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def proc_status(pid: int) -> tuple[float, int]:
    """A process's resident memory in MB and its thread count, from /proc/<pid>/status."""
    rss = threads = 0
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return rss / 1024, threads


def machine_cpu_seconds() -> float:
    """CPU time every processor has spent busy (not idle, not waiting for I/O), from /proc/stat."""
    with open("/proc/stat") as stat:
        ticks = [int(t) for t in stat.readline().split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used, from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    """One server process (`kind`: daphne or uvicorn) serving config.asgi; its stderr kept in a file."""

    def __init__(self, index: int, env: dict[str, str], kind: str = "uvicorn"):
        self.name = f"server-{index + 1}"
        self.port = free_port()
        self.app = f"{SERVER_APP}{index + 1}"
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - its stderr, closed in stop()
        start, arguments = SERVERS[kind]
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVE + start, *arguments(self.port)],
            cwd=ROOT, env={**env, "PGAPPNAME": self.app}, stdout=subprocess.DEVNULL, stderr=self.log)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str, scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def wait_ready(self, token: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        with requests.Session() as session:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise CommandError(f"{self.name} exited with {self.process.returncode}:\n{self.tail()}")
                try:
                    status = session.get(self.url("/api/conversations/"), timeout=5,
                                         headers={"Authorization": f"Token {token}"}).status_code
                except requests.RequestException:
                    status = None
                if status == 200:
                    return
                if status is not None:
                    raise CommandError(f"{self.name} answered {status}:\n{self.tail()}")
                time.sleep(0.2)
        raise CommandError(f"{self.name} did not answer within {START_TIMEOUT_SECONDS} s:\n{self.tail()}")

    def stop(self) -> None:
        processes.stop(self.process)

    def stderr(self) -> str:
        return os.pread(self.log.fileno(), os.fstat(self.log.fileno()).st_size, 0).decode(errors="replace")

    def stacks(self, sig: signal.Signals, settle: float = 0.3) -> list[list[str]]:
        """The stacks faulthandler writes on `sig`, innermost frame first. The log is read without moving its
        offset, which the server's stderr shares."""
        fd = self.log.fileno()
        offset = os.fstat(fd).st_size
        os.kill(self.pid, sig)
        time.sleep(settle)
        return parse_stacks(os.pread(fd, os.fstat(fd).st_size - offset, offset).decode(errors="replace"))

    def tail(self, chars: int = 3000) -> str:
        return self.stderr()[-chars:]


def parse_stacks(text: str) -> list[list[str]]:
    """faulthandler's dump as one list of `file:function` frames per thread, innermost first."""
    stacks: list[list[str]] = []
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x", "Stack (most recent call first)")):
            current = []
            stacks.append(current)
        elif current is not None and (match := FRAME.match(line)):
            current.append(f"{short_path(match[1])}:{match[2]}")
        else:
            current = None
    return [stack for stack in stacks if stack]




def shorten(line: str, keep: int = 110) -> str:
    return line if len(line) <= 2 * keep else f"{line[:keep]} … {line[-keep:]}"


def short_path(path: str) -> str:
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1]
    if path.startswith(str(ROOT)):
        return path[len(str(ROOT)) + 1:]
    return Path(path).name


class StackSampler(threading.Thread):
    """Dumps a server's stacks every STACK_SECONDS during a load (the first after one second): its main thread's
    LOOP_SAMPLES times, then every thread's."""

    def __init__(self, server: Server, count: int):
        super().__init__(daemon=True, name="arbor-load-stacks")
        self.server, self.count = server, count
        self.loop: list[list[str]] = []
        self.threads: list[list[str]] = []
        self.dumps = 0
        self.halt = threading.Event()

    def run(self) -> None:
        wait = 1.0
        while self.dumps < self.count and not self.halt.wait(wait):
            for _ in range(LOOP_SAMPLES):
                self.loop += self.server.stacks(signal.SIGUSR2, settle=LOOP_EVERY)
            self.threads += [s for s in self.server.stacks(signal.SIGUSR1) if MAIN_THREAD not in s]
            self.dumps += 1
            wait = STACK_SECONDS


@dataclass
class Sample:
    at: float
    connections: dict[str, int]  # by PGAPPNAME
    rss_mb: list[float]  # per server
    threads: list[int]
    db_cpu: dict[int, float]  # CPU seconds so far of each database backend serving a server, by pid


class Sampler(threading.Thread):
    """Every SAMPLE_SECONDS: the servers' database connections (by PGAPPNAME) and the CPU their backends have
    used, the servers' resident memory and threads."""

    def __init__(self, url: str, servers: list[Server]):
        super().__init__(daemon=True, name="arbor-load-sampler")
        self.url, self.servers = url, servers
        self.database = dj_database_url.parse(url)["NAME"]
        self.samples: list[Sample] = []
        self.failure: str = ""
        self.halt = threading.Event()

    def run(self) -> None:
        try:
            with connect(self.url) as db:
                while not self.halt.is_set():
                    rows = db.execute("select pid, application_name from pg_stat_activity where datname = %s",
                                      [self.database]).fetchall()
                    status = [proc_status(s.pid) for s in self.servers]
                    self.samples.append(Sample(
                        time.monotonic(), Counter(app for _, app in rows), [r for r, _ in status],
                        [t for _, t in status],
                        {pid: proc_cpu_seconds(pid) for pid, app in rows if app.startswith(SERVER_APP)}))
                    self.halt.wait(SAMPLE_SECONDS)
        except psycopg.Error as error:
            self.failure = repr(error)

    def window(self, start: float, end: float, servers: list[Server]) -> Machine:
        index = [self.servers.index(s) for s in servers]
        none = Sample(start, {}, [0.0] * len(self.servers), [0] * len(self.servers), {})
        inside = [s for s in self.samples if start <= s.at <= end] or self.samples[-1:] or [none]
        before = ([s for s in self.samples if s.at < start][-1:] or [none])[0]
        machine = Machine()
        machine.connections_each = [max(s.connections.get(server.app, 0) for s in inside) for server in servers]
        machine.connections = max(sum(s.connections.get(server.app, 0) for server in servers) for s in inside)
        machine.rss_mb = [max(s.rss_mb[i] for s in inside) for i in index]
        machine.rss_before_mb = [before.rss_mb[i] for i in index]
        machine.threads = [max(s.threads[i] for s in inside) for i in index]
        used: dict[int, float] = {}
        for sample in inside:
            used.update(sample.db_cpu)
        machine.db_cpu = sum(cpu - before.db_cpu.get(pid, 0.0) for pid, cpu in used.items()) / max(end - start, 1e-9)
        return machine


SETTLE_SECONDS = 1.0  # after the probe stops, before the servers do


class Probe:
    """The GET probe process and the latencies it reports: (sent at, took, status)."""

    def __init__(self, server: Server, path: str, token: str):
        self.process = subprocess.Popen([sys.executable, "-c", PROBE_SCRIPT, str(server.port), path, token,
                                         str(PROBE_SECONDS)], stdout=subprocess.PIPE, text=True)
        self.samples: list[tuple[float, float, int]] = []
        threading.Thread(target=self._read, daemon=True, name="arbor-load-probe").start()

    def _read(self) -> None:
        for line in self.process.stdout:
            at, took, status = line.split()
            self.samples.append((float(at), float(took), int(status)))

    def window(self, start: float, end: float) -> tuple[list[float], int]:
        inside = [s for s in self.samples if start <= s[0] and s[0] + s[1] <= end]
        return [took for _, took, status in inside if status == 200], sum(1 for s in inside if s[2] != 200)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        self.process.wait(10)


# --- the clients ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Person:
    """A simulated user: its token, its session (for the socket) and the conversations its turns go to."""

    token: str
    session: str
    conversations: list[int]


class Stream:
    """One turn as it goes: when it was asked, its token messages as they arrive, the phase it is in."""

    def __init__(self):
        self.began = self.sent = time.monotonic()
        self.result = TurnResult()
        self.last: float | None = None
        self.phase = "connecting"

    def accepted(self) -> None:
        self.result.accepted = time.monotonic() - self.sent
        self.phase = "streaming"

    def asked(self) -> None:
        """The question goes out now (on a socket, after its handshake)."""
        self.sent = time.monotonic()

    def token(self, text: str) -> None:
        now = time.monotonic()
        if self.last is None:
            self.result.first_token = now - self.sent
        else:
            self.result.gaps.append(now - self.last)
        self.last = now
        self.result.words += len(text.split())
        self.result.messages += 1

    def end(self, kind: str, data: object) -> TurnResult:
        if kind == "done":
            self.result.latency = time.monotonic() - self.sent
        else:
            self.result.error = f"{kind}: {json.dumps(data)[:160]}"
            self.result.failed_after = time.monotonic() - self.began
        return self.result

    def failed(self, error: str) -> TurnResult:
        self.result.error = f"{self.phase}: {error}"
        self.result.failed_after = time.monotonic() - self.began
        return self.result


async def sse_events(response: aiohttp.ClientResponse):
    """(type, data) of each server-sent event of a response, as it arrives."""
    kind, data = "", []
    async for raw in response.content:
        line = raw.decode().rstrip("\r\n")
        if line:
            name, _, value = line.partition(":")
            if name == "event":
                kind = value.strip()
            elif name == "data":
                data.append(value.removeprefix(" "))
            continue
        if kind or data:
            yield kind or "message", json.loads("\n".join(data)) if data else None
        kind, data = "", []


async def sse_turn(http: aiohttp.ClientSession, server: Server, person: Person, conversation: int,
                   content: str, stream: Stream) -> TurnResult:
    async with http.post(server.url(f"/api/conversations/{conversation}/turns/"), json={"content": content},
                         headers={"Authorization": f"Token {person.token}", "Accept": "text/event-stream"}
                         ) as response:
        stream.accepted()
        async for kind, data in sse_events(response):
            if kind == "token":
                stream.token(data["text"])
            elif kind in ("done", "error", "approval_required"):
                return stream.end(kind, data)
        return stream.end(f"HTTP {response.status}, stream ended without done", None)


async def ws_turn(http: aiohttp.ClientSession, server: Server, person: Person, conversation: int,
                  content: str, stream: Stream) -> TurnResult:
    async with http.ws_connect(server.url(f"/ws/conversations/{conversation}/", scheme="ws"),
                               headers={"Origin": server.origin, "Cookie": f"sessionid={person.session}"}
                               ) as ws:
        stream.accepted()
        stream.asked()
        await ws.send_json({"type": "ask", "content": content})
        async for message in ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            data = json.loads(message.data)
            if data.get("type") == "token":
                stream.token(data["text"])
            elif data.get("type") in ("done", "error", "approval_required"):
                return stream.end(data["type"], data)
        return stream.end(f"socket ended without done (close code {ws.close_code})", None)


async def json_turn(http: aiohttp.ClientSession, server: Server, person: Person, conversation: int,
                    content: str, stream: Stream) -> TurnResult:
    async with http.post(server.url(f"/api/conversations/{conversation}/turns/"), json={"content": content},
                         headers={"Authorization": f"Token {person.token}"}) as response:
        stream.accepted()
        body = await response.read()
    if response.status != 201:
        return stream.failed(f"HTTP {response.status}: {body[:160].decode(errors='replace')}")
    return stream.end("done", None)


TURNS = {"sse": sse_turn, "ws": ws_turn, "json": json_turn}


async def one_turn(kind: str, http, server: Server, person: Person, conversation: int, content: str) -> TurnResult:
    stream = Stream()
    try:
        async with asyncio.timeout(TURN_TIMEOUT_SECONDS):
            return await TURNS[kind](http, server, person, conversation, content, stream)
    except TimeoutError:
        return stream.failed(f"no answer within {TURN_TIMEOUT_SECONDS} s")
    except (aiohttp.ClientError, OSError, ValueError) as error:
        return stream.failed(f"{type(error).__name__}: {str(error)[:160]}")


async def drive(kind: str, people: list[Person], servers: list[Server], content: str, *, ramp: float
                ) -> list[TurnResult]:
    """Every person asks its turns one after another, all people at once; turns alternate the servers."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar(),
                                     timeout=aiohttp.ClientTimeout(total=None)) as http:
        async def person_turns(i: int, person: Person) -> list[TurnResult]:
            await asyncio.sleep(ramp * i / len(people))
            return [await one_turn(kind, http, servers[(i + j) % len(servers)], person, conversation, content)
                    for j, conversation in enumerate(person.conversations)]

        done = await asyncio.gather(*(person_turns(i, p) for i, p in enumerate(people)))
    return [turn for turns in done for turn in turns]


def slow_question(words: int) -> str:
    """A `#slow` question whose answer (on a fresh conversation) is `words` words, or as near as it gets."""
    filler = 1
    while True:
        question = "#slow " + " ".join(f"load{i:02d}" for i in range(filler))
        plan = make_plan([{"role": "user", "content": question}], tools_offered=False)
        if len(plan.words) >= words or filler > words:
            return question
        filler += 1


QUICK_QUESTION = "a quick question: how many rows?"


# --- the command ---------------------------------------------------------------------------------------------

class Command(BaseCommand):
    help = "Issue 13's figures on real server processes: streaming and quick turns under load, 1 and 2 processes."

    def add_arguments(self, parser):
        parser.add_argument("--users", default="1,20,100,300", help="concurrent streaming users (default 1,20,100,300)")
        parser.add_argument("--processes", default="1,2", help="server processes to spread loads over (default 1,2)")
        parser.add_argument("--quick-users", type=int, default=50, help="users doing quick JSON turns (default 50)")
        parser.add_argument("--quick-turns", type=int, default=6, help="quick turns per user (default 6)")
        parser.add_argument("--turns", type=int, default=2, help="streaming turns per user (default 2)")
        parser.add_argument("--words", type=int, default=20, help="words per streamed answer (default 20)")
        parser.add_argument("--repeat", type=int, default=2, help="runs of every load, interleaved (default 2)")
        parser.add_argument("--stacks", type=int, default=4,
                            help="stack dumps of server-1 during the heaviest 1-process streaming loads and the "
                                 "1-process quick load of run 1 (default 4; 0: none)")
        parser.add_argument("--server", choices=sorted(SERVERS), default="uvicorn",
                            help="the ASGI server the processes run (default uvicorn, as scripts/serve)")
        parser.add_argument("--database-url", default=None,
                            help=f"PostgreSQL to run on (default: DATABASE_URL if PostgreSQL, else "
                                 f"{DEFAULT_DATABASE_URL})")

    def handle(self, *args, **options):
        users, processes = parse_counts(options["users"]), parse_counts(options["processes"])
        if max(processes) > 2:
            raise CommandError("--processes takes 1 and 2 only (a client-side round robin over two ports).")
        if min(options["repeat"], options["quick_users"], options["quick_turns"], options["turns"]) < 1:
            raise CommandError("--repeat, --quick-users, --quick-turns and --turns must be at least 1.")
        url = database_url(options["database_url"])
        ensure_database(url)
        check_redis(settings.REDIS_URL or DEFAULT_REDIS_URL)
        if not is_current_database(url):
            if os.environ.get(CHILD_ENV):
                raise CommandError(f"this process was started to run on {url} but is configured with another "
                                   "database")
            self.run_in_child(url, options)
            return
        self.users, self.processes = users, processes
        self.options, self.url = options, url
        self.run()

    def run_in_child(self, url: str, options: dict) -> None:
        """Run this command in a process whose Django database is `url`, printing what it prints."""
        argv = [sys.executable, str(ROOT / "manage.py"), "bench_load", "--database-url", url]
        for name in ("users", "processes", "quick_users", "quick_turns", "turns", "words", "repeat", "stacks",
                     "server"):
            argv += [f"--{name.replace('_', '-')}", str(options[name])]
        env = {**os.environ, "DATABASE_URL": url, "PGAPPNAME": BENCH_APP, CHILD_ENV: "1"}
        with subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True) as child:
            for line in child.stdout:
                self.stdout.write(line.rstrip("\n"))
        if child.returncode:
            raise CommandError(f"the benchmark process ({url}) exited with {child.returncode}")

    # --- the run ----------------------------------------------------------------------------------------

    def run(self) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        self.pacing = settings.ARBOR_ECHO_WORD_SECONDS
        self.question = slow_question(self.options["words"])
        need = max(max(self.users), self.options["quick_users"])
        open_files = raise_open_files(8 * need + 4096)
        self.delete_conversations()
        people = self.make_users(need)
        env = {**os.environ, "DATABASE_URL": self.url, "REDIS_URL": settings.REDIS_URL or DEFAULT_REDIS_URL,
               "DJANGO_DEBUG": "0", "DJANGO_ALLOWED_HOSTS": "127.0.0.1", "ARBOR_ECHO_WORD_SECONDS": f"{self.pacing:g}",
               "ARBOR_MAX_CONCURRENT_TURNS_PER_USER": HIGH, "ARBOR_API_USER_RATE": f"{HIGH}/min"}
        self.servers = [Server(i, env, self.options["server"]) for i in range(max(self.processes))]
        probe = self.sampler = None
        try:
            for server in self.servers:
                server.wait_ready(people["probe"].token)
            self.header(open_files)
            self.warm_up(people)
            self.sampler = Sampler(self.url, self.servers)
            self.sampler.start()
            probe = Probe(self.servers[0], f"/api/conversations/{people['probe'].conversations[0]}/",
                          people["probe"].token)
            results = self.runs(people["users"], probe)
        finally:
            if probe:
                probe.stop()
            if self.sampler:
                self.sampler.halt.set()
            # The probe's last GET may still be in a server when it goes: let it end. Daphne stopped with it pending
            # kills it, and Django's handler then leaves its disconnect watcher's RequestAborted unread, a traceback
            # in the server's stderr that is the benchmark's doing (seen once in CI, on a machine at 200%).
            time.sleep(SETTLE_SECONDS)
            for server in self.servers:
                server.stop()
            self.delete_conversations()
            Session.objects.filter(session_key__in=self.sessions).delete()
        self.summary(results)
        self.targets(results)
        self.stack_summary()
        self.server_logs()

    def header(self, open_files: int) -> None:
        db = connection.settings_dict
        words = len(make_plan([{"role": "user", "content": self.question}], tools_offered=False).words)
        self.stdout.write(
            f"database: PostgreSQL {db['NAME']} at {db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}; turn logs and "
            f"cache: Redis {settings.REDIS_URL or DEFAULT_REDIS_URL}; servers: {self.options['server']} config.asgi x"
            f"{len(self.servers)} on loopback, model arbor/echo, pacing ARBOR_ECHO_WORD_SECONDS={self.pacing:g} s; "
            f"{os.cpu_count()} CPUs; open files {open_files}")
        self.stdout.write(
            f"loads: streaming `#slow` answers of {words} words, {self.options['turns']} turns per user (a fresh "
            f"conversation each, first turns spread over {RAMP_SECONDS:g} s), over SSE and WebSockets, for N = "
            f"{', '.join(map(str, self.users))}; {self.options['quick_users']} users x {self.options['quick_turns']} "
            f"quick JSON turns; idle {IDLE_SECONDS:g} s; on {' and '.join(map(str, self.processes))} process(es) "
            f"(clients alternate ports); {self.options['repeat']} run(s), interleaved, order rotated; a quick GET "
            f"every {PROBE_SECONDS:g} s from its own process to server-1 throughout")

    def make_users(self, count: int) -> dict:
        """`count` users with a token and a session each, plus the probe's user and conversation."""
        model = get_user_model()
        names = [f"{USER_PREFIX}{i:03d}" for i in range(count)] + [PROBE_USER]
        have = set(model.objects.filter(username__in=names).values_list("username", flat=True))
        missing = [model(username=name) for name in names if name not in have]
        for user in missing:
            user.set_unusable_password()
        model.objects.bulk_create(missing)
        users = {u.username: u for u in model.objects.filter(username__in=names)}
        tokens = dict(Token.objects.filter(user__in=users.values()).values_list("user__username", "key"))
        Token.objects.bulk_create([Token(user=users[n], key=Token.generate_key()) for n in names if n not in tokens])
        tokens = dict(Token.objects.filter(user__in=users.values()).values_list("user__username", "key"))
        self.sessions = [self.session_for(users[name]) for name in names]
        probe_conversation = Conversation.objects.create(owner=users[PROBE_USER], title=f"{TITLE}probe",
                                                         model="arbor/echo")
        people = [Person(tokens[n], key, []) for n, key in zip(names, self.sessions, strict=True)]
        self.user_objects = [users[n] for n in names[:-1]]
        return {"users": people[:-1],
                "probe": Person(tokens[PROBE_USER], self.sessions[-1], [probe_conversation.pk])}

    @staticmethod
    def session_for(user) -> str:
        """A signed-in session for `user`, as Django's login would leave it."""
        session = SessionStore()
        session[SESSION_KEY] = str(user.pk)
        session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
        session[HASH_SESSION_KEY] = user.get_session_auth_hash()
        session.create()
        return session.session_key

    def delete_conversations(self) -> None:
        """The bench users' conversations with their nodes and after-turn jobs, in bulk (no other path uses them)."""
        delete_conversations(Conversation.objects.filter(owner__username__startswith=USER_PREFIX))

    def conversations_for(self, people: list[Person], count: int, case: Case, run: int) -> list[Person]:
        """`people` with `count` fresh conversations each."""
        owners = self.user_objects[:len(people)]
        made = Conversation.objects.bulk_create([
            Conversation(owner=owner, title=f"{TITLE}{case.label} run {run}", model="arbor/echo")
            for owner in owners for _ in range(count)])
        ids = [c.pk for c in made]
        return [Person(p.token, p.session, ids[i * count:(i + 1) * count]) for i, p in enumerate(people)]

    def warm_up(self, people: dict) -> None:
        """One turn of each kind on each server before anything is measured (the first request imports)."""
        probe = people["probe"]
        for server in self.servers:
            for kind in ("json", "sse", "ws"):
                conversation = Conversation.objects.create(owner=self.user_objects[0], title=f"{TITLE}warm-up",
                                                           model="arbor/echo")
                person = Person(people["users"][0].token, people["users"][0].session, [conversation.pk])
                content = QUICK_QUESTION if kind == "json" else self.question
                result = asyncio.run(drive(kind, [person], [server], content, ramp=0))[0]
                if result.error:
                    raise CommandError(f"warm-up {kind} turn on {server.name} failed: {result.error}\n"
                                       f"{server.tail()}")
        asyncio.run(drive("json", [probe], self.servers[:1], QUICK_QUESTION, ramp=0))

    def cases(self) -> list[Case]:
        cases = [Case(kind, n, p) for p in self.processes for kind in TRANSPORTS for n in self.users]
        cases += [Case("json", self.options["quick_users"], p) for p in self.processes]
        return [*cases, Case("idle", 0, 1)]

    def runs(self, people: list[Person], probe: Probe) -> list[LoadResult]:
        cases, repeat = self.cases(), self.options["repeat"]
        one = min(self.processes)
        self.stacked: dict[Case, StackSampler | None] = {
            **{Case(kind, max(self.users), one): None for kind in TRANSPORTS},
            Case("json", self.options["quick_users"], one): None}
        results: list[LoadResult] = []
        for run in range(1, repeat + 1):
            shift = (run - 1) * len(cases) // repeat
            order = cases[shift:] + cases[:shift]
            self.stdout.write(f"\n== run {run} of {repeat}: {', '.join(c.label for c in order)}")
            for case in order:
                result = self.load(case, run, people, probe)
                results.append(result)
                self.stdout.write(self.line(result))
        return results

    def load(self, case: Case, run: int, people: list[Person], probe: Probe) -> LoadResult:
        self.wait_idle()
        servers = self.servers[:case.processes]
        if case.kind == "idle":
            chosen, content = [], ""
        elif case.kind == "json":
            chosen = self.conversations_for(people[:case.users], self.options["quick_turns"], case, run)
            content = QUICK_QUESTION
        else:
            chosen = self.conversations_for(people[:case.users], self.options["turns"], case, run)
            content = self.question
        connection.close()
        cpu = [proc_cpu_seconds(s.pid) for s in servers]
        own = resource.getrusage(resource.RUSAGE_SELF)
        everyone = machine_cpu_seconds()
        stacks = None
        if self.options["stacks"] and run == 1 and case in self.stacked:
            stacks = self.stacked[case] = StackSampler(servers[0], self.options["stacks"])
            stacks.start()
        start = time.monotonic()
        if case.kind == "idle":
            time.sleep(IDLE_SECONDS)
            turns = []
        else:
            turns = asyncio.run(drive(case.kind, chosen, servers, content,
                                      ramp=RAMP_SECONDS if case.streaming else 0))
        end = time.monotonic()
        if stacks:
            stacks.halt.set()
            stacks.join()
        for server in servers:
            if server.process.poll() is not None:
                raise CommandError(f"{server.name} exited with {server.process.returncode} during {case.label}, run "
                                   f"{run}:\n{server.tail()}")
        wall = end - start
        machine = self.sampler.window(start, end, servers)
        machine.server_cpu = sum(proc_cpu_seconds(s.pid) - c for s, c in zip(servers, cpu, strict=True)) / wall
        after = resource.getrusage(resource.RUSAGE_SELF)
        machine.client_cpu = (after.ru_utime + after.ru_stime - own.ru_utime - own.ru_stime) / wall
        machine.machine_cpu = (machine_cpu_seconds() - everyone) / wall
        latencies, probe_errors = probe.window(start, end)
        return LoadResult(case, run, turns, wall, machine, latencies, probe_errors)

    def wait_idle(self) -> None:
        """Until no turn of the bench runs (at most TURN_TIMEOUT_SECONDS), then SETTLE_SECONDS more."""
        deadline = time.monotonic() + TURN_TIMEOUT_SECONDS
        while TurnRun.objects.filter(ended_at__isnull=True, conversation__title__startswith=TITLE).exists():
            if time.monotonic() > deadline:
                self.stdout.write("(turns of an earlier load were still running; going on)")
                break
            time.sleep(0.2)
        connection.close()
        time.sleep(SETTLE_SECONDS)

    # --- what it prints -----------------------------------------------------------------------------------

    def line(self, result: LoadResult) -> str:
        figures = pooled([result])
        return f"run {result.run} {self.figures(result.case, figures, [result])}"

    def figures(self, case: Case, f: dict, results: list[LoadResult]) -> str:
        m = [r.machine for r in results]
        connections = max(x.connections for x in m)
        each = "+".join(str(max(x.connections_each[i] for x in m)) for i in range(case.processes))
        rss = "+".join(f"{max(x.rss_mb[i] for x in m):.0f}" for i in range(case.processes))
        before = "+".join(f"{min(x.rss_before_mb[i] for x in m):.0f}" for i in range(case.processes))
        threads = "+".join(str(max(x.threads[i] for x in m)) for i in range(case.processes))
        machine = (f"db connections peak {connections} ({each}); RSS peak {rss} MB (before {before}); threads peak "
                   f"{threads}; CPU servers {f['server_cpu']:.0%} their db backends {f['db_cpu']:.0%} client "
                   f"{f['client_cpu']:.0%} machine "
                   f"{f['machine_cpu']:.0%} of {os.cpu_count() * 100}%; "
                   f"GET p95 {ms(percentile(f['probe'], 95))} ms (n={len(f['probe'])}"
                   f"{f', {n} failed' if (n := f['probe_errors']) else ''})")
        if case.kind == "idle":
            return f"{case.label}: {machine}"
        accepted = "handshake" if case.kind == "ws" else "headers"
        head = (f"{case.label}: {f['done']}/{f['turns']} turns, {f['rate']:.1f} turns/s; latency p50/p95/p99 "
                f"{seconds(percentile(f['latency'], 50))}/{seconds(percentile(f['latency'], 95))}/"
                f"{seconds(percentile(f['latency'], 99))} s; {accepted} p50/p95 "
                f"{seconds(percentile(f['accepted'], 50), 3)}/{seconds(percentile(f['accepted'], 95), 3)} s")
        if case.streaming:
            gap = percentile(f["gaps"], 95)
            bunched = sum(1 for g in f["gaps"] if g < self.pacing / 2) / len(f["gaps"]) if f["gaps"] else 0
            head += (f"; first token p50/p95 {seconds(percentile(f['first_token'], 50), 3)}/"
                     f"{seconds(percentile(f['first_token'], 95), 3)} s; gap p50/p95 "
                     f"{seconds(percentile(f['gaps'], 50), 3)}/{seconds(gap, 3)} s = "
                     f"{times(ratio(gap, self.pacing))} pacing, {bunched:.0%} under half of it ({f['words']:.0f} "
                     f"words, {f['per_message']:.2f} per message)")
        return f"{head}; {error_summary(f['errors'])}; {machine}"

    def summary(self, results: list[LoadResult]) -> None:
        self.stdout.write(f"\n== pooled over {self.options['repeat']} run(s) (turns/s: mean of the runs)")
        for case in self.cases():
            mine = [r for r in results if r.case == case]
            self.stdout.write(self.figures(case, pooled(mine), mine))

    def targets(self, results: list[LoadResult]) -> None:
        def of(case: Case) -> dict:
            return pooled([r for r in results if r.case == case])

        one, heavy, single = min(self.processes), max(self.users), min(self.users)
        pacing = self.pacing
        self.stdout.write("\n== targets (issue 13)")
        idle = of(Case("idle", 0, 1))
        for kind, name in TRANSPORTS.items():
            load, alone = of(Case(kind, heavy, one)), of(Case(kind, single, one))
            what = f"{heavy} concurrent streaming turns on {one} process over {name}"
            self.verdict(load["done"] == load["turns"] and not load["errors"],
                         f"{what}: all complete, 0 errors ({load['done']}/{load['turns']} complete, "
                         f"{len(load['errors'])} errors)")
            gap = ratio(percentile(load["gaps"], 95), pacing)
            self.verdict(gap is not None and gap <= GAP_TARGET,
                         f"{what}: inter-token gap p95 {seconds(percentile(load['gaps'], 95), 3)} s = {times(gap)} the "
                         f"model's pacing {pacing:g} s (target <= {GAP_TARGET:g}x)")
            first = ratio(percentile(load["first_token"], 95), percentile(alone["first_token"], 95))
            if single == heavy:  # the load would be compared with itself
                self.stdout.write(f"NOT MEASURED  {what}: first token p95 against a single stream's (needs a "
                                  f"lighter load in --users as well, e.g. --users 1,{heavy})")
            else:
                self.verdict(first is not None and first <= FIRST_TOKEN_TARGET,
                             f"{what}: first token p95 {seconds(percentile(load['first_token'], 95), 3)} s = "
                             f"{times(first)} a single stream's {seconds(percentile(alone['first_token'], 95), 3)} "
                             f"s (N={single}; target <= {FIRST_TOKEN_TARGET:g}x)")
            get = ratio(percentile(load["probe"], 95), percentile(idle["probe"], 95))
            self.verdict(get is not None and get <= GET_TARGET,
                         f"quick GET p95 during {heavy} streaming turns over {name} on {one} process "
                         f"{ms(percentile(load['probe'], 95))} ms = {times(get)} idle "
                         f"{ms(percentile(idle['probe'], 95))} ms (target <= {GET_TARGET:g}x)")
        self.scale_target(results)

    def scale_target(self, results: list[LoadResult]) -> None:
        quick = self.options["quick_users"]
        if self.processes != [1, 2]:
            self.stdout.write(f"NOT MEASURED  2 processes vs 1 at N = {quick} quick turns (needs --processes 1,2)")
            return
        rates = {p: [r.rate for r in results if r.case == Case("json", quick, p)] for p in (1, 2)}
        per_run = [ratio(b, a) for a, b in zip(rates[1], rates[2], strict=True)]
        scale = ratio(statistics.mean(rates[2]), statistics.mean(rates[1]))
        self.verdict(scale is not None and scale >= SCALE_TARGET,
                     f"2 processes {statistics.mean(rates[2]):.1f} turns/s = {times(scale)} 1 process's "
                     f"{statistics.mean(rates[1]):.1f} turns/s at N = {quick} quick turns (target >= "
                     f"{SCALE_TARGET:g}x; per run {', '.join(times(r) for r in per_run)})")

    def verdict(self, passed: bool, text: str) -> None:
        self.stdout.write(f"{'PASS  ' if passed else 'MISSED'}  {text}")

    def stack_summary(self) -> None:
        """Where server-1's threads were in the stack dumps: the loop thread, then the others (innermost frames
        first, `a <- b` = a called by b), and the innermost frame of Arbor's own code."""
        for case, sampler in self.stacked.items():
            if not sampler or not sampler.dumps:
                continue
            others = sampler.threads
            self.stdout.write(f"\n== server-1's threads in {sampler.dumps} stack dumps during {case.label}, run 1 "
                              f"({len(sampler.loop)} samples of the event loop thread; {len(others)} stacks of other "
                              "threads, at most 100 a dump)")
            groups = {
                "the event loop thread": Counter(" <- ".join(s[:3]) for s in sampler.loop),
                "the other threads": Counter(" <- ".join(s[:3]) for s in others),
                "the other threads, innermost Arbor frame": Counter(
                    next((f for f in s if f.startswith(PROJECT)), "(none)") for s in others),
            }
            for title, counted in groups.items():
                total = sum(counted.values()) or 1
                self.stdout.write(f"{title}:")
                for frames, n in counted.most_common(6):
                    self.stdout.write(f"  {n / total:4.0%} {frames}")

    def server_logs(self) -> None:
        """What the servers wrote to stderr: its lines counted, the most frequent shown (problems first)."""
        self.stdout.write("\n== server stderr (timestamps cut; warnings and errors first, then the most frequent)")
        if self.sampler and self.sampler.failure:
            self.stdout.write(f"(the sampler stopped: {self.sampler.failure})")
        for server in self.servers:
            lines = [STAMP.sub("", line.strip()) for line in server.stderr().splitlines()
                     if line.strip() and not DUMPED.match(line.strip())]
            tracebacks = sum(1 for line in lines if line.startswith("Traceback"))
            self.stdout.write(f"{server.name}: {len(lines)} lines, {tracebacks} tracebacks")
            counted = Counter(shorten(re.sub(r"\d+", "N", line)) for line in lines
                              if not line.startswith(("File ", "Traceback", "^")))
            for line, n in sorted(counted.items(), key=lambda item: (not PROBLEM.search(item[0]), -item[1]))[:8]:
                self.stdout.write(f"  {n}x {line}")
