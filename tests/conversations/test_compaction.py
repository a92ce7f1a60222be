"""Compaction and provider switching (C1–C4, T10) through the one turn runner, arbor/echo and the stub."""

from __future__ import annotations

import logging

import pytest
from django.test import Client
from django.urls import reverse

from conversations import budget, llm, services
from conversations.context import SUMMARY_PREFIX, is_compaction_root
from conversations.locks import TurnLock
from conversations.models import Bubble, Node
from conversations.screen import path_bubbles
from conversations.selectors import context_path, history_path, node_path
from conversations.turns.compaction import COMPACTION_PROMPT
from conversations.turns.seen import call_context
from conversations.turns.start import turn_compact
from tests.conversations.helpers import answer, ask, head, owner_of
from tests.support.openai_stub import Reply

pytestmark = pytest.mark.django_db

STUB = "openai/stub-model"


@pytest.fixture
def small_echo(settings):
    """arbor/echo with a small input limit: 1200 tokens, 300 kept for the answer, compaction at 80% of 900."""
    settings.ARBOR_ECHO_MAX_INPUT_TOKENS = 1200
    settings.ARBOR_ANSWER_RESERVE_TOKENS = 300
    settings.ARBOR_COMPACTION_THRESHOLD = 0.8
    settings.ARBOR_COMPACTION_KEEP_TURNS = 2
    return budget.budget_for("arbor/echo")


def _url(name: str, conversation) -> str:
    return reverse(name, args=[conversation.pk])


def _ask_until_compacted(conversation, *, limit: int = 40, past: Node | None = None) -> Node:
    """Ask until the path starts at a compaction root (another one than `past`); return that root."""
    for i in range(limit):
        events = ask(conversation, f"question {i}: what were the sales of region {i}?")
        assert events[-1].type == "done", events[-1]
        root = node_path(head(conversation).pk, owner=conversation.owner_id)[0]
        if is_compaction_root(root) and (past is None or root.id != past.pk):
            return Node.objects.get(pk=root.id)
    raise AssertionError("no compaction happened")


def _compact_by_hand(api, conversation) -> Node:
    response = api.post(_url("conversation-compact", conversation))
    assert response.status_code == 201, response.json()
    return Node.objects.get(pk=response.json()["id"])


# --- the budget (C1) -------------------------------------------------------------------------------


def test_c1_the_budget_is_the_input_limit_minus_a_reserve_with_overrides(settings):
    """C1: litellm's max input tokens (never the context window), a settings override, echo's own limit."""
    settings.ARBOR_MAX_INPUT_TOKENS = {}
    settings.ARBOR_ANSWER_RESERVE_TOKENS = 4096
    settings.ARBOR_COMPACTION_THRESHOLD = 0.5
    gpt = budget.budget_for("openai/gpt-4o")
    assert (gpt.limit, gpt.reserve, gpt.allowed, gpt.threshold) == (128000, 4096, 123904, 61952)
    settings.ARBOR_MAX_INPUT_TOKENS = {"openai/gpt-4o": 20000}
    assert budget.budget_for("openai/gpt-4o").limit == 20000
    settings.ARBOR_ECHO_MAX_INPUT_TOKENS = 4000
    echo = budget.budget_for("arbor/echo")
    assert (echo.limit, echo.reserve) == (4000, 1000), "the reserve is capped at a quarter of a small limit"
    settings.ARBOR_DEFAULT_MAX_INPUT_TOKENS = 5000
    assert budget.budget_for("hosted_vllm/unknown-model").limit == 5000
    settings.ARBOR_MAX_INPUT_TOKENS = {"*": 7000}
    assert budget.budget_for("hosted_vllm/unknown-model").limit == 7000


def test_c1_every_node_stores_its_count_and_its_paths(conversation, small_echo):
    """C1: path_tokens = parent's path_tokens + own tokens, and a compaction root starts again from its own."""
    root = _ask_until_compacted(conversation)
    assert root.path_tokens == root.tokens > 0
    ask(conversation, "one more")
    for node in Node.objects.filter(kind=Node.Kind.TURN).exclude(parent=None).select_related("parent"):
        assert node.tokens > 0
        assert node.path_tokens == node.parent.path_tokens + node.tokens
    # The stored figure is what the assembled context costs, give or take rounding per message.
    tip = head(conversation)
    context = call_context(tip)
    assert abs(budget.llm.count_tokens("arbor/echo", context) - tip.path_tokens + tip.tokens) < 40


# --- compacting in the turn runner (C1, C2) ------------------------------------------------------


@pytest.mark.slow
def test_c1_c2_a_200_turn_conversation_never_passes_the_budget_and_its_path_stays_short(conversation, small_echo,
                                                                                       caplog):
    """C1, C2: 200 turns with echo's small limit (some with tool rounds): no call fails, none passes the
    budget, every summarising call fits the limit, the path stays bounded, and no tool pair is split (T6)."""
    longest = 0
    for i in range(200):
        question = f"q{i}: sales of region {i % 7}?"
        if i % 10 == 3:
            question += f' #tool sql_query {{"sql": "select {i} as n"}}'
        events = ask(conversation, question)
        assert events[-1].type == "done", (i, events[-1])
        longest = max(longest, len(node_path(head(conversation).pk, owner=conversation.owner_id)))
    calls = Node.objects.filter(conversation=conversation)
    assert not calls.filter(status=Node.Status.FAILED).exists()
    turn_calls = calls.filter(kind=Node.Kind.TURN)
    assert max(n.usage["prompt_tokens"] for n in turn_calls) <= small_echo.allowed
    summaries = calls.filter(kind=Node.Kind.COMPACTION, parent__isnull=False)
    assert summaries.count() >= 10
    assert max(n.usage["prompt_tokens"] for n in summaries) <= small_echo.limit
    assert longest <= 12, f"the path grew to {longest} nodes"
    assert not [r for r in caplog.records if "no partner" in r.getMessage()], "a tool call was split from its result"
    # Nothing is lost: the whole history behind the compactions still holds every question.
    questions = [b.content for b in Bubble.objects.filter(conversation=conversation, role="user").order_by("id")]
    assert len(questions) == 200
    history = {p.id for p in history_path(head(conversation).pk, owner=conversation.owner_id)}
    asked = set(Bubble.objects.filter(conversation=conversation, role="user").values_list("node_id", flat=True))
    assert asked <= history, "every question node is still reachable behind the compactions (C3)"


def test_c2_the_summarising_call_is_recorded_and_never_a_head_nor_in_a_context(conversation, small_echo, api):
    """C2: the summarising call hangs below the old head with the compaction prompt, keeps its usage,
    is never a head or a switch target, and the next call's context starts at the root."""
    root = _ask_until_compacted(conversation)
    call = root.summary_call
    assert call.kind == Node.Kind.COMPACTION and call.status == Node.Status.SUCCEEDED
    assert call.parent_id in {p.id for p in history_path(root.compacted_from_id, owner=root.owner_id)}
    assert call.sent[-1] == {"type": "user", "text": COMPACTION_PROMPT}
    assert call.usage["prompt_tokens"] > 0 and call.usage["completion_tokens"] > 0
    assert root.parent_id is None and root.received == [] and root.status == Node.Status.SUCCEEDED
    assert not Node.objects.can_be_head().filter(pk=call.pk).exists()
    assert Node.objects.can_be_head().filter(pk=root.pk).exists()
    refused = api.post(_url("head-switch", conversation), {"node": call.pk}, format="json")
    assert refused.status_code == 400 and head(conversation).pk != call.pk
    ask(conversation, "after the compaction")
    assert node_path(head(conversation).pk, owner=conversation.owner_id)[0].id == root.pk
    assert COMPACTION_PROMPT not in str(call_context(head(conversation)))


def test_c2_compaction_keeps_the_last_turns_verbatim(conversation, small_echo):
    """C2: the root holds the summary item, then the last turns word for word (two here)."""
    root = _ask_until_compacted(conversation)
    assert root.sent[0]["type"] == "summary"
    kept_questions = [i["text"] for i in root.sent if i["type"] == "user"]
    assert len(kept_questions) == 2
    original_path = node_path(root.compacted_from_id, owner=owner_of(root.compacted_from_id))
    assert kept_questions[-1] == original_path[-1].sent[-1]["text"]


def test_c2_compact_by_hand_moves_the_head_to_a_new_root(conversation, small_echo, api, settings):
    """C2, C3: POST /compact/ answers 201 with the root; the head moves there, the original is the old head."""
    settings.ARBOR_COMPACTION_KEEP_TURNS = 1  # two short turns leave something to compact, far below the limit
    for i in range(2):
        ask(conversation, f"question {i}")
    assert not Node.objects.filter(kind="compaction").exists(), "no automatic compaction before the manual one"
    old_head = head(conversation).pk
    response = api.post(_url("conversation-compact", conversation))
    assert response.status_code == 201
    body = response.json()
    assert body["kind"] == "compaction" and body["parent"] is None and body["compacted_from"] == old_head
    assert head(conversation).pk == body["id"]
    summary = Node.objects.get(pk=body["summary_call"])
    assert summary.parent_id == old_head and summary.usage["total_tokens"] > 0
    seen = answer(ask(conversation, "what did I ask?"))
    assert "seen: user:summary of" in seen, "echo reads its own opaque summary"
    assert "question 0" not in seen.split("seen:")[1].split("|")[0]


def test_c2_compact_by_hand_refuses_bad_states_and_changes_nothing(conversation, api, other_api):
    """A refused compaction writes no node and moves no head: empty, too short, locked, not yours."""
    assert api.post(_url("conversation-compact", conversation)).json()["error"]["code"] == "nothing_to_compact"
    ask(conversation, "only one question")
    before = (Node.objects.count(), head(conversation).pk)
    short = api.post(_url("conversation-compact", conversation))
    assert short.status_code == 400 and short.json()["error"]["code"] == "nothing_to_compact"
    assert other_api.post(_url("conversation-compact", conversation)).status_code == 404
    lock = TurnLock.acquire(conversation)
    locked = api.post(_url("conversation-compact", conversation))
    assert locked.status_code == 409 and locked.json()["error"]["code"] == "turn_in_progress"
    lock.release()
    assert (Node.objects.count(), head(conversation).pk) == before


def test_c2_compact_by_hand_waits_for_a_pending_approval(conversation, api, settings):
    """F3: a call waiting for a person's decision is not compacted away: 409 approval_pending."""
    settings.ARBOR_COMPACTION_KEEP_TURNS = 1
    ask(conversation, "hello")
    ask(conversation, '#tool send_email {"to": "a@example.com", "subject": "s", "body": "b"}')
    before = (Node.objects.count(), head(conversation).pk)
    refused = api.post(_url("conversation-compact", conversation))
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "approval_pending"
    assert (Node.objects.count(), head(conversation).pk) == before


def test_c2_a_failed_summarising_call_loses_nothing_and_leaves_the_head(conversation, stub, api, settings):
    """F1/C2: the summarising call fails at the provider: 502, its node recorded as failed, no root, same head."""
    settings.ARBOR_COMPACTION_KEEP_TURNS = 1
    services.conversation_update(conversation=conversation, model=STUB)
    for i in range(3):
        ask(conversation, f"question {i}")
    old_head, count = head(conversation).pk, Node.objects.count()
    stub.script(Reply.server_error("the summariser is down"))
    response = api.post(_url("conversation-compact", conversation))
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == "provider_error" and "summariser is down" in error["message"]
    failed = Node.objects.get(pk=error["node"])
    assert (failed.kind, failed.status, failed.parent_id) == ("compaction", "failed", old_head)
    assert Node.objects.count() == count + 1 and head(conversation).pk == old_head
    assert not Node.objects.filter(compacted_from__isnull=False).exists()
    assert answer(ask(conversation, "still here?")) == "stub: ok"


def _stub_compacting_soon(conversation, settings, *, limit: int) -> None:
    """Three turns on the stub, then a limit whose threshold the next call passes."""
    services.conversation_update(conversation=conversation, model=STUB)
    for i in range(3):
        ask(conversation, f"question number {i} with some words in it")
    settings.ARBOR_MAX_INPUT_TOKENS = {STUB: limit}
    settings.ARBOR_ANSWER_RESERVE_TOKENS = 20
    settings.ARBOR_COMPACTION_THRESHOLD = 0.1
    settings.ARBOR_COMPACTION_KEEP_TURNS = 1


def test_c2_a_failed_summarising_call_inside_a_turn_lets_the_turn_go_on(conversation, stub, settings):
    """C2: in the turn runner a failed summary is recorded and the call goes out uncompacted (it fits)."""
    _stub_compacting_soon(conversation, settings, limit=200)
    old_head = head(conversation).pk
    stub.script(Reply.server_error("no summary today"), Reply.text("answered anyway"))
    events = ask(conversation, "and now?")
    assert answer(events) == "answered anyway"
    failed = Node.objects.get(kind="compaction", status="failed")
    assert failed.parent_id == old_head and head(conversation).parent_id == old_head


def test_c2_a_failed_summary_is_tried_once_per_turn(conversation, stub, settings):
    """C2: after a failed summarising call, the turn's later rounds go out uncompacted without asking
    for another summary (one failed compaction node, and the scripted replies go to the turn's calls)."""
    _stub_compacting_soon(conversation, settings, limit=300)
    stub.script(Reply.server_error("no summary today"),
                Reply.tool_calls([("call_1", "sql_query", '{"sql": "select 1 as n"}')]),
                Reply.text("answered after the tool"))
    events = ask(conversation, "and now?")
    assert answer(events) == "answered after the tool"
    assert Node.objects.filter(kind="compaction").count() == 1


# --- T10 ------------------------------------------------------------------------------------------


def test_t10_editing_a_question_before_compaction_is_refused_through_the_api(conversation, small_echo, api):
    """T10: 409 before_compaction and nothing changes, for a question one and two compactions back."""
    first = _ask_until_compacted(conversation)
    first_question = Node.objects.filter(conversation=conversation, kind="turn").order_by("id").first()
    kept_question = node_path(first.compacted_from_id, owner=owner_of(first.compacted_from_id))[-1].id
    second = _ask_until_compacted(conversation, past=first)
    assert node_path(second.compacted_from_id, owner=owner_of(second.compacted_from_id))[0].id == first.pk
    ask(conversation, "after both")
    before = (Node.objects.count(), head(conversation).pk, Bubble.objects.count())
    for node in (first_question.pk, kept_question, first.pk):
        response = api.post(_url("turn-edit", conversation), {"node": node, "content": "changed"}, format="json")
        assert response.status_code == 409, response.json()
        assert response.json()["error"]["code"] == "before_compaction"
    regenerate = api.post(_url("turn-regenerate", conversation), {"node": first_question.pk}, format="json")
    assert regenerate.json()["error"]["code"] == "before_compaction"
    assert (Node.objects.count(), head(conversation).pk, Bubble.objects.count()) == before


def test_t7_t10_editing_a_question_after_compaction_branches_normally(conversation, small_echo, api):
    """T7: a question after the compaction node is edited like any other: a sibling below the same parent."""
    root = _ask_until_compacted(conversation)
    ask(conversation, "first after")
    question = head(conversation)
    ask(conversation, "second after")
    response = api.post(_url("turn-edit", conversation), {"node": question.pk, "content": "first, edited"},
                        format="json")
    assert response.status_code == 201
    edited = head(conversation)
    assert edited.parent_id == question.parent_id and node_path(edited.pk, owner=owner_of(edited.pk))[0].id == root.pk
    assert "first, edited" in response.json()["answer"]
    bubbles = api.get(_url("conversation-bubbles", conversation)).json()["results"]
    edited_bubble = next(b for b in bubbles if b["node"] == edited.pk and b["role"] == "user")
    assert edited_bubble["branch"]["count"] == 2 and edited_bubble["editable"] is True


# --- the screen and "what the model saw" ---------------------------------------------------------


def test_c3_bubbles_show_the_whole_history_with_a_marker_and_no_edit_before_it(conversation, small_echo, api):
    """C3, T8, T10: /bubbles/ shows the original path's bubbles, a compaction marker, then the new ones."""
    root = _ask_until_compacted(conversation)
    ask(conversation, "after the compaction")
    bubbles = api.get(_url("conversation-bubbles", conversation)).json()["results"]
    questions = [b["content"] for b in bubbles if b["role"] == "user"]
    asked = list(Bubble.objects.filter(conversation=conversation, role="user").order_by("id")
                 .values_list("content", flat=True))
    assert questions == asked
    markers = [i for i, b in enumerate(bubbles) if b["role"] == "compaction"]
    assert len(markers) == 1 and bubbles[markers[0]]["node"] == root.pk and bubbles[markers[0]]["id"] is None
    assert all(not b["editable"] for b in bubbles[: markers[0] + 1])
    assert all(b["editable"] for b in bubbles[markers[0] + 1:])
    assert bubbles[-1]["content"].startswith("echo: after the compaction")


def test_c2_what_the_model_saw_after_a_compaction(conversation, small_echo, api):
    """C2: /context/ and call_context start with the summary, then the kept turns, then the new question."""
    root = _ask_until_compacted(conversation)
    ask(conversation, "after the compaction")
    node = head(conversation)
    seen = call_context(node)
    assert seen[0]["role"] == "user" and seen[0]["content"] == root.sent[0]["data"]
    assert seen[-1] == {"role": "user", "content": "after the compaction"}
    assert answer_digest_count(node) == len(seen), "echo saw exactly the messages call_context shows"
    context = api.get(_url("conversation-context", conversation)).json()["messages"]
    assert context == [*seen, {"role": "assistant", "content": node.received[0]["text"]}]
    root_context = call_context(root)
    assert seen[: len(root_context)] == root_context, "a compaction root's context is where its next call starts"


def answer_digest_count(node: Node) -> int:
    return len(node.received[0]["text"].split("\nseen: ", 1)[1].split(" | "))


# --- switching provider (C3, C4) ------------------------------------------------------------------


def test_c3_a_provider_that_cannot_read_the_summary_gets_the_original_expanded(conversation, small_echo, stub):
    """C3: echo's opaque summary never reaches the OpenAI-compatible stub; the original path does."""
    root = _ask_until_compacted(conversation)
    assert root.sent[0]["provider"] == "arbor", "echo compacts natively, opaquely"
    services.conversation_update(conversation=conversation, model=STUB)
    stub.script(Reply.text("the stub answers"))
    assert answer(ask(conversation, "now on another provider")) == "the stub answers"
    sent = stub.requests[-1]["messages"]
    assert "<arbor-compaction" not in str(sent)
    assert sent[0]["content"] == "question 0: what were the sales of region 0?"
    assert sent[-1]["content"] == "now on another provider"
    node = head(conversation)
    assert node_path(node.pk, owner=node.owner_id)[0].id == root.pk, \
        "the tree is unchanged: the call still hangs below the root"
    assert call_context(node) == [{k: v for k, v in m.items() if v is not None} for m in sent]
    # C1: the stored count stays the one of the path the node really hangs on; the expansion is added
    # at check time, once, and the next call's check sees the whole expanded path.
    assert node.path_tokens == Node.objects.get(pk=node.parent_id).path_tokens + node.tokens
    expanded = context_path(node_path(node.pk, owner=node.owner_id), "openai", owner=node.owner_id)
    assert expanded[-1].path_tokens == Node.objects.get(pk=root.compacted_from_id).path_tokens + (
        node.path_tokens - root.tokens)


def test_c3_expanded_and_still_over_budget_compacts_again_for_the_new_model(conversation, small_echo, stub, settings):
    """C3: after the switch the original is expanded, it is over the stub's budget, so the stub compacts it
    (a text summary any provider reads); switching back to echo then reads the stub's summary as text."""
    root = _ask_until_compacted(conversation)
    services.conversation_update(conversation=conversation, model=STUB)
    settings.ARBOR_MAX_INPUT_TOKENS = {STUB: 700}
    stub.script(Reply.text("stub summary: regions 0 to 3 asked about [user]"), Reply.text("the stub answers"))
    assert answer(ask(conversation, "now on another provider")) == "the stub answers", [
        budget.llm.count_tokens(STUB, r["messages"]) for r in stub.requests]
    summarising, turn = stub.requests
    assert budget.llm.count_tokens(STUB, summarising["messages"]) <= 700, "C1: the summary fits the new model"
    assert summarising["messages"][-1]["content"] == COMPACTION_PROMPT
    assert "<arbor-compaction" not in str(summarising["messages"])
    second = Node.objects.filter(compacted_from__isnull=False).exclude(pk=root.pk).get()
    assert node_path(second.compacted_from_id, owner=second.owner_id)[0].id == root.pk, \
        "C3: its original is the head at compaction time"
    assert second.provider == "openai" and second.summary_call.model == STUB
    assert second.sent[0] == {"type": "summary", "text": "stub summary: regions 0 to 3 asked about [user]"}
    assert turn["messages"][0]["content"] == SUMMARY_PREFIX + "stub summary: regions 0 to 3 asked about [user]"
    assert head(conversation).parent_id == second.pk
    services.conversation_update(conversation=conversation, model="arbor/echo")
    seen = answer(ask(conversation, "back on echo"))
    assert "seen: user:Summary of the earlier convers | " in seen


def test_c3_delete_keeps_a_shared_roots_summarising_call(user, conversation, small_echo):
    """T11, P3: another conversation whose head is past a compaction root keeps the root, its original and
    its summarising call when this conversation is deleted."""
    root = _ask_until_compacted(conversation)
    ask(conversation, "after")
    other = services.conversation_create(owner=user, title="other")
    services.head_move(conversation=other, to=head(conversation).pk)
    services.conversation_delete(conversation=conversation)
    assert Node.objects.filter(pk__in=[root.pk, root.summary_call_id, root.compacted_from_id]).count() == 3


def test_c2_compaction_inside_a_tool_turn_keeps_call_and_result_together(conversation, settings, caplog):
    """C2, T4, T6: compaction between rounds: the summarising call sends the open calls' results, the root
    keeps the calls, the next round's node sends the results: no pair split, nothing dropped."""
    settings.ARBOR_ECHO_MAX_INPUT_TOKENS = 1200
    settings.ARBOR_ANSWER_RESERVE_TOKENS = 300
    settings.ARBOR_COMPACTION_KEEP_TURNS = 1
    for i in range(3):
        ask(conversation, f"warm-up question {i} " + "words " * 30)
    settings.ARBOR_COMPACTION_THRESHOLD = 0.5
    caplog.set_level(logging.WARNING, logger="arbor.context")
    events = ask(conversation, '#tool sql_query {"sql": "select 7 as n"} ' + "padding " * 40)
    assert events[-1].type == "done"
    assert any(e.type == "compaction" for e in events)
    assert not [r for r in caplog.records if "no partner" in r.getMessage()]
    # S1: the tool bubble belongs to the node that made the call, which the root is not: it still gets
    # its result instead of staying "running".
    tool = Bubble.objects.get(conversation=conversation, role=Bubble.Role.TOOL)
    assert tool.data["status"] == "done" and "7" in tool.data["result"]


def test_t10_regenerate_right_after_a_compaction_is_refused(conversation, api, settings):
    """T10: with the head on a compaction node, the last question lies before it: 409, nothing changes."""
    settings.ARBOR_COMPACTION_KEEP_TURNS = 1
    for i in range(3):
        ask(conversation, f"question {i}")
    root = _compact_by_hand(api, conversation)
    count = Node.objects.count()
    refused = api.post(_url("turn-regenerate", conversation), {}, format="json")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "before_compaction"
    assert Node.objects.count() == count and head(conversation).pk == root.pk


# --- branches across a compaction (T7, T8: nothing is ever lost) ----------------------------------


def _switch(api, conversation, node_id: int) -> None:
    response = api.post(_url("head-switch", conversation), {"node": node_id}, format="json")
    assert response.status_code == 200, response.json()


def _edit(api, conversation, node_id: int, content: str) -> None:
    response = api.post(_url("turn-edit", conversation), {"node": node_id, "content": content}, format="json")
    assert response.status_code == 201, response.json()


def test_t8_switching_back_reaches_a_branch_tip_beyond_its_compaction(conversation, small_echo, api):
    """T8, C3: a branch compacted after it was left is reached through the root's original pointer:
    switching to its question lands on its latest tip, not on the pre-compaction original."""
    ask(conversation, "q0")
    ask(conversation, "q1A")
    q1a = head(conversation).pk
    _edit(api, conversation, q1a, "q1B")
    q1b = head(conversation).pk
    _switch(api, conversation, q1a)
    assert head(conversation).pk == q1a
    root = _ask_until_compacted(conversation)
    ask(conversation, "once more on A")
    a_tip = head(conversation).pk
    assert node_path(a_tip, owner=owner_of(a_tip))[0].id == root.pk
    _switch(api, conversation, q1b)
    assert head(conversation).pk == q1b
    _switch(api, conversation, q1a)
    assert head(conversation).pk == a_tip
    # The compare page shows each branch down to its latest tip, behind the compaction too.
    page = Client()
    page.force_login(conversation.owner)
    compare = page.get(reverse("chat-compare", args=[conversation.pk]) + f"?a={q1a}&b={q1b}")
    assert compare.status_code == 200
    assert "once more on A" in compare.content.decode()
    assert "Failed (" not in compare.content.decode() and 'class="compaction-marker"' in compare.content.decode()


def test_t7_t8_an_edit_that_compacts_keeps_both_questions_as_siblings(conversation, small_echo, api, settings):
    """T7, T8: an edit long enough to trigger compaction hangs the new question below a new root; the old
    and the new question are still siblings (2/2) on the screen, and switching between them works."""
    settings.ARBOR_ECHO_MAX_INPUT_TOKENS = 100_000  # no compaction while warming up
    for i in range(4):
        ask(conversation, f"warm-up {i} " + "words " * 20)
    old = head(conversation)
    ask(conversation, "after the warm-up")
    assert not is_compaction_root(node_path(head(conversation).pk, owner=conversation.owner_id)[0])
    settings.ARBOR_ECHO_MAX_INPUT_TOKENS = 1200
    _edit(api, conversation, old.pk, "edited " + "long words " * 150)
    edited = head(conversation)
    root = node_path(edited.pk, owner=owner_of(edited.pk))[0]
    assert is_compaction_root(root) and root.compacted_from_id == old.parent_id, "the edit compacted"
    bubbles = api.get(_url("conversation-bubbles", conversation)).json()["results"]
    edited_bubble = next(b for b in bubbles if b["node"] == edited.pk and b["role"] == "user")
    assert edited_bubble["branch"] == {"index": 2, "count": 2, "siblings": [old.pk, edited.pk]}
    _switch(api, conversation, old.pk)
    assert head(conversation).parent_id == old.pk, "back on the old branch's tip"
    bubbles = api.get(_url("conversation-bubbles", conversation)).json()["results"]
    old_bubble = next(b for b in bubbles if b["node"] == old.pk and b["role"] == "user")
    assert old_bubble["branch"] == {"index": 1, "count": 2, "siblings": [old.pk, edited.pk]}
    _switch(api, conversation, edited.pk)
    assert head(conversation).pk == edited.pk


# --- the summarising call's own failures and lock (S3) ---------------------------------------------


def _failing_summary(monkeypatch, error: BaseException) -> None:
    real = llm.stream_call

    def stream_call(*args, compaction=False, **kwargs):
        if not compaction:
            return (yield from real(*args, **kwargs))
        yield "a few words"
        raise error

    monkeypatch.setattr(llm, "stream_call", stream_call)


def test_c2_a_summarising_call_that_crashes_is_recorded_as_failed(conversation, settings, monkeypatch):
    """F1, C2: an exception other than a provider error still ends the summarising node (failed,
    interrupted): never left pending; no root, the head where it was, the lock given back."""
    settings.ARBOR_COMPACTION_KEEP_TURNS = 1
    for i in range(3):
        ask(conversation, f"question {i}")
    old_head = head(conversation).pk
    _failing_summary(monkeypatch, RuntimeError("a bug in the middle of the stream"))
    with pytest.raises(RuntimeError):
        turn_compact(user=conversation.owner, conversation_id=conversation.pk)
    call = Node.objects.get(kind=Node.Kind.COMPACTION)
    assert (call.status, call.failure_reason, call.parent_id) == ("failed", "interrupted", old_head)
    assert "a bug in the middle" in call.failure_message
    assert head(conversation).pk == old_head and conversation.turn_token is None


# --- a provider switch onto a smaller model (C1, C3) ------------------------------------------------


def test_c1_c3_after_a_switch_every_summarising_call_fits_the_new_models_limit(conversation, small_echo, stub,
                                                                              settings):
    """C1, C3: several echo compactions, then a switch to a provider that cannot read them and has a small
    input limit: the whole history is expanded, then summarised in windows that each fit (oldest first,
    each window's summary carried into the next), every window a recorded call; no request to the new
    model passes its limit, and the conversation goes on."""
    root = _ask_until_compacted(conversation)
    root = _ask_until_compacted(conversation, past=root)
    _ask_until_compacted(conversation, past=root)
    limit = 400
    services.conversation_update(conversation=conversation, model=STUB)
    settings.ARBOR_MAX_INPUT_TOKENS = {STUB: limit}
    expanded = context_path(node_path(head(conversation).pk, owner=conversation.owner_id), "openai",
                            owner=conversation.owner_id)
    assert budget.llm.count_tokens(STUB, budget.to_messages(
        [i for p in expanded for i in (*p.sent, *p.received)], provider="openai")) > 2 * limit, "much to summarise"
    before = set(Node.objects.values_list("id", flat=True))
    events = ask(conversation, "now on a small model")
    assert answer(events) == "stub: ok", events[-1]
    assert stub.requests, "the stub was called"
    sizes = [budget.llm.count_tokens(STUB, request["messages"]) for request in stub.requests]
    assert max(sizes) <= limit, sizes
    new = Node.objects.exclude(id__in=before)
    summaries = new.filter(kind=Node.Kind.COMPACTION, parent__isnull=False)
    assert summaries.count() >= 2 and set(summaries.values_list("status", flat=True)) == {"succeeded"}
    assert new.exclude(kind=Node.Kind.COMPACTION, parent__isnull=True).count() == len(stub.requests), \
        "every request is a recorded call"
    assert answer(ask(conversation, "and again")) == "stub: ok"
    assert max(budget.llm.count_tokens(STUB, r["messages"]) for r in stub.requests) <= limit


def test_c1_a_node_too_large_for_the_model_is_refused_without_an_oversized_call(conversation, stub, api, settings):
    """C1: when even one node with the prompt cannot fit the model, compaction refuses clearly (400
    cannot_compact) and sends nothing: no call over the limit, no node, the head where it was."""
    settings.ARBOR_COMPACTION_KEEP_TURNS = 1
    services.conversation_update(conversation=conversation, model=STUB)
    for i in range(3):
        ask(conversation, f"question {i} " + "with many words " * 40)
    settings.ARBOR_MAX_INPUT_TOKENS = {STUB: 120}
    before = (Node.objects.count(), head(conversation).pk, len(stub.requests))
    response = api.post(_url("conversation-compact", conversation))
    assert response.status_code == 400 and response.json()["error"]["code"] == "cannot_compact"
    assert (Node.objects.count(), head(conversation).pk, len(stub.requests)) == before


def test_c3_the_screen_history_costs_four_queries_however_long(conversation, small_echo, django_assert_num_queries):
    """C3, T8: behind several compactions the screen's history is one history query, the roots, the
    sibling questions and the bubbles: four queries, whatever the history's length."""
    root = _ask_until_compacted(conversation)
    _ask_until_compacted(conversation, past=root)
    conversation.refresh_from_db()
    with django_assert_num_queries(4):
        views = path_bubbles(conversation=conversation)
    assert [v.bubble.content for v in views if v.bubble.role == "user"] == list(
        Bubble.objects.filter(conversation=conversation, role="user").order_by("id").values_list("content", flat=True))


def test_c3_a_window_root_is_never_a_head_a_tip_or_a_branch(conversation):
    """An intermediate root that only carries one window's summary (left behind when a later window failed)
    is no place a head can rest: switching never lands there, however new it is."""
    ask(conversation, "first")
    first = head(conversation)
    ask(conversation, "second")
    tip = head(conversation)
    window = Node.objects.create(kind="compaction", status="succeeded", conversation=conversation, window_root=True,
                                 compacted_from=first, sent=[{"type": "summary", "text": "window one"}])
    assert not Node.objects.can_be_head().filter(pk=window.pk).exists()
    services.head_switch(conversation=conversation, node_id=first.pk)
    assert head(conversation).pk == tip.pk, "the branch's latest tip, not the newer window root"



def test_c2_t4_the_kept_turns_never_begin_with_results_whose_calls_would_be_summarised(settings):
    """C2, T4: a turn that opens with the results of an earlier turn's calls (a question asked while calls were
    open) pulls that earlier turn into the kept part, so no call is split from its result; when that reaches the
    first turn, everything is kept."""
    from conversations import items as it
    from conversations.context import PathNode
    from conversations.turns.compaction import kept_from

    settings.ARBOR_COMPACTION_KEEP_TURNS = 1

    def node(i: int, sent: list, tokens: int = 10) -> PathNode:
        return PathNode(i, i - 1 or None, "turn", "succeeded", sent, [], tokens=tokens, path_tokens=10 * i)

    call_answered_late = [it.tool_result("c1", "sql_query", "not run: the conversation went on"), it.user("q3")]
    path = [node(1, [it.user("q1")]), node(2, [it.user("q2")]), node(3, call_answered_late)]
    assert kept_from(path, threshold=10_000) == 1, "the turn whose call q3's results answer is kept too"
    first_opens_with_results = [node(1, call_answered_late), node(2, call_answered_late),
                                node(3, call_answered_late)]
    assert kept_from(first_opens_with_results, threshold=10_000) == 0
    assert kept_from([node(1, [it.user("q1")]), node(2, [it.user("q2")])], threshold=10_000) == 1
