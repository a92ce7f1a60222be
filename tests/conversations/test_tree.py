"""The tree itself: the path query, the database's own guarantees, compaction boundaries, deletion (T1, T2,
T5, T10, T11, C2, C3)."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from config.errors import NotFound
from conversations import items as it
from conversations import services
from conversations.errors import BeforeCompaction, CorruptTree, TurnInProgress
from conversations.models import Bubble, Conversation, Node
from conversations.screen import path_bubbles
from conversations.selectors import node_path
from conversations.turns.detached import run_here
from conversations.turns.start import turn_ask, turn_edit, turn_regenerate
from tests.conversations.helpers import answer, ask, head, owner_of
from tests.support.trees import TreeBuilder

pytestmark = pytest.mark.django_db


def chain(conversation, length, parent=None):
    return TreeBuilder(conversation).chain(length, parent=parent)


def test_t5_the_path_is_one_query_whatever_its_depth(conversation):
    deep = chain(conversation, 300)
    for depth in (1, 300):
        with CaptureQueriesContext(connection) as queries:
            path = node_path(deep[depth - 1].pk, owner=conversation.owner_id)
        assert len(queries) == 1
        assert [p.id for p in path] == [n.pk for n in deep[:depth]]


def test_t5_nodes_off_the_path_never_appear(conversation):
    trunk = chain(conversation, 3)
    chain(conversation, 5, parent=trunk[0])  # a side branch
    assert [p.id for p in node_path(trunk[-1].pk, owner=conversation.owner_id)] == [n.pk for n in trunk]


def test_the_depth_guard_stops_a_corrupt_loop(conversation, settings):
    a, b = chain(conversation, 2)
    with transaction.atomic():
        Node.objects.filter(pk=a.pk).update(parent=b)  # a loop no service can make
        settings.ARBOR_PATH_DEPTH_LIMIT = 50
        with pytest.raises(CorruptTree):
            node_path(b.pk, owner=owner_of(b.pk))
        transaction.set_rollback(True)


@pytest.mark.parametrize(
    ("fields", "constraint"),
    [
        ({"kind": "banana"}, "node_kind_known"),
        ({"status": "done"}, "node_status_known"),
        ({"status": "failed"}, "node_failure_reason_iff_failed"),
        ({"status": "succeeded", "failure_reason": "timeout"}, "node_failure_reason_iff_failed"),
        ({"status": "failed", "failure_reason": "gremlins"}, "node_failure_reason_known"),
        ({"kind": "compaction", "parent": "PARENT", "compacted_from": "PARENT"},
         "node_compaction_root_or_summarising_call"),
        ({"kind": "compaction"}, "node_compaction_root_or_summarising_call"),
        ({"kind": "compaction", "parent": "PARENT", "summary_call": "PARENT"},
         "node_summary_call_only_on_compaction_root"),
        ({"kind": "turn", "compacted_from": "PARENT"}, "node_original_only_on_compaction"),
    ],
)
def test_t1_c2_c3_the_database_refuses_what_must_never_happen(conversation, fields, constraint):
    (parent,) = chain(conversation, 1)
    fields = {k: parent if v == "PARENT" else v for k, v in fields.items()}
    with pytest.raises(IntegrityError, match=constraint), transaction.atomic():
        Node.objects.create(conversation=conversation, **fields)


def test_t1_a_node_cannot_be_its_own_parent(conversation):
    (node,) = chain(conversation, 1)
    with pytest.raises(IntegrityError), transaction.atomic():
        Node.objects.filter(pk=node.pk).update(parent=node.pk)


def compact(conversation):
    """A compaction root laid out by hand, as C2/C3 shape it (tests/conversations/test_compaction.py runs the
    real one, with its summarising call)."""
    conversation.refresh_from_db()
    original = conversation.head_id
    tree = TreeBuilder(conversation)
    return tree.move_head(tree.compaction(of=Node.objects.get(pk=original)))


def test_c2_assembly_stops_at_the_compaction_node(conversation):
    ask(conversation, "before compaction")
    summary = compact(conversation)
    seen = answer(ask(conversation, "after"))
    assert "before compaction" not in seen
    assert seen.endswith("seen: system:summary of the conversation so | user:after")
    path = node_path(head(conversation).pk, owner=conversation.owner_id)
    assert path[0].id == summary.pk and len(path) == 2


def test_t10_a_question_before_the_compaction_node_cannot_be_edited(conversation):
    ask(conversation, "old question")
    old = head(conversation)
    compact(conversation)
    ask(conversation, "new question")
    after = head(conversation)
    count = Node.objects.count()
    with pytest.raises(BeforeCompaction):
        turn_edit(user=conversation.owner, conversation_id=conversation.pk, node_id=old.pk, content="x")
    assert head(conversation) == after and Node.objects.count() == count
    run_here(turn_edit(user=conversation.owner, conversation_id=conversation.pk, node_id=after.pk,
                    content="edited after compaction"))
    assert head(conversation).parent_id == after.parent_id


def test_t11_clear_drops_bubbles_and_head_but_keeps_nodes(conversation):
    ask(conversation, "remember 42")
    nodes = Node.objects.count()
    services.conversation_clear(conversation=conversation)
    assert head(conversation) is None and not Bubble.objects.filter(conversation=conversation).exists()
    assert Node.objects.count() == nodes, "nothing is ever lost"
    assert "42" not in answer(ask(conversation, "what number?"))


def test_t11_delete_removes_its_nodes_but_keeps_those_another_path_passes_through(user):
    """T11, P3: deleting a conversation keeps exactly the nodes another conversation's tree still needs."""
    source = services.conversation_create(owner=user)
    ask(source, "shared 1")
    ask(source, "shared 2")
    shared_head = head(source)
    run_here(turn_regenerate(user=user, conversation_id=source.pk))  # a branch only `source` has
    ask(source, "source only")
    other = services.conversation_create(owner=user)
    services.head_move(conversation=other, to=shared_head.pk)  # P3's edit conversation, nothing copied
    ask(other, "other's own question")
    ask(other, "and again")
    other_path = node_path(head(other).pk, owner=other.owner_id)
    services.conversation_delete(conversation=source)
    assert not Conversation.objects.filter(pk=source.pk).exists()
    kept = Node.objects.filter(conversation__isnull=True)
    assert sorted(s[0]["text"] for s in kept.values_list("sent", flat=True)) == ["shared 1", "shared 2"]
    assert not Node.objects.filter(sent=[it.user("source only")]).exists()
    assert Node.objects.filter(conversation=other).count() == 2
    assert node_path(head(other).pk, owner=other.owner_id) == other_path, \
        "the other conversation's context is untouched"
    assert "user:shared 1 | " in answer(ask(other, "still there?"))


def test_t11_delete_keeps_the_original_behind_a_shared_compaction_node(user):
    """C3: another path through a compaction node still needs its original, so that survives too."""
    source = services.conversation_create(owner=user)
    ask(source, "long ago")
    original = head(source)
    summary = compact(source)
    other = services.conversation_create(owner=user)
    services.head_move(conversation=other, to=summary.pk)
    services.conversation_delete(conversation=source)
    assert Node.objects.filter(pk__in=[original.pk, summary.pk]).count() == 2


def test_t11_delete_is_refused_while_a_turn_runs(conversation):
    running = turn_ask(user=conversation.owner, conversation_id=conversation.pk, content="busy")
    with pytest.raises(TurnInProgress):
        services.conversation_delete(conversation=conversation)
    run_here(running)
    services.conversation_delete(conversation=conversation)
    assert Node.objects.count() == 0


def test_t8_switch_refuses_a_node_of_another_conversation(user, conversation):
    other = services.conversation_create(owner=user)
    ask(other, "elsewhere")
    with pytest.raises(NotFound):
        services.head_switch(conversation=conversation, node_id=head(other).pk)


def test_t11_after_clear_no_branch_leads_back_to_the_cleared_history(conversation):
    """T11: the cleared turns are not a sibling branch of the next question, and switch cannot reach them."""
    ask(conversation, "secret 42")
    cleared = head(conversation)
    services.conversation_clear(conversation=conversation)
    ask(conversation, "fresh start")
    (question, _) = path_bubbles(conversation=head_conversation(conversation))
    assert (question.branch.index, question.branch.count) == (1, 1)
    with pytest.raises(NotFound):
        services.head_switch(conversation=conversation, node_id=cleared.pk)
    assert Node.objects.filter(pk=cleared.pk).exists(), "kept, only detached"


def test_t11_p3_clearing_or_deleting_the_source_keeps_the_shared_bubbles_of_the_other_conversation(user):
    source = services.conversation_create(owner=user)
    ask(source, "shared question")
    other = services.conversation_create(owner=user)
    services.head_move(conversation=other, to=head(source).pk)
    ask(other, "own question")
    shown = [v.bubble.content for v in path_bubbles(conversation=head_conversation(other))]
    services.conversation_clear(conversation=source)
    assert [v.bubble.content for v in path_bubbles(conversation=head_conversation(other))] == shown
    services.conversation_delete(conversation=source)
    assert [v.bubble.content for v in path_bubbles(conversation=head_conversation(other))] == shown
    assert shown[0] == "shared question"


def head_conversation(conversation):
    conversation.refresh_from_db()
    return conversation
