"""Conversion of a conversation into a playbook through arbor/echo and the real database (P1, P2)."""

from __future__ import annotations

import pytest

from config.errors import ArborError, BadInput, TooLarge
from conversations import budget, llm
from conversations import items as it
from conversations import services as conversation_services
from conversations.errors import ApprovalPending, TurnInProgress
from conversations.locks import TurnLock
from conversations.models import Node
from conversations.selectors import node_path
from conversations.turns.seen import call_context
from conversations.turns.start import turn_ask
from playbooks import services
from playbooks.errors import PlaybookInvalid
from playbooks.models import Playbook, PlaybookVersion
from playbooks.selectors import conversion_chain, conversion_chains
from playbooks.serializers import PlaybookDetailOut
from tests.conversations.helpers import answer, ask, give_back, head
from tests.playbooks.helpers import sales_conversation

pytestmark = pytest.mark.django_db


def _convert(conversation):
    return services.playbook_convert(user=conversation.owner, conversation_id=conversation.pk)


def test_p1_a_valid_first_draft_is_one_playbook_node_below_the_head(conversation):
    """P1: one try, kind `playbook`, parent the head, succeeded with usage; the playbook records it all."""
    sales_conversation(conversation)
    source_head = conversation.head_id
    playbook = _convert(conversation)
    node = playbook.conversion_node
    assert node.kind == Node.Kind.PLAYBOOK and node.status == Node.Status.SUCCEEDED
    assert node.parent_id == source_head and node.conversation_id == conversation.pk, "in its tree, never a head"
    assert node.usage["prompt_tokens"] > 0 and node.model == "arbor/echo"
    assert playbook.source_head_id == source_head and playbook.source_conversation_id == conversation.pk
    assert [p["name"] for p in playbook.definition["parameters"]] == ["month", "limit", "include_overseas"]
    assert playbook.definition["steps"][0]["tool"] == "sql_query"
    assert "'{{month}}'" in playbook.definition["steps"][0]["arguments"]["sql"]
    version = playbook.versions.get()
    assert (version.number, version.conversion_node_id, version.head_id) == (1, node.pk, source_head)
    assert version.definition == playbook.definition


def test_p1_the_conversion_reads_the_whole_context_through_the_one_assembly(conversation):
    """P1, T5: the first try was sent the path (question, tool call, result, answer) then the request."""
    sales_conversation(conversation)
    playbook = _convert(conversation)
    context = call_context(playbook.conversion_node)
    assert [m["role"] for m in context] == ["user", "assistant", "tool", "assistant", "user"]
    assert context[0]["content"].startswith("Top 5 domestic customers")
    assert context[-1]["content"].startswith("[arbor:playbook-draft]")


def test_p1_an_invalid_draft_is_retried_below_itself_with_its_errors(conversation):
    """P1: invalid once, then valid: two tries in one chain; the second sends the first's errors."""
    sales_conversation(conversation, "#draft-invalid 1")
    playbook = _convert(conversation)
    first, second = conversion_chain(playbook.conversion_node_id)
    assert first.parent_id == conversation.head_id and second.parent_id == first.pk
    assert first.kind == second.kind == Node.Kind.PLAYBOOK
    assert first.status == second.status == Node.Status.SUCCEEDED
    retry = second.sent[0]["text"]
    assert "steps[0].arguments.sql: SQL error: no such column: no_such_column" in retry
    assert "no_such_column" not in str(playbook.definition)
    context = call_context(second)  # the retry saw its own failed draft, then the errors
    assert "no_such_column" in context[-2]["content"] and context[-1]["content"] == retry


def test_p1_still_invalid_after_the_last_try_is_a_422_with_every_try_recorded(conversation, settings):
    """P1: `#draft-invalid always` exhausts the tries (a setting); the error carries the last errors."""
    settings.ARBOR_PLAYBOOK_TRIES = 4
    sales_conversation(conversation, "#draft-invalid always")
    with pytest.raises(PlaybookInvalid) as raised:
        _convert(conversation)
    error = raised.value
    assert error.status == 422 and error.code == "playbook_invalid"
    assert error.extra["errors"] == ["steps[0].arguments.sql: SQL error: no such column: no_such_column"]
    tries = list(Node.objects.filter(pk__in=error.extra["nodes"]).order_by("id"))
    assert len(tries) == 4 and all(t.status == Node.Status.SUCCEEDED and t.kind == "playbook" for t in tries)
    assert [t.parent_id for t in tries] == [conversation.head_id, *[t.pk for t in tries[:-1]]]
    assert not Playbook.objects.exists()


def test_p2_the_head_never_moves_and_the_next_question_sees_no_draft_or_error(conversation):
    """P2: after a conversion with a retry, the head is where it was and the next call's context holds
    neither a draft nor a validation error."""
    sales_conversation(conversation, "#draft-invalid 1")
    before = conversation.head_id
    version = conversation.version
    _convert(conversation)
    conversation.refresh_from_db()
    assert conversation.head_id == before and conversation.version == version
    events = ask(conversation, "and now?")
    new = head(conversation)
    assert new.parent_id == before
    seen = str(call_context(new))
    assert "playbook-draft" not in seen and "no_such_column" not in seen and "expected_output" not in seen
    assert answer(events).startswith("echo: and now?")


def test_a_conversation_without_a_head_cannot_be_converted(conversation):
    with pytest.raises(BadInput, match="no messages yet"):
        _convert(conversation)
    assert not Node.objects.exists()


def test_t9_a_conversion_waits_for_no_turn_it_is_refused_while_one_runs(conversation):
    """T9, R3: the conversion takes the turn lock; a running turn refuses it and nothing is recorded."""
    sales_conversation(conversation)
    turn = turn_ask(user=conversation.owner, conversation_id=conversation.pk, content="hold the lock")
    try:
        with pytest.raises(TurnInProgress):
            _convert(conversation)
    finally:
        give_back(turn)
    assert not Node.objects.filter(kind="playbook").exists()


def test_a_provider_failure_is_recorded_on_the_try_and_answers_502(conversation, monkeypatch):
    """T1, F1: a try whose call fails is kept, failed with its reason; nothing else is written."""
    sales_conversation(conversation)
    monkeypatch.setattr("playbooks.prompts.PLAYBOOK_DRAFT_MARKER", "#fail")
    with pytest.raises(ArborError) as raised:
        _convert(conversation)
    assert raised.value.status == 502 and raised.value.code == "provider_error"
    node = Node.objects.get(kind="playbook")
    assert node.status == "failed" and node.failure_reason == "provider_error"
    assert node.parent_id == conversation.head_id
    assert not Playbook.objects.exists()
    TurnLock.acquire(conversation)  # the lock was given back


def test_f3_a_conversion_waits_for_a_pending_approval_to_be_decided(conversation):
    """F3: a head whose email waits for a person has an unfinished context; converting is refused."""
    ask(conversation, 'mail it #tool send_email {"to": "a@example.com", "subject": "s", "body": "b"}')
    with pytest.raises(ApprovalPending):
        _convert(conversation)
    assert not Node.objects.filter(kind="playbook").exists()


def test_t11_deleting_a_conversation_after_a_refused_conversion_leaves_nothing_behind(conversation):
    """T11: the tries of a conversion that never became a playbook go with their conversation; no record
    protects them and no other path passes through them."""
    sales_conversation(conversation, directives="#draft-invalid always")
    with pytest.raises(PlaybookInvalid):
        _convert(conversation)
    tries = list(Node.objects.filter(kind=Node.Kind.PLAYBOOK).values_list("pk", flat=True))
    assert len(tries) == 3 and Node.objects.filter(pk__in=tries, conversation=conversation).count() == 3
    conversation_services.conversation_delete(conversation=conversation)
    assert not Node.objects.exists()


def test_t11_a_saved_playbook_keeps_its_conversion_chain_and_source_path(conversation):
    """T11, P3: the version's chain and the path it stands on outlive the source conversation."""
    sales_conversation(conversation)
    playbook = _convert(conversation)
    chain = {playbook.conversion_node_id,
             *(p.id for p in node_path(playbook.conversion_node_id, owner=conversation.owner_id))}
    conversation_services.conversation_delete(conversation=conversation)
    assert set(Node.objects.values_list("pk", flat=True)) == chain


def test_s6_a_provider_failure_on_a_retry_reports_every_try(conversation, monkeypatch):
    """S6: like the 422, the error names every try (`nodes`), not only the one that failed."""
    sales_conversation(conversation, "#draft-invalid 1")
    monkeypatch.setattr("playbooks.prompts.conversion_retry", lambda errors: it.user("#fail"))
    with pytest.raises(ArborError) as raised:
        _convert(conversation)
    tries = list(Node.objects.filter(kind="playbook").order_by("id"))
    assert [t.status for t in tries] == ["succeeded", "failed"]
    assert raised.value.status == 502 and raised.value.extra["nodes"] == [t.pk for t in tries]
    assert raised.value.extra["node"] == tries[-1].pk


def _measured_tries(conversation, monkeypatch) -> list[int]:
    """What each of three always-invalid tries needs, as the budget check counts it."""
    needed: list[int] = []
    real = budget.call_tokens

    def spy(*args, **kwargs):
        needed.append(real(*args, **kwargs))
        return needed[-1]

    monkeypatch.setattr(budget, "call_tokens", spy)
    with pytest.raises(PlaybookInvalid):
        _convert(conversation)
    monkeypatch.setattr(budget, "call_tokens", real)
    Node.objects.filter(kind="playbook").delete()
    return needed


def test_s3_a_retry_that_cannot_fit_the_model_stops_before_the_call_with_the_tries_recorded(
        conversation, settings, monkeypatch):
    """S3, C1: each retry re-sends the drafts and errors; one that would pass the input limit is not sent."""
    settings.ARBOR_PLAYBOOK_TRIES = 3
    sales_conversation(conversation, "#draft-invalid always")
    needed = _measured_tries(conversation, monkeypatch)
    assert needed[0] < needed[1] < needed[2]
    monkeypatch.setattr(budget, "budget_for", lambda model: budget.Budget(limit=needed[1], reserve=0,
                                                                          threshold=needed[1]))
    calls = []
    real_call = llm.stream_call
    monkeypatch.setattr(llm, "stream_call", lambda **kw: (calls.append(1), real_call(**kw))[1])
    with pytest.raises(TooLarge, match="after 2 tries") as raised:
        _convert(conversation)
    tries = list(Node.objects.filter(kind="playbook").order_by("id"))
    assert len(calls) == 2 and len(tries) == 2 and raised.value.extra["nodes"] == [t.pk for t in tries]
    assert raised.value.status == 413 and raised.value.code == "too_large"
    conversation.refresh_from_db()
    assert all(t.parent_id in (conversation.head_id, tries[0].pk) for t in tries)


def test_s3_a_first_try_that_cannot_fit_makes_no_call_and_no_node(conversation, monkeypatch):
    sales_conversation(conversation)
    monkeypatch.setattr(budget, "budget_for", lambda model: budget.Budget(limit=100, reserve=0, threshold=100))
    with pytest.raises(TooLarge, match="Converting stopped: the next try needs about"):
        _convert(conversation)
    assert not Node.objects.filter(kind="playbook").exists()


def test_n4_every_versions_chain_is_read_in_one_query(conversation, django_assert_num_queries):
    """N4: the tries of every version come from one recursive query, however many versions and tries."""
    sales_conversation(conversation, "#draft-invalid 2")
    playbook = _convert(conversation)
    first = playbook.versions.get()
    other = _convert(conversation)  # a second conversion of three tries, as another version of the first
    PlaybookVersion.objects.create(playbook=playbook, number=2, definition=first.definition,
                                   conversion_node=other.conversion_node, head=first.head)
    with django_assert_num_queries(1):
        chains = conversion_chains([first.conversion_node_id, other.conversion_node_id])
    assert [len(c) for c in chains.values()] == [3, 3]
    assert chains[other.conversion_node_id][-1].pk == other.conversion_node_id
    assert chains[other.conversion_node_id][0].parent_id == conversation.head_id
    with django_assert_num_queries(2):  # the versions, then their chains
        data = PlaybookDetailOut(playbook).data
    assert [[n["id"] for n in v["conversion_nodes"]] for v in data["versions"]] == [
        [n.pk for n in chains[other.conversion_node_id]], [n.pk for n in chains[first.conversion_node_id]]]
