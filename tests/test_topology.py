"""Issue 34, a real topology: `scripts/topology` (uvicorn app processes, one arbor_worker, HAProxy in front, round
robin) on the test database (PostgreSQL), every request through HAProxy, pinned to one app process with the
`X-Arbor-Server` header where it matters (HAProxy answers with the server that served it in the same header). Run
with the turn log in the database (3 app processes), then on Redis (REDIS_URL, 2 app processes), one topology at a
time: every process of a deployment must agree on REDIS_URL (the worker of one would sweep the other's runs).

A streamed turn started through app-1 is followed through app-2, cut and resumed there with `after=N` (no gap,
no duplicate), and stopped there: its node ends failed/cancelled and its log is whole; a chat socket through
HAProxy runs the next turn. Then app-1 is killed with `kill -9` mid-answer: app-2's follower ends, the worker's
recovery sweep fails the node as interrupted with the text D3 keeps (saved every ARBOR_PARTIAL_SAVE_SECONDS),
and the next turns through HAProxy work, on the living processes. Last, another process than app-2 is killed while
no worker runs, so app-2's follower ends before the sweep writes the ending; resumed afterwards, it gets that
ending (a dead run's mirror is not kept). On Redis the sweep numbers that ending after the run's last event (shown
without a topology).

Needs Debian's haproxy (/usr/sbin/haproxy): skipped without it, except under CI (env CI set), where it fails:
.ci/run installs it. Likewise Redis for its variant. The turn lock's lease is 5 s here (20 s by default), so
a kill is recovered in seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
import redis
import requests
import websocket
from django.utils import timezone
from rest_framework.authtoken.models import Token

from conversations import items as it
from conversations import services
from conversations.bench.processes import database_url, stop
from conversations.bench.topology import HAPROXY, ROOT, Topology, alive
from conversations.models import Node, TurnRun
from conversations.turns import log_stores, recovery
from conversations.turns.events import EventType, TurnEvent
from tests.support.sockets import session_cookie

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

REDIS_URL = "redis://127.0.0.1:6379/0"
WORD_SECONDS = 0.1
PARTIAL_SAVE_SECONDS = 2  # D3's "partial text saved so far": the default, stated here because the bound uses it
LEASE_SECONDS = 5
ENV = {"DJANGO_DEBUG": "0", "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost", "ARBOR_ECHO_WORD_SECONDS": str(WORD_SECONDS),
       "ARBOR_PARTIAL_SAVE_SECONDS": str(PARTIAL_SAVE_SECONDS), "ARBOR_TURN_LOCK_SECONDS": str(LEASE_SECONDS),
       "ARBOR_TURN_HEARTBEAT_SECONDS": "1"}
A, B = {"X-Arbor-Server": "app-1"}, {"X-Arbor-Server": "app-2"}
SSE = {"Accept": "text/event-stream"}
ENDINGS = ("done", "error", "approval_required")

Event = tuple[int, str, dict]


def _redis_unreachable() -> str | None:
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError as error:
        return f"Redis is not reachable at {REDIS_URL} ({error})"
    return None


def _needed(reason: str | None) -> None:
    """Skip for `reason`, or fail under CI (.ci/run installs haproxy and starts Redis)."""
    if reason and os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: .ci/run installs haproxy and starts Redis, so this is an error)")
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="module", params=["database", "redis"])
def topology(request, django_db_setup, django_db_blocker) -> Iterator[Topology]:
    """`scripts/topology` with the turn log in the database, or on Redis."""
    _needed(None if HAPROXY.exists() else f"{HAPROXY} missing: install Debian's haproxy to run the topology checks")
    if request.param == "redis":
        _needed(_redis_unreachable())
    with django_db_blocker.unblock():
        url = database_url()
    redis_url = REDIS_URL if request.param == "redis" else ""
    # The kill and the follower-resumed tests (database only) each kill a process other than app-2.
    started = Topology(2 if redis_url else 3,
                       {**ENV, "DATABASE_URL": url, "REDIS_URL": redis_url, "WORKERS": "0"})  # see `worker`
    try:
        yield started.wait_ready(timeout=120)
    finally:
        started.stop()


@pytest.fixture
def lb(topology: Topology) -> Topology:
    return topology


@contextlib.contextmanager
def worker(topology: Topology) -> Iterator[None]:
    """`manage.py arbor_worker` on the topology's database and store, for the block. The topologies here run no
    worker of their own (WORKERS=0): the test database is flushed after each test (TRUNCATE of every table), which
    deadlocked with a worker's sweep, so a test that needs one runs it and stops it before it ends."""
    process = subprocess.Popen([sys.executable, "manage.py", "arbor_worker"], cwd=ROOT,
                               env={**os.environ, **topology.env}, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        stop(process)


def _store(topology: Topology) -> str:
    return "redis" if topology.env.get("REDIS_URL") else "database"


def events(response: requests.Response) -> Iterator[Event]:
    """The server-sent events of a streamed response as they arrive, up to the turn's ending."""
    assert response.status_code == 200, response.text[:500]
    seq, kind, data = None, "", None
    for line in response.iter_lines(chunk_size=None, decode_unicode=True):
        if line.startswith("id:"):
            seq = int(line[3:])
        elif line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            data = json.loads(line[5:])
        elif not line and kind:
            yield seq, kind, data
            if kind in ENDINGS:
                return
            seq, kind, data = None, "", None


class Reader(threading.Thread):
    """Reads a stream to its end in the background; `wait_tokens(n)` waits until n tokens have come."""

    def __init__(self, response: requests.Response):
        super().__init__(daemon=True)
        self.response, self.events, self.error = response, [], None
        self.start()

    def run(self) -> None:
        try:
            self.events.extend(events(self.response))
        except requests.RequestException as error:
            self.error = error

    def wait_tokens(self, count: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while sum(kind == "token" for _, kind, _ in list(self.events)) < count:
            assert self.is_alive() and time.monotonic() < deadline, (self.events[-3:], self.error)
            time.sleep(0.02)

    @property
    def text(self) -> str:
        return "".join(data["text"] for _, kind, data in list(self.events) if kind == "token")


def _slow(words: int) -> str:
    return "#slow " + " ".join(f"w{i}" for i in range(words))


def _ids(log: list[Event]) -> list[int]:
    return [seq for seq, _, _ in log]


def test_issue_34_the_sweep_numbers_the_ending_of_a_dead_run_logged_on_redis_after_its_last_event(
        settings, conversation):
    """Issue 12, 34 (D3), on Redis: the ending the sweep writes for a run whose process died comes after the run's
    last event, so a reader resuming there gets it. (In a topology: a process killed mid-answer, the worker's sweep,
    then `GET …/stream/?after=N`; here the dead run's log is written directly, and the sweep is the worker's.)"""
    _needed(_redis_unreachable())
    settings.REDIS_URL = REDIS_URL
    log_stores.reset()
    try:
        run = TurnRun.objects.create(id=uuid.uuid4(), conversation=conversation,
                                     started_at=timezone.now() - timedelta(hours=1))  # its lease long gone
        log_stores.store().write([log_stores.Batch(run.pk, conversation.owner_id, [
            (seq, TurnEvent(EventType.TOKEN, {"node": 1, "text": f"w{seq} "})) for seq in (1, 2, 3)])])
        recovery.sweep()
        after = log_stores.store().read(run.pk, 3, owner=conversation.owner_id)
    finally:
        settings.REDIS_URL = ""
        log_stores.reset()
    assert [(seq, event.type, event.data["code"]) for seq, event in after] == [(4, "error", "interrupted")]


def test_issue_34_a_turn_started_through_one_process_is_followed_resumed_and_stopped_through_another(
        lb, user):
    """Issue 34, 12 (T3): followed, cut, resumed after N (no gap, no duplicate) and stopped through app-2 while
    app-1 runs it, all through HAProxy; the node ends failed/cancelled and keeps what was streamed; the log read
    afterwards is the whole log, the one app-1's own stream and app-2's pieces saw; and a chat socket through
    HAProxy runs the next turn."""
    conversation = services.conversation_create(owner=user, title=f"across ({_store(lb)})")
    auth = {"Authorization": f"Token {Token.objects.get_or_create(user=user)[0].key}"}
    turn, stream = f"/api/conversations/{conversation.pk}/turns/", f"/api/conversations/{conversation.pk}/stream/"

    started = requests.post(lb.url(turn), json={"content": _slow(80)}, headers={**auth, **SSE, **A}, stream=True,
                            timeout=60)
    assert started.headers.get("X-Arbor-Server") == "app-1"
    own = Reader(started)
    own.wait_tokens(3)

    followed = requests.get(lb.url(stream), headers={**auth, **SSE, **B}, stream=True, timeout=60)
    assert followed.headers.get("X-Arbor-Server") == "app-2"
    first: list[Event] = []
    for event in events(followed):
        first.append(event)
        if len(first) == 8:
            break
    followed.close()  # the cut
    cut = first[-1][0]

    resumed = requests.get(lb.url(f"{stream}?after={cut}"), headers={**auth, **SSE, **B}, stream=True, timeout=60)
    assert resumed.headers.get("X-Arbor-Server") == "app-2"
    rest = events(resumed)
    after: list[Event] = [next(rest) for _ in range(3)]
    stopped = requests.post(lb.url(f"/api/conversations/{conversation.pk}/stop/"), headers={**auth, **B}, timeout=60)
    after += list(rest)
    own.join(30)

    assert stopped.status_code == 200 and stopped.headers.get("X-Arbor-Server") == "app-2", stopped.text
    assert (stopped.json()["status"], stopped.json()["failure_reason"]) == ("failed", "cancelled")
    joined = first + after
    assert _ids(joined) == list(range(1, len(joined) + 1)), "resumed after the cut: no gap, no duplicate"
    assert joined[-1][1] == "error" and joined[-1][2]["code"] == "cancelled", joined[-2:]
    assert own.events == joined, "app-1's own stream saw the same log as app-2's pieces"
    whole = list(events(requests.get(lb.url(f"{stream}?after=0"), headers={**auth, **SSE}, stream=True, timeout=60)))
    assert whole == joined, "the log read afterwards is whole"

    node = Node.objects.get(pk=stopped.json()["id"])
    assert (node.status, node.failure_reason) == ("failed", "cancelled")
    streamed = "".join(data["text"] for _, kind, data in joined if kind == "token")
    assert streamed and it.answer_text(node.received) == streamed, "the stopped node keeps what was streamed"

    socket = websocket.create_connection(lb.url(f"/ws/conversations/{conversation.pk}/", "ws"), timeout=30,
                                         origin=lb.url(""), cookie=session_cookie(user).decode())
    try:
        socket.send(json.dumps({"type": "ask", "content": "and through the balancer's socket?"}))
        seen = []
        while not seen or seen[-1]["type"] not in ENDINGS:
            seen.append(json.loads(socket.recv()))
    finally:
        socket.close()
    assert seen[-1]["type"] == "done", seen[-3:]


@pytest.mark.parametrize("topology", ["database"], indirect=True)  # the log's store plays no part in what is kept
def test_issue_34_kill_9_of_the_process_running_a_turn_loses_at_most_what_d3_allows(lb, user):
    """Issue 34, D3: app-1 is killed (`kill -9`) mid-answer. app-2's follower ends (it does not hang); the worker's
    sweep fails the node as interrupted, keeping the text saved up to ARBOR_PARTIAL_SAVE_SECONDS before the kill
    (a prefix of what the client had seen); the next turns through HAProxy are answered, by the living processes."""
    conversation = services.conversation_create(owner=user, title="killed")
    auth = {"Authorization": f"Token {Token.objects.get_or_create(user=user)[0].key}"}
    with worker(lb):
        _kill_mid_answer(lb, conversation, auth)


def _kill_mid_answer(lb: Topology, conversation, auth: dict[str, str]) -> None:

    started = requests.post(lb.url(f"/api/conversations/{conversation.pk}/turns/"), json={"content": _slow(300)},
                            headers={**auth, **SSE, **A}, stream=True, timeout=60)
    assert started.headers.get("X-Arbor-Server") == "app-1"
    own = Reader(started)
    own.wait_tokens(5)
    follower = Reader(requests.get(lb.url(f"/api/conversations/{conversation.pk}/stream/"),
                                   headers={**auth, **SSE, **B}, stream=True, timeout=60))
    own.wait_tokens(30)
    seen = own.text
    lb.kill9("app-1")
    killed_at = time.monotonic()
    node_id = next(data["node"] for _, kind, data in own.events if kind == "token")

    follower.join(LEASE_SECONDS + 15)
    assert not follower.is_alive(), "app-2's follower of the dead turn ended"
    ended_after = time.monotonic() - killed_at
    assert _ids(follower.events) == list(range(1, len(follower.events) + 1)), "no gap, no duplicate"
    deadline = time.monotonic() + LEASE_SECONDS + 20
    while Node.objects.get(pk=node_id).status == Node.Status.PENDING:
        assert time.monotonic() < deadline, "the worker's sweep never failed the dead turn's node"
        time.sleep(0.2)
    node = Node.objects.get(pk=node_id)
    assert (node.status, node.failure_reason) == ("failed", "interrupted")
    kept = it.answer_text(node.received)
    assert seen.startswith(kept) or kept.startswith(seen), (seen[-80:], kept[-80:])
    lost = len(seen.split()) - len(kept.split())
    allowed = (PARTIAL_SAVE_SECONDS + 0.5) / WORD_SECONDS  # D3: up to the save interval, and the last batch
    assert lost <= allowed, f"{lost} words lost (allowed {allowed:.0f})"
    assert len(kept.split()) > 5, "the text saved before the kill is kept"

    # D3: the conversation takes a new turn within the lease (the sweep holds it a moment while it recovers);
    # round robin would give app-1 its share: the health check, or HAProxy's retry, takes it out.
    answered = []
    while len(answered) < 3:
        again = requests.post(lb.url(f"/api/conversations/{conversation.pk}/turns/"),
                              json={"content": f"still there {len(answered)}?"}, headers=auth, timeout=60)
        if again.status_code == 409 and not answered and time.monotonic() - killed_at < LEASE_SECONDS + 30:
            time.sleep(0.2)
            continue
        assert again.status_code == 201, (answered, again.headers.get("X-Arbor-Server"), again.text)
        answered.append(again.headers.get("X-Arbor-Server"))
    accepted_after = time.monotonic() - killed_at
    assert "app-1" not in answered and None not in answered, answered
    print(f"\nkill -9: app-2's follower ended {ended_after:.1f} s after the kill (lease {LEASE_SECONDS} s), the "
          f"next turns were answered {accepted_after:.1f} s after it; "
          f"its last event {follower.events[-1][1] if follower.events else None}; {len(seen.split())} words seen, "
          f"{len(kept.split())} kept, {lost} lost")




@pytest.mark.parametrize("topology", ["database"], indirect=True)
def test_issue_34_a_follower_resumed_after_the_sweep_gets_the_interrupted_ending(lb, user):
    """Issue 12, 34 (D3): the process running a turn is killed mid-answer while no worker runs, so app-2's
    follower ends because the run's lock ran out, before any ending is written. Once the worker's sweep has failed
    the node, the follower resumes through app-2 after the last event it had and gets the rest of the log: the
    `interrupted` ending."""
    runner = next(app for app, (pid, _) in lb.apps.items() if app != "app-2" and alive(pid))  # app-1 may be killed
    conversation = services.conversation_create(owner=user, title="killed, then resumed")
    auth = {"Authorization": f"Token {Token.objects.get_or_create(user=user)[0].key}"}
    stream = f"/api/conversations/{conversation.pk}/stream/"

    started = requests.post(lb.url(f"/api/conversations/{conversation.pk}/turns/"), json={"content": _slow(300)},
                            headers={**auth, **SSE, "X-Arbor-Server": runner}, stream=True, timeout=60)
    assert started.headers.get("X-Arbor-Server") == runner
    own = Reader(started)
    own.wait_tokens(5)
    follower = Reader(requests.get(lb.url(stream), headers={**auth, **SSE, **B}, stream=True, timeout=60))
    own.wait_tokens(10)
    lb.kill9(runner)  # no worker runs yet: nothing sweeps
    node_id = next(data["node"] for _, kind, data in own.events if kind == "token")
    follower.join(LEASE_SECONDS + 15)
    assert not follower.is_alive(), "app-2's follower of the dead turn ended"
    assert follower.events and follower.events[-1][1] == "token", "it ended before any ending was written"
    with worker(lb):
        deadline = time.monotonic() + 60
        while Node.objects.get(pk=node_id).status == Node.Status.PENDING:
            assert time.monotonic() < deadline, "the worker's sweep never failed the dead turn's node"
            time.sleep(0.2)
        while TurnRun.objects.get(conversation=conversation).ended_at is None:  # the sweep ends the run's log next
            assert time.monotonic() < deadline, "the worker's sweep never ended the dead turn's run"
            time.sleep(0.1)
    assert Node.objects.get(pk=node_id).failure_reason == "interrupted"

    last = follower.events[-1][0]
    resumed = requests.get(lb.url(f"{stream}?after={last}"), headers={**auth, **SSE, **B}, stream=True, timeout=60)
    assert resumed.headers.get("X-Arbor-Server") == "app-2"
    rest = list(events(resumed))
    assert _ids(follower.events + rest) == list(range(1, last + len(rest) + 1)), "no gap, no duplicate"
    assert rest and rest[-1][1] == "error" and rest[-1][2]["code"] == "interrupted", rest[-2:]
