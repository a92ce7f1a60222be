"""Full-text search over a person's own conversations, every branch (issue 7): PostgreSQL or SQLite FTS5."""

from __future__ import annotations

import pytest
from django.urls import reverse

from conversations import services
from conversations.jobs import worker
from conversations.turns.detached import run_here
from conversations.turns.start import turn_edit
from search.index import index_conversation
from search.query import search_bubbles
from tests.conversations.helpers import ask, head

pytestmark = pytest.mark.django_db


def _indexed(conversation, *questions):
    for question in questions:
        ask(conversation, question)
    worker.run_due()


def test_search_finds_words_ranks_and_highlights_only_the_callers_own(user, other_user, conversation):
    _indexed(conversation, "Quarterly revenue in Seoul grew", "Unrelated weather talk")
    theirs = services.conversation_create(owner=other_user, title="theirs")
    _indexed(theirs, "Their revenue is secret")
    hits = search_bubbles(user=user, query="revenue")
    assert hits and all(h.conversation == conversation.pk for h in hits)
    assert {h.role for h in hits} == {"user", "assistant"}
    assert "<mark>" in hits[0].snippet and "revenue" in hits[0].snippet.lower()
    assert not search_bubbles(user=user, query="weatherless")


def test_snippets_are_escaped_text_with_marks_only(user, conversation):
    _indexed(conversation, "<script>alert(1)</script> revenue")
    (hit, *_) = search_bubbles(user=user, query="revenue")
    # SQLite escapes the tag; PostgreSQL's parser drops it. Either way no markup but <mark> reaches the page.
    assert "<script>" not in hit.snippet and "alert(1)" in hit.snippet and "<mark>" in hit.snippet


def test_hits_on_another_branch_say_so_and_opening_one_switches_to_it(user, conversation, api):
    """T8: search covers every branch; a hit off the current path is marked, and switch moves the head there."""
    ask(conversation, "apples question")
    first = head(conversation)
    run_here(turn_edit(user=user, conversation_id=conversation.pk, node_id=first.pk, content="bananas question"))
    worker.run_due()
    (apple,) = [h for h in search_bubbles(user=user, query="apples") if h.role == "user"]
    (banana,) = [h for h in search_bubbles(user=user, query="bananas") if h.role == "user"]
    assert not apple.on_current_path and banana.on_current_path
    api.post(f"/api/conversations/{conversation.pk}/switch/", {"node": apple.node}, format="json")
    assert head(conversation).pk == first.pk


def test_search_api_and_bad_queries(api, user, conversation):
    _indexed(conversation, "Revenue by region")
    response = api.get("/api/search/", {"q": "region"})
    assert response.status_code == 200
    (hit, *_) = response.json()["results"]
    assert hit["conversation"] == conversation.pk and "<mark>" in hit["snippet"] and hit["on_current_path"]
    assert api.get("/api/search/", {"q": " "}).json()["error"]["code"] == "bad_input"
    assert api.get("/api/search/", {"q": "x" * 201}).status_code == 400
    assert api.get("/api/search/", {"q": "a\x00b"}).json()["error"]["code"] == "bad_input"
    assert api.get("/api/search/", {"q": 'unbalanced " quote AND ('}).status_code == 200, "input is never syntax"


def test_cleared_conversations_are_not_searched(user, conversation):
    """T11: clearing removes the bubbles, so nothing 'deleted' is still found."""
    _indexed(conversation, "Forget this revenue")
    services.conversation_clear(conversation=conversation)
    assert search_bubbles(user=user, query="revenue") == []


def test_the_search_page_lists_hits_with_their_branch(client, user, conversation):
    _indexed(conversation, "Revenue by region")
    client.force_login(user)
    html = client.get(reverse("search"), {"q": "region"}).content.decode()
    assert "<mark>region</mark>" in html.lower() or "<mark>Region</mark>" in html
    assert f"/chat/{conversation.pk}/" in html


def test_issue_16_a_prefix_finds_the_word_and_word_forms_match_where_the_database_stems(user, conversation, settings):
    """"sal" finds "sales" on both databases; a shorter word matches whole ("a" does not find "apple"). Word
    forms: SQLite's index stems English (Porter); PostgreSQL stems with ARBOR_SEARCH_CONFIG set to `english`.
    Punctuation alone finds nothing, and no query syntax gets through (quotes, NEAR, :*, &)."""
    from django.db import connection

    if connection.vendor == "postgresql":
        settings.ARBOR_SEARCH_CONFIG = "english"
    _indexed(conversation, "Monthly sales of apples", "Steps to end a subscription")
    assert {h.role for h in search_bubbles(user=user, query="sal")} == {"user", "assistant"}
    assert "<mark>sales</mark>" in search_bubbles(user=user, query="sal")[0].snippet.lower()
    assert search_bubbles(user=user, query="monthly sal")
    assert not search_bubbles(user=user, query="salsa")
    short = search_bubbles(user=user, query="a")  # a stop word for PostgreSQL's english: no hit at all there
    assert all("<mark>a</mark>" in h.snippet.lower() and "<mark>apples" not in h.snippet for h in short)
    assert search_bubbles(user=user, query="subscriptions"), "a word form"
    assert search_bubbles(user=user, query="ending steps"), "another word form"
    for syntax in ('"', "NEAR(", "sal:*", "sales & apples |", "-", "'"):
        search_bubbles(user=user, query=syntax)  # no syntax error reaches the person
    assert search_bubbles(user=user, query="!!!") == []


def _migrated_again(connection) -> None:
    """Back to search's migration 0004 (entries without owners), then forward to the newest."""
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes("search")
    try:
        executor.migrate([("search", "0004_pgvector")])
        with connection.cursor() as cursor:  # entries as 0004 left them: no owner column
            columns = [c.name for c in connection.introspection.get_table_description(cursor, "search_bubbledocument")]
        assert "owner_id" not in columns
    finally:
        MigrationExecutor(connection).migrate(latest)


def _indexes(connection) -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'search_bubbledocument'")
        return {row[0] for row in cursor.fetchall()}


@pytest.mark.django_db(transaction=True)
def test_an_index_made_before_entries_had_owners_gets_them_and_still_finds_only_the_callers_own(
        user, other_user, conversation):
    """Migration 0005 on a database with entries: each gets its conversation's owner, so search (which now asks
    the index for the caller's entries) finds what it found before, and another person's nothing. PostgreSQL's
    tsvector index ends as one over the owner's words (0006, issue 34), 0005's over (owner, tsvector) gone."""
    from django.db import connection

    _indexed(conversation, "Quarterly revenue in Seoul grew")
    theirs = services.conversation_create(owner=other_user, title="theirs")
    _indexed(theirs, "Their revenue is secret")
    _migrated_again(connection)
    assert {h.conversation for h in search_bubbles(user=user, query="revenue")} == {conversation.pk}
    assert {h.conversation for h in search_bubbles(user=other_user, query="revenue")} == {theirs.pk}
    if connection.vendor == "postgresql":
        assert "search_owned_words_gin" in _indexes(connection)
        assert not {"search_owner_vector_gin", "search_bubble_vector_gin"} & _indexes(connection)


@pytest.mark.django_db(transaction=True)
def test_without_btree_gin_the_migration_keeps_the_words_index_says_so_and_search_works(
        user, other_user, conversation, monkeypatch, caplog):
    """A role that may not create btree_gin: the failed statement is rolled back to its savepoint, the migration
    goes on (owners filled, the tsvector index kept) and says what to do; search finds the same. The owner's words
    index of 0006 (issue 34) needs no btree_gin, so the newest state is the same either way."""
    import importlib

    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("btree_gin is PostgreSQL's")
    migration = importlib.import_module("search.migrations.0005_document_owner")
    _indexed(conversation, "Quarterly revenue in Seoul grew")
    theirs = services.conversation_create(owner=other_user, title="theirs")
    _indexed(theirs, "Their revenue is secret")
    monkeypatch.setattr(migration, "_create_btree_gin",  # what a role without the privilege meets: an error
                        lambda schema_editor: schema_editor.execute("CREATE EXTENSION arbor_no_such_extension"))
    try:
        _migrated_again(connection)
        assert "btree_gin could not be created" in caplog.text
        assert "search_owned_words_gin" in _indexes(connection)
        assert not {"search_owner_vector_gin", "search_bubble_vector_gin"} & _indexes(connection)
        assert {h.conversation for h in search_bubbles(user=user, query="revenue")} == {conversation.pk}
        assert {h.conversation for h in search_bubbles(user=other_user, query="revenue")} == {theirs.pk}
    finally:
        monkeypatch.undo()
        _migrated_again(connection)  # the other tests' index
    assert "search_owned_words_gin" in _indexes(connection)


def test_an_entry_written_without_its_owner_is_indexed_again(user, conversation):
    """An entry an older process wrote after the migration (no owner; PostgreSQL's search asks the index by owner,
    so nobody finds it there): the worker's next pass indexes it again, with its owner."""
    from django.db import connection

    from search.models import BubbleDocument

    _indexed(conversation, "Quarterly revenue in Seoul grew")
    entries = BubbleDocument.objects.filter(bubble__conversation=conversation)
    entries.update(owner=None)
    if connection.vendor == "postgresql":
        assert not search_bubbles(user=user, query="revenue")
    assert index_conversation(conversation.pk) == 2
    assert {entry.owner_id for entry in entries} == {user.pk}
    assert {h.conversation for h in search_bubbles(user=user, query="revenue")} == {conversation.pk}
