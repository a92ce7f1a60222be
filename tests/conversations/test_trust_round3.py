"""Issue 26 (trust, round 3): what a person approves is what runs; the screen never disagrees with the record."""

from __future__ import annotations

import json

import pytest
from django.core import mail
from django.test import Client
from django.urls import reverse

from conversations import items as it
from conversations.models import Bubble, Conversation, Node
from conversations.transfer import arbor_tree
from conversations.turns.detached import run_here
from conversations.turns.start import turn_ask, turn_decide
from tests.conversations.helpers import ask, head

pytestmark = pytest.mark.django_db

ATTACKER = "attacker@evil.example"
BOSS = "boss@company.example"


def _import(api, document):
    return api.post("/api/conversations/import/", data=json.dumps(document), content_type="application/json")


def _waiting_mail_export(conversation) -> dict:
    """An Arbor JSON export of a conversation whose head waits for approval of a mail to the attacker."""
    arguments = json.dumps({"to": ATTACKER, "subject": "pay", "body": "wire the money"})
    events = ask(conversation, f"#tool send_email {arguments}")
    assert events[-1].type == "approval_required"
    conversation.refresh_from_db()
    return arbor_tree.export_tree(conversation)


def _tool_bubble(document) -> dict:
    (bubble,) = [b for b in document["bubbles"] if b["role"] == "tool"]
    return bubble


def test_issue_26_f3_an_imported_card_shows_the_call_approve_runs_not_the_files_words(api, user, conversation):
    """F3, D4: a file's tool bubble says the mail goes to the boss and is done; the stored call sends it to the
    attacker. After the import the card shows the attacker's address, waiting, with its buttons; Approve sends
    exactly what the card showed."""
    document = _waiting_mail_export(conversation)
    bubble = _tool_bubble(document)
    bubble["content"] = "harmless_tool"
    bubble["data"] = {**bubble["data"], "name": "harmless_tool", "status": "done", "result": "sent",
                      "arguments": json.dumps({"to": BOSS, "subject": "hello", "body": "hi"})}
    response = _import(api, document)
    assert response.status_code == 201, response.json()
    copy = Conversation.objects.get(pk=response.json()["conversations"][0]["id"])
    shown = Bubble.objects.get(conversation=copy, role=Bubble.Role.TOOL)
    (call,) = it.tool_calls(head(copy).received)
    assert shown.content == "send_email" and shown.data["name"] == "send_email"
    assert json.loads(shown.data["arguments"])["to"] == ATTACKER and shown.data["status"] == "awaiting_approval"
    browser = Client()
    browser.force_login(user)
    html = browser.get(reverse("chat-conversation", args=[copy.pk])).content.decode()
    assert ATTACKER in html and BOSS not in html and "waiting for your approval" in html
    events = run_here(turn_decide(user=user, conversation_id=copy.pk, call_id=call["id"], approve=True))
    assert events[-1].type == "done"
    assert [m.to for m in mail.outbox] == [[ATTACKER]], "what ran is what the card showed"


def test_issue_26_f3_a_file_cannot_show_a_waiting_call_as_done(api, user, conversation):
    """F3: a call that waits for approval at the imported head stays waiting, with its buttons, whatever the
    file's bubble says; the conversation is not stuck refusing every question with 409 behind a card with none."""
    document = _waiting_mail_export(conversation)
    bubble = _tool_bubble(document)
    bubble["data"] = {**bubble["data"], "status": "done", "result": "already sent", "is_error": False}
    response = _import(api, document)
    assert response.status_code == 201, response.json()
    copy = Conversation.objects.get(pk=response.json()["conversations"][0]["id"])
    shown = Bubble.objects.get(conversation=copy, role=Bubble.Role.TOOL)
    assert shown.data["status"] == "awaiting_approval" and "result" not in shown.data
    assert head(copy).pk == shown.node_id, "the waiting call is at the head, where Approve acts"


def test_issue_26_a_done_call_shows_its_stored_result_not_the_files(api, user, conversation):
    """T4: a call that ran shows the result its next node sent, whatever the file's bubble claims."""
    ask(conversation, '#tool sql_query {"sql": "select 41 + 1 as n"}')
    conversation.refresh_from_db()
    document = arbor_tree.export_tree(conversation)
    bubble = _tool_bubble(document)
    real = bubble["data"]["result"]
    bubble["data"] = {**bubble["data"], "status": "error", "result": "the file's own words", "is_error": True}
    response = _import(api, document)
    assert response.status_code == 201, response.json()
    copy = Conversation.objects.get(pk=response.json()["conversations"][0]["id"])
    shown = Bubble.objects.get(conversation=copy, role=Bubble.Role.TOOL)
    assert (shown.data["status"], shown.data["result"], shown.data["is_error"]) == ("done", real, False)
    assert "42" in real


def test_issue_26_a_tool_bubble_naming_no_call_of_its_node_is_refused_and_creates_nothing(api, conversation):
    """Bad input changes nothing: a tool bubble whose call id names no call of its node is a 400."""
    document = _waiting_mail_export(conversation)
    _tool_bubble(document)["data"]["call_id"] = "call_that_never_was"
    before = (Conversation.objects.count(), Node.objects.count(), Bubble.objects.count())
    response = _import(api, document)
    assert response.status_code == 400
    assert "names no tool call of that node" in response.json()["error"]["message"]
    assert (Conversation.objects.count(), Node.objects.count(), Bubble.objects.count()) == before


def test_issue_26_the_live_card_still_comes_from_the_call(user, conversation):
    """The live path: the bubble of a waiting call carries the call's own name and arguments."""
    arguments = json.dumps({"to": BOSS, "subject": "s", "body": "b"})
    run_here(turn_ask(user=user, conversation_id=conversation.pk, content=f"#tool send_email {arguments}"))
    shown = Bubble.objects.get(conversation=conversation, role=Bubble.Role.TOOL)
    (call,) = it.tool_calls(head(conversation).received)
    assert (shown.data["name"], shown.data["arguments"], shown.data["status"]) == (
        call["name"], call["arguments"], "awaiting_approval")


def test_issue_26_the_migration_redraws_cards_an_earlier_import_stored(conversation):
    """Bubbles stored before the fix are redrawn from their calls by migration 0015."""
    import importlib

    from django.apps import apps

    arguments = json.dumps({"to": ATTACKER, "subject": "s", "body": "b"})
    ask(conversation, f"#tool send_email {arguments}")
    shown = Bubble.objects.get(conversation=conversation, role=Bubble.Role.TOOL)
    Bubble.objects.filter(pk=shown.pk).update(content="x", data={**shown.data, "status": "done", "arguments": BOSS})
    forged = Bubble.objects.create(conversation=conversation, node=shown.node, role=Bubble.Role.TOOL,
                                   content="ghost", data={"call_id": "nope", "name": "ghost", "status": "done"})
    importlib.import_module("conversations.migrations.0015_tool_bubbles_from_calls")._redraw(apps, None)
    shown.refresh_from_db()
    forged.refresh_from_db()
    assert shown.content == "send_email" and ATTACKER in shown.data["arguments"]
    assert shown.data["status"] == "awaiting_approval"
    assert forged.data["status"] == "error" and "names no call" in forged.data["result"]


def test_issue_26_a_patch_racing_a_delete_is_a_404_and_writes_nothing(user, conversation, monkeypatch):
    """Issue 26: a PATCH that read the conversation just before another request deleted it answered 503 ("did not
    affect any rows") in 7 of 105 races; it is the 404 the conversation now is, and nothing is queued for it."""
    from conversations import selectors
    from conversations.apis import views
    from conversations.models import OutboxJob

    read = selectors.conversation_for_user

    def read_then_deleted(**kwargs):
        found = read(**kwargs)
        Conversation.objects.filter(pk=found.pk).delete()  # the other request's DELETE lands here
        return found

    monkeypatch.setattr(views, "conversation_for_user", read_then_deleted)
    browser = Client()
    browser.force_login(user)
    response = browser.patch(f"/api/conversations/{conversation.pk}/", data={"title": "late", "model": "arbor/echo"},
                             content_type="application/json")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
    assert not Conversation.objects.filter(pk=conversation.pk).exists()
    assert not OutboxJob.objects.filter(kind="recount").exists()


def test_issue_26_an_import_is_bounded_by_its_tree_not_by_how_many_bubbles_a_file_repeats(api, conversation):
    """Issue 26: one file with 1,000,000 bubbles on one node was accepted and made a 131 MB page. A node shows one
    question, one answer, one error and one bubble a tool call, as live nodes do; more is a 400 creating nothing."""
    ask(conversation, '#tool sql_query {"sql": "select 1 as n"}')
    conversation.refresh_from_db()
    document = arbor_tree.export_tree(conversation)
    before = (Conversation.objects.count(), Node.objects.count(), Bubble.objects.count())
    answer = next(b for b in document["bubbles"] if b["role"] == "assistant")
    cases = ((answer, "already has its assistant bubble"), (_tool_bubble(document), "two tool bubbles"))
    for repeated, needle in cases:
        copy = {**document, "bubbles": [*document["bubbles"], *[dict(repeated) for _ in range(1000)]]}
        response = _import(api, copy)
        assert response.status_code == 400 and needle in response.json()["error"]["message"]
    assert (Conversation.objects.count(), Node.objects.count(), Bubble.objects.count()) == before
    assert _import(api, document).status_code == 201, "the file as exported imports"
