"""Issue 33, "Share a branch" (X5): a read-only, revocable snapshot of one path, through the API and the page.

Each test names the rule it checks: X5 (a share is a read-only snapshot of one path, revocable), T8 (only the
nodes on the path show), T11 (a cleared or deleted conversation remembers nothing, its shares included), P3 (a
fork copies nothing; a share's "continue" copies, because the copy changes owner), D4 (nothing copied approves
an action) and D5 (a refused request writes nothing).
"""

from __future__ import annotations

import json
import re

import pytest
from django.test import Client

from config.middleware import CONTENT_SECURITY_POLICY
from conversations import services
from conversations.models import Bubble, Conversation, Node, ToolApproval
from conversations.selectors import node_path
from shares.models import Share, token_digest
from tests.conversations.helpers import ask, head, owner_of

pytestmark = pytest.mark.django_db

ACTION_MARKS = ("data-turn-control", "data-action", "/switch/", "/fork/", "/clear/", "/delete/", "/compact/",
                "Approve", "Refuse", "Regenerate", "Edit this question", "Retry")


def _share(api, conversation, **body):
    response = api.post(f"/api/conversations/{conversation.pk}/share/", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def _questions(html: str) -> list[str]:
    return re.findall(r'<article class="msg user"[^>]*>\s*<div class="body plain">(.*?)</div>', html, re.S)


def _items(tip_id: int) -> list[tuple]:
    return [(p.kind, p.status, p.sent, p.received) for p in node_path(tip_id, owner=owner_of(tip_id))]


# --- the page: a snapshot, for anyone holding the link ------------------------------------------------------------


def test_x5_t8_a_share_is_a_snapshot_that_ends_at_its_node_seen_signed_out(api, conversation):
    """X5, T8: the page shows the path up to the shared node, to someone signed out; a turn asked after sharing
    never appears on it (a share names its node, not the head)."""
    ask(conversation, "first question")
    ask(conversation, "second question")
    shared = _share(api, conversation)
    assert set(shared) == {"token", "url"}
    assert shared["url"].endswith(f"/s/{shared['token']}/") and len(shared["token"]) >= 43
    ask(conversation, "asked after sharing")

    response = Client().get(f"/s/{shared['token']}/")
    assert response.status_code == 200
    html = response.content.decode()
    assert _questions(html) == ["first question", "second question"]
    assert "echo: second question" in html
    assert "asked after sharing" not in html


def test_x5_t8_a_share_of_an_earlier_answer_ends_there(api, conversation):
    """X5, T8: `node` names an earlier answer: the page ends at it, though the head lies further on."""
    ask(conversation, "one")
    earlier = head(conversation)
    ask(conversation, "two")
    shared = _share(api, conversation, node=earlier.pk)
    assert Share.objects.get().node_id == earlier.pk
    no_body = api.post(f"/api/conversations/{conversation.pk}/share/")  # no body at all: the head
    assert no_body.status_code == 201 and Share.objects.get(digest=token_digest(no_body.json()["token"])).node_id == (
        head(conversation).pk)
    html = Client().get(f"/s/{shared['token']}/").content.decode()
    assert _questions(html) == ["one"] and "echo: one" in html and "two" not in html


def test_x5_tool_calls_and_results_show_as_in_the_chat(api, conversation):
    """X5: a tool round shows on the share page as in the chat: the tool's name, its arguments and its result."""
    ask(conversation, '#tool sql_query {"sql": "select 41 + 1 as answer"}')
    shared = _share(api, conversation)
    html = Client().get(f"/s/{shared['token']}/").content.decode()
    assert 'class="msg tool tool-done"' in html and "<code>sql_query</code>" in html
    assert "select 41 + 1 as answer" in html and "42" in html.split("<h3>Result</h3>", 1)[1]


def test_x5_the_page_has_no_action_buttons_signed_out_or_in(api, conversation, user):
    """X5 (read-only): no edit, regenerate, fork, switch, approve or retry control on the page, even for a call
    waiting for approval and a failed call; signed out its one form is "sign in", signed in "continue"."""
    ask(conversation, "hello")
    ask(conversation, '#tool send_email {"to": "x@example.com", "subject": "s", "body": "b"}')
    assert Bubble.objects.filter(node=head(conversation), data__status="awaiting_approval").exists()
    shared = _share(api, conversation)

    signed_in = Client()
    signed_in.force_login(user)
    for client in (Client(), signed_in):
        html = client.get(f"/s/{shared['token']}/").content.decode()
        assert "send_email" in html and "waiting for approval" in html
        for mark in ACTION_MARKS:
            assert mark not in html, mark
        forms = re.findall(r"<form[^>]*>", html)
        assert len(forms) == 1, forms
        if client is signed_in:
            assert f'action="/s/{shared["token"]}/continue/"' in forms[0]
            assert "Continue as a new conversation of my own" in html
        else:
            assert 'action="/accounts/login/"' in forms[0] and "Sign in to continue" in html


def test_x5_the_page_is_kept_out_of_search_engines_with_the_pages_csp(api, conversation):
    """X5: noindex in a robots meta tag and in X-Robots-Tag; the same CSP as every page; no referrer (the token is
    in the address) and no caching (a revoked link stops at once)."""
    ask(conversation, "hello")
    shared = _share(api, conversation)
    response = Client().get(f"/s/{shared['token']}/")
    assert '<meta name="robots" content="noindex' in response.content.decode()
    assert "noindex" in response["X-Robots-Tag"]
    assert response["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert response["Referrer-Policy"] == "no-referrer"
    assert "no-store" in response["Cache-Control"]


def test_x5_an_unknown_or_malformed_token_is_a_plain_404(api, conversation):
    ask(conversation, "hello")
    shared = _share(api, conversation)
    for token in ("x" * 43, shared["token"][:-1], shared["token"] + "x", "a" * 500):
        assert Client().get(f"/s/{token}/").status_code == 404


def test_x5_the_token_is_found_by_its_digest(api, conversation):
    """The token is unguessable (token_urlsafe(32)) and looked up by its SHA-256, never by comparing it in SQL."""
    ask(conversation, "hello")
    tokens = {_share(api, conversation)["token"] for _ in range(3)}
    assert len(tokens) == 3
    for token in tokens:
        assert Share.objects.filter(digest=token_digest(token)).count() == 1


# --- revocation and listing: the owner's alone --------------------------------------------------------------------


def test_x5_revoking_a_share_makes_its_page_a_404(api, conversation):
    """X5 (revocable): DELETE /api/shares/{token}/ → 204; the page and a second revocation are 404s."""
    ask(conversation, "hello")
    shared = _share(api, conversation)
    assert Client().get(f"/s/{shared['token']}/").status_code == 200
    assert api.delete(f"/api/shares/{shared['token']}/").status_code == 204
    assert Client().get(f"/s/{shared['token']}/").status_code == 404
    assert api.delete(f"/api/shares/{shared['token']}/").status_code == 404
    assert api.get("/api/shares/").json()["results"] == []


def test_x5_the_list_names_each_of_the_callers_shares(api, conversation):
    ask(conversation, "one")
    first = _share(api, conversation)
    ask(conversation, "two")
    second = _share(api, conversation)
    results = api.get("/api/shares/").json()["results"]
    assert [r["token"] for r in results] == [second["token"], first["token"]], "newest first"
    assert set(results[0]) == {"token", "url", "conversation", "node", "created_at"}
    assert results[0]["url"] == second["url"] and results[0]["conversation"] == conversation.pk
    assert results[0]["node"] == head(conversation).pk


def test_x5_another_person_can_neither_list_nor_revoke_a_share(api, other_api, conversation):
    ask(conversation, "hello")
    shared = _share(api, conversation)
    assert other_api.get("/api/shares/").json()["results"] == []
    response = other_api.delete(f"/api/shares/{shared['token']}/")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
    assert Client().get(f"/s/{shared['token']}/").status_code == 200, "still shared"


# --- refusals write nothing ---------------------------------------------------------------------------------------


def test_x5_d5_another_persons_conversation_or_node_is_a_404_and_nothing_is_written(api, other_api, conversation,
                                                                                     other_user):
    """Another person's conversation, and a node of another person's conversation named in one's own: 404, no
    share written (API.md: anyone else's is a 404; a refused request changes nothing)."""
    ask(conversation, "mine")
    theirs = services.conversation_create(owner=other_user, title="theirs")
    ask(theirs, "theirs")
    response = api.post(f"/api/conversations/{theirs.pk}/share/", {}, format="json")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
    response = api.post(f"/api/conversations/{conversation.pk}/share/", {"node": head(theirs).pk}, format="json")
    assert response.status_code == 404
    response = api.post("/api/conversations/999999/share/", {}, format="json")
    assert response.status_code == 404
    assert not Share.objects.exists()


def test_x5_d5_what_is_not_an_answer_is_a_400_and_nothing_is_written(api, conversation, settings):
    """Only a node a head may rest on is shared: not an overflowed call (F2), not a bad id, not an empty
    conversation's missing head. 400, nothing written."""
    empty = api.post(f"/api/conversations/{conversation.pk}/share/", {}, format="json")
    assert empty.status_code == 400 and empty.json()["error"]["code"] == "bad_input"
    ask(conversation, "hello")
    ask(conversation, "#overflow")
    overflowed = Node.objects.get(conversation=conversation, failure_reason=Node.FailureReason.CONTEXT_OVERFLOW)
    response = api.post(f"/api/conversations/{conversation.pk}/share/", {"node": overflowed.pk}, format="json")
    assert response.status_code == 400 and "not an answer" in response.json()["error"]["message"]
    for bad in ("seven", True, -1, [1]):
        response = api.post(f"/api/conversations/{conversation.pk}/share/", {"node": bad}, format="json")
        assert response.status_code == 400, bad
    assert not Share.objects.exists()


# --- T11: a cleared or deleted conversation shares nothing ---------------------------------------------------------


def test_t11_clearing_the_conversation_makes_its_shares_404(api, conversation):
    """T11: cleared, a conversation remembers nothing, and a link to it shows nothing."""
    ask(conversation, "hello")
    shared = _share(api, conversation)
    services.conversation_clear(conversation=conversation)
    assert Client().get(f"/s/{shared['token']}/").status_code == 404


def test_t11_deleting_the_conversation_deletes_its_shares(api, conversation):
    ask(conversation, "hello")
    shared = _share(api, conversation)
    services.conversation_delete(conversation=conversation)
    assert not Share.objects.exists()
    assert Client().get(f"/s/{shared['token']}/").status_code == 404


# --- continue as a new conversation of one's own ------------------------------------------------------------------


def test_x5_continue_copies_the_path_into_a_new_conversation_of_the_visitors(api, conversation, other_user):
    """X5 (P3's counterpart): "Continue as a new conversation of my own" copies the shared path's nodes into a new
    conversation the visitor owns, whose head is the copy of the shared node; the original is untouched, and what
    either side adds later never shows in the other (T8)."""
    ask(conversation, "first")
    ask(conversation, '#tool sql_query {"sql": "select 2 as n"}')
    shared_head = head(conversation)
    services.conversation_update(conversation=conversation, instructions="the sharer's own instructions")
    shared = _share(api, conversation)
    ask(conversation, "after sharing")
    before = (list(Node.objects.filter(conversation=conversation).values_list("id", "sent", "received")),
              head(conversation).pk, Bubble.objects.filter(conversation=conversation).count())

    visitor = Client()
    visitor.force_login(other_user)
    response = visitor.post(f"/s/{shared['token']}/continue/")
    copy = Conversation.objects.get(owner=other_user)
    assert response.status_code == 302 and response["Location"] == f"/chat/{copy.pk}/"
    assert copy.head_id != shared_head.pk and copy.title.endswith("(shared)")
    assert copy.instructions == "", "the sharer's instructions are theirs"
    assert _items(copy.head_id) == _items(shared_head.pk), "the same path, item for item"
    copied_ids = {p.id for p in node_path(copy.head_id, owner=copy.owner_id)}
    assert copied_ids.isdisjoint({p.id for p in node_path(shared_head.pk, owner=shared_head.owner_id)}), \
        "copied, not shared"
    assert Node.objects.filter(pk__in=copied_ids, conversation=copy).count() == len(copied_ids)
    assert not Node.objects.filter(pk__in=copied_ids).exclude(instructions="").exists()
    assert Bubble.objects.filter(conversation=copy, node_id__in=copied_ids).count() == Bubble.objects.filter(
        node__in=[p.id for p in node_path(shared_head.pk, owner=owner_of(shared_head.pk))]).count()

    page = visitor.get(f"/chat/{copy.pk}/").content.decode()
    assert "echo: first" in page and "after sharing" not in page
    after = (list(Node.objects.filter(conversation=conversation).values_list("id", "sent", "received")),
             head(conversation).pk, Bubble.objects.filter(conversation=conversation).count())
    assert after == before, "the original is untouched"

    ask(copy, "the visitor goes on")
    services.conversation_delete(conversation=copy)  # T11: deleting the copy reaches nothing of the original
    assert head(conversation).pk == before[1] and Node.objects.filter(conversation=conversation).count() == len(
        before[0])
    assert Client().get(f"/s/{shared['token']}/").status_code == 200


def test_d4_a_copied_path_approves_nothing(api, conversation, other_user):
    """D4: a call that waits for approval on the shared path still waits in the copy, for the visitor's own
    decision; no decision comes with the copy."""
    ask(conversation, '#tool send_email {"to": "x@example.com", "subject": "s", "body": "b"}')
    shared = _share(api, conversation)
    visitor = Client()
    visitor.force_login(other_user)
    visitor.post(f"/s/{shared['token']}/continue/")
    copy = Conversation.objects.get(owner=other_user)
    (tool,) = Bubble.objects.filter(conversation=copy, role=Bubble.Role.TOOL)
    assert tool.data["status"] == "awaiting_approval" and json.loads(tool.data["arguments"])["to"] == "x@example.com"
    assert not ToolApproval.objects.filter(node__conversation=copy).exists()


def test_x5_continue_signed_out_asks_to_sign_in_and_writes_nothing(api, conversation):
    ask(conversation, "hello")
    shared = _share(api, conversation)
    response = Client().post(f"/s/{shared['token']}/continue/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    assert Conversation.objects.count() == 1


def test_x5_continue_from_a_revoked_share_is_a_404_and_writes_nothing(api, conversation, other_user):
    ask(conversation, "hello")
    shared = _share(api, conversation)
    api.delete(f"/api/shares/{shared['token']}/")
    visitor = Client()
    visitor.force_login(other_user)
    assert visitor.post(f"/s/{shared['token']}/continue/").status_code == 404
    assert not Conversation.objects.filter(owner=other_user).exists()


def test_issue_33_the_settings_page_lists_a_persons_shares_and_revokes_one(user, other_user, client):
    """Issue 33: the settings page lists the person's own shared links (never another's), each with Revoke; a
    revoked link is a 404 from then on."""
    from django.urls import reverse

    from conversations import services as conversation_services
    from shares import services as share_services
    from tests.conversations.helpers import ask

    mine = conversation_services.conversation_create(owner=user, title="Mine to share")
    ask(mine, "hello")
    share, token = share_services.share_create(user=user, conversation_id=mine.pk)
    theirs = conversation_services.conversation_create(owner=other_user, title="Theirs")
    ask(theirs, "hi")
    _, their_token = share_services.share_create(user=other_user, conversation_id=theirs.pk)
    client.force_login(user)
    html = client.get(reverse("preferences")).content.decode()
    assert "Mine to share" in html and reverse("share-page", args=[token]) in html and "Theirs" not in html
    assert client.post(reverse("share-revoke", args=[their_token])).status_code == 404, "not theirs to revoke"
    assert client.post(reverse("share-revoke", args=[token])).status_code == 302
    assert client.get(reverse("share-page", args=[token])).status_code == 404
    assert client.get(reverse("share-page", args=[their_token])).status_code == 200
