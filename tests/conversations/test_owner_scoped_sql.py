"""Issue 34, ready to shard by owner: every statement a turn, a chat page, a search and a /v1 call make on a hot table
(nodes, bubbles, files, the usage ledger, the search entries) names `owner_id`, the column a distributed
PostgreSQL (Citus) would route it by, so each stays on one person's shard (README: sharding by owner). The SQL is
recorded as the database gets it; a statement on a hot table without the owner fails the test with its text."""

from __future__ import annotations

import importlib
import re
import threading
from types import SimpleNamespace

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from conversations import services
from conversations.errors import CorruptTree
from conversations.jobs import worker
from conversations.models import Bubble, Node, ToolApproval, TurnLogEntry, TurnRun, UsageEntry
from conversations.selectors import history_ids, node_path
from conversations.turns import log
from files.models import FileChunkVector, SentFile, StoredFile
from search.models import BubbleDocument, ChunkVector
from tests.conversations.helpers import ask, head

pytestmark = pytest.mark.django_db

HOT = [model._meta.db_table for model in (Node, Bubble, StoredFile, FileChunkVector, UsageEntry, BubbleDocument,
                                          ChunkVector, ToolApproval, SentFile, TurnRun, TurnLogEntry)]
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


def _read_file(api) -> dict:
    """A text file uploaded and read by the worker, ready to send."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    note = api.post("/api/files/", {"file": SimpleUploadedFile("oaks.txt", b"Oaks live long.\n")},
                    format="multipart").json()
    worker.run_due()
    return note


def _waiting_call(api, base: str) -> dict:
    """A turn whose tool call (send_email) waits for a person's decision (F3); the call as the turn shows it."""
    mail = '{"to": "a@example.com", "subject": "s", "body": "b"}'
    (call,) = api.post(f"{base}/turns/", {"content": f"#tool send_email {mail}"}, format="json"
                       ).json()["approval_required"]
    return call


def test_issue_34_an_approval_a_sent_file_a_replayed_stream_a_stop_and_the_exports_ask_by_the_owner(api, conversation):
    """The rows that hang off a node or a conversation name its owner too (migration 0027, files 0003): a decision on
    a tool call, a file a call sent, a turn run and its log. A turn that sends a file, a person's approval, following
    a turn's stream again, a stop and both exports ask each by it (the exports and the tree map are off the hot
    path, but on a sharded database a read without the owner would ask every shard)."""
    note = _read_file(api)
    base = f"/api/conversations/{conversation.pk}"
    sent = recorded(lambda: api.post(f"{base}/turns/", {"content": "Read this.", "files": [note["id"]]},
                                     format="json"))
    call = _waiting_call(api, base)
    decided = recorded(lambda: api.post(f"{base}/approvals/", {"tool_call_id": call["call_id"], "approve": True},
                                        format="json"))
    replayed = recorded(lambda: api.get(f"{base}/stream/"))  # which run to follow again
    run = TurnRun.objects.filter(conversation=conversation).latest("started_at")
    # A reader in another process follows it from the store (`log.mirrored` fills its copy so).
    followed = recorded(lambda: list(log.follow_store(run.pk, owner=conversation.owner_id, after=0,
                                                      stop=threading.Event())))
    stopped = recorded(lambda: api.post(f"{base}/stop/"))
    exported = recorded(lambda: [b"".join(api.get(f"{base}/export/", {"format": kind}).streaming_content)
                                 for kind in ("json", "chatgpt", "md")])
    mapped = recorded(lambda: api.get(f"{base}/tree/"))
    assert SentFile.objects.filter(file_id=note["id"]).count() == 1
    assert ToolApproval.objects.filter(call_id=call["call_id"], approved=True).count() == 1
    for row in (SentFile, ToolApproval, TurnRun, TurnLogEntry):
        assert set(row.objects.values_list("owner_id", flat=True)) == {conversation.owner_id}, row.__name__
    for name, statements, table in (("turn with a file", sent, SentFile), ("decision", decided, ToolApproval),
                                    ("replay", replayed, TurnRun), ("reader elsewhere", followed, TurnLogEntry),
                                    ("stop", stopped, TurnRun),
                                    ("exports", exported, Node), ("tree map", mapped, Node)):
        assert any(table._meta.db_table in sql for sql in statements), f"the {name} reads {table.__name__}"
        assert unscoped(statements) == [], f"the {name} asks a hot table without its owner"


def test_issue_34_the_backfill_gives_approvals_runs_logs_and_sent_files_their_owner(api, conversation):
    """Migrations 0027 and files 0003: rows written before them get the owner of their node, conversation or run."""
    note = _read_file(api)
    base = f"/api/conversations/{conversation.pk}"
    api.post(f"{base}/turns/", {"content": "Read this.", "files": [note["id"]]}, format="json")
    call = _waiting_call(api, base)
    api.post(f"{base}/approvals/", {"tool_call_id": call["call_id"], "approve": False}, format="json")
    rows = (SentFile, ToolApproval, TurnRun, TurnLogEntry)
    for row in rows:
        row.objects.update(owner=None)  # as before the migrations
    for migration in ("conversations.migrations.0027_approval_and_run_owner", "files.migrations.0003_sentfile_owner"):
        importlib.import_module(migration).owners(None, SimpleNamespace(connection=connection))
    for row in rows:
        assert row.objects.exists() and set(row.objects.values_list("owner_id", flat=True)) == {
            conversation.owner_id}, row.__name__
