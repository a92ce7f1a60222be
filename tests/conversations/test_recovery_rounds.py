"""Issue 12, crashes and outages lose nothing, between rounds: a process killed after the model asked for
tools and before their results were recorded (or while a tool ran) leaves no pending node, only a node
that succeeded with tool calls nobody answers, and its lock to run out. Recovery (the next turn's
`recover`, the worker's `sweep`) closes those calls the way a turn stopped between rounds closes them: a
failed/interrupted node below them whose sent items are a result for every call (C4, T4): a result stored
before the crash is kept, every other call's says it was not run. A call that waits for a person is a state
of its own and is left exactly as it is (F3, D4).

A death is simulated as in `test_recovery.py`: the turn's generator is never resumed (or, to die while a
tool runs, its thread stops for good), its lock is never released, and the lease runs out on the frozen
clock. Then the next call's messages are checked as the model received them: every assistant tool call
has its tool result (T5, T6: no orphan is left for assembly to drop).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from datetime import timedelta

import pytest
from django.core import mail
from django.db import DEFAULT_DB_ALIAS, connections

from conversations import items as it
from conversations import services
from conversations.errors import ApprovalPending
from conversations.locks import TurnLock
from conversations.models import Bubble, Conversation, Node, ToolApproval
from conversations.selectors import path_node
from conversations.tools import get_tool, registry
from conversations.turns import calls, recovery
from conversations.turns.detached import run_here
from conversations.turns.seen import next_context
from conversations.turns.start import turn_ask, turn_decide
from tests.conversations.helpers import answer, ask, head
from tests.support.openai_stub import Reply

LEASE = 20
SQL = '{"sql": "select count(*) from customers"}'
SQL_2 = '{"sql": "select count(*) from monthly_sales"}'
MAIL_A = '{"to": "cfo@example.com", "subject": "Q3", "body": "numbers"}'
MAIL_B = '{"to": "ceo@example.com", "subject": "Q3", "body": "numbers"}'


@pytest.fixture
def stub_conversation(conversation, stub):
    services.conversation_update(conversation=conversation, model="openai/stub-model")
    return conversation


@pytest.fixture
def ran(monkeypatch):
    """How many times each tool's own function ran (so a test can say nothing ran again)."""
    counts: dict[str, int] = {}
    for name in ("sql_query", "send_email"):
        tool = get_tool(name)

        def function(_tool=tool, **arguments):
            counts[_tool.name] = counts.get(_tool.name, 0) + 1
            return _tool.function(**arguments)

        monkeypatch.setitem(registry._TOOLS, name, dataclasses.replace(tool, function=function))
    return counts


class Death:
    """kill -9 while a tool runs. The turn runs in a thread of its own on this test's database connection
    (what it writes is in the test's transaction, as the test's own writes are); the chosen tool call
    blocks, and once it has started the process "dies": the turn's thread stops for good where it next
    looks for a stop (a killed process runs no more code: it writes nothing more and gives its lock back
    never). The blocked tool's own thread is let go at the test's end, its result never read."""

    def __init__(self, monkeypatch):
        self._monkeypatch = monkeypatch
        self._tool_started = threading.Event()
        self._dead = threading.Event()
        self._frozen = threading.Event()
        self._never = threading.Event()
        self._release = threading.Event()
        self._connection = None

    def during(self, name: str, number: int) -> None:
        """Die while the `number`-th call of tool `name` runs; the calls before it run for real."""
        tool = get_tool(name)
        seen = {"calls": 0}

        def function(**arguments):
            seen["calls"] += 1
            if seen["calls"] == number:
                self._tool_started.set()
                self._release.wait(120)
                return "never read"
            return tool.function(**arguments)

        self._monkeypatch.setitem(registry._TOOLS, name, dataclasses.replace(tool, function=function))

    def run(self, turn) -> None:
        """Run `turn` until the chosen tool runs, then kill its process."""
        self._connection = connections[DEFAULT_DB_ALIAS]
        self._connection.inc_thread_sharing()
        turn.lock._stop.set()  # its heartbeat dies with the process
        turn.stop_requested = self._look_for_a_stop

        def body() -> None:
            connections[DEFAULT_DB_ALIAS] = self._connection
            for _ in turn.events():
                pass

        threading.Thread(target=body, name="arbor-turn-about-to-die", daemon=True).start()
        assert self._tool_started.wait(30), "the tool never started"
        self._dead.set()
        assert self._frozen.wait(10), "the turn's thread did not stop"

    def _look_for_a_stop(self) -> bool:
        if self._dead.is_set():
            self._frozen.set()
            self._never.wait()  # the process is gone: this thread runs nothing more
        return False

    def bury(self) -> None:
        self._release.set()
        if self._connection is not None:
            self._connection.dec_thread_sharing()


@pytest.fixture
def death(monkeypatch):
    dying = Death(monkeypatch)
    yield dying
    dying.bury()


@pytest.fixture
def no_orphans(caplog):
    """T6's safety net must catch nothing: a dropped orphan would be a defect upstream (logged as a warning)."""
    caplog.set_level(logging.WARNING, logger="arbor.context")
    yield
    assert "assembly dropped" not in caplog.text


def _die_after_the_tool_call_node(conversation, graveyard, content: str | None = None, *, turn=None):
    """Run a turn (a new question `content`, or `turn`) until its first tool_call event (the node with the
    tool calls is committed by then), then "die": the generator is never resumed or closed, and its lock is
    never released."""
    if turn is None:
        turn = turn_ask(user=conversation.owner, conversation_id=conversation.pk, content=content)
    turn.lock._stop.set()  # its heartbeat dies with the process
    events = turn.events()
    graveyard.append(events)
    seen = []
    for event in events:
        seen.append(event)
        if event.type == "tool_call":
            return seen
    raise AssertionError(f"the turn ended without a tool call: {seen}")


def _unanswered(messages: list[dict]) -> list[str]:
    """The assistant tool calls in `messages` with no tool message answering them (what providers refuse)."""
    answered = {m["tool_call_id"] for m in messages if m["role"] == "tool"}
    return [c["id"] for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or ()
            if c["id"] not in answered]


def _tool_messages(messages: list[dict]) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}


def _lock_held_by_the_dead(conversation) -> bool:
    conversation = Conversation.objects.get(pk=conversation.pk)
    return conversation.turn_token is not None


def _approvals(node: Node) -> list[tuple]:
    return list(ToolApproval.objects.filter(node=node).order_by("call_id")
                .values_list("call_id", "approved", "result", "decided_by", "decided_at"))


def _not_run(call: it.Item) -> it.Item:
    return it.tool_result(call["id"], call["name"], recovery.NOT_RUN, is_error=True)


# --- a crash after the node with tool calls, before any result ------------------------------------------


def test_issue_12_t3_t4_c4_f1_crash_after_the_tool_call_node_leaves_open_calls_off_the_path_and_the_next_turn_closes_them(  # noqa: E501
        conversation, settings, frozen_now, graveyard, ran, no_orphans):
    """Issue 12 (T3, T4, C4, F1, T5, T6). The state a crash leaves between rounds: the node that asked for
    a tool succeeded, no node below it carries the result, nothing is pending, the head has not moved (it
    moves at the turn's end, T3), so the question and its call are off the path; the lock is still held.
    The next turn, once the lease is over, closes the call with a 'not run' result in a failed/interrupted
    node of its own (as a stop between rounds would), moves the head there (F1), and hangs below it: its
    question, the dead question, the call and its result all reach the model; the tool never runs."""
    settings.ARBOR_TURN_LOCK_SECONDS = LEASE
    ask(conversation, "q1")
    q1 = head(conversation)
    _die_after_the_tool_call_node(conversation, graveyard, f"#tool sql_query {SQL}")

    asked = Node.objects.get(conversation=conversation, sent__0__text__startswith="#tool")
    (call,) = it.tool_calls(asked.received)
    assert asked.status == "succeeded" and asked.parent_id == q1.pk
    assert not Node.objects.filter(parent=asked).exists(), "no node carries the call's result"
    assert not Node.objects.filter(conversation=conversation, status="pending").exists()
    assert head(conversation) == q1, "the head moves at the turn's end: the question is off the path"
    assert _lock_held_by_the_dead(conversation)
    assert Bubble.objects.get(node=asked, role="tool").data["status"] == "running"
    assert recovery.sweep() == [], "a live lease is left alone"

    frozen_now["now"] += timedelta(seconds=LEASE + 1)
    later = ask(conversation, "after the crash")

    closing = Node.objects.get(parent=asked)
    assert (closing.kind, closing.status, closing.failure_reason) == ("turn", "failed", "interrupted")
    assert closing.sent == [_not_run(call)] and closing.received == []
    assert Bubble.objects.get(node=closing, role="error").data["reason"] == "interrupted"
    tool_bubble = Bubble.objects.get(node=asked, role="tool")
    assert (tool_bubble.data["status"], tool_bubble.data["result"]) == ("error", recovery.NOT_RUN)
    latest = head(conversation)
    assert latest.parent_id == closing.pk and later[-1].type == "done"
    assert answer(later).endswith(
        "seen: user:q1 | assistant:echo: q1\nseen: user:q1 | user:#tool sql_query {\"sql\": \"selec"
        " | assistant:[call sql_query] | tool:not run: the process running t | user:after the crash")
    assert ran == {}, "the tool never ran, then or since"


def test_issue_12_t4_c4_the_workers_sweep_closes_open_calls_nobody_comes_back_for(
        conversation, settings, frozen_now, graveyard, ran, no_orphans):
    """Issue 12 (T4, C4, F1). Nothing is pending, so only the lock that was never given back tells the
    sweep: it closes the call, moves the head to the closing node (nothing moved it since the crash), gives
    the lock back, and a second sweep finds nothing. What the next call would send is valid."""
    settings.ARBOR_TURN_LOCK_SECONDS = LEASE
    _die_after_the_tool_call_node(conversation, graveyard, f"#tool sql_query {SQL}")
    asked = Node.objects.get(conversation=conversation)
    frozen_now["now"] += timedelta(seconds=LEASE + 1)

    (closing_id,) = recovery.sweep()
    closing = Node.objects.get(pk=closing_id)
    assert closing.parent_id == asked.pk and closing.failure_reason == "interrupted"
    assert [r["content"] for r in closing.sent] == [recovery.NOT_RUN]
    assert head(conversation) == closing, "shown with Retry, as a stopped turn is"
    assert not _lock_held_by_the_dead(conversation), "the sweep gave the lock back"
    assert recovery.sweep() == []
    messages = next_context(conversation)
    assert _unanswered(messages) == [] and len(_tool_messages(messages)) == 1
    assert ran == {}


def test_issue_12_t3_f3_d4_crash_between_rounds_after_an_approval_keeps_the_approved_result_and_closes_the_rest(
        conversation, settings, frozen_now, graveyard, ran, no_orphans):
    """Issue 12 (T3, T4, F3, D4, C4). A turn goes on after a person approved an email: the email is sent, the
    next round's node carries its result and asks for a query, and the process dies there. The head is still
    the approved call's node; recovery closes the query below the node that asked for it, moves the head
    there, and leaves the decision and its stored result as they were. The next turn sends both results."""
    settings.ARBOR_TURN_LOCK_SECONDS = LEASE
    ask(conversation, f"#tool send_email {MAIL_A} #tool sql_query {SQL}")
    approved = head(conversation)
    (email,) = it.tool_calls(approved.received)
    resumed = turn_decide(user=conversation.owner, conversation_id=conversation.pk, call_id=email["id"],
                          approve=True)
    _die_after_the_tool_call_node(conversation, graveyard, turn=resumed)

    second = Node.objects.get(parent=approved)
    (query,) = it.tool_calls(second.received)
    assert second.status == "succeeded" and [r["call_id"] for r in second.sent] == [email["id"]]
    assert head(conversation) == approved and not Node.objects.filter(parent=second).exists()
    assert len(mail.outbox) == 1
    decisions = _approvals(approved)

    frozen_now["now"] += timedelta(seconds=LEASE + 1)
    later = ask(conversation, "and then?")

    closing = Node.objects.get(parent=second)
    assert closing.failure_reason == "interrupted" and closing.sent == [_not_run(query)]
    assert _approvals(approved) == decisions
    assert later[-1].type == "done" and head(conversation).parent_id == closing.pk
    assert answer(later).endswith("assistant:[call send_email] | tool:{\"sent\": true, \"to\": \"cfo@exam"
                                  " | assistant:[call sql_query] | tool:not run: the process running t"
                                  " | user:and then?")
    assert len(mail.outbox) == 1 and ran == {"send_email": 1}


# --- a crash while a tool runs -----------------------------------------------------------------------------


def test_issue_12_t4_c4_crash_while_the_second_of_two_tools_runs_closes_both_and_the_model_gets_a_valid_list(
        stub_conversation, stub, settings, frozen_now, death, ran, no_orphans):
    """Issue 12 (T4, C4, T5, T6). Tools that need no approval keep their results in memory until the next
    round's node is written, so a crash while the second of two runs leaves the same state as a crash
    before either: the first's result is lost with the process (the tool ran once), and both calls get a
    'not run' result. The next request has every tool call answered; nothing runs again."""
    settings.ARBOR_TURN_LOCK_SECONDS = LEASE
    stub.script(Reply.tool_calls([("call_1", "sql_query", SQL), ("call_2", "sql_query", SQL_2)]),
                Reply.text("They did not run."))
    death.during("sql_query", 2)
    death.run(turn_ask(user=stub_conversation.owner, conversation_id=stub_conversation.pk, content="count both"))

    asked = Node.objects.get(conversation=stub_conversation)
    assert asked.status == "succeeded" and [c["id"] for c in it.tool_calls(asked.received)] == ["call_1", "call_2"]
    assert not Node.objects.filter(parent=asked).exists() and head(stub_conversation) is None
    assert _lock_held_by_the_dead(stub_conversation)

    frozen_now["now"] += timedelta(seconds=LEASE + 1)
    later = ask(stub_conversation, "what happened?")

    closing = Node.objects.get(parent=asked)
    assert closing.failure_reason == "interrupted"
    assert closing.sent == [_not_run(c) for c in it.tool_calls(asked.received)]
    assert later[-1].type == "done" and head(stub_conversation).parent_id == closing.pk
    messages = stub.requests[-1]["messages"]
    assert _unanswered(messages) == []
    assert _tool_messages(messages) == {"call_1": recovery.NOT_RUN, "call_2": recovery.NOT_RUN}
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "user"]
    assert messages[0]["content"] == "count both" and messages[-1]["content"] == "what happened?"
    assert ran == {"sql_query": 1}, "the first ran once, its result lost with its process; none ran again"


def test_issue_12_f3_d4_c4_crash_while_the_second_approved_action_runs_keeps_the_first_result_and_runs_nothing_twice(  # noqa: E501
        stub_conversation, stub, settings, frozen_now, death, ran, no_orphans):
    """Issue 12 (F3, D4, C4, T4, F1). Two emails, each approved by a person; the first is sent and its
    result stored with its decision, and the process dies while the second runs. Recovery keeps the first
    result, gives the second a 'not run' result (whether it went out is not known: it is never run again),
    leaves both decisions exactly as the person made them, and the next request answers both calls."""
    settings.ARBOR_TURN_LOCK_SECONDS = LEASE
    stub.script(Reply.tool_calls([("call_a", "send_email", MAIL_A), ("call_b", "send_email", MAIL_B)]),
                Reply.text("One went out."))
    first = ask(stub_conversation, "mail both")
    assert first[-1].type == "approval_required"
    asked = head(stub_conversation)
    user, conversation_id = stub_conversation.owner, stub_conversation.pk
    assert turn_decide(user=user, conversation_id=conversation_id, call_id="call_a", approve=True) is None
    death.during("send_email", 2)
    death.run(turn_decide(user=user, conversation_id=conversation_id, call_id="call_b", approve=True))

    assert len(mail.outbox) == 1 and mail.outbox[0].to == ["cfo@example.com"]
    stored = ToolApproval.objects.get(node=asked, call_id="call_a").result
    assert stored["call_id"] == "call_a" and json.loads(stored["content"])["sent"] is True
    assert ToolApproval.objects.get(node=asked, call_id="call_b").result is None
    assert not Node.objects.filter(parent=asked).exists() and head(stub_conversation) == asked
    assert _lock_held_by_the_dead(stub_conversation)
    decisions = _approvals(asked)

    frozen_now["now"] += timedelta(seconds=LEASE + 1)
    later = ask(stub_conversation, "did they go out?")

    closing = Node.objects.get(parent=asked)
    assert closing.failure_reason == "interrupted"
    assert closing.sent == [stored, _not_run(it.tool_calls(asked.received)[1])]
    assert _approvals(asked) == decisions, "recovery never grants, refuses or changes a decision (D4)"
    statuses = dict(Bubble.objects.filter(node=asked, role="tool").values_list("data__call_id", "data__status"))
    assert statuses == {"call_a": "done", "call_b": "error"}
    assert later[-1].type == "done" and len(mail.outbox) == 1, "nothing was sent twice"
    messages = stub.requests[-1]["messages"]
    assert _unanswered(messages) == []
    assert _tool_messages(messages) == {"call_a": stored["content"], "call_b": recovery.NOT_RUN}
    assert messages[-1] == {"role": "user", "content": "did they go out?"}
    assert ran == {"send_email": 1}


# --- a crash while a call waits for a person -----------------------------------------------------------------


@pytest.mark.parametrize("recovered_by", ["the next turn", "the sweep"])
def test_issue_12_f3_d4_crash_while_an_approval_is_waiting_leaves_it_waiting_untouched(
        conversation, settings, frozen_now, graveyard, ran, no_orphans, recovered_by):
    """Issue 12 (F3, D4). A turn that ended waiting for approval and died before giving its lock back:
    recovery, whoever runs it, writes nothing (no result, no node, no decision); the call still waits, a
    new question is still refused until a person decides, and only that person's click runs the tool."""
    settings.ARBOR_TURN_LOCK_SECONDS = LEASE
    # Its node and the head move are committed before its tool_call events, and the lock goes back in
    # that same commit (the head move's UPDATE clears it): a death after it leaves nothing held.
    _die_after_the_tool_call_node(conversation, graveyard, f"#tool send_email {MAIL_A}")
    asked = head(conversation)
    (call,) = it.tool_calls(asked.received)
    assert not _lock_held_by_the_dead(conversation)
    frozen_now["now"] += timedelta(seconds=LEASE + 1)

    if recovered_by == "the sweep":
        assert recovery.sweep() == []
    else:
        with pytest.raises(ApprovalPending):  # the next turn takes the lock, recovers, and is refused
            ask(conversation, "anything new?")
    assert Node.objects.filter(conversation=conversation).count() == 1 and head(conversation) == asked
    assert not ToolApproval.objects.exists()
    assert calls.undecided(path_node(asked), owner=conversation.owner_id) == [call]
    assert Bubble.objects.get(node=asked, role="tool").data["status"] == "awaiting_approval"
    assert not _lock_held_by_the_dead(conversation)
    assert mail.outbox == [] and ran == {}

    resumed = run_here(turn_decide(user=conversation.owner, conversation_id=conversation.pk, call_id=call["id"],
                          approve=True))
    assert resumed[-1].type == "done" and len(mail.outbox) == 1 and ran == {"send_email": 1}
    assert "assistant:[call send_email] | tool:{" in answer(resumed)


def test_issue_12_f3_d4_crash_after_one_of_two_decisions_keeps_it_and_waits_for_the_other(
        stub_conversation, stub, settings, frozen_now, monkeypatch, ran, no_orphans):
    """Issue 12 (F3, D4). The process that recorded a person's first decision died before giving its lock
    back; the second call still waits. Recovery changes neither (the approved email is not run, the other
    is not decided for anyone); the person's second click runs both, and the model gets both results."""
    settings.ARBOR_TURN_LOCK_SECONDS = LEASE
    stub.script(Reply.tool_calls([("call_a", "send_email", MAIL_A), ("call_b", "send_email", MAIL_B)]),
                Reply.text("Both went out."))
    ask(stub_conversation, "mail both")
    asked = head(stub_conversation)
    user, conversation_id = stub_conversation.owner, stub_conversation.pk
    with monkeypatch.context() as dying:
        dying.setattr(TurnLock, "release", lambda self: None)  # a killed process never gives its lock back
        assert turn_decide(user=user, conversation_id=conversation_id, call_id="call_a", approve=True) is None
    assert _lock_held_by_the_dead(stub_conversation)
    decisions = _approvals(asked)
    frozen_now["now"] += timedelta(seconds=LEASE + 1)

    assert recovery.sweep() == []
    assert _approvals(asked) == decisions and [d[:3] for d in decisions] == [("call_a", True, None)]
    assert [c["id"] for c in calls.undecided(path_node(asked), owner=user.pk)] == ["call_b"]
    assert Node.objects.filter(conversation=stub_conversation).count() == 1 and mail.outbox == []

    resumed = run_here(turn_decide(user=user, conversation_id=conversation_id, call_id="call_b", approve=True))
    assert resumed[-1].type == "done" and len(mail.outbox) == 2 and ran == {"send_email": 2}
    messages = stub.requests[-1]["messages"]
    assert _unanswered(messages) == [] and set(_tool_messages(messages)) == {"call_a", "call_b"}
