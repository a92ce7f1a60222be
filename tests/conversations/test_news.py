"""Issue 34, push instead of polling, inside one process: the news listener (`config.news`) survives losing its
connection, a writer's NOTIFY travels in its own statement and only once it commits, and a mirror of another
process's run (`log.mirrored`) is filled by one reader however many follow it, and leaves memory when nobody does.
A run "of another process" is one written here through a log that keeps nothing in this process's memory (as
recovery writes one), so everything read comes from the store."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest
from django.db import connection, transaction

from config import news
from config.together import together
from conversations.models import TurnRun
from conversations.turns import log, log_stores
from conversations.turns.events import EventType, TurnEvent

pytestmark = pytest.mark.django_db(transaction=True)

WAIT = 10


def _heard(channel: str, key: str) -> threading.Event:
    heard = threading.Event()
    news.subscribe(channel, key, heard.set)
    return heard


def _listening() -> None:
    deadline = time.monotonic() + WAIT
    while not news._listener.listening.is_set():
        assert time.monotonic() < deadline, "the listener never listened"
        time.sleep(0.02)


def test_issue_34_news_is_sent_when_the_write_commits_never_before():
    """Issue 34: a notice joins its writer's transaction: waiters hear nothing while it is open, and hear it once
    it commits (a reader woken early would find nothing and wait again; one woken never would miss the write)."""
    key = uuid.uuid4().hex
    heard = _heard("arbor_test_news", key)
    _listening()
    heard.clear()
    with transaction.atomic():
        news.announce("arbor_test_news", key)
        assert not heard.wait(0.5), "heard before the commit"
    assert heard.wait(WAIT), "never heard after the commit"


def test_issue_34_a_batched_write_carries_its_notice_in_its_own_statement():
    """Issue 34: in a `together` batch the NOTIFY is part of the one statement (no extra round trip), with or
    without other writes in it."""
    key = uuid.uuid4().hex
    heard = _heard("arbor_test_news", key)
    _listening()
    heard.clear()
    run_id = uuid.uuid4()
    statements = []

    def record(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record), together() as writes:
        writes.update(TurnRun.objects.filter(pk=run_id), stop_requested=True)
        writes.notify("arbor_test_news", key)
    assert len(statements) == 1 and "pg_notify" in statements[0]
    assert heard.wait(WAIT)
    heard.clear()
    with together() as writes:
        writes.notify("arbor_test_news", key)
    assert heard.wait(WAIT), "a batch of only a notice sends it too"


def test_issue_34_the_listener_comes_back_after_losing_its_connection_and_wakes_everyone_once():
    """Issue 34: PostgreSQL restarted or killed the listener's connection: it connects again, wakes every waiter
    once (news said meanwhile was lost: they look for themselves) and hears news again."""
    key = uuid.uuid4().hex
    heard = _heard("arbor_test_news", key)
    _listening()
    heard.clear()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", (news._listener._backend,))
    assert heard.wait(WAIT), "not woken after the listener came back"
    _listening()
    heard.clear()
    news.announce("arbor_test_news", key)
    assert heard.wait(WAIT), "no news after the listener came back"


def test_issue_34_a_waiter_that_stopped_hears_nothing_more():
    """Issue 34: unsubscribing stops the callbacks (a closed socket or a finished reader leaves no waiter)."""
    key = uuid.uuid4().hex
    calls = []
    stop = news.subscribe("arbor_test_news", key, lambda: calls.append(1))
    _listening()
    stop()
    news.announce("arbor_test_news", key)
    other = _heard("arbor_test_news", key)
    news.announce("arbor_test_news", key)
    assert other.wait(WAIT)
    assert calls == []


def _held_by(conversation, run: TurnRun) -> None:
    """The run holds the conversation's lock (its process is alive): a reader does not give up on it."""
    conversation.turn_token = run.pk
    conversation.turn_expires_at = run.started_at.replace(year=2100)
    conversation.save(update_fields=["turn_token", "turn_expires_at"])


def test_issue_34_many_followers_of_another_processs_run_share_one_reader(conversation, monkeypatch):
    """Issue 34: 50 async followers of a run written elsewhere get every event in order to its ending, through one
    mirror read by one thread; each store read is woken by the writer's news (a handful, not ten a second each)."""
    run = TurnRun.objects.create(id=uuid.uuid4(), conversation=conversation)
    _held_by(conversation, run)
    writer = log.TurnLog(run.pk, owner=conversation.owner_id)
    log._local.pop(run.pk)  # the writer's copy is "in the other process"
    writer._local = None
    reads = []
    store = log_stores.store()
    original = store.read
    monkeypatch.setattr(store, "read", lambda run_id, after, owner: reads.append(after) or original(run_id, after,
                                                                                          owner=owner))

    async def scenario() -> list[list[str]]:
        async def follow() -> list[str]:
            from conversations.turns.streaming import follow_log

            owner = conversation.owner_id
            return [event.data.get("text", event.type) async for _, event in follow_log(run.pk, owner=owner)]

        followers = [asyncio.create_task(follow()) for _ in range(50)]
        await asyncio.sleep(0.3)
        for word in ("a", "b", "c"):
            await asyncio.to_thread(writer.append, TurnEvent(EventType.TOKEN, {"text": word, "node": 1}))
            await asyncio.to_thread(writer._write_out)
            await asyncio.sleep(0.2)
        await asyncio.to_thread(writer.append, TurnEvent(EventType.DONE, {"answer": "abc", "head": 1, "nodes": [1]}))
        return await asyncio.wait_for(asyncio.gather(*followers), WAIT)

    seen = asyncio.run(scenario())
    writer.close()
    assert all(events == ["a", "b", "c", "done"] for events in seen), seen[0]
    mirrors = [t for t in threading.enumerate() if t.name == "arbor-log-mirror"]
    assert len(mirrors) <= 1, "one reader for the run, not one a follower"
    assert len(reads) < 20, f"{len(reads)} store reads for 50 followers of 4 writes"


def test_issue_34_a_mirror_nobody_follows_stops_reading_and_the_next_follower_starts_afresh(
        conversation, monkeypatch):
    """Issue 34: a follower that leaves early leaves a mirror nobody follows; after MIRROR_IDLE_SECONDS its reader
    stops and the mirror leaves memory; the next follower gets the whole run again from the store."""
    monkeypatch.setattr(log, "MIRROR_IDLE_SECONDS", 0.2)
    run = TurnRun.objects.create(id=uuid.uuid4(), conversation=conversation)
    _held_by(conversation, run)
    writer = log.TurnLog(run.pk, owner=conversation.owner_id)
    log._local.pop(run.pk)
    writer._local = None
    writer.append(TurnEvent(EventType.TOKEN, {"text": "a", "node": 1}))
    writer._write_out()

    async def first_event() -> str:
        from conversations.turns.streaming import follow_log

        async for _, event in follow_log(run.pk, owner=conversation.owner_id):
            return event.data["text"]
        return ""

    assert asyncio.run(first_event()) == "a"
    mirror = log._local.get(run.pk)
    assert mirror is not None
    deadline = time.monotonic() + WAIT
    while run.pk in log._local:
        assert time.monotonic() < deadline, "the idle mirror stayed"
        time.sleep(0.05)
    assert mirror.ended_at is not None
    writer.append(TurnEvent(EventType.DONE, {"answer": "a", "head": 1, "nodes": [1]}))
    writer.close()

    async def everything() -> list[str]:
        from conversations.turns.streaming import follow_log

        owner = conversation.owner_id
        return [event.data.get("text", event.type) async for _, event in follow_log(run.pk, owner=owner)]

    assert asyncio.run(asyncio.wait_for(everything(), WAIT)) == ["a", "done"]
