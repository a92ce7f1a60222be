"""Issue 34, ready to shard by owner: every statement a turn, a chat page and a search make on a hot table
(nodes, bubbles, files, the usage ledger, the search entries) names `owner_id`, the column a distributed
PostgreSQL (Citus) would route it by, so each stays on one person's shard (README: sharding by owner). The SQL is
recorded as the database gets it; a statement on a hot table without the owner fails the test with its text."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from conversations import services
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


def unscoped(queries: CaptureQueriesContext) -> list[str]:
    """The statements that name a hot table but not `owner_id`."""
    return [query["sql"] for query in queries.captured_queries
            if _NAMED.search(query["sql"]) and "owner_id" not in query["sql"]]


def test_issue_34_a_turn_a_page_and_a_search_ask_every_hot_table_by_its_owner(api, page, conversation, user):
    ask(conversation, "Where do oak trees grow?")
    with CaptureQueriesContext(connection) as turn:
        ask(conversation, "And how tall do oaks get?")
    with CaptureQueriesContext(connection) as shown:
        assert page.get(f"/chat/{conversation.pk}/").status_code == 200
    worker.run_due()  # the search index is written by the worker (R4)
    with CaptureQueriesContext(connection) as searched:
        assert api.get("/api/search/", {"q": "oak"}).json()["results"]
    for name, queries in (("turn", turn), ("page", shown), ("search", searched)):
        assert any(_NAMED.search(q["sql"]) for q in queries.captured_queries), f"the {name} reads a hot table"
        assert unscoped(queries) == [], f"the {name} asks a hot table without its owner"



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
