"""Issue 12, resumable streams: a turn's numbered events reach readers in other processes through a store,
Redis Streams when `REDIS_URL` is set, else the database; and a stream goes on when Redis stops or restarts.

A reader "in another process" is simulated by hiding this process's in-memory copy of the run
(`elsewhere`): it then reads the store, as a web process that does not run the turn does. Redis is a
throwaway `redis-server` each test starts on a port of its own, so stopping it harms nothing else.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
import uuid

import pytest

from conversations import items as it
from conversations.models import TurnLogEntry, TurnRun
from conversations.turns import detached, log, log_stores
from conversations.turns.events import EventType, TurnEvent
from conversations.turns.start import turn_ask
from tests.conversations.helpers import head

pytestmark = pytest.mark.django_db(transaction=True)

WORDS = [f"w{i}" for i in range(40)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ThrowawayRedis:
    def __init__(self):
        self.port = _free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> ThrowawayRedis:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True).stdout != b"PONG\n":
            assert time.monotonic() < deadline, "the throwaway redis-server did not start"
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def xlen(self, run_id) -> int:
        out = subprocess.run(["redis-cli", "-p", str(self.port), "xlen", log_stores.RedisStore.key(run_id)],
                             capture_output=True, text=True).stdout
        return int(out.strip() or 0)


@pytest.fixture
def redis_server(settings):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = ThrowawayRedis().start()
    settings.REDIS_URL = server.url
    log_stores.reset()
    yield server
    server.stop()
    log_stores.reset()


@pytest.fixture
def database_store(settings):
    settings.REDIS_URL = ""
    log_stores.reset()
    yield
    log_stores.reset()


def _launch(conversation, words=WORDS):
    return detached.launch(turn_ask(user=conversation.owner, conversation_id=conversation.pk,
                                    content="#slow " + " ".join(words)))


def _elsewhere(run_id):
    """Read the run as a process that does not run it would: from the store, not this process's memory."""
    log._local.pop(run_id, None)


def _text(entries) -> str:
    return "".join(event.data["text"] for _, event in entries if event.type == EventType.TOKEN)


def _numbered(entries) -> bool:
    return [seq for seq, _ in entries] == list(range(1, len(entries) + 1))


@pytest.mark.parametrize("store", ["database_store", "redis_server"])
def test_issue_12_a_reader_in_another_process_follows_the_turn_live_from_the_store(conversation, settings, store,
                                                                                    request):
    """Two readers of one running turn, one here (memory) and one elsewhere (the store), get the same
    numbered events; with Redis the entries are in its stream and none in the database."""
    server = request.getfixturevalue(store)
    settings.ARBOR_ECHO_WORD_SECONDS = 0.02
    run_id = _launch(conversation)
    here: list = []
    reading = threading.Thread(target=lambda: here.extend(log.follow(run_id, owner=conversation.owner_id)))
    reading.start()
    first = next(log.follow(run_id, owner=conversation.owner_id))  # the turn is under way
    _elsewhere(run_id)
    there = list(log.follow(run_id, owner=conversation.owner_id))
    reading.join(30)
    assert there[0] == first and there[-1][1].type == EventType.DONE and _numbered(there)
    assert [(seq, e.type, e.data) for seq, e in there] == [(seq, e.type, e.data) for seq, e in here]
    assert _text(there) == it.answer_text(head(conversation).received)
    if store == "redis_server":
        owner = conversation.owner_id
        stored = log_stores.store().read(run_id, 0, owner=owner)  # Redis's entries, with none in the database
        assert not TurnLogEntry.objects.filter(run_id=run_id).exists()
    else:
        stored = _stored(run_id)
    assert stored == there
    # Issue 13: each run of tokens went in as one row or stream entry, not one per token.
    rows = server.xlen(run_id) if store == "redis_server" else TurnLogEntry.objects.filter(run_id=run_id).count()
    assert rows < len(there) / 3, (rows, len(there))


def _stored(run_id) -> list:
    """The run's entries as kept in the database, unpacked."""
    rows = TurnLogEntry.objects.filter(run_id=run_id).order_by("seq").values_list("seq", "type", "data")
    return log_stores.unpacked([(seq, TurnEvent(EventType(kind), data)) for seq, kind, data in rows], 0)


@pytest.mark.parametrize("store", ["database_store", "redis_server"])
def test_issue_12_resume_from_the_store_after_any_number_gives_exactly_the_rest(conversation, settings, store,
                                                                              request):
    """Also from inside a packed run of tokens (issue 13: one row or stream entry per run)."""
    request.getfixturevalue(store)
    settings.ARBOR_ECHO_WORD_SECONDS = 0.01
    run_id = _launch(conversation)
    whole = list(log.follow(run_id, owner=conversation.owner_id))
    _elsewhere(run_id)
    for cut in range(len(whole) + 1):
        assert log.read(run_id, owner=conversation.owner_id, after=cut) == whole[cut:]


@pytest.mark.slow
def test_issue_12_redis_stopped_and_restarted_mid_turn_loses_no_event(conversation, settings, redis_server):
    """Redis dies while a turn streams and comes back (empty, as a restarted cache does): the writer puts
    what Redis cannot take in the database, and a reader elsewhere, following all along, gets every event
    once, in order, to the end; the node has the whole answer."""
    settings.ARBOR_ECHO_WORD_SECONDS = 0.1
    run_id = _launch(conversation, [f"w{i}" for i in range(80)])
    first = next(log.follow(run_id, owner=conversation.owner_id))
    _elsewhere(run_id)
    there: list = [first]
    owner = conversation.owner_id
    reading = threading.Thread(target=lambda: there.extend(log.follow(run_id, owner=owner, after=first[0])))
    reading.start()
    time.sleep(1.5)
    redis_server.stop()
    time.sleep(2)
    redis_server.start()
    reading.join(60)
    assert not reading.is_alive()
    assert there[-1][1].type == EventType.DONE and _numbered(there), [seq for seq, _ in there]
    assert _text(there) == it.answer_text(head(conversation).received)
    assert "w78 w79" in _text(there)
    fallen_back = TurnLogEntry.objects.filter(run_id=run_id).count()
    assert fallen_back > 0, "the events written while Redis was away are in the database"
    deadline = time.monotonic() + 5  # marked just after its ending is written
    while TurnRun.objects.get(pk=run_id).ended_at is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_issue_12_a_redis_that_cannot_be_reached_at_all_leaves_the_database_log(conversation, settings):
    """REDIS_URL set but nothing listening: turns and their streams work as on the embedded default."""
    settings.REDIS_URL = f"redis://127.0.0.1:{_free_port()}/0"
    settings.ARBOR_ECHO_WORD_SECONDS = 0.01
    log_stores.reset()
    try:
        run_id = _launch(conversation, WORDS[:5])
        here = list(log.follow(run_id, owner=conversation.owner_id))
        _elsewhere(run_id)
        assert list(log.follow(run_id, owner=conversation.owner_id)) == here and here[-1][1].type == EventType.DONE
        assert _stored(run_id) == here
    finally:
        log_stores.reset()


def test_issue_12_tokens_a_paused_model_left_waiting_reach_other_processes_without_the_next_event(
        conversation, database_store):
    """Tokens go to the store in batches; when the model then goes quiet (thinking before a tool call), the
    flusher writes them within FLUSH_SECONDS, not when the model speaks again."""
    run_id = TurnRun.objects.create(id=uuid.uuid4(), conversation=conversation).pk
    writer = log.TurnLog(run_id, owner=conversation.owner_id)
    for text in "abc":
        writer.append(TurnEvent(EventType.TOKEN, {"text": text, "node": 1}))
    store = log_stores.store()
    deadline = time.monotonic() + 3
    while _text(store.read(run_id, 0, owner=conversation.owner_id)) != "abc":
        assert time.monotonic() < deadline, store.read(run_id, 0, owner=conversation.owner_id)
        time.sleep(0.05)
    _elsewhere(run_id)
    owner = conversation.owner_id
    assert _text(log.read(run_id, owner=owner)) == "abc" and _numbered(log.read(run_id, owner=owner))
    writer.close()


@pytest.mark.parametrize("store", ["database_store", "redis_server"])
async def test_issue_12_async_readers_elsewhere_follow_through_a_thread(conversation, settings, store, request):
    """A socket or stream in a process that does not run the turn reads the store in a thread of its own
    (`streaming.follow_log`), getting the same events as a reader here."""
    from asgiref.sync import sync_to_async

    from conversations.turns.streaming import follow_log

    await sync_to_async(request.getfixturevalue)(store)
    settings.ARBOR_ECHO_WORD_SECONDS = 0.02
    run_id = await sync_to_async(_launch)(conversation, WORDS[:10])
    here = [entry async for entry in follow_log(run_id, owner=conversation.owner_id)]
    _elsewhere(run_id)
    there = [entry async for entry in follow_log(run_id, owner=conversation.owner_id)]
    assert there == here and there[-1][1].type == EventType.DONE and _numbered(there)


def test_issue_34_a_quick_turns_log_reaches_redis_in_one_round_trip_kept_for_the_retention(conversation, settings,
                                                                                           redis_server):
    """A quick turn's events go to Redis with its ending, in one pipeline that also sets the stream's retention
    (a round trip of its own after them cost every turn one more); the stream then lives for the retention,
    not the running turn's lease, and holds the whole turn."""
    settings.ARBOR_TURN_LOG_RETENTION_SECONDS = 600

    def redis(*args: str) -> str:
        return subprocess.run(["redis-cli", "-p", str(redis_server.port), *args], capture_output=True, text=True,
                              check=True).stdout

    def commands() -> int:
        return sum(int(line.split("calls=")[1].split(",")[0]) for line in redis("info", "commandstats").splitlines()
                   if line.startswith("cmdstat_") and not line.startswith("cmdstat_info"))

    log_stores.store().client.ping()  # the store's connection is made before counting
    turn = turn_ask(user=conversation.owner, conversation_id=conversation.pk, content="a quick question")
    before = commands()
    run_id = detached.start(turn)
    events = [event for _, event in detached.run(turn, run_id)]
    written = commands() - before
    assert events[-1].type == EventType.DONE
    key = log_stores.RedisStore.key(run_id)
    assert 0 < int(redis("ttl", key)) <= 600, "kept for the retention once the turn ended"
    entries = redis_server.xlen(run_id)
    assert written == entries + 1, f"{written} commands: {entries} entries and one expiry"
    _elsewhere(run_id)
    assert [event for _, event in log.read(run_id, owner=conversation.owner_id)] == events


@pytest.mark.parametrize("store", ["database_store", "redis_server"])
def test_issue_34_the_tokens_of_every_run_of_a_process_go_to_the_store_in_one_write(conversation, settings, store,
                                                                                    request, monkeypatch):
    """Three turns stream at once: the flusher writes their waiting tokens in one store write (one Redis pipeline,
    or one statement) rather than one a run, and each run's log, read from the store, is the whole of it."""
    from conversations.services import conversation_create

    request.getfixturevalue(store)
    settings.ARBOR_ECHO_WORD_SECONDS = 0.03
    settings.ARBOR_MAX_CONCURRENT_TURNS_PER_USER = 10
    kept = log_stores.store()
    writes: list[set] = []
    real_write = type(kept).write

    def write(self, batches):
        writes.append({batch.run_id for batch in batches})
        return real_write(self, batches)

    monkeypatch.setattr(type(kept), "write", write)
    others = [conversation_create(owner=conversation.owner, title=f"c{i}") for i in range(2)]
    runs = [_launch(c, WORDS[:30]) for c in (conversation, *others)]
    here = {run_id: list(log.follow(run_id, owner=conversation.owner_id)) for run_id in runs}
    assert any(len(runs_written) >= 2 for runs_written in writes), "several runs' tokens went in one write"
    for run_id in runs:
        _elsewhere(run_id)
        assert log_stores.store().read(run_id, 0, owner=conversation.owner_id) == here[run_id]
        assert here[run_id][-1][1].type == EventType.DONE and _numbered(here[run_id])
