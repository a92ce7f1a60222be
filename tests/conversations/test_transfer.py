"""Export and import (issue 7): Markdown of the path, Arbor's lossless tree JSON, ChatGPT's conversations.json."""

from __future__ import annotations

import json

import pytest

from conversations import services
from conversations.models import Bubble, Conversation, Node
from conversations.screen import path_bubbles
from conversations.selectors import node_path
from conversations.transfer import arbor_tree
from conversations.transfer.check import item_paths
from conversations.turns.detached import run_here
from conversations.turns.seen import call_context, next_context
from conversations.turns.start import turn_compact, turn_decide, turn_edit, turn_regenerate
from tests.conversations.helpers import ask, head

pytestmark = pytest.mark.django_db


def _import(api, document, **extra):
    return api.post("/api/conversations/import/", data=json.dumps(document), content_type="application/json", **extra)


def _rich_tree(conversation, settings):
    """Branches, a tool round, an approval, a failure, an overflow and a compaction: every shape the tree has."""
    settings.ARBOR_COMPACTION_KEEP_TURNS = 1
    services.conversation_update(conversation=conversation, instructions="Be brief.")
    ask(conversation, "first question")
    first = head(conversation)
    run_here(turn_edit(user=conversation.owner, conversation_id=conversation.pk, node_id=first.pk,
                    content="edited first"))
    run_here(turn_regenerate(user=conversation.owner, conversation_id=conversation.pk))
    ask(conversation, '#tool sql_query {"sql": "select count(*) as n from customers"}')
    ask(conversation, '#tool send_email {"to": "a@example.com", "subject": "s", "body": "b"}')
    (call,) = head(conversation).received
    run_here(turn_decide(user=conversation.owner, conversation_id=conversation.pk, call_id=call["id"],
                      approve=True))
    ask(conversation, "#fail")
    ask(conversation, "#overflow")
    turn_compact(user=conversation.owner, conversation_id=conversation.pk)
    ask(conversation, "after the compaction")


def _normalised(document):
    """The export with node ids replaced by their position, and the import's own creation times left out."""
    position = {n["id"]: i for i, n in enumerate(document["nodes"])}
    renumber = position.get
    nodes = [{**n, "id": renumber(n["id"]), "parent": renumber(n["parent"]),
              "compacted_from": renumber(n["compacted_from"]), "summary_call": renumber(n["summary_call"]),
              **({"first_round": renumber(n["first_round"])} if "first_round" in n else {}),  # issue 32
              "created_at": None} for n in document["nodes"]]
    bubbles = [{**b, "node": renumber(b["node"])} for b in document["bubbles"]]
    approvals = [{**a, "node": renumber(a["node"])} for a in document["approvals"]]
    meta = {**document["conversation"], "head": renumber(document["conversation"]["head"])}
    return {**document, "conversation": meta, "nodes": nodes, "bubbles": bubbles, "approvals": approvals}


def test_the_tree_json_imports_back_losslessly(api, user, conversation, settings):
    """Round trip: every node (status, kind, compaction pointers), bubble, approval and the head come back, and
    every node's "what the model saw" and every branch's bubbles are the same (T5, T8, C2, C3)."""
    _rich_tree(conversation, settings)
    original = arbor_tree.export_tree(conversation)
    response = _import(api, original)
    assert response.status_code == 201, response.json()
    (created,) = response.json()["conversations"]
    copy = Conversation.objects.get(pk=created["id"])
    again = arbor_tree.export_tree(copy)
    assert _normalised(again) == _normalised(original)
    assert {n["kind"] for n in original["nodes"]} == {"turn", "compaction"}
    assert any("first_round" in n for n in original["nodes"]), "a tool round names its turn's first call"
    assert {n["failure_reason"] for n in original["nodes"]} >= {"provider_error", "context_overflow"}

    old_nodes = Node.objects.filter(pk__in=[n["id"] for n in original["nodes"]]).order_by("id")
    new_nodes = Node.objects.filter(pk__in=[n["id"] for n in again["nodes"]]).order_by("id")
    for old, new in zip(old_nodes, new_nodes, strict=True):
        assert call_context(new) == call_context(old), f"what node {old.pk} saw"
        old_path = node_path(old.pk, owner=old.owner_id)
        old_view = [(v.bubble.role, v.bubble.content) for v in path_bubbles(conversation=conversation, path=old_path)]
        new_path = node_path(new.pk, owner=new.owner_id)
        new_view = [(v.bubble.role, v.bubble.content) for v in path_bubbles(conversation=copy, path=new_path)]
        assert new_view == old_view, f"the bubbles of the branch at node {old.pk}"
    assert next_context(copy) == next_context(conversation)


def test_markdown_is_the_current_path(api, conversation):
    ask(conversation, "kept question")
    run_here(turn_edit(user=conversation.owner, conversation_id=conversation.pk, node_id=head(conversation).pk,
                    content="shown question"))
    response = api.get(f"/api/conversations/{conversation.pk}/export/", {"format": "md"})
    text = b"".join(response.streaming_content).decode()  # issue 13: exports stream
    assert response["Content-Type"].startswith("text/markdown") and "attachment" in response["Content-Disposition"]
    assert "## Question\n\nshown question" in text and "kept question" not in text
    assert "## Answer\n\necho: shown question" in text


def test_chatgpt_export_keeps_branches_and_imports_back(api, user, conversation):
    """ChatGPT's format: `mapping` with parent and children and `current_node`; both branches survive the trip."""
    ask(conversation, "apples?")
    first = head(conversation)
    ask(conversation, "and pears?")
    run_here(turn_edit(user=user, conversation_id=conversation.pk, node_id=first.pk, content="bananas?"))
    document = json.loads(b"".join(api.get(f"/api/conversations/{conversation.pk}/export/",
                                           {"format": "chatgpt"}).streaming_content))
    (entry,) = document
    mapping = entry["mapping"]
    assert all(mapping[c]["parent"] == key for key, e in mapping.items() for c in e["children"])
    root = next(k for k, e in mapping.items() if e["parent"] is None)
    assert len(mapping[root]["children"]) == 2, "the edit is a second branch from the root"
    assert mapping[entry["current_node"]]["message"]["content"]["parts"][0].startswith("echo: bananas?")

    (created,) = _import(api, document).json()["conversations"]
    copy = Conversation.objects.get(pk=created["id"])
    conversation.refresh_from_db()
    shown = [(v.bubble.role, v.bubble.content) for v in path_bubbles(conversation=copy)]
    assert shown == [(v.bubble.role, v.bubble.content) for v in path_bubbles(conversation=conversation)]
    other = [v for v in path_bubbles(conversation=copy) if v.bubble.role == "user"][0]
    assert other.branch.count == 2
    services.head_switch(conversation=copy, node_id=other.branch.siblings[0])
    assert [v.bubble.content for v in path_bubbles(conversation=copy) if v.bubble.role == "user"] == [
        "apples?", "and pears?"]


def test_a_chatgpt_regeneration_becomes_a_sibling_turn(api):
    """In ChatGPT a regenerated answer is a second child of the question; here it is a sibling turn (T7, T8)."""
    def message(role, text):
        return {"author": {"role": role}, "content": {"content_type": "text", "parts": [text]}}

    document = {"title": "Imported", "current_node": "a2", "mapping": {
        "root": {"message": None, "parent": None, "children": ["sys"]},
        "sys": {"message": message("system", ""), "parent": "root", "children": ["q"]},
        "q": {"message": message("user", "Hi?"), "parent": "sys", "children": ["a1", "a2"]},
        "a1": {"message": message("assistant", "Hello."), "parent": "q", "children": []},
        "a2": {"message": message("assistant", "Hey there."), "parent": "q", "children": []},
    }}
    (created,) = _import(api, document).json()["conversations"]
    copy = Conversation.objects.get(pk=created["id"])
    views = path_bubbles(conversation=copy)
    assert [(v.bubble.role, v.bubble.content) for v in views] == [("user", "Hi?"), ("assistant", "Hey there.")]
    assert (views[0].branch.index, views[0].branch.count) == (2, 2)
    assert copy.title == "Imported"


@pytest.mark.parametrize(("body", "status", "needle"), [
    ("[" * 200_009 + "]" * 200_009, 400, "nests deeper"),  # two levels a node it may hold (issue 28)
    ("not json", 400, "not valid JSON"),
    (json.dumps({"format": "arbor.tree", "version": 1, "conversation": {}, "nodes": [
        {"id": 1, "parent": 2, "kind": "turn", "status": "succeeded"},
        {"id": 2, "parent": 1, "kind": "turn", "status": "succeeded"}]}), 400, "cycle"),
    (json.dumps({"format": "arbor.tree", "version": 1, "conversation": {"head": 9}, "nodes": [
        {"id": 1, "parent": None, "kind": "turn", "status": "succeeded"}]}), 400, "not in the file"),
    (json.dumps({"format": "arbor.tree", "version": 1, "conversation": {}, "nodes": [
        {"id": 1, "parent": None, "kind": "turn", "status": "succeeded",
         "sent": [{"type": "user", "text": "x" * 100_001}]}]}), 400, "longer than"),
    (json.dumps({"format": "arbor.tree", "version": 1, "conversation": {}, "nodes": [
        {"id": 1, "parent": None, "kind": "turn", "status": "failed"}]}), 400, "failure reason"),
    (json.dumps([{"mapping": {"a": {"parent": None, "message": None}, "b": {"parent": "c", "message": None},
                              "c": {"parent": "b", "message": None}}}]), 400, "cycle"),
    (json.dumps({"something": "else"}), 400, "Unknown file"),
    (json.dumps({"format": "arbor.tree", "version": 1, "conversation": {"head": 3}, "nodes": [
        {"id": 1, "parent": None, "kind": "turn", "status": "succeeded"},
        {"id": 2, "parent": None, "kind": "compaction", "status": "succeeded", "compacted_from": 3},
        {"id": 3, "parent": 2, "kind": "turn", "status": "succeeded"}]}), 400, "lead back to it"),
    (json.dumps({"format": "arbor.tree", "version": 1, "conversation": {}, "nodes": [
        {"id": 1, "parent": None, "kind": "turn", "status": "succeeded", "received": [{"type": "tool_call"}]}]}),
     400, "received[0].id: missing"),
    (json.dumps({"format": "arbor.tree", "version": 1, "conversation": {"head": {}}, "nodes": [
        {"id": 1, "parent": [1], "kind": "turn", "status": "succeeded"}]}), 400, "not in the file"),
    (json.dumps({"format": "arbor.tree", "version": 1, "conversation": {"head": 2}, "nodes": [
        {"id": 1, "parent": None, "kind": "turn", "status": "succeeded"},
        {"id": 2, "parent": 1, "kind": "title", "status": "succeeded"}]}), 400, "a head can rest on"),
    (json.dumps({"format": "arbor.tree", "version": 1, "conversation": {}, "nodes": [
        {"id": 1, "parent": None, "kind": "turn", "status": "succeeded"}],
        "bubbles": [{"node": [1], "role": "user", "content": "x"}]}), 400, "not in the file"),
])
def test_hostile_or_malformed_files_are_refused_and_create_nothing(api, body, status, needle):
    before = (Conversation.objects.count(), Node.objects.count(), Bubble.objects.count())
    response = api.post("/api/conversations/import/", data=body, content_type="application/json")
    assert response.status_code == status, response.content
    assert needle in response.json()["error"]["message"]
    assert (Conversation.objects.count(), Node.objects.count(), Bubble.objects.count()) == before


def test_too_big_or_too_many_nodes_is_413(api, conversation, settings):
    ask(conversation, "one")
    ask(conversation, "two")
    document = arbor_tree.export_tree(conversation)
    settings.ARBOR_IMPORT_MAX_NODES = 1
    assert _import(api, document).status_code == 413
    settings.ARBOR_IMPORT_MAX_NODES = 100
    settings.ARBOR_IMPORT_MAX_BYTES = 100
    assert _import(api, document).status_code == 413
    assert Conversation.objects.count() == 1


def test_export_is_only_for_the_owner_and_names_its_formats(api, other_api, conversation):
    assert other_api.get(f"/api/conversations/{conversation.pk}/export/").status_code == 404
    response = api.get(f"/api/conversations/{conversation.pk}/export/", {"format": "pdf"})
    assert response.status_code == 400 and "md, json, chatgpt" in response.json()["error"]["message"]


def test_an_import_names_only_an_offered_model_and_is_queued_for_search(api, user, conversation, settings):
    ask(conversation, "findable words")
    document = arbor_tree.export_tree(conversation)
    document["conversation"]["model"] = "openai/o1-pro"
    (created,) = _import(api, document).json()["conversations"]
    assert created["model"] == settings.ARBOR_MODEL, "a file cannot pick a model this server does not offer"
    from conversations.jobs import worker
    from search.query import search_bubbles

    worker.run_due()
    assert {h.conversation for h in search_bubbles(user=user, query="findable")} == {conversation.pk, created["id"]}


def test_the_chatgpt_export_leaves_side_calls_out(api, user, conversation):
    """A title call (R4) is no turn: it must not come back from a round trip as a sibling question."""
    from conversations.jobs import worker

    services.conversation_update(conversation=conversation, title="")
    ask(conversation, "first question")
    worker.run_due()
    ask(conversation, "second question")
    document = json.loads(b"".join(api.get(f"/api/conversations/{conversation.pk}/export/",
                                           {"format": "chatgpt"}).streaming_content))
    texts = [e["message"]["content"]["parts"][0] for e in document[0]["mapping"].values() if e["message"]]
    assert not any(t.startswith("#title") for t in texts)
    (created,) = _import(api, document).json()["conversations"]
    copy = Conversation.objects.get(pk=created["id"])
    assert all(v.branch.count == 1 for v in path_bubbles(conversation=copy) if v.bubble.role == "user")


def test_issue_15_t8_a_chatgpt_round_trip_keeps_every_branch_message_call_result_and_the_instructions(
        api, user, conversation):
    """Issue 15: export to ChatGPT's format and import back: a regenerated answer is one question with two
    answers (it was exported as a repeated question), a tool call is a call with its id and arguments and its
    result comes back (they became visible text, and results were dropped), the instructions are kept (they
    were dropped); every node's path, and the head, are as they were."""
    services.conversation_update(conversation=conversation, instructions="Answer in one line.")
    ask(conversation, "first question")
    run_here(turn_regenerate(user=user, conversation_id=conversation.pk))
    run_here(turn_edit(user=user, conversation_id=conversation.pk, node_id=head(conversation).pk,
                       content="first, edited"))
    ask(conversation, '#tool sql_query {"sql": "select count(*) as n from customers"}')
    ask(conversation, "and after the tool?")

    document = json.loads(b"".join(api.get(f"/api/conversations/{conversation.pk}/export/",
                                           {"format": "chatgpt"}).streaming_content))
    questions = [e["message"]["content"]["parts"][0] for e in document[0]["mapping"].values()
                 if e["message"] and e["message"]["author"]["role"] == "user"]
    assert questions.count("first question") == 1, "one question, its two answers below it"
    (created,) = _import(api, document).json()["conversations"]
    copy = Conversation.objects.get(pk=created["id"])

    conversation.refresh_from_db()
    assert copy.instructions == "Answer in one line."
    assert item_paths(copy) == item_paths(conversation)
    assert [(v.bubble.role, v.bubble.content, v.branch.count) for v in path_bubbles(conversation=copy)] == [
        (v.bubble.role, v.bubble.content, v.branch.count) for v in path_bubbles(conversation=conversation)]


def test_a_long_view_runs_straight_under_wsgi(api, conversation, monkeypatch):
    """Under WSGI (the test client) a long view is called as the sync view it is: no event loop per request and
    no context hop, where Python 3.11 can corrupt a context (CPython gh-148891, seen once in CI as "unhashable
    type: 'hamt_bitmap_node'" during this very export)."""
    import asgiref.sync

    def no_hop(*args, **kwargs):
        raise AssertionError("the view went through async_to_sync")

    monkeypatch.setattr(asgiref.sync.AsyncToSync, "__call__", no_hop)
    ask(conversation, "kept question")
    response = api.get(f"/api/conversations/{conversation.pk}/export/", {"format": "md"})
    assert response.status_code == 200 and "kept question" in b"".join(response.streaming_content).decode()


def test_a_decorator_around_a_long_view_still_runs_under_wsgi(page, conversation):
    """`require_POST` around a long view still refuses a GET, so a link cannot compact a conversation (a paid
    call) past CSRF."""
    response = page.get(f"/chat/{conversation.pk}/compact/")
    assert response.status_code == 405


def test_issue_32_a_file_cannot_make_a_call_a_round_of_a_response_it_did_not_follow(api, user, conversation):
    ask(conversation, '#tool sql_query {"sql": "select 1 as one"}')
    ask(conversation, "unrelated")
    document = arbor_tree.export_tree(conversation)
    rounds = [n for n in document["nodes"] if "first_round" in n]
    assert len(rounds) == 1
    later, last = rounds[0], document["nodes"][-1]
    forgeries = [(last, later["first_round"]),  # a question's call, not a later round
                 (later, "nowhere"), (later, later["id"]), (later, last["id"]),  # no node, itself, a call below it
                 (last, later["id"])]  # a later round, not a first call
    for forged_node, wrong in forgeries:
        forged = {**document, "nodes": [{**n, "first_round": wrong} if n is forged_node else n
                                        for n in document["nodes"]]}
        refused = _import(api, forged)
        assert refused.status_code == 400 and "first_round" in refused.json()["error"]["message"], wrong
    assert Conversation.objects.count() == 1, "a refused file creates nothing"
    assert _import(api, document).status_code == 201
