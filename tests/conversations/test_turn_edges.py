"""Edges of the turn pipeline the main suites leave out: crashes, partial approvals, compaction that cannot
or may not finish, the lock's own rules, and a turn's events handed to async code (R1, R3, T7, T9, T10, F1-F3,
C2, D1)."""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta

import pytest
from django.core import mail
from django.urls import reverse

from config.errors import BadInput, NotFound
from conversations import budget, llm, locks, services
from conversations import items as it
from conversations.errors import BeforeCompaction, TurnInProgress
from conversations.models import Bubble, Conversation, Node, ToolApproval
from conversations.selectors import node_path
from conversations.tools.errors import ToolError
from conversations.tools.sql_query import sql_check
from conversations.turns import compaction, records, retrieval, side_calls
from conversations.turns.detached import run_here
from conversations.turns.start import (
    turn_ask,
    turn_compact,
    turn_decide,
    turn_edit,
    turn_regenerate,
    turn_retry,
)
from tests.conversations.helpers import answer, ask, head
from tests.support.openai_stub import Reply

pytestmark = pytest.mark.django_db

STUB = "openai/stub-model"


def _locked(conversation) -> bool:
    return Conversation.objects.filter(pk=conversation.pk, turn_token__isnull=False).exists()


def _crashing_stream(error: BaseException):
    """A model call that streams one token, then fails with something that is not a provider error."""

    def stream_call(**kwargs):
        yield "partial "
        raise error

    return stream_call


# --- the crash path (R1, F1, D3) ---------------------------------------------------------------------


def test_r1_f1_an_unexpected_error_mid_stream_fails_the_node_interrupted_frees_the_lock_and_says_so(
        conversation, monkeypatch):
    ask(conversation, "q1")
    q1 = head(conversation)
    monkeypatch.setattr(llm, "stream_call", _crashing_stream(RuntimeError("a bug mid-stream")))
    turn = turn_ask(user=conversation.owner, conversation_id=conversation.pk, content="q2")
    events = run_here(turn)  # the run logs the bug and ends with an error event that says what is recorded
    assert events[-1].type == "error" and events[-1].data["code"] == "server_error"
    assert "a bug mid-stream" in events[-1].data["message"]
    node = Node.objects.get(sent=[{"type": "user", "text": "q2"}])
    assert (node.status, node.failure_reason, node.parent_id) == ("failed", "interrupted", q1.pk)
    assert "a bug mid-stream" in node.failure_message
    assert head(conversation) == node, "F1: the head moves to the failed node, so its question is kept"
    assert Bubble.objects.filter(node=node, role=Bubble.Role.ERROR).exists()
    assert not _locked(conversation)
    monkeypatch.undo()
    assert answer(ask(conversation, "q3")).startswith("echo: q3"), "the conversation is free again"


def test_r1_a_turn_runs_once_and_its_run_is_the_one_owner_that_gives_the_lock_back(conversation):
    """R1, T9: the lock taken for a turn stays held until the turn runs, which gives it back at its end;
    running the same turn again does nothing (no second call, no second node)."""
    turn = turn_ask(user=conversation.owner, conversation_id=conversation.pk, content="once")
    assert _locked(conversation)
    assert run_here(turn)[-1].type == "done"
    assert not _locked(conversation)
    assert list(turn.events()) == []
    assert Node.objects.count() == 1


def test_r1_a_refused_start_gives_the_lock_back_and_a_decision_that_leaves_calls_open_too(conversation, stub):
    """R1: a start refused after the lock was taken (an edit of a node the conversation lacks) gives it back at once,
    as does a decision on one of two calls waiting (no turn runs until both are decided, F3)."""
    ask(conversation, "q1")
    with pytest.raises(NotFound):
        turn_edit(user=conversation.owner, conversation_id=conversation.pk, node_id=head(conversation).pk + 1000,
                  content="x")
    assert not _locked(conversation)
    services.conversation_update(conversation=conversation, model="openai/stub-model")
    stub.script(Reply.tool_calls([("call_1", "send_email", '{"to": "a@example.com", "subject": "1", "body": "b"}'),
                                  ("call_2", "send_email", '{"to": "b@example.com", "subject": "2", "body": "b"}')]))
    assert ask(conversation, "mail both")[-1].type == "approval_required"
    first = it.tool_calls(head(conversation).received)[0]
    assert turn_decide(user=conversation.owner, conversation_id=conversation.pk, call_id=first["id"],
                       approve=False) is None
    assert not _locked(conversation)


def test_c4_f1_a_model_that_asks_for_tools_in_the_last_round_ends_the_turn_with_not_run_results(
        conversation, settings, monkeypatch):
    """The last round offers no tools; a model that asks for one anyway ends the turn (round_limit): the call
    gets a 'not run' result in a failed node that becomes the head (C4, F1), and the tool never runs."""
    settings.ARBOR_MAX_ROUNDS_PER_TURN = 1
    offered = []

    def stream_call(*, model, messages, tools=None, **kwargs):
        offered.append(tools)
        return llm.CallResult(received=[it.tool_call("call_1", "sql_query", '{"sql": "select 1"}')],
                              usage={}, provider=llm.provider_of(model), model=model)
        yield  # a generator, like the real call

    monkeypatch.setattr(llm, "stream_call", stream_call)
    events = run_here(turn_ask(user=conversation.owner, conversation_id=conversation.pk, content="q"))
    assert offered == [None], "the only round is the last: no tools offered"
    assert events[-1].type == "error" and events[-1].data["code"] == "round_limit"
    failed = head(conversation)
    assert (failed.status, failed.failure_reason) == ("failed", "round_limit")
    (result,) = failed.sent
    assert result["call_id"] == "call_1" and result["is_error"] and result["content"].startswith("not run:")
    asking = Node.objects.get(pk=failed.parent_id)
    assert asking.status == "succeeded" and asking.sent == [{"type": "user", "text": "q"}]
    assert not _locked(conversation)


def test_r2_retrieved_items_go_before_the_question_of_this_call(conversation, user, monkeypatch):
    notes = services.conversation_create(owner=user, title="Notes")
    ask(notes, "the tier costs 900")
    bubble = Bubble.objects.get(conversation=notes, role=Bubble.Role.USER)
    found = retrieval.Hit(bubble=bubble.pk, conversation=notes.pk, conversation_title="Notes", role="user")
    monkeypatch.setattr(retrieval, "_retrievers", [lambda conversation, question, limit: [found]])
    services.conversation_update(conversation=conversation, retrieval=True)
    reply = answer(ask(conversation, "what does the tier cost?"))
    hit, question = head(conversation).sent
    assert hit["ephemeral"] and hit["source"] == {"conversation": notes.pk, "bubble": bubble.pk}
    assert question == {"type": "user", "text": "what does the tier cost?"}
    assert "system:From the person's conversation" in reply


# --- partial approvals (F3, D4) ------------------------------------------------------------------------


def _email(to: str) -> str:
    return json.dumps({"to": to, "subject": "s", "body": "b"})


@pytest.fixture
def two_emails(conversation, stub):
    """A conversation on the stub model whose head asks for two emails in one call, both awaiting approval."""
    services.conversation_update(conversation=conversation, model=STUB)
    stub.script(Reply.tool_calls([("call_a", "send_email", _email("a@example.com")),
                                  ("call_b", "send_email", _email("b@example.com"))]),
                Reply.text("both decided"))
    events = ask(conversation, "send both")
    assert events[-1].type == "approval_required" and len(events[-1].data["calls"]) == 2
    paused = head(conversation)
    return paused, [c["id"] for c in it.tool_calls(paused.received)]


def test_f3_deciding_one_of_two_calls_runs_nothing_and_frees_the_lock(conversation, api, two_emails, stub):
    paused, (first, second) = two_emails
    url = f"/api/conversations/{conversation.pk}/approvals/"
    nodes = Node.objects.count()
    partial = api.post(url, {"tool_call_id": first, "approve": True}, format="json")
    assert partial.status_code == 202, partial.content
    assert partial.json() == {"answer": None, "head": None, "nodes": [], "approval_required": []}
    assert Node.objects.count() == nodes and head(conversation) == paused and mail.outbox == []
    assert not _locked(conversation), "waiting for the second decision holds no lock"
    assert Bubble.objects.get(node=paused, data__call_id=first).data["status"] == "approved"

    other_way = api.post(url, {"tool_call_id": first, "approve": False}, format="json")
    assert other_way.status_code == 400 and other_way.json()["error"]["code"] == "bad_input"
    assert "already approved" in other_way.json()["error"]["message"]
    unknown = api.post(url, {"tool_call_id": "call_zzz", "approve": True}, format="json")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "not_found"
    assert ToolApproval.objects.filter(node=paused).count() == 1 and not _locked(conversation)

    done = api.post(url, {"tool_call_id": second, "approve": False}, format="json")
    assert done.status_code == 201 and done.json()["answer"] == "both decided"
    final = head(conversation)
    assert final.parent_id == paused.pk
    sent_result, refused_result = final.sent
    assert sent_result["call_id"] == first and '"sent": true' in sent_result["content"]
    assert refused_result["call_id"] == second and refused_result["is_error"]
    assert [m.to for m in mail.outbox] == [["a@example.com"]], "only the approved email went out, once"
    assert not _locked(conversation)


# --- compaction inside a turn that cannot compact (C1, F2) ---------------------------------------------


def _long_first_turn_then_a_short_one(conversation, settings) -> Node:
    """Two turns, the first one long; return the head. The echo limit is then set by the caller."""
    settings.ARBOR_COMPACTION_KEEP_TURNS = 1
    ask(conversation, "long " + "words of the first question " * 70)
    ask(conversation, "short")
    return head(conversation)


def test_c1_f2_a_node_too_large_to_summarise_leaves_the_turn_uncompacted_and_its_overflow_recorded(
        conversation, settings):
    before = _long_first_turn_then_a_short_one(conversation, settings)
    first = Node.objects.get(pk=before.parent_id)
    settings.ARBOR_ECHO_MAX_INPUT_TOKENS = first.tokens // 3  # the first node alone is too large
    events = ask(conversation, "third")
    assert events[-1].type == "error" and events[-1].data["code"] == "context_overflow"
    assert not [e for e in events if e.type == "compaction"]
    assert not Node.objects.filter(kind=Node.Kind.COMPACTION).exists(), "no summarising call was sent"
    failed = Node.objects.get(sent=[{"type": "user", "text": "third"}])
    assert (failed.status, failed.failure_reason, failed.parent_id) == ("failed", "context_overflow", before.pk)
    assert head(conversation) == before, "F2: the head stays at the last succeeded node"
    assert not _locked(conversation)


def test_c1_a_turn_whose_history_cannot_be_summarised_but_still_fits_goes_on_uncompacted(conversation, settings):
    before = _long_first_turn_then_a_short_one(conversation, settings)
    first = Node.objects.get(pk=before.parent_id)
    # The whole call fits the limit, but with the answer's reserve kept free the first node and the
    # summarising prompt do not: compaction is needed and impossible; the call goes out as it is.
    limit = before.path_tokens + 40
    settings.ARBOR_ECHO_MAX_INPUT_TOKENS = limit
    settings.ARBOR_ANSWER_RESERVE_TOKENS = limit // 4
    assert first.tokens + 50 > budget.budget_for("arbor/echo").allowed
    events = ask(conversation, "third")
    assert events[-1].type == "done", events[-1]
    assert "seen: user:long words of the first quest" in answer(events), "the whole history was read"
    assert not Node.objects.filter(kind=Node.Kind.COMPACTION).exists()
    assert head(conversation).parent_id == before.pk


# --- a compaction by hand that lost its lock (R3, T9) ----------------------------------------------------


def test_r3_a_compaction_by_hand_that_lost_its_lock_keeps_its_nodes_and_leaves_the_head(conversation, settings,
                                                                                       monkeypatch, api):
    settings.ARBOR_COMPACTION_KEEP_TURNS = 1
    for i in range(3):
        ask(conversation, f"question {i}")
    old_head = head(conversation)
    thief = uuid.uuid4()

    real = compaction.run_side_call

    def stolen(**options):  # while the summary is made, another holder takes the lock over
        Conversation.objects.filter(pk=conversation.pk).update(turn_token=thief)
        return real(**options)

    monkeypatch.setattr(compaction, "run_side_call", stolen)
    response = api.post(reverse("conversation-compact", args=[conversation.pk]))
    assert response.status_code == 409 and response.json()["error"]["code"] == "turn_in_progress"
    assert "outlived its lock" in response.json()["error"]["message"]
    call = Node.objects.get(kind=Node.Kind.COMPACTION, parent__isnull=False)
    root = Node.objects.get(kind=Node.Kind.COMPACTION, parent__isnull=True)
    assert call.status == "succeeded" and root.compacted_from_id == old_head.pk, "its nodes are kept"
    conversation.refresh_from_db()
    assert conversation.head_id == old_head.pk
    assert conversation.turn_token == thief, "the new holder's lock is left alone"


# --- where a turn may start (T7, T10, F1) -----------------------------------------------------------------


def test_t7_f1_regenerate_and_retry_with_nothing_to_redo_are_refused(conversation):
    with pytest.raises(BadInput, match="no question to regenerate"):
        turn_regenerate(user=conversation.owner, conversation_id=conversation.pk)
    with pytest.raises(BadInput, match="Nothing to retry"):
        turn_retry(user=conversation.owner, conversation_id=conversation.pk)
    ask(conversation, "q1")
    with pytest.raises(BadInput, match="Nothing to retry"):
        turn_retry(user=conversation.owner, conversation_id=conversation.pk)
    assert Node.objects.count() == 1 and not _locked(conversation)


def test_t7_edit_refuses_an_answer_a_node_off_the_path_and_an_unknown_node(conversation, other_user):
    ask(conversation, '#tool sql_query {"sql": "select 1"}')
    tool_round = head(conversation)  # answered the tool's result: sent no question
    question = Node.objects.get(pk=tool_round.parent_id)
    run_here(turn_edit(user=conversation.owner, conversation_id=conversation.pk, node_id=question.pk, content="other"))
    theirs = services.conversation_create(owner=other_user)
    ask(theirs, "theirs")
    before = (head(conversation).pk, Node.objects.count())

    def edit(node_id):
        turn_edit(user=conversation.owner, conversation_id=conversation.pk, node_id=node_id, content="x")

    with pytest.raises(BadInput, match="not on this conversation's current path"):
        edit(question.pk)  # the old branch, now off the path
    services.head_switch(conversation=conversation, node_id=tool_round.pk)
    with pytest.raises(BadInput, match="did not send a question"):
        edit(tool_round.pk)
    with pytest.raises(NotFound):
        edit(head(theirs).pk)
    with pytest.raises(NotFound):
        edit(999_999)
    assert Node.objects.count() == before[1] and not _locked(conversation)


def test_t10_the_compaction_node_itself_cannot_be_edited(conversation, settings):
    settings.ARBOR_COMPACTION_KEEP_TURNS = 1
    for i in range(3):
        ask(conversation, f"question {i}")
    root = turn_compact(user=conversation.owner, conversation_id=conversation.pk)
    with pytest.raises(BeforeCompaction, match="before the compaction node"):
        turn_edit(user=conversation.owner, conversation_id=conversation.pk, node_id=root.pk, content="x")
    assert head(conversation) == root and not _locked(conversation)


# --- the lock (T9, R3) ------------------------------------------------------------------------------------


def test_r3_an_expired_lock_is_taken_over_and_its_first_holder_can_neither_renew_nor_move_the_head(
        conversation, settings, frozen_now):
    settings.ARBOR_TURN_LOCK_SECONDS = 300
    ask(conversation, "q1")
    q1 = head(conversation)
    first = locks.TurnLock.acquire(conversation)
    with pytest.raises(TurnInProgress):
        locks.TurnLock.acquire(conversation)
    frozen_now["now"] += timedelta(seconds=301)  # the first holder died, or stalled past its expiry
    second = locks.TurnLock.acquire(conversation)
    assert first.renew() is False, "lost: another holder has it"
    assert second.renew() is True
    with pytest.raises(TurnInProgress):
        services.head_move(conversation=conversation, to=None, lock=first)
    assert head(conversation) == q1
    first.release()  # the late holder's release leaves the new holder's lock alone
    assert Conversation.objects.get(pk=conversation.pk).turn_token == second.token
    services.head_move(conversation=conversation, to=None, lock=second)
    assert head(conversation) is None


def test_t9_release_twice_is_harmless_and_the_with_block_releases(conversation):
    with locks.TurnLock.acquire(conversation) as lock:
        assert _locked(conversation)
    assert not _locked(conversation) and conversation.turn_token is None
    lock.release()
    assert not _locked(conversation)
    again = locks.TurnLock.acquire(conversation)
    lock.release()  # an old holder's late release does not free a newer lock
    assert Conversation.objects.get(pk=conversation.pk).turn_token == again.token
    again.release()


@pytest.mark.django_db(transaction=True)
def test_t9_a_held_lock_is_renewed_by_its_heartbeat_while_its_holder_is_silent(conversation, settings):
    """Issue 12: a held lock (inside its with-block) is renewed in the background (a model may send nothing
    for minutes); one taken for a turn that never began is not, and runs out; the heartbeat stops with the
    release, so a released lock is never renewed again."""
    settings.ARBOR_TURN_LOCK_SECONDS = 30
    settings.ARBOR_TURN_HEARTBEAT_SECONDS = 0.05

    def expiry():
        return Conversation.objects.get(pk=conversation.pk).turn_expires_at

    idle = locks.TurnLock.acquire(conversation)  # taken, never entered: no heartbeat, it runs out
    first = expiry()
    time.sleep(0.3)
    assert expiry() == first
    idle.release()
    with locks.TurnLock.acquire(conversation) as lock:
        first = expiry()
        deadline = time.monotonic() + 10
        while expiry() == first and time.monotonic() < deadline:
            time.sleep(0.02)
        assert expiry() > first, "the heartbeat pushed the expiry ahead while the holder did nothing"
    time.sleep(0.2)
    assert expiry() is None and not lock.lost


@pytest.mark.django_db(transaction=True)
def test_t9_a_heartbeat_that_finds_another_holder_marks_its_lock_lost(conversation, settings, frozen_now):
    settings.ARBOR_TURN_LOCK_SECONDS = 30
    settings.ARBOR_TURN_HEARTBEAT_SECONDS = 0.05
    first = locks.TurnLock.acquire(conversation).__enter__()  # held: its heartbeat beats
    frozen_now["now"] += timedelta(seconds=31)
    second = locks.TurnLock.acquire(conversation)
    deadline = time.monotonic() + 10
    while not first.lost and time.monotonic() < deadline:
        time.sleep(0.02)
    assert first.lost and not second.lost
    assert Conversation.objects.get(pk=conversation.pk).turn_token == second.token
    second.release()


def test_r3_a_head_move_without_a_lock_clears_an_expired_one(conversation, settings, frozen_now):
    settings.ARBOR_TURN_LOCK_SECONDS = 300
    ask(conversation, "q1")
    q1 = head(conversation)
    stale = locks.TurnLock.acquire(conversation)
    with pytest.raises(TurnInProgress):
        services.head_move(conversation=conversation, to=None)
    frozen_now["now"] += timedelta(seconds=301)
    services.head_move(conversation=conversation, to=None)
    conversation.refresh_from_db()
    assert conversation.head_id is None and conversation.turn_token is None
    frozen_now["now"] -= timedelta(seconds=301)  # even once its clock says it is alive again
    with pytest.raises(TurnInProgress):
        services.head_move(conversation=conversation, to=q1.pk, lock=stale)


# --- small refusals and helpers of the writers ----------------------------------------------------------


def test_t8_switch_and_update_refuse_bad_values(conversation):
    ask(conversation, "q1")
    before = head(conversation)
    for bad in ("abc", None, [1]):
        with pytest.raises(BadInput, match="must be a node id"):
            services.head_switch(conversation=conversation, node_id=bad)
    with pytest.raises(BadInput, match="Unknown fields: head, owner"):
        services.conversation_update(conversation=conversation, head=None, owner=None)
    assert head(conversation) == before


def test_d5_an_empty_sql_check_is_refused_without_running():
    for empty in ("", "   \n\t"):
        with pytest.raises(ToolError, match="the statement is empty"):
            sql_check(empty)


def test_t4_result_bubbles_update_only_the_calls_whose_results_arrive(conversation):
    node = Node.objects.create(conversation=conversation, kind=Node.Kind.TURN, status=Node.Status.SUCCEEDED,
                               received=[it.tool_call("c1", "sql_query", "{}"), it.tool_call("c2", "sql_query", "{}")],
                               model="arbor/echo", provider="arbor")
    records.answer_bubbles(node, needs_approval=lambda call: False)
    records.result_bubbles(node.pk, [it.tool_result("c2", "sql_query", "rows")], owner=conversation.owner_id)
    bubbles = {b.data["call_id"]: b.data for b in Bubble.objects.filter(node=node, role=Bubble.Role.TOOL)}
    assert bubbles["c1"]["status"] == "running" and "result" not in bubbles["c1"]
    assert (bubbles["c2"]["status"], bubbles["c2"]["result"]) == ("done", "rows")


def test_t1_a_side_call_is_a_recorded_node_that_a_follow_up_can_hang_below(conversation):
    ask(conversation, "q1")
    parent = node_path(head(conversation).pk, owner=conversation.owner_id)[-1]
    messages = [{"role": "user", "content": "#title q1"}]
    side = side_calls.run_side_call(conversation=conversation, parent=parent, kind=Node.Kind.TURN,
                                 sent=[it.user("#title q1")], messages=messages, model="arbor/echo")
    assert side.result is not None and side.node.status == "succeeded" and side.node.parent_id == parent.id
    follow = side.path_node()
    assert follow.id == side.node.pk and follow.status == "succeeded"
    assert follow.stored_path_tokens == side.node.path_tokens
    assert head(conversation).pk == parent.id, "a side call never moves the head"
