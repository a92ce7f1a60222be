"""Issue 12: detached turns and their numbered event log.

A turn launched apart from its client runs to its end whatever the client does; every event has a
number; a reader resuming after any number gets exactly the rest; two readers get the same events.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from config import news
from conversations import items as it
from conversations.models import Node, TurnLogEntry, TurnRun
from conversations.turns import detached, log
from conversations.turns.events import EventType, TurnEvent
from conversations.turns.start import turn_ask
from tests.conversations.helpers import head

pytestmark = pytest.mark.django_db(transaction=True)

SLOW = "#slow " + " ".join(f"w{i}" for i in range(30))


def _launch(conversation, content: str = SLOW):
    return detached.launch(turn_ask(user=conversation.owner, conversation_id=conversation.pk, content=content))


def _text(entries) -> str:
    return "".join(event.data["text"] for _, event in entries if event.type == EventType.TOKEN)


def test_issue_12_a_reader_that_leaves_early_does_not_end_the_turn(conversation, settings):
    """The client reads the first tokens and goes away; the turn completes, succeeded with the whole
    answer, and the log replays it from the start."""
    settings.ARBOR_ECHO_WORD_SECONDS = 0.02
    run_id = _launch(conversation)
    reader = log.follow(run_id, owner=conversation.owner_id)
    first = next(reader)
    assert first[0] == 1 and first[1].type == EventType.TOKEN
    reader.close()  # the client left
    whole = list(log.follow(run_id, owner=conversation.owner_id))
    assert whole[-1][1].type == EventType.DONE
    node = head(conversation)
    assert node.status == "succeeded" and it.answer_text(node.received) == _text(whole)
    assert _text(whole).startswith(f"echo: {SLOW}")
    assert [seq for seq, _ in whole] == list(range(1, len(whole) + 1)), "numbered 1, 2, 3, ... without gaps"
    assert TurnRun.objects.get(pk=run_id).ended_at is not None


def test_issue_12_resuming_after_any_number_gives_exactly_the_rest(conversation, settings):
    """1,000 random cut points over a finished turn's log: nothing duplicated, nothing missing."""
    settings.ARBOR_ECHO_WORD_SECONDS = 0.03
    run_id = _launch(conversation, "#slow " + " ".join(f"w{i}" for i in range(60)))
    whole = list(log.follow(run_id, owner=conversation.owner_id))
    full = _text(whole)
    rng = random.Random(12)
    duplicated = missing = 0
    for _ in range(1000):
        cut = rng.randrange(0, len(whole))
        owner = conversation.owner_id
        seen = _text(whole[:cut]) + _text(log.read(run_id, owner=owner, after=whole[cut - 1][0] if cut else 0))
        duplicated += len(seen) > len(full)
        missing += len(seen) < len(full)
        assert seen == full
    print(f"\nresume at 1000 random cut points over {len(whole)} events: {duplicated} duplicated, "
          f"{missing} missing")


def test_issue_12_two_readers_following_live_get_the_same_events(conversation, settings):
    settings.ARBOR_ECHO_WORD_SECONDS = 0.03
    run_id = _launch(conversation)
    got: list[list] = [[], []]

    def read(into):
        into.extend((seq, event.type, event.data) for seq, event in log.follow(run_id, owner=conversation.owner_id))

    readers = [threading.Thread(target=read, args=(got[i],)) for i in range(2)]
    for reader in readers:
        reader.start()
        time.sleep(0.2)  # the second joins late: it replays, then follows
    for reader in readers:
        reader.join(30)
    assert got[0] == got[1] and got[0][-1][1] == EventType.DONE


def test_issue_12_a_stop_asked_from_elsewhere_ends_the_turn_as_cancelled(conversation, settings):
    settings.ARBOR_ECHO_WORD_SECONDS = 0.05
    run_id = _launch(conversation, "#slow " + " ".join(f"w{i}" for i in range(200)))
    reader = log.follow(run_id, owner=conversation.owner_id)
    next(reader)
    asked = time.monotonic()
    assert detached.request_stop(conversation)
    rest = list(reader)
    took = time.monotonic() - asked
    ending = rest[-1][1]
    assert ending.type == EventType.ERROR and ending.data["code"] == "cancelled"
    node = Node.objects.get(pk=ending.data["node"])
    assert (node.status, node.failure_reason) == ("failed", "cancelled") and node.received
    assert took < 2, f"stopped after {took:.2f} s"
    assert detached.request_stop(conversation) is False, "nothing runs any more"


def test_issue_12_tokens_reach_readers_here_at_once_and_the_store_in_one_batch(conversation):
    """Each token is numbered and shared with this process's readers as it comes; the store gets the tokens
    in one batched write, before the event that follows them."""
    run = TurnRun.objects.create(id=uuid.uuid4(), conversation=conversation)
    writer = log.TurnLog(run.pk, owner=conversation.owner_id)
    for text, node in [("a", 1), ("b", 1), ("c", 2)]:
        writer.append(TurnEvent(EventType.TOKEN, {"text": text, "node": node}))
    owner = conversation.owner_id
    assert [(seq, e.data["text"]) for seq, e in log.read(run.pk, owner=owner)] == [(1, "a"), (2, "b"), (3, "c")]
    with CaptureQueriesContext(connection) as queries:
        writer.append(TurnEvent(EventType.DONE, {"answer": "abc", "head": 2, "nodes": [1, 2]}))
    inserts = [q["sql"] for q in queries if q["sql"].lstrip().upper().startswith("INSERT")]
    assert len(inserts) <= 1, inserts
    writer.close()
    log._local.pop(run.pk)  # read as another process does: from the store
    assert [(seq, e.type, e.data.get("text")) for seq, e in log.read(run.pk, owner=conversation.owner_id)] == [
        (1, "token", "a"), (2, "token", "b"), (3, "token", "c"), (4, "done", None)]
    # Issue 13: a run of one node's tokens is one row, numbered by its last token: a, b | c | done.
    assert list(TurnLogEntry.objects.filter(run=run).order_by("seq").values_list("seq", flat=True)) == [2, 3, 4]


def test_issue_12_old_logs_are_forgotten_and_then_no_run_is_shown(conversation, settings):
    settings.ARBOR_ECHO_WORD_SECONDS = 0
    run_id = _launch(conversation, "hi")
    list(log.follow(run_id, owner=conversation.owner_id))
    assert log.latest_run(conversation).pk == run_id
    settings.ARBOR_TURN_LOG_RETENTION_SECONDS = -1
    assert log.latest_run(conversation) is None
    assert log.forget_old() >= 1 and not TurnLogEntry.objects.filter(run_id=run_id).exists()


def test_issue_12_stream_answers_204_when_no_turn_runs_and_stop_409(conversation, api):
    assert api.get(f"/api/conversations/{conversation.pk}/stream/").status_code == 204
    response = api.post(f"/api/conversations/{conversation.pk}/stop/")
    assert response.status_code == 409 and response.json()["error"]["code"] == "no_turn_running"
    for after in ("-1", ""):  # an empty `after` is no number either (the fuzzer's ST201 found it taken as 0)
        bad = api.get(f"/api/conversations/{conversation.pk}/stream/?after={after}")
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "bad_input", after
    # An empty Last-Event-ID is none, as an EventSource may send it.
    assert api.get(f"/api/conversations/{conversation.pk}/stream/", HTTP_LAST_EVENT_ID="").status_code == 204


def test_issue_12_stop_over_the_api_answers_the_stopped_node(conversation, api, settings, other_api):
    """`POST …/stop/` from any client of the owner: 200 with the node, failed/cancelled, its partial kept."""
    settings.ARBOR_ECHO_WORD_SECONDS = 0.05
    run_id = _launch(conversation, "#slow " + " ".join(f"w{i}" for i in range(200)))
    next(log.follow(run_id, owner=conversation.owner_id))
    assert other_api.post(f"/api/conversations/{conversation.pk}/stop/").status_code == 404
    response = api.post(f"/api/conversations/{conversation.pk}/stop/")
    assert response.status_code == 200
    body = response.json()
    assert (body["status"], body["failure_reason"]) == ("failed", "cancelled")
    # The stop is news to the turn (issue 34), so it ends within a word: its partial is what it had streamed.
    streamed = _text(log.read(run_id, owner=conversation.owner_id))
    assert streamed.startswith("echo: ") and it.answer_text(body["received"]) == streamed
    assert api.get(f"/api/conversations/{conversation.pk}/stream/").status_code == 200, "replayable a while"


def test_issue_12_a_stop_while_the_model_is_silent_ends_the_turn_without_waiting_it_out(conversation, settings):
    """The model sends a word, then nothing for 3 s: a stop asked from elsewhere ends the turn as
    failed/cancelled without waiting for the next word, keeping the word it had."""
    settings.ARBOR_ECHO_WORD_SECONDS = 3
    run_id = _launch(conversation, "#slow one two three")
    reader = log.follow(run_id, owner=conversation.owner_id)
    first = next(reader)
    asked = time.monotonic()
    assert detached.request_stop(conversation)
    rest = list(reader)
    took = time.monotonic() - asked
    print(f"\nstop while the model is silent -> cancelled: {took:.2f} s (the next word was 3 s away)")
    ending = rest[-1][1]
    assert ending.type == EventType.ERROR and ending.data["code"] == "cancelled"
    node = Node.objects.get(pk=ending.data["node"])
    assert (node.status, node.failure_reason) == ("failed", "cancelled")
    assert it.answer_text(node.received) == first[1].data["text"]
    assert took < 2.5, "it did not wait for the silent call's next word"


def _looks_for_a_stop(sql: str) -> bool:
    return sql.startswith("SELECT") and '"stop_requested"' in sql


def test_issue_34_a_running_turn_reads_no_stop_until_one_is_asked(conversation, settings, monkeypatch):
    """A stop is news: a turn streaming for 3 s asks the database for a stop only when one was announced (it
    asked every half second, 600 queries a second at 300 streams). Its look without news is pushed past the
    turn here; a stop asked meanwhile still ends it within a poll (the test above)."""
    monkeypatch.setattr(detached, "STOP_CHECK_SECONDS", 60)
    settings.ARBOR_ECHO_WORD_SECONDS = 0.1
    # The process listens first: a listener that starts mid-turn wakes every waiter once to look (news said before
    # its LISTEN would be lost), which is one look by design, not one this test is about.
    unsubscribe = news.subscribe(detached.STOP_NEWS, "before the turns", lambda: None)
    assert news.listening(10)
    unsubscribe()
    turn = turn_ask(user=conversation.owner, conversation_id=conversation.pk, content=SLOW)
    with CaptureQueriesContext(connection) as queries:
        events = detached.run_here(turn)
    assert events[-1].type == EventType.DONE and sum(e.type == EventType.TOKEN for e in events) >= 10
    assert not [q for q in queries.captured_queries if _looks_for_a_stop(q["sql"])]

    second = turn_ask(user=conversation.owner, conversation_id=conversation.pk, content=SLOW)
    def stop_from_elsewhere():
        try:
            detached.request_stop(conversation)
        finally:
            connection.close()  # this thread's own

    stopper = threading.Timer(0.5, stop_from_elsewhere)
    stopper.start()
    with CaptureQueriesContext(connection) as queries:
        ending = detached.run_here(second)[-1]
    stopper.join()
    assert ending.type == EventType.ERROR and ending.data["code"] == "cancelled", "the news of the stop came"
    looks = [q for q in queries.captured_queries if _looks_for_a_stop(q["sql"])]
    assert len(looks) == 1, "one look, when the stop was announced"


def test_issue_12_a_stop_while_a_tool_runs_ends_the_turn_without_waiting_for_it(conversation, settings,
                                                                                monkeypatch):
    """A tool that takes 5 s: a stop asked meanwhile ends the turn as failed/cancelled within about a
    second; the call has a result that says it was stopped while it ran (C4: no call without one)."""
    from conversations.tools import registry
    from conversations.tools.registry import Tool

    started = threading.Event()

    def slow(**_):
        started.set()
        time.sleep(5)
        return "late"

    monkeypatch.setitem(registry._TOOLS, "slow_tool", Tool("slow_tool", "Takes its time.", {"type": "object"}, slow))
    run_id = _launch(conversation, "#tool slow_tool {}")
    assert started.wait(30)
    asked = time.monotonic()
    assert detached.request_stop(conversation)
    entries = list(log.follow(run_id, owner=conversation.owner_id))
    took = time.monotonic() - asked
    print(f"\nstop while a tool runs -> cancelled: {took:.2f} s (the tool needed 5 s)")
    ending = entries[-1][1]
    assert ending.type == EventType.ERROR and ending.data["code"] == "cancelled"
    node = Node.objects.get(pk=ending.data["node"])
    (result,) = node.sent
    assert result["is_error"] and result["content"].startswith("stopped: the turn was stopped while slow_tool ran")
    assert took < 3, "it did not wait for the tool"


@pytest.mark.parametrize("broken", ["database", "bug"])
def test_issue_12_a_turn_that_breaks_says_what_was_recorded(conversation, monkeypatch, broken):
    """The database goes away (or a bug strikes) as the answer is being recorded: the turn's `error` event
    names the node that was written and says its text is kept, never "nothing changed"; the node is kept,
    failed/interrupted, and the conversation is free again."""
    from django.db import OperationalError

    from conversations.turns import records

    error = OperationalError("the connection is closed") if broken == "database" else RuntimeError("a bug")

    def fails(*args, **kwargs):
        raise error

    monkeypatch.setattr(records, "succeed", fails)
    turn = turn_ask(user=conversation.owner, conversation_id=conversation.pk, content="hello")
    events = detached.run_here(turn)
    ending = events[-1]
    node = Node.objects.get(conversation=conversation)
    assert ending.type == EventType.ERROR and ending.data["node"] == node.pk
    assert ending.data["code"] == ("unavailable" if broken == "database" else "server_error")
    assert f"Recorded: node(s) {node.pk}" in ending.data["message"]
    assert "nothing" not in ending.data["message"]
    assert (node.status, node.failure_reason) == ("failed", "interrupted")
    assert turn_ask(user=conversation.owner, conversation_id=conversation.pk, content="again") is not None


def test_issue_12_a_turn_that_breaks_before_writing_says_nothing_was_recorded(conversation, monkeypatch):
    from conversations.turns import records

    def fails(*args, **kwargs):
        raise RuntimeError("no node today")

    monkeypatch.setattr(records, "start", fails)
    ending = detached.run_here(turn_ask(user=conversation.owner, conversation_id=conversation.pk, content="hi"))[-1]
    assert ending.type == EventType.ERROR and ending.data["node"] is None
    assert "no node of this turn was recorded" in ending.data["message"]
    assert not Node.objects.filter(conversation=conversation).exists()


def test_issue_13_an_async_reader_gets_what_came_meanwhile_in_one_batch(conversation):
    """A busy loop reads a run's tokens in batches (one SSE write each): all that came since it last looked."""
    from conversations.turns.streaming import follow_log_batches

    run = TurnRun.objects.create(id=uuid.uuid4(), conversation=conversation)
    writer = log.TurnLog(run.pk, owner=conversation.owner_id)
    for k in range(5):
        writer.append(TurnEvent(EventType.TOKEN, {"text": f"w{k} ", "node": 1}))

    async def first_batch():
        async for batch in follow_log_batches(run.pk, owner=conversation.owner_id):
            return batch

    assert [seq for seq, _ in asyncio.run(first_batch())] == [1, 2, 3, 4, 5]
    writer.close()


def test_issue_13_a_reader_has_at_most_one_wake_waiting_in_its_loop():
    """Each token used to post a wake to every async reader's loop; now one waits at a time, however many
    tokens come before the loop runs it, and the next token after it ran posts the next."""
    loop = asyncio.new_event_loop()
    posted = []
    original = loop.call_soon_threadsafe
    loop.call_soon_threadsafe = lambda callback, *args: (posted.append(callback), original(callback, *args))
    try:
        wake = log._Wake(loop)
        for _ in range(100):
            wake.soon()
        assert len(posted) == 1 and not wake.event.is_set()
        loop.run_until_complete(asyncio.sleep(0))
        assert wake.event.is_set()
        wake.soon()
        assert len(posted) == 2
    finally:
        loop.close()


def test_issue_25_a_stop_during_an_automatic_compaction_ends_the_turn_without_waiting_for_the_summary(
        conversation, stub, settings):
    """C2, F1: the summarising call is a side call read like any round, so a stop asked while the provider is
    silent ends it within a poll: the summary node is recorded cancelled, the question is kept on a cancelled
    node where the head now is, and no root is made. The provider would have kept the summary 30 s."""
    from tests.conversations.test_compaction import STUB, _stub_compacting_soon
    from tests.support.openai_stub import Reply

    _stub_compacting_soon(conversation, settings, limit=200)
    old_head = head(conversation).pk
    stub.script(Reply.hang(30, then=Reply.text("a summary too late")))
    run_id = _launch(conversation, "and now?")
    deadline = time.monotonic() + 20
    while not Node.objects.filter(kind="compaction", status="pending").exists():
        assert time.monotonic() < deadline, "the summarising call never started"
        time.sleep(0.05)
    asked = time.monotonic()
    assert detached.request_stop(conversation)
    events = [event for _, event in log.follow(run_id, owner=conversation.owner_id)]
    took = time.monotonic() - asked
    assert took < 5, f"the stop waited {took:.1f} s for the summary"
    assert events[-1].type == EventType.ERROR and events[-1].data["code"] == "cancelled"
    summary = Node.objects.get(kind="compaction", parent__isnull=False)
    assert (summary.status, summary.failure_reason, summary.parent_id) == ("failed", "cancelled", old_head)
    question = head(conversation)
    assert (question.status, question.failure_reason, question.parent_id) == ("failed", "cancelled", old_head)
    assert it.question_of(question.sent) == "and now?" and question.model == STUB
    assert not Node.objects.filter(kind="compaction", parent__isnull=True).exists(), "no root without a summary"
    assert set(events[-1].data["nodes"]) == {summary.pk, question.pk}
