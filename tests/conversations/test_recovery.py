"""Issue 12, crashes and outages lose nothing: a short lease, partial text saved as it streams, and calls a
dead process left pending failed as interrupted, by the next turn or by the worker's sweep.

The last test kills (SIGKILL) a real server process mid-answer and measures how soon the conversation
takes a new turn and how many streamed words the crash lost.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import requests
from django.conf import settings as django_settings
from django.db import OperationalError
from django.urls import reverse
from rest_framework.authtoken.models import Token

from conversations import items as it
from conversations import locks
from conversations.errors import TurnInProgress
from conversations.jobs import worker
from conversations.models import Bubble, Conversation, Node
from conversations.turns import recovery
from conversations.turns.seen import call_context
from conversations.turns.start import turn_ask
from tests.conversations.helpers import ask, give_back, head
from tests.support.servers import database_url, free_port

ROOT = Path(__file__).resolve().parents[2]
WORDS = [f"w{i}" for i in range(60)]


def _die_mid_answer(conversation, settings, graveyard, *, tokens: int = 6):
    """Start a `#slow` turn, read `tokens` token events, then "die": the generator is never resumed or
    closed, and its lock is never released (a killed process does neither)."""
    settings.ARBOR_PARTIAL_SAVE_SECONDS = 0  # save after every token: the test needs no clock
    # Words one by one: words that came at once are one token event (issue 34), and six could then be the whole
    # answer, the turn ended before it "dies" (seen once in CI).
    settings.ARBOR_ECHO_WORD_SECONDS = 0.01
    events = turn_ask(user=conversation.owner, conversation_id=conversation.pk,
                      content="#slow " + " ".join(WORDS)).events()
    seen = "".join(e.data["text"] for e in (next(events) for _ in range(tokens)) if e.type == "token")
    lock = events.gi_frame.f_locals["self"].lock
    lock._stop.set()  # its heartbeat dies with the process
    graveyard.append(events)
    return seen


def test_issue_12_partial_text_is_on_the_pending_node_while_it_streams(conversation, settings, graveyard):
    seen = _die_mid_answer(conversation, settings, graveyard)
    node = Node.objects.get(conversation=conversation)
    assert node.status == "pending" and seen.startswith("echo: #slow")
    assert it.answer_text(node.received) == seen


def test_issue_12_the_next_turn_after_the_lease_fails_the_dead_call_as_interrupted_with_its_text(
        conversation, settings, frozen_now, graveyard):
    """F1, T5: the dead call becomes failed/interrupted with what it had streamed, shown with Retry (an
    error bubble, the head on it); the next question hangs below it and never sees the partial text."""
    settings.ARBOR_TURN_LOCK_SECONDS = 20
    ask(conversation, "q1")
    q1 = head(conversation)
    seen = _die_mid_answer(conversation, settings, graveyard)
    with pytest.raises(TurnInProgress):  # the lease still runs: 409
        ask(conversation, "too early")
    frozen_now["now"] += timedelta(seconds=21)
    ask_later = ask(conversation, "after the crash")
    assert ask_later[-1].type == "done"
    dead = Node.objects.get(conversation=conversation, sent__0__text__startswith="#slow")
    assert (dead.status, dead.failure_reason) == ("failed", "interrupted")
    assert it.answer_text(dead.received) == seen and dead.parent_id == q1.pk
    bubble = Bubble.objects.get(node=dead, role="error")
    assert bubble.data == {"reason": "interrupted", "partial": seen}
    latest = head(conversation)
    assert latest.parent_id == dead.pk
    sent_text = json.dumps(call_context(latest))
    assert "after the crash" in sent_text and seen not in sent_text and "#slow" in sent_text


def test_issue_12_the_workers_sweep_recovers_a_conversation_nobody_writes_in(conversation, settings, frozen_now,
                                                                           graveyard):
    settings.ARBOR_TURN_LOCK_SECONDS = 20
    seen = _die_mid_answer(conversation, settings, graveyard)
    assert recovery.sweep() == [], "a live lease is left alone"
    frozen_now["now"] += timedelta(seconds=21)
    (node_id,) = recovery.sweep()
    dead = Node.objects.get(pk=node_id)
    assert dead.failure_reason == "interrupted" and it.answer_text(dead.received) == seen
    assert head(conversation).pk == node_id, "the head shows it, as it shows a stopped answer"
    assert Conversation.objects.get(pk=conversation.pk).turn_token is None, "the sweep gave the lock back"
    assert recovery.sweep() == []


def test_issue_12_a_branch_switch_after_the_lease_keeps_the_persons_head(conversation, settings, frozen_now, graveyard):
    """A person who moved the head after the lease ran out keeps it: the dead call is failed in place."""
    from conversations import services

    settings.ARBOR_TURN_LOCK_SECONDS = 20
    ask(conversation, "q1")
    q1 = head(conversation)
    _die_mid_answer(conversation, settings, graveyard)
    frozen_now["now"] += timedelta(seconds=21)
    services.head_switch(conversation=conversation, node_id=q1.pk)
    (node_id,) = recovery.sweep()
    assert Node.objects.get(pk=node_id).failure_reason == "interrupted"
    assert head(conversation) == q1


def test_issue_12_a_stale_title_call_is_swept_after_the_workers_lease(conversation, settings):
    from conversations.turns import records

    ask(conversation, "q1")
    title = records.start(conversation=conversation, parent=None, kind=Node.Kind.TITLE,
                          sent=[it.user("#title")], model="arbor/echo")
    assert title.pk not in recovery.sweep()
    Node.objects.filter(pk=title.pk).update(created_at=title.created_at - timedelta(
        seconds=settings.ARBOR_WORKER_LEASE_SECONDS + 1))
    assert title.pk in recovery.sweep()
    assert Node.objects.get(pk=title.pk).failure_reason == "interrupted"


def test_issue_12_the_worker_waits_out_database_errors_and_goes_on(monkeypatch):
    """The worker loop logs a database error, backs off and tries again; it never exits for one."""
    outcomes = [OperationalError("server closed the connection"), OperationalError("the database is starting"),
                None, None]
    calls, sleeps = [], []

    def sweep():
        calls.append(1)
        outcome = outcomes.pop(0) if outcomes else None
        if outcome:
            raise outcome
        return []

    monkeypatch.setattr(recovery, "sweep", sweep)
    monkeypatch.setattr(worker, "run_due", lambda batch: worker.RunStats())
    monkeypatch.setattr(worker.log, "forget_old", lambda: 0)
    worker.run_forever(idle_seconds=0.5, stop=lambda: len(calls) >= 4, sleep=sleeps.append)
    assert len(calls) == 4
    assert sleeps == [1.0, 2.0, 0.5, 0.5], "backed off twice, then the usual idle pace"


# --- a real process, killed ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_issue_12_kill_9_mid_answer_frees_the_conversation_and_keeps_the_streamed_text(conversation, api, user):
    """A server process started here streams a `#slow` answer; it is killed with SIGKILL after ~3 s. The
    conversation takes a new turn within 30 s (the lease, 20 s by default), and the dead call is
    failed/interrupted with the text saved up to 2 s before the kill."""
    port = free_port()
    env = {**os.environ, "DATABASE_URL": database_url(), "ARBOR_ECHO_WORD_SECONDS": "0.1",
           "DJANGO_DEBUG": "0", "DJANGO_ALLOWED_HOSTS": "127.0.0.1"}
    server = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                               "config.asgi:application"], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}/api/conversations/{conversation.pk}/turns/"
        headers = {"Authorization": f"Token {Token.objects.get_or_create(user=user)[0].key}",
                   "Accept": "text/event-stream"}
        deadline = time.monotonic() + 60
        while True:
            try:
                stream = requests.post(url, json={"content": "#slow " + " ".join(WORDS)}, headers=headers,
                                       stream=True, timeout=30)
                break
            except requests.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        streamed, started = "", time.monotonic()
        for line in stream.iter_lines(decode_unicode=True):
            if line.startswith("data:"):
                data = json.loads(line[5:])
                streamed += data.get("text", "")
            if time.monotonic() - started > 3:
                break
        os.kill(server.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        server.wait(10)
    finally:
        if server.poll() is None:
            server.kill()
    while True:
        response = api.post(reverse("turn-create", args=[conversation.pk]), {"content": "still there?"},
                            format="json")
        if response.status_code != 409 or time.monotonic() - killed_at > 40:
            break
        time.sleep(0.25)
    accepted_after = time.monotonic() - killed_at
    assert response.status_code == 201, response.content
    assert accepted_after < 30
    dead = Node.objects.get(conversation=conversation, sent__0__text__startswith="#slow")
    assert (dead.status, dead.failure_reason) == ("failed", "interrupted")
    kept = it.answer_text(dead.received)
    assert kept and streamed.startswith(kept), "what was kept is what the client saw, up to the last save"
    lost_words = len(streamed.split()) - len(kept.split())
    print(f"\nkill -9 -> next accepted turn: {accepted_after:.1f} s; words streamed {len(streamed.split())}, "
          f"kept {len(kept.split())}, lost {lost_words}")
    assert 0 <= lost_words <= 2 / 0.1 + 2, "at most the last 2 s of words (0.1 s each) are lost"
    assert head(conversation).parent_id == dead.pk
    assert django_settings.ARBOR_TURN_LOCK_SECONDS <= 30


def test_issue_12_a_call_that_finished_late_is_left_as_it_ended(conversation, settings, frozen_now, graveyard):
    """Recovery fails only what is still pending: a process that was only late keeps its own record, and
    no copy of the node is made."""
    settings.ARBOR_TURN_LOCK_SECONDS = 20
    _die_mid_answer(conversation, settings, graveyard)
    node = Node.objects.get(conversation=conversation)
    Node.objects.filter(pk=node.pk).update(status="succeeded")  # it finished just before the sweep read it
    frozen_now["now"] += timedelta(seconds=21)
    lock = locks.TurnLock.acquire(Conversation.objects.get(pk=conversation.pk))
    assert recovery.recover(conversation, lock) == []
    lock.release()
    assert Node.objects.filter(conversation=conversation).count() == 1
    assert Node.objects.get(pk=node.pk).status == "succeeded"


@pytest.mark.django_db(transaction=True)
def test_issue_12_a_run_whose_turn_never_began_ends_for_its_readers(conversation, settings, monkeypatch):
    """A turn whose client left before it began (its lock runs out unheld): readers stop following within
    a few seconds, and the sweep ends its run with an `interrupted` event."""
    from conversations.turns import detached, log

    turn = turn_ask(user=conversation.owner, conversation_id=conversation.pk, content="never run")
    run_id = detached.start(turn)
    give_back(turn)  # the lock goes back; the run was opened and nobody runs it
    monkeypatch.setattr(log, "ORPHAN_SECONDS", 0.3)
    assert list(log.follow(run_id, owner=conversation.owner_id)) == []
    settings.ARBOR_TURN_LOCK_SECONDS = -1
    recovery.sweep()
    (seq, ending), = log.read(run_id, owner=conversation.owner_id)
    assert seq == 1 and ending.data["code"] == "interrupted"
    assert log.latest_run(conversation).ended_at is not None
