"""Retrieval (R2): the owner's other conversations are searched before a question; hits go in as ephemeral
items the call reads; later calls drop them unless the conversation keeps them."""

from __future__ import annotations

import pytest
from django.urls import reverse

from conversations import services
from conversations.jobs import worker
from conversations.turns.seen import call_context
from conversations.turns.start import turn_compact
from tests.conversations.helpers import answer, ask, head

pytestmark = pytest.mark.django_db


@pytest.fixture
def notes(user):
    """Another conversation of the same person, indexed by the worker."""
    other = services.conversation_create(owner=user, title="Pricing notes")
    ask(other, "Our enterprise tier costs 900 dollars per seat")
    worker.run_due()
    return other


def test_r2_hits_from_other_conversations_reach_this_call_only(user, notes):
    conversation = services.conversation_create(owner=user)
    services.conversation_update(conversation=conversation, retrieval=True)
    first = answer(ask(conversation, "What does the enterprise tier cost?"))
    assert "system:From the person's conversation" in first, "the model read the hit"
    node = head(conversation)
    retrieved = [i for i in node.sent if i.get("ephemeral")]
    assert retrieved and retrieved[0]["source"]["conversation"] == notes.pk
    assert node.sent[-1] == {"type": "user", "text": "What does the enterprise tier cost?"}

    second = answer(ask(conversation, "unrelated zebra question"))
    assert "From the person's conversation" not in second, "dropped from later assemblies by default"
    assert "user:What does the enterprise tie" in second, "the question itself stays"


def test_r2_the_keep_policy_keeps_them_in_later_calls(user, notes):
    conversation = services.conversation_create(owner=user)
    services.conversation_update(conversation=conversation, retrieval=True, keep_retrieved=True)
    ask(conversation, "What does the enterprise tier cost?")
    kept = len([i for i in head(conversation).sent if i.get("ephemeral")])
    second = answer(ask(conversation, "unrelated zebra question"))
    assert kept and second.count("system:From the person's conversation") == kept
    assert not [i for i in head(conversation).sent if i.get("ephemeral")], "the new question found nothing new"


def test_r2_without_retrieval_nothing_is_searched(user, notes):
    conversation = services.conversation_create(owner=user)
    ask(conversation, "What does the enterprise tier cost?")
    assert not [i for i in head(conversation).sent if i.get("ephemeral")]


def test_r2_only_the_owners_conversations_are_retrieved(user, other_user, notes):
    theirs = services.conversation_create(owner=other_user)
    services.conversation_update(conversation=theirs, retrieval=True)
    ask(theirs, "What does the enterprise tier cost?")
    assert not [i for i in head(theirs).sent if i.get("ephemeral")]


def test_r2_what_the_model_saw_marks_the_retrieved_items(client, user, notes):
    conversation = services.conversation_create(owner=user)
    services.conversation_update(conversation=conversation, retrieval=True)
    ask(conversation, "What does the enterprise tier cost?")
    first = head(conversation)
    ask(conversation, "next question")
    client.force_login(user)
    seen = client.get(reverse("chat-seen", args=[first.pk]), headers={"X-Fragment": "1"}).content.decode()
    assert "retrieved for this call only (ephemeral)" in seen
    later = client.get(reverse("chat-seen", args=[head(conversation).pk]), headers={"X-Fragment": "1"}).content.decode()
    assert "retrieved for this call only" not in later and "900 dollars" not in later
    assert call_context(first)[1]["role"] == "system"


def test_r2_a_long_question_is_retrieved_for_with_a_bounded_query(user, notes):
    """A question longer than the search box allows still goes out, with hits, and is never refused."""
    conversation = services.conversation_create(owner=user)
    services.conversation_update(conversation=conversation, retrieval=True)
    question = "What does the enterprise tier cost? " + " ".join(f"detail{n}" for n in range(80))
    assert len(question) > 500
    answer(ask(conversation, question))
    assert [i for i in head(conversation).sent if i.get("ephemeral")]


def test_r2_the_panel_shows_the_policy_the_call_had_not_the_current_one(client, user, notes):
    """A node keeps whether its context kept retrieved items: turning keep on later does not rewrite history."""
    conversation = services.conversation_create(owner=user)
    services.conversation_update(conversation=conversation, retrieval=True)
    ask(conversation, "What does the enterprise tier cost?")
    ask(conversation, "unrelated zebra question")
    second = head(conversation)
    services.conversation_update(conversation=conversation, keep_retrieved=True)
    assert not second.keep_ephemeral
    assert [m["role"] for m in call_context(second)] == ["user", "assistant", "user"], "no retrieved items"


def test_r2_kept_retrieved_items_survive_a_compaction(user, notes, settings):
    """C2 with the keep policy: retrieved items are kept verbatim in the compaction node like other items."""
    settings.ARBOR_COMPACTION_KEEP_TURNS = 1
    conversation = services.conversation_create(owner=user)
    services.conversation_update(conversation=conversation, retrieval=True, keep_retrieved=True)
    ask(conversation, "filler one")
    ask(conversation, "What does the enterprise tier cost?")
    turn_compact(user=user, conversation_id=conversation.pk)
    root = head(conversation)
    assert root.kind == "compaction" and any(i.get("ephemeral") for i in root.sent) and root.keep_ephemeral
    summary_call = root.summary_call
    assert summary_call.keep_ephemeral, "the summarising call read the kept items, and says so"
    assert any(m["role"] == "system" for m in call_context(summary_call)), "what it saw includes them"
    later = answer(ask(conversation, "unrelated zebra question"))
    assert "system:From the person's conversation" in later


def test_r2_the_same_words_found_twice_go_to_the_call_once(user, notes):
    """Issue 26: the same text asked in two other conversations (and the answers echoing it) was sent twice in one
    call; each distinct text goes once."""
    twin = services.conversation_create(owner=user, title="Pricing notes, again")
    ask(twin, "Our enterprise tier costs 900 dollars per seat")
    worker.run_due()
    conversation = services.conversation_create(owner=user)
    services.conversation_update(conversation=conversation, retrieval=True)
    ask(conversation, "What does the enterprise tier cost?")
    texts = [i["text"].split(": ", 1)[1] for i in head(conversation).sent if i.get("ephemeral")]
    assert texts and len(texts) == len(set(texts)), texts
    assert texts.count("Our enterprise tier costs 900 dollars per seat") == 1
