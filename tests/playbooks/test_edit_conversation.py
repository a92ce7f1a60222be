"""The edit conversation shares the source's history without copying it (P3, T11)."""

from __future__ import annotations

import json

import pytest

from conversations import services as conversation_services
from conversations.models import Bubble, Node
from conversations.turns.seen import next_context
from playbooks import services
from playbooks.selectors import conversion_chain
from tests.conversations.helpers import ask, head
from tests.playbooks.helpers import SALES_SQL, sales_conversation

pytestmark = pytest.mark.django_db


@pytest.fixture
def playbook(conversation):
    sales_conversation(conversation)
    return services.playbook_convert(user=conversation.owner, conversation_id=conversation.pk)


def _edit(playbook):
    return services.playbook_edit_conversation(user=playbook.owner, playbook_id=playbook.pk)


def _context(conversation) -> str:
    """What the conversation's next call would send, read from its current head."""
    conversation.refresh_from_db()
    return str(next_context(conversation))


def test_p3_the_edit_conversation_starts_at_the_source_head_and_copies_nothing(conversation, playbook):
    """P3: a new conversation whose head is the source head; no node or bubble is created."""
    nodes, bubbles = Node.objects.count(), Bubble.objects.count()
    edit = _edit(playbook)
    assert edit.pk != conversation.pk and edit.head_id == conversation.head_id == playbook.source_head_id
    assert (Node.objects.count(), Bubble.objects.count()) == (nodes, bubbles)
    assert next_context(edit) == next_context(conversation)
    playbook.refresh_from_db()
    assert playbook.edit_conversation_id == edit.pk


def test_p3_new_nodes_of_either_conversation_never_appear_in_the_others_context(conversation, playbook):
    """P3: both continue from the shared head; each one's new turn is off the other's path."""
    edit = _edit(playbook)
    ask(edit, "edit side question")
    ask(conversation, "source side question")
    edit_context, source_context = _context(edit), _context(conversation)
    assert "edit side question" in edit_context and "source side question" not in edit_context
    assert "source side question" in source_context and "edit side question" not in source_context
    assert "Top 5 domestic customers" in edit_context and "Top 5 domestic customers" in source_context
    assert head(edit).parent_id == head(conversation).parent_id == playbook.source_head_id


def test_p3_t11_deleting_the_source_keeps_the_history_the_edit_conversation_stands_on(conversation, playbook):
    """P3, T11: delete the source; the edit conversation still asks on top of the original history."""
    edit = _edit(playbook)
    ask(edit, "before the delete")
    ask(conversation, "only the source needs this")
    only_source = head(conversation).pk
    conversation_services.conversation_delete(conversation=conversation)
    assert not Node.objects.filter(pk=only_source).exists()
    ask(edit, "after the delete")
    context = _context(edit)
    assert "Top 5 domestic customers" in context and "before the delete" in context and "after the delete" in context
    playbook.refresh_from_db()
    assert playbook.source_conversation_id is None and Node.objects.filter(pk=playbook.source_head_id).exists()


def test_p3_t11_a_playbook_keeps_its_source_history_for_a_later_edit_conversation(conversation, playbook):
    """T11, P3: the conversion nodes hang below the source head, so deleting the source keeps that path:
    an edit conversation opened afterwards still starts on the whole original history."""
    conversation_services.conversation_delete(conversation=conversation)
    edit = _edit(playbook)
    ask(edit, "still there?")
    assert "Top 5 domestic customers" in _context(edit)


def test_p3_save_converts_the_edit_conversation_into_the_next_version(conversation, playbook):
    """P3, P1: chatting changes the playbook; save drafts from the edit conversation's head (P2: which
    does not move) and records version 2, while version 1 stays as it was."""
    edit = _edit(playbook)
    three = SALES_SQL.replace("LIMIT 5", "LIMIT 3")
    ask(edit, f"Only the top 3, please #tool sql_query {json.dumps({'sql': three})}")
    edit_head = head(edit).pk
    saved = services.playbook_save(user=playbook.owner, playbook_id=playbook.pk)
    first, second = saved.versions.order_by("number")
    assert (first.number, second.number) == (1, 2)
    assert second.conversation_id == edit.pk and second.head_id == edit_head
    assert conversion_chain(second.conversion_node_id)[0].parent_id == edit_head
    assert head(edit).pk == edit_head
    limits = {v.number: next(p["default"] for p in v.definition["parameters"] if p["name"] == "limit")
              for v in (first, second)}
    assert limits == {1: 5, 2: 3} and saved.definition == second.definition
    assert saved.conversion_node_id == second.conversion_node_id
    again = _edit(saved)  # a second edit round starts where the saved version came from
    assert again.head_id == edit_head


def test_t11_deleting_a_saved_edit_conversation_keeps_the_versions_history(conversation, playbook):
    """T11, P3: version 2 came from an edit conversation's own turn; deleting that conversation keeps the
    turn (the version's conversion hangs below it), so the next edit conversation still starts there."""
    edit = _edit(playbook)
    ask(edit, "a change made while editing")
    services.playbook_save(user=playbook.owner, playbook_id=playbook.pk)
    version_head = playbook.versions.get(number=2).head_id
    conversation_services.conversation_delete(conversation=edit)
    again = _edit(playbook)
    assert again.head_id == version_head
    assert "a change made while editing" in _context(again) and "Top 5 domestic customers" in _context(again)
