"""Issue 33, branch tools no chat app has: fork a conversation at any answer (P3: nothing copied; new nodes of
either never appear in the other) and diff the contexts of two calls (where their paths part, from the one
assembly, T5)."""

from __future__ import annotations

import pytest

from conversations import services
from conversations.models import Conversation, Node
from conversations.turns.detached import run_here
from conversations.turns.start import turn_edit
from tests.conversations.helpers import ask, head

pytestmark = pytest.mark.django_db


def _nodes(api, cid: int) -> set[int]:
    body = api.get(f"/api/conversations/{cid}/nodes/").json()
    return {n["id"] for n in (body["results"] if isinstance(body, dict) else body)}


def test_issue_33_p3_a_fork_copies_nothing_and_neither_side_sees_the_others_new_turns(api, conversation):
    services.conversation_update(conversation=conversation, instructions="Be brief.")
    ask(conversation, "one")
    ask(conversation, "two")
    middle = head(conversation)
    ask(conversation, "three")
    before = Node.objects.count()

    forked = api.post(f"/api/conversations/{conversation.pk}/fork/", {"node": middle.pk}, format="json")
    assert forked.status_code == 201, forked.content
    fork = Conversation.objects.get(pk=forked.json()["id"])
    assert (fork.head_id, fork.owner_id, fork.instructions) == (middle.pk, conversation.owner_id, "Be brief.")
    assert Node.objects.count() == before, "P3: nothing copied"

    answer = ask(fork, "four, in the fork")[-1].data
    new = Node.objects.get(pk=answer["head"])
    assert new.parent_id == middle.pk and "three" not in answer["answer"], "the fork's path ends at its point"
    assert new.pk not in _nodes(api, conversation.pk) and head(conversation).sent[-1]["text"] == "three"
    ask(conversation, "five, in the source")
    assert head(conversation).pk not in _nodes(api, fork.pk)
    bubbles = [b["content"] for b in api.get(f"/api/conversations/{fork.pk}/bubbles/").json()["results"]
               if b["role"] == "user"]
    assert bubbles == ["one", "two", "four, in the fork"]

    services.conversation_delete(conversation=conversation)  # P3: the fork's path outlives its source
    assert ask(fork, "six")[-1].type == "done" and Node.objects.filter(pk=middle.pk).exists()


def test_issue_33_a_fork_refuses_what_is_not_an_answer_of_this_conversation_and_changes_nothing(
        api, other_api, conversation, other_user):
    ask(conversation, "mine")
    mine = head(conversation)
    theirs = services.conversation_create(owner=other_user)
    ask(theirs, "theirs")
    cases = [(api, conversation.pk, {"node": head(theirs).pk}, 404), (api, conversation.pk, {"node": "x"}, 400),
             (other_api, conversation.pk, {"node": mine.pk}, 404), (api, conversation.pk, {}, 400)]
    for client, cid, body, expected in cases:
        assert client.post(f"/api/conversations/{cid}/fork/", body, format="json").status_code == expected
    assert Conversation.objects.count() == 2


def test_issue_33_t5_the_diff_of_an_edited_branch_says_where_the_two_contexts_part(api, conversation):
    ask(conversation, "shared question")
    asked = ask(conversation, "original question")[-1].data["head"]
    opener = Node.objects.get(pk=asked)
    edited = run_here(turn_edit(user=conversation.owner, conversation_id=conversation.pk, node_id=opener.pk,
                                content="edited question"))[-1].data["head"]

    diff = api.get(f"/api/conversations/{conversation.pk}/diff/", {"a": asked, "b": edited})
    assert diff.status_code == 200, diff.content
    body = diff.json()
    assert body["common"] == 2, "the shared question and its answer"
    assert [m["content"] for m in body["a"]] == ["original question"]
    assert [m["content"] for m in body["b"]] == ["edited question"]
    assert body["answers"]["a"].startswith("echo: original question")
    assert body["answers"]["b"].startswith("echo: edited question")
    same = api.get(f"/api/conversations/{conversation.pk}/diff/", {"a": asked, "b": asked}).json()
    assert same["a"] == same["b"] == [] and same["common"] == 3
    assert api.get(f"/api/conversations/{conversation.pk}/diff/", {"a": asked}).status_code == 400
    assert api.get(f"/api/conversations/{conversation.pk}/diff/", {"a": asked, "b": 10**9}).status_code == 404
    # the schema allows any id below 2**63 (a bigint): a large one is no node here, not bad input
    assert api.get(f"/api/conversations/{conversation.pk}/diff/", {"a": asked, "b": 2**63 - 1}).status_code == 404
    assert api.get(f"/api/conversations/{conversation.pk}/diff/", {"a": asked, "b": 2**63}).status_code == 400


def test_issue_33_fork_from_here_on_an_answer_opens_the_new_conversation(page, conversation):
    from django.urls import reverse

    ask(conversation, "one")
    first = head(conversation)
    ask(conversation, "two")
    html = page.get(reverse("chat-conversation", args=[conversation.pk])).content.decode()
    assert html.count(">Fork from here</button>") == 2 and f'name="node" value="{first.pk}"' in html
    response = page.post(reverse("chat-fork", args=[conversation.pk]), {"node": first.pk})
    fork = Conversation.objects.exclude(pk=conversation.pk).get()
    assert response.status_code == 302 and response.url == reverse("chat-conversation", args=[fork.pk])
    assert fork.head_id == first.pk and head(conversation).sent[-1]["text"] == "two"
    shown = page.get(response.url).content.decode()
    assert "Forked" in shown and "one" in shown and "echo: two" not in shown


def test_issue_33_the_compare_page_shows_where_an_edited_questions_context_parts(page, conversation):
    from django.urls import reverse

    ask(conversation, "shared question")
    asked = ask(conversation, "original question")[-1].data["head"]
    edited = run_here(turn_edit(user=conversation.owner, conversation_id=conversation.pk, node_id=asked,
                                content="edited question"))[-1].data["head"]
    html = page.get(reverse("chat-compare", args=[conversation.pk]), {"a": asked, "b": edited}).content.decode()
    assert "both calls were sent the same 2 messages, then" in html
    left, right = html.split("call's own messages")[1:3]
    assert "<pre>original question</pre>" in left and "<pre>edited question</pre>" in right


def test_issue_33_x2_a_fork_stays_in_its_sources_project(api, conversation):
    project = api.post("/api/projects/", {"name": "Launch", "instructions": "We launch in June."},
                       format="json").json()
    assert api.patch(f"/api/conversations/{conversation.pk}/", {"project": project["id"]},
                     format="json").status_code == 200
    ask(conversation, "when?")
    forked = api.post(f"/api/conversations/{conversation.pk}/fork/", {"node": head(conversation).pk}, format="json")
    assert forked.status_code == 201 and forked.json()["project"] == project["id"]
    answer = ask(Conversation.objects.get(pk=forked.json()["id"]), "and in the fork?")[-1].data
    assert "June" in Node.objects.get(pk=answer["head"]).instructions, "the project's instructions go on"
