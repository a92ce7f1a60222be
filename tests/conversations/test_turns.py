"""The one turn runner against arbor/echo and the real database (R1, T1-T4, T7, T9, F1-F3, C4)."""

from __future__ import annotations

import json
import time

import pytest
from django.core import mail

from config.errors import BadInput
from conversations import services
from conversations.errors import ApprovalPending, TurnInProgress
from conversations.jobs import worker
from conversations.locks import TurnLock
from conversations.models import Bubble, Node, OutboxJob, ToolApproval
from conversations.screen import path_bubbles
from conversations.selectors import node_path
from conversations.turns.detached import run_here
from conversations.turns.seen import call_context, next_context
from conversations.turns.start import turn_ask, turn_decide, turn_edit, turn_regenerate
from tests.conversations.helpers import answer, ask, give_back, head

pytestmark = pytest.mark.django_db


def test_t1_t3_one_call_is_one_succeeded_node_and_the_head_moves_to_it(conversation):
    """T1, T3: a turn of one round makes one node, succeeded, with sent and received items and usage."""
    events = ask(conversation, "hello")
    node = head(conversation)
    assert node is not None and node.kind == "turn" and node.status == "succeeded"
    assert node.sent == [{"type": "user", "text": "hello"}]
    assert node.received == [{"type": "text", "text": "echo: hello\nseen: user:hello"}]
    assert node.provider == "arbor" and node.model == "arbor/echo"
    assert node.usage["prompt_tokens"] > 0 and node.usage["completion_tokens"] > 0
    assert node.finished_at is not None and node.conversation_id == conversation.pk
    assert answer(events) == "echo: hello\nseen: user:hello"
    assert [e.type for e in events].count("token") >= 1


def test_t3_an_answer_streams_as_its_words_come_and_what_came_at_once_is_one_token_event(conversation, settings):
    """T3, issue 34: words that come one by one are passed on one by one; words the model gave while the turn was
    busy come as one event (an instant answer: one), so a turn pays per event, not per word."""
    settings.ARBOR_ECHO_WORD_SECONDS = 0.02
    paced = [e.data["text"] for e in ask(conversation, "one two three #slow") if e.type == "token"]
    assert len(paced) > 3 and "".join(paced).startswith("echo: one two three #slow")
    instant = [e.data["text"] for e in ask(conversation, "four five six seven eight") if e.type == "token"]
    assert len(instant) < 6, "fewer events than the answer's six words"
    assert "".join(instant) == head(conversation).received[0]["text"]


def test_t2_t5_the_next_call_sees_the_whole_path_and_nothing_else(conversation):
    """T2, T5: the head is the only pointer; the second call receives the first question and answer."""
    ask(conversation, "first")
    events = ask(conversation, "second")
    assert answer(events) == ("echo: second\nseen: user:first | assistant:echo: first\nseen: user:first | "
                              "user:second")
    path = node_path(head(conversation).pk, owner=conversation.owner_id)
    assert [p.sent[0]["text"] for p in path] == ["first", "second"]


def test_instructions_go_first_as_a_system_message(conversation):
    services.conversation_update(conversation=conversation, instructions="Be brief.")
    assert answer(ask(conversation, "hi")).endswith("seen: system:Be brief. | user:hi")


def test_a_persons_instructions_go_before_the_conversations_and_each_node_keeps_what_it_was_sent(conversation):
    """T1, T5: the owner's instructions come first; a node records the instructions its call got, so
    "what the model saw" (`call_context`) stays exact after the instructions change."""
    services.preferences_update(user=conversation.owner, instructions="Answer in English.")
    services.conversation_update(conversation=conversation, instructions="Be brief.")
    assert answer(ask(conversation, "hi")).endswith("seen: system:Answer in English.\n\nBe brief. | user:hi")
    first = head(conversation)
    assert first.instructions == "Answer in English.\n\nBe brief."
    services.preferences_update(user=conversation.owner, instructions="")
    services.conversation_update(conversation=conversation, instructions="Be long.")
    assert call_context(first) == [{"role": "system", "content": "Answer in English.\n\nBe brief."},
                                         {"role": "user", "content": "hi"}]
    assert next_context(conversation)[0] == {"role": "system", "content": "Be long."}


def test_t3_t4_tool_rounds_form_one_chain_and_results_are_the_next_nodes_sent_items(conversation):
    """T3, T4: the round that asked for the tool and the round that got its result are parent and child."""
    events = ask(conversation, '#tool sql_query {"sql": "select count(*) as n from customers"}')
    last = head(conversation)
    first = last.parent
    assert first.parent_id is None and first.status == "succeeded"
    (call,) = first.received
    assert call["type"] == "tool_call" and call["name"] == "sql_query"
    (result,) = last.sent
    assert result["type"] == "tool_result" and result["call_id"] == call["id"] and not result["is_error"]
    assert json.loads(result["content"])["rows"] == [[60]]
    assert "assistant:[call sql_query] | tool:" in answer(events)
    assert [e.type for e in events if e.type in {"tool_call", "tool_result", "done"}] == [
        "tool_call", "tool_result", "done"]
    tool_bubble = Bubble.objects.get(role="tool")
    assert tool_bubble.node_id == first.pk and tool_bubble.data["status"] == "done"


def test_c4_a_missing_tool_or_bad_arguments_still_get_a_result(conversation):
    """C4: a tool that does not exist, or gets arguments it refuses, still answers with an error result."""
    ask(conversation, '#tool no_such_tool {"x": 1} #tool sql_query {"sql": 42}')
    last = head(conversation)
    (bad_args,) = last.sent
    (missing,) = last.parent.sent
    assert missing["is_error"] and "no tool named 'no_such_tool'" in missing["content"]
    assert bad_args["is_error"] and "invalid arguments" in bad_args["content"]
    assert last.status == "succeeded"


def test_c4_a_raising_tool_becomes_an_error_result(conversation):
    """C4: SQL the database refuses becomes an error result and the turn goes on."""
    ask(conversation, '#tool sql_query {"sql": "delete from customers"}')
    (result,) = head(conversation).sent
    assert result["is_error"] and "read-only" in result["content"]


def test_round_cap_ends_the_turn_with_an_answer(conversation, settings):
    """A turn never loops for ever: the last allowed round offers no tools, so the model answers."""
    settings.ARBOR_MAX_ROUNDS_PER_TURN = 2
    directive = '#tool sql_query {"sql": "select 1"} '
    events = ask(conversation, directive * 5)
    assert events[-1].type == "done"
    assert len(node_path(head(conversation).pk, owner=conversation.owner_id)) == 2


def test_f1_a_failed_call_moves_the_head_to_the_failed_node_and_keeps_paid_tool_results(conversation):
    """F1: the failed node is the head, its sent tool results stay on the path for the next turn."""
    events = ask(conversation, '#tool sql_query {"sql": "select 1 as one"} #fail')
    failed = head(conversation)
    assert events[-1].type == "error" and events[-1].data["code"] == "provider_error"
    assert failed.status == "failed" and failed.failure_reason == "provider_error"
    assert failed.sent[0]["type"] == "tool_result"
    follow_up = answer(ask(conversation, "again"))
    assert "tool:" in follow_up, "the paid tool result is in the next turn's context"
    assert "user:again" in follow_up


def test_f2_context_overflow_leaves_the_head_where_it_was(conversation):
    """F2: an overflowing call is recorded as a branch; the head stays at the last succeeded node."""
    ask(conversation, "fine")
    before = head(conversation)
    events = ask(conversation, "#overflow")
    assert events[-1].data["code"] == "context_overflow"
    assert head(conversation) == before
    failed = Node.objects.get(failure_reason="context_overflow")
    assert failed.parent_id == before.pk and failed.sent == [{"type": "user", "text": "#overflow"}]
    assert "#overflow" not in answer(ask(conversation, "next"))


def test_f2_echo_limit_overflow_is_a_real_context_window_error(conversation, settings):
    settings.ARBOR_ECHO_MAX_INPUT_TOKENS = 50
    events = ask(conversation, "x" * 400)
    assert events[-1].data["code"] == "context_overflow"
    assert head(conversation) is None


def test_r1_each_step_commits_node_head_bubbles_and_an_outbox_job(conversation):
    """R1: at the end of a turn the node, the head move, the bubbles and a post-commit job exist together."""
    ask(conversation, "hi")
    node = head(conversation)
    assert list(Bubble.objects.filter(node=node).values_list("role", flat=True)) == ["user", "assistant"]
    assert sorted((j.kind, j.payload["conversation"], j.payload["head"]) for j in OutboxJob.objects.all()) == [
        ("embed", conversation.pk, node.pk), ("index", conversation.pk, node.pk),
        ("title", conversation.pk, node.pk)], "one job per kind, one commit"


def test_t9_r3_a_second_turn_is_refused_while_one_runs(conversation):
    """T9, R3: the database lock refuses a concurrent turn and any head move; it frees at the turn's end."""
    running = turn_ask(user=conversation.owner, conversation_id=conversation.pk, content="one")
    with pytest.raises(TurnInProgress):
        turn_ask(user=conversation.owner, conversation_id=conversation.pk, content="two")
    with pytest.raises(TurnInProgress):
        services.conversation_clear(conversation=conversation)
    run_here(running)
    assert answer(ask(conversation, "two")).startswith("echo: two")


def test_r3_an_expired_lock_does_not_block_for_ever(conversation, settings):
    """R3: a process killed mid-turn leaves a lock that expires."""
    settings.ARBOR_TURN_LOCK_SECONDS = -1
    turn_ask(user=conversation.owner, conversation_id=conversation.pk, content="abandoned")
    assert answer(ask(conversation, "later")).startswith("echo: later")


def test_stopping_a_turn_records_it_as_cancelled_and_frees_the_conversation(conversation, settings):
    """Closing the event stream (stop) fails the node as cancelled, keeps its partial text, frees the lock."""
    settings.ARBOR_ECHO_WORD_SECONDS = 0.02  # words one by one: two token events, then the stop
    events = turn_ask(user=conversation.owner, conversation_id=conversation.pk, content="one two three #slow").events()
    tokens = [next(events), next(events)]
    events.close()
    node = head(conversation)
    assert node.status == "failed" and node.failure_reason == "cancelled"
    assert node.received == [{"type": "text", "text": "".join(t.data["text"] for t in tokens)}]
    assert answer(ask(conversation, "after")).startswith("echo: after")


def test_t7_edit_branches_from_the_turn_before_and_never_sees_the_old_answer(conversation):
    """T7: the edited question's parent is the node before the original question; the old branch is kept."""
    ask(conversation, "q1")
    original = ask(conversation, "top 10 customers")
    old_head = head(conversation)
    edited = run_here(turn_edit(user=conversation.owner, conversation_id=conversation.pk, node_id=old_head.pk,
                             content="top 10 customers including overseas"))
    new_head = head(conversation)
    assert new_head.parent_id == old_head.parent_id and new_head.pk != old_head.pk
    assert "top 10 customers\n" not in answer(edited) and "user:top 10 customers | " not in answer(edited)
    assert answer(edited).endswith("| user:top 10 customers including ove")
    assert Node.objects.filter(pk=old_head.pk, received=old_head.received).exists()
    assert answer(original) != answer(edited)


def test_t7_regenerate_reruns_the_last_question_as_a_sibling(conversation):
    ask(conversation, "q1")
    first = head(conversation)
    run_here(turn_regenerate(user=conversation.owner, conversation_id=conversation.pk))
    second = head(conversation)
    assert second.pk != first.pk and second.parent_id == first.parent_id and second.sent == first.sent


def test_t7_edit_of_a_tool_turn_starts_before_its_first_round(conversation):
    ask(conversation, "q1")
    ask(conversation, '#tool sql_query {"sql": "select 1"}')
    tool_turn_end = head(conversation)
    opener = tool_turn_end.parent
    with pytest.raises(BadInput, match="did not send a question"):
        turn_edit(user=conversation.owner, conversation_id=conversation.pk, node_id=tool_turn_end.pk,
                        content="x")
    assert head(conversation) == tool_turn_end, "a refused edit changes nothing"
    run_here(turn_edit(user=conversation.owner, conversation_id=conversation.pk, node_id=opener.pk, content="q2"))
    assert head(conversation).parent_id == opener.parent_id


def test_t8_switch_goes_to_the_latest_tip_and_bubbles_carry_branch_info(conversation):
    """T8: k/n on the question's bubbles; switching back finds the old branch whole."""
    ask(conversation, "q1")
    ask(conversation, "q2")
    old_tip = head(conversation)
    q2 = old_tip
    run_here(turn_edit(user=conversation.owner, conversation_id=conversation.pk, node_id=q2.pk, content="q2b"))
    ask(conversation, "q3 on the new branch")
    views = path_bubbles(conversation=head_conversation(conversation))
    q2b_view = [v for v in views if v.bubble.content == "q2b"][0]
    assert (q2b_view.branch.index, q2b_view.branch.count) == (2, 2)
    services.head_switch(conversation=conversation, node_id=q2.pk)
    assert head(conversation) == old_tip
    views = path_bubbles(conversation=conversation)
    assert [v.bubble.content for v in views if v.bubble.role == "user"] == ["q1", "q2"]
    assert [v for v in views if v.bubble.content == "q2"][0].branch.index == 1
    new_branch_first = Node.objects.get(sent=[{"type": "user", "text": "q2b"}])
    services.head_switch(conversation=conversation, node_id=new_branch_first.pk)
    assert head(conversation).sent == [{"type": "user", "text": "q3 on the new branch"}]


def head_conversation(conversation):
    conversation.refresh_from_db()
    return conversation


def test_t9_edit_regenerate_and_switch_are_refused_while_a_turn_runs(conversation):
    ask(conversation, "q1")
    node = head(conversation)
    running = turn_ask(user=conversation.owner, conversation_id=conversation.pk, content="q2")
    with pytest.raises(TurnInProgress):
        turn_edit(user=conversation.owner, conversation_id=conversation.pk, node_id=node.pk, content="x")
    with pytest.raises(TurnInProgress):
        turn_regenerate(user=conversation.owner, conversation_id=conversation.pk)
    with pytest.raises(TurnInProgress):
        services.head_switch(conversation=conversation, node_id=node.pk)
    run_here(running)


def test_f3_send_email_waits_for_approval_then_runs(conversation):
    """F3: the turn pauses with the call pending; approving runs it through Django's mail backend."""
    events = ask(conversation, '#tool send_email {"to": "cfo@example.com", "subject": "Q3", "body": "numbers"}')
    assert events[-1].type == "approval_required"
    paused = head(conversation)
    (call,) = paused.received
    assert mail.outbox == []
    with pytest.raises(ApprovalPending):
        ask(conversation, "something else")
    resumed = run_here(turn_decide(user=conversation.owner, conversation_id=conversation.pk, call_id=call["id"],
                                approve=True))
    assert len(mail.outbox) == 1 and mail.outbox[0].to == ["cfo@example.com"]
    assert resumed[-1].type == "done"
    final = head(conversation)
    assert final.parent_id == paused.pk and not final.sent[0]["is_error"]
    assert ToolApproval.objects.get().approved is True


def test_f3_a_refused_call_gets_a_result_that_says_so(conversation):
    ask(conversation, '#tool send_email {"to": "x@example.com", "subject": "s", "body": "b"}')
    (call,) = head(conversation).received
    run_here(turn_decide(user=conversation.owner, conversation_id=conversation.pk, call_id=call["id"],
                      approve=False))
    (result,) = head(conversation).sent
    assert result["is_error"] and result["content"].startswith("refused")
    assert mail.outbox == []


def test_f3_switching_branches_neither_undoes_nor_repeats_a_sent_email(conversation):
    """F3: effects happened once; switching away and back, and asking on, never re-runs the tool."""
    ask(conversation, "q1")
    q1 = head(conversation)
    ask(conversation, '#tool send_email {"to": "x@example.com", "subject": "s", "body": "b"}')
    (call,) = head(conversation).received
    run_here(turn_decide(user=conversation.owner, conversation_id=conversation.pk, call_id=call["id"],
                      approve=True))
    email_branch = head(conversation)
    run_here(turn_edit(user=conversation.owner, conversation_id=conversation.pk, node_id=email_branch.parent_id,
                    content="no email this time"))
    services.head_switch(conversation=conversation, node_id=email_branch.pk)
    assert head(conversation) == email_branch
    assert 'tool:{"sent": true' in answer(ask(conversation, "and now?"))
    path = node_path(head(conversation).pk, owner=conversation.owner_id)
    assert len(mail.outbox) == 1 and q1.pk in [p.id for p in path]


def test_r3_a_turn_that_outlived_its_lock_keeps_its_node_but_cannot_move_the_head(conversation, settings):
    """R3: a stale run (its lock expired and another turn took it) never moves the head; nothing is lost."""
    settings.ARBOR_TURN_LOCK_SECONDS = -1  # every lock is born expired
    stale = turn_ask(user=conversation.owner, conversation_id=conversation.pk, content="stale").events()
    next(stale)  # its node is pending, its call under way
    settings.ARBOR_TURN_LOCK_SECONDS = 300
    ask(conversation, "fresh")
    fresh_head = head(conversation)
    events = list(stale)
    assert events[-1].type == "error" and events[-1].data["code"] == "turn_superseded"
    assert head(conversation) == fresh_head
    # The fresh turn took the lock over and found the stale node pending: it failed it as interrupted (and
    # asked below it, as after a crash). The stale run's late answer is kept too, beside it, so the fresh
    # question's context never changes under it (issue 12).
    interrupted, late = Node.objects.filter(sent=[{"type": "user", "text": "stale"}]).order_by("pk")
    assert interrupted.status == "failed" and interrupted.failure_reason == "interrupted"
    assert fresh_head.parent_id == interrupted.pk
    assert late.status == "succeeded" and late.parent_id == interrupted.parent_id
    # R4: the late answer, kept as a branch, is searchable like the rest (its turn queued jobs for it).
    worker.run_due()
    shown = Bubble.objects.filter(conversation=conversation, role__in=("user", "assistant"))
    assert shown.filter(node=late).exists() and not shown.filter(document__isnull=True).exists()
    assert late.received[0]["text"].startswith("echo: stale")
    # Its answer's bubble is the sibling's; the interrupted node keeps only its error (issue 13: the answer is
    # written in one batch, whose bubbles wait for the node's own UPDATE and are written for the sibling instead).
    assert list(Bubble.objects.filter(node=late).values_list("role", flat=True)) == ["assistant"]
    assert "assistant" not in Bubble.objects.filter(node=interrupted).values_list("role", flat=True)


def test_r1_a_turn_that_dies_mid_way_loses_nothing_already_answered(conversation, settings):
    """R1: each round commits on its own: if the process dies after round one, round one is in the tree."""
    settings.ARBOR_TURN_LOCK_SECONDS = -1  # the dead process's lock must not block the next turn
    events = turn_ask(user=conversation.owner, conversation_id=conversation.pk,
                            content='#tool sql_query {"sql": "select 1"}').events()
    assert next(e for e in events if e.type == "tool_call")
    # The process "dies" here: the generator is never resumed nor closed.
    try:
        first = Node.objects.get(parent__isnull=True)
        assert first.status == "succeeded" and first.received[0]["type"] == "tool_call"
        assert Bubble.objects.filter(node=first, role="user").exists()
        assert head(conversation) is None, "the head moves only at the end of a turn (T3)"
        settings.ARBOR_TURN_LOCK_SECONDS = 300
        assert answer(ask(conversation, "next")).startswith("echo: next")
        assert Node.objects.filter(pk=first.pk, status="succeeded").exists()
    finally:
        events.close()


@pytest.mark.django_db(transaction=True)
def test_t9_the_lock_is_renewed_while_a_long_answer_streams(conversation, settings):
    """T9, R3, issue 12: a turn that outlives its lease keeps the lock by its heartbeat; a switch meanwhile
    is refused. A 3 s lease, renewed every 0.1 s, held through a 5 s answer."""
    ask(conversation, "q1")
    q1 = head(conversation)
    settings.ARBOR_TURN_LOCK_SECONDS = 3
    settings.ARBOR_TURN_HEARTBEAT_SECONDS = 0.1
    settings.ARBOR_ECHO_WORD_SECONDS = 0.2
    events = turn_ask(user=conversation.owner, conversation_id=conversation.pk,
                      content="#slow " + " ".join(f"w{i}" for i in range(24))).events()
    started = time.monotonic()
    for _ in events:
        if time.monotonic() - started > 4:
            break
    with pytest.raises(TurnInProgress):  # 4 s after the lock was taken: only renewals held it
        services.head_switch(conversation=conversation, node_id=q1.pk)
    rest = list(events)
    assert rest[-1].type == "done" and head(conversation).pk == rest[-1].data["head"]


def test_f3_f2_an_approved_call_whose_next_round_overflows_does_not_lock_the_conversation(conversation):
    """F3 with F2: the email is sent once; the head stays at the approval; the next question carries the
    stored result instead of sending the email again."""
    ask(conversation, '#tool send_email {"to": "a@example.com", "subject": "s", "body": "b"} #overflow')
    paused = head(conversation)
    (call,) = paused.received
    events = run_here(turn_decide(user=conversation.owner, conversation_id=conversation.pk, call_id=call["id"],
                               approve=True))
    assert events[-1].data["code"] == "context_overflow"
    assert head(conversation) == paused and len(mail.outbox) == 1
    follow = ask(conversation, "did it go out?")
    assert follow[-1].type == "done" and len(mail.outbox) == 1
    (result, question) = head(conversation).sent
    assert result["call_id"] == call["id"] and '"sent": true' in result["content"]
    assert question == {"type": "user", "text": "did it go out?"}


def test_f3_deciding_again_the_same_way_resumes_without_running_the_tool_twice(conversation):
    ask(conversation, '#tool send_email {"to": "a@example.com", "subject": "s", "body": "b"}')
    (call,) = head(conversation).received
    turn = turn_decide(user=conversation.owner, conversation_id=conversation.pk, call_id=call["id"],
                             approve=True)
    give_back(turn)  # the client left before the turn ran
    again = run_here(turn_decide(user=conversation.owner, conversation_id=conversation.pk, call_id=call["id"],
                              approve=True))
    assert again[-1].type == "done" and len(mail.outbox) == 1
    with pytest.raises(Exception, match="No tool call"):
        turn_decide(user=conversation.owner, conversation_id=conversation.pk, call_id=call["id"],
                          approve=False)


def test_c4_f1_stopping_between_rounds_gives_the_open_calls_not_run_results(conversation):
    """C4, F1: stop after a round that asked for tools: the calls get 'not run' results in a failed node
    that becomes the head, so the question stays on the path."""
    events = turn_ask(user=conversation.owner, conversation_id=conversation.pk,
                            content='#tool sql_query {"sql": "select 1"}').events()
    next(e for e in events if e.type == "tool_call")
    events.close()
    stopped = head(conversation)
    assert stopped.status == "failed" and stopped.failure_reason == "cancelled"
    (result,) = stopped.sent
    assert result["is_error"] and result["content"] == "not run: stopped by the user"
    assert [v.bubble.content for v in path_bubbles(conversation=conversation) if v.bubble.role == "user"] == [
        '#tool sql_query {"sql": "select 1"}']
    assert answer(ask(conversation, "next")).startswith("echo: next")


def test_t8_f2_overflowed_attempts_are_not_branches_to_switch_to(conversation):
    ask(conversation, "q1")
    ask(conversation, "#overflow")
    ask(conversation, "q2")
    views = path_bubbles(conversation=head_conversation(conversation))
    q2 = [v for v in views if v.bubble.content == "q2"][0]
    assert (q2.branch.index, q2.branch.count) == (1, 1)
    overflowed = Node.objects.get(failure_reason="context_overflow")
    with pytest.raises(BadInput, match="no answer to switch to"):
        services.head_switch(conversation=conversation, node_id=overflowed.pk)


def test_c4_a_tool_that_times_out_still_gets_a_result(conversation, settings, monkeypatch):
    import time

    from conversations.tools import registry

    slow = registry.Tool(name="slow_tool", description="sleeps", function=lambda: time.sleep(2),
                         parameters={"type": "object", "properties": {}})
    monkeypatch.setitem(registry._TOOLS, "slow_tool", slow)
    settings.ARBOR_TOOL_TIMEOUT_SECONDS = 0.2
    events = ask(conversation, "#tool slow_tool {}")
    (result,) = head(conversation).sent
    assert result["is_error"] and "did not finish within 0.2 s" in result["content"]
    assert events[-1].type == "done"


def test_t6_a_healthy_tool_turn_never_drops_anything(conversation, caplog):
    """T6: through real rounds (tool calls, results, follow-up questions) the orphan drop never fires."""
    import logging

    with caplog.at_level(logging.WARNING, logger="arbor.context"):
        ask(conversation, '#tool sql_query {"sql": "select 1"} #tool sql_query {"sql": "select 2"}')
        ask(conversation, "and then?")
        run_here(turn_regenerate(user=conversation.owner, conversation_id=conversation.pk))
    assert [r for r in caplog.records if r.name == "arbor.context"] == []


def test_r3_a_turn_reads_the_head_with_its_lock(conversation, monkeypatch):
    """R3: a turn that finishes just before another request takes the lock cannot be overwritten: the
    conversation is read by the UPDATE that takes the lock (no earlier read can be stale)."""
    ask(conversation, "q1")
    take = TurnLock._take.__func__

    def let_another_turn_finish_then_take(cls, pk, **kwargs):
        monkeypatch.setattr(TurnLock, "_take", classmethod(take))
        ask(conversation, "finished in between")
        return take(cls, pk, **kwargs)

    monkeypatch.setattr(TurnLock, "_take", classmethod(let_another_turn_finish_then_take))
    ask(conversation, "q3")
    texts = [p.sent[0]["text"] for p in node_path(head(conversation).pk, owner=conversation.owner_id)]
    assert texts == ["q1", "finished in between", "q3"]


def test_t7_an_edit_that_never_runs_moves_nothing(conversation):
    """T7: edit and regenerate only choose the parent; the head moves when their turn ends."""
    ask(conversation, "q1")
    ask(conversation, "q2")
    before = head(conversation)
    give_back(turn_regenerate(user=conversation.owner, conversation_id=conversation.pk))
    give_back(turn_edit(user=conversation.owner, conversation_id=conversation.pk, node_id=before.pk,
                    content="x"))
    assert head(conversation) == before


def test_t7_f2_an_edit_that_overflows_leaves_the_head_on_the_old_branch(conversation):
    ask(conversation, "q1")
    before = head(conversation)
    events = run_here(turn_edit(user=conversation.owner, conversation_id=conversation.pk, node_id=before.pk,
                             content="#overflow"))
    assert events[-1].data["code"] == "context_overflow" and head(conversation) == before
