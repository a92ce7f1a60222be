"""Issue 34, ready to shard by owner: every statement a turn, a chat page, a search and a /v1 call make on a hot table
(nodes, bubbles, files, the usage ledger, the search entries) names `owner_id`, the column a distributed
PostgreSQL (Citus) would route it by, so each stays on one person's shard (README: sharding by owner). The SQL is
recorded as the database gets it; a statement on a hot table without the owner fails the test with its text."""

from __future__ import annotations

import importlib
import re
from types import SimpleNamespace

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from conversations import services
from conversations.errors import CorruptTree
from conversations.jobs import worker
from conversations.models import Bubble, Node, UsageEntry
from conversations.selectors import history_ids, node_path
from files.models import FileChunkVector, StoredFile
from search.models import BubbleDocument, ChunkVector
from tests.conversations.helpers import ask, head

pytestmark = pytest.mark.django_db

HOT = [model._meta.db_table for model in (Node, Bubble, StoredFile, FileChunkVector, UsageEntry, BubbleDocument,
                                          ChunkVector)]
_NAMED = re.compile(r'"?\b(' + "|".join(HOT) + r')\b"?')


# A batch of writes is one statement of data-modifying CTEs (config/together.py): each must name the owner.
_PART = re.compile(r"\bwritten_\d+ AS \(")


def unscoped(statements: list[str]) -> list[str]:
    """The statements, or the parts of a batch, that name a hot table but not `owner_id`."""
    return [part for sql in statements for part in _PART.split(sql) if _NAMED.search(part) and "owner_id" not in part]


def recorded(run) -> list[str]:
    """The SQL `run()` sent, kept at once: a request empties the connection's log (Django's reset_queries)."""
    with CaptureQueriesContext(connection) as queries:
        run()
    return [query["sql"] for query in queries.captured_queries]


def test_issue_34_a_turn_a_page_a_search_and_a_gateway_call_ask_every_hot_table_by_its_owner(api, page, conversation,
                                                                                           user):
    ask(conversation, "Where do oak trees grow?")
    turn = recorded(lambda: ask(conversation, "And how tall do oaks get?"))
    shown = recorded(lambda: page.get(f"/chat/{conversation.pk}/"))
    gateway = APIClient()
    gateway.credentials(HTTP_AUTHORIZATION="Bearer " + Token.objects.get_or_create(user=user)[0].key)
    first = [{"role": "user", "content": "Name an oak."}]
    reply = gateway.post("/v1/chat/completions", {"model": "arbor/echo", "messages": first}, format="json").json()
    again = [*first, reply["choices"][0]["message"], {"role": "user", "content": "Another?"}]
    continued = recorded(lambda: gateway.post("/v1/chat/completions", {"model": "arbor/echo", "messages": again},
                                              format="json"))  # a call that continues a stored path (issue 27)
    worker.run_due()  # the search index is written by the worker (R4)
    searched = recorded(lambda: api.get("/api/search/", {"q": "oak"}))
    assert api.get("/api/search/", {"q": "oak"}).json()["results"], "the search finds something"
    for name, statements in (("turn", turn), ("page", shown), ("search", searched), ("gateway call", continued)):
        assert any(_NAMED.search(sql) for sql in statements), f"the {name} reads a hot table"
        assert unscoped(statements) == [], f"the {name} asks a hot table without its owner"


def test_issue_34_nodes_and_bubbles_carry_their_conversations_owner_and_a_path_is_read_by_it(user, other_user):
    """Every node and bubble a turn writes names its conversation's owner (a fork's too: P3 keeps a path one
    person's); a path asked with another person's id is empty, not theirs."""
    conversation = services.conversation_create(owner=user, title="mine")
    ask(conversation, "Where do oak trees grow?")
    fork = services.conversation_fork(conversation=conversation, node_id=head(conversation).pk)
    ask(fork, "And birches?")
    assert set(Node.objects.values_list("owner_id", flat=True)) == {user.pk}
    assert set(Bubble.objects.values_list("owner_id", flat=True)) == {user.pk}
    tip = head(fork).pk
    assert len(node_path(tip, owner=user.pk)) == 2 and len(history_ids(tip, owner=user.pk)) == 2
    assert node_path(tip, owner=other_user.pk) == [] and history_ids(tip, owner=other_user.pk) == []


def test_issue_34_the_backfill_gives_a_deleted_conversations_nodes_the_owner_of_what_rests_on_them(user):
    """Migration 0026: a fork's path that runs through nodes of a deleted conversation (T11 kept them: the fork
    rests on them) gets its owner from the fork's head, so the fork still reads its whole path."""
    source = services.conversation_create(owner=user, title="source")
    ask(source, "one")
    ask(source, "two")
    fork = services.conversation_fork(conversation=source, node_id=head(source).pk)
    services.conversation_delete(conversation=source)
    fork.refresh_from_db()
    assert Node.objects.filter(conversation__isnull=True).count() == 2
    Node.objects.update(owner=None)  # as before the migration
    Bubble.objects.update(owner=None)
    migration = importlib.import_module("conversations.migrations.0026_node_and_bubble_owner")
    migration.owners(None, SimpleNamespace(connection=connection))
    assert [p.sent[0]["text"] for p in node_path(fork.head_id, owner=user.pk)] == ["one", "two"]
    assert set(Bubble.objects.values_list("owner_id", flat=True)) == {user.pk}


def test_issue_34_a_path_that_leaves_its_owners_nodes_is_refused_not_cut_short(conversation):
    """A node with no owner (or another's) on a path would end the walk early: a call would get a shortened context
    without a word. The read says the tree is corrupt instead."""
    ask(conversation, "one")
    ask(conversation, "two")
    tip = head(conversation)
    Node.objects.filter(pk=tip.parent_id).update(owner=None)
    with pytest.raises(CorruptTree):
        node_path(tip.pk, owner=conversation.owner_id)


def test_issue_34_t11_a_cleared_conversations_nodes_are_not_shown_again(api, page, conversation):
    """The owner column finds a person's nodes, but a node whose conversation is gone is shown only while one of
    their heads still rests on it (P3): a cleared conversation's question is a 404, as before."""
    ask(conversation, "secret 42")
    node = head(conversation).pk
    fork = services.conversation_fork(conversation=conversation, node_id=node)
    services.conversation_clear(conversation=conversation)
    assert api.get(f"/api/nodes/{node}/").status_code == 200, "the fork still rests on it"
    services.head_move(conversation=fork, to=None)
    assert Node.objects.filter(pk=node, owner_id=conversation.owner_id).exists(), "kept, yet nobody's path"
    assert api.get(f"/api/nodes/{node}/").status_code == 404
    assert page.get(f"/chat/nodes/{node}/seen/").status_code == 404
