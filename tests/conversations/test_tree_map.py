"""The tree map's data (issue 16, API.md `GET /api/conversations/{id}/tree/`, `PATCH /api/nodes/{id}/`): one mark a
turn, branches side by side, compaction and failures marked, side calls left out; labels and one star."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from conversations import services
from conversations.jobs import worker
from conversations.models import Node
from conversations.turns.detached import run_here
from conversations.turns.start import turn_compact, turn_edit, turn_regenerate
from tests.conversations.helpers import ask, head

pytestmark = pytest.mark.django_db


def _tree(api, conversation) -> dict:
    response = api.get(f"/api/conversations/{conversation.pk}/tree/")
    assert response.status_code == 200, response.content
    return response.json()


def test_issue_16_t8_the_tree_has_one_mark_a_turn_with_branches_tool_rounds_folded_and_side_calls_left_out(
        api, user, conversation, settings):
    settings.ARBOR_COMPACTION_KEEP_TURNS = 1
    services.conversation_update(conversation=conversation, title="")
    ask(conversation, "first question")
    worker.run_due()  # a title call hangs below the first answer: no mark
    first = head(conversation)
    run_here(turn_edit(user=user, conversation_id=conversation.pk, node_id=first.pk, content="first, edited"))
    run_here(turn_regenerate(user=user, conversation_id=conversation.pk))
    ask(conversation, '#tool sql_query {"sql": "select count(*) as n from customers"}')  # two nodes, one turn
    ask(conversation, "#fail")
    turn_compact(user=user, conversation_id=conversation.pk)
    ask(conversation, "after the compaction")

    tree = _tree(api, conversation)
    marks = {m["id"]: m for m in tree["nodes"]}
    assert not Node.objects.filter(pk__in=marks, kind=Node.Kind.TITLE).exists()
    roots = [m for m in tree["nodes"] if m["parent"] is None]
    assert [m["snippet"] for m in roots] == ["first question", "first, edited", "first, edited"], "siblings"
    tool_turn = next(m for m in tree["nodes"] if m["snippet"].startswith("#tool sql_query"))
    assert tool_turn["last"] != tool_turn["id"] and Node.objects.get(pk=tool_turn["last"]).parent_id == tool_turn["id"]
    assert not any(m["snippet"] == "Tool results" for m in tree["nodes"]), "the tool round is folded into its turn"
    failed = next(m for m in tree["nodes"] if m["snippet"] == "#fail")
    assert (failed["status"], failed["failure_reason"]) == ("failed", "provider_error")
    compaction = next(m for m in tree["nodes"] if m["kind"] == "compaction")
    assert compaction["parent"] == failed["id"], "a compaction root hangs below the node it compacted (C3)"
    after = marks[tree["head"]]
    assert after["snippet"] == "after the compaction" and after["parent"] == compaction["id"]
    on_path = [m["snippet"] for m in tree["nodes"] if m["on_path"]]
    assert on_path[0] == "first, edited" and on_path[-1] == "after the compaction" and "first question" not in on_path
    for mark in tree["nodes"]:
        assert mark["parent"] is None or mark["parent"] in marks and mark["parent"] < mark["id"]


def test_issue_16_a_branch_is_named_and_starred_and_the_conversation_opens_on_the_star(api, page, user, conversation):
    ask(conversation, "apples")
    apples = head(conversation)
    run_here(turn_edit(user=user, conversation_id=conversation.pk, node_id=apples.pk, content="pears"))
    pears = head(conversation)
    response = api.patch(f"/api/nodes/{apples.pk}/", {"label": "Apple plan", "starred": True}, format="json")
    assert response.status_code == 200 and (response.json()["label"], response.json()["starred"]) == (
        "Apple plan", True)
    assert api.patch(f"/api/nodes/{pears.pk}/", {"starred": True}, format="json").status_code == 200
    assert list(Node.objects.filter(starred=True).values_list("pk", flat=True)) == [pears.pk], "one star"
    api.patch(f"/api/nodes/{apples.pk}/", {"starred": True}, format="json")
    marks = {m["id"]: m for m in _tree(api, conversation)["nodes"]}
    assert (marks[apples.pk]["label"], marks[apples.pk]["starred"], marks[pears.pk]["starred"]) == (
        "Apple plan", True, False)

    conversation.refresh_from_db()
    assert conversation.head_id == pears.pk
    html = page.get(reverse("chat-conversation", args=[conversation.pk])).content.decode()
    conversation.refresh_from_db()
    assert conversation.head_id == apples.pk, "opened on the starred branch"
    assert ">apples</div>" in html and ">pears</div>" not in html
    assert apples.sent == Node.objects.get(pk=apples.pk).sent, "a label changes nothing that was sent"


@pytest.mark.parametrize(("body", "needle"), [
    ({"label": "x" * 41}, "no more than 40 characters"),
    ({"label": "two\nlines"}, "one line of text"),
    ({"label": 7}, "Not a valid string."),
    ({"starred": "yes"}, "Must be a valid boolean."),
])
def test_issue_16_a_bad_mark_is_refused_and_changes_nothing(api, conversation, body, needle):
    ask(conversation, "q")
    node = head(conversation)
    response = api.patch(f"/api/nodes/{node.pk}/", body, format="json")
    assert response.status_code == 400 and needle in json.dumps(response.json()), response.json()
    node.refresh_from_db()
    assert (node.label, node.starred) == ("", False)


def test_issue_16_an_empty_mark_changes_nothing(api, conversation):
    ask(conversation, "q")
    node = head(conversation)
    response = api.patch(f"/api/nodes/{node.pk}/", {}, format="json")
    assert response.status_code == 200 and (response.json()["label"], response.json()["starred"]) == ("", False)


def test_issue_16_someone_elses_tree_and_nodes_are_not_found(api, other_api, conversation):
    ask(conversation, "mine")
    node = head(conversation)
    assert other_api.get(f"/api/conversations/{conversation.pk}/tree/").status_code == 404
    assert other_api.patch(f"/api/nodes/{node.pk}/", {"label": "theirs"}, format="json").status_code == 404
    node.refresh_from_db()
    assert node.label == ""


def test_issue_16_labels_and_the_star_survive_the_tree_export(api, conversation):
    ask(conversation, "q")
    node = head(conversation)
    api.patch(f"/api/nodes/{node.pk}/", {"label": "kept", "starred": True}, format="json")
    document = json.loads(b"".join(api.get(f"/api/conversations/{conversation.pk}/export/",
                                           {"format": "json"}).streaming_content))
    created = api.post("/api/conversations/import/", data=json.dumps(document),
                       content_type="application/json").json()["conversations"][0]
    copy = Node.objects.get(conversation_id=created["id"])
    assert (copy.label, copy.starred) == ("kept", True)


def test_issue_16_a_star_goes_only_where_the_conversation_can_open_and_one_a_file(api, user, conversation):
    """A title call or an overflowed question starred would leave a conversation that cannot open on its star: both
    are refused over the API, and so is a file with such a star or with two stars; nothing changes."""
    services.conversation_update(conversation=conversation, title="")
    ask(conversation, "first")
    worker.run_due()
    ask(conversation, "#overflow")
    for node in (Node.objects.get(kind=Node.Kind.TITLE), Node.objects.get(failure_reason="context_overflow")):
        # A well-formed request the node's state refuses: 409 (the fuzzer's ST202 took a 400 for a schema lie).
        response = api.patch(f"/api/nodes/{node.pk}/", {"starred": True}, format="json")
        assert response.status_code == 409 and response.json()["error"]["code"] == "not_a_branch", response.json()
    assert not Node.objects.filter(starred=True).exists()
    title = Node.objects.get(kind=Node.Kind.TITLE)
    assert api.patch(f"/api/nodes/{title.pk}/", {"label": "x"}, format="json").status_code == 409

    ask(conversation, "second")
    document = json.loads(b"".join(api.get(f"/api/conversations/{conversation.pk}/export/",
                                           {"format": "json"}).streaming_content))
    overflow = next(n for n in document["nodes"] if n["failure_reason"] == "context_overflow")
    turns = [n for n in document["nodes"] if n["kind"] == "turn" and not n["failure_reason"]]
    for starred, needle in (([overflow], "only a turn the conversation can open on is starred"),
                            (turns[:2], "2 nodes are starred; a conversation has one star at most")):
        copy = json.loads(json.dumps(document))
        for node in copy["nodes"]:
            node["starred"] = any(node["id"] == s["id"] for s in starred)
        response = api.post("/api/conversations/import/", data=json.dumps(copy), content_type="application/json")
        assert response.status_code == 400 and needle in response.json()["error"]["message"], response.json()


def test_issue_16_a_page_reloading_itself_keeps_the_head_where_the_person_put_it(page, user, conversation):
    """The star decides where a conversation opens afresh, not where a page of it lands after a rename or a
    no-script ◀ / ▶ (its Referer is the conversation's own page)."""
    ask(conversation, "apples")
    apples = head(conversation)
    run_here(turn_edit(user=user, conversation_id=conversation.pk, node_id=apples.pk, content="pears"))
    pears = head(conversation)
    services.branch_mark(node=apples, starred=True)
    own = reverse("chat-conversation", args=[conversation.pk])
    page.post(reverse("chat-switch", args=[conversation.pk]), {"node": pears.pk}, HTTP_REFERER=f"http://testserver{own}")
    page.get(own, HTTP_REFERER=f"http://testserver{own}")
    conversation.refresh_from_db()
    assert conversation.head_id == pears.pk
    page.get(own, HTTP_REFERER="http://testserver/chat/")
    conversation.refresh_from_db()
    assert conversation.head_id == apples.pk


def test_issue_16_a_turns_label_stays_on_it_as_rounds_are_added_and_clears(api, user, conversation):
    """A turn waiting for an approval is named and starred; the approval adds its result round (a new last node):
    the mark keeps its name and star, and clearing them clears them. A retry (F1) is folded into its turn."""
    from conversations.turns.start import turn_decide, turn_retry

    ask(conversation, '#tool send_email {"to": "a@example.com", "subject": "s", "body": "b"}')
    (mark,) = _tree(api, conversation)["nodes"]
    api.patch(f"/api/nodes/{mark['id']}/", {"label": "Mail", "starred": True}, format="json")
    (call,) = head(conversation).received
    run_here(turn_decide(user=user, conversation_id=conversation.pk, call_id=call["id"], approve=True))
    (after,) = _tree(api, conversation)["nodes"]
    assert after["last"] != mark["last"] and (after["label"], after["starred"]) == ("Mail", True)
    api.patch(f"/api/nodes/{mark['id']}/", {"label": "", "starred": False}, format="json")
    (cleared,) = _tree(api, conversation)["nodes"]
    assert (cleared["label"], cleared["starred"]) == ("", False)

    ask(conversation, "#fail")
    run_here(turn_retry(user=user, conversation_id=conversation.pk))
    marks = _tree(api, conversation)["nodes"]
    assert [m["snippet"] for m in marks] == [mark["snippet"], "#fail"], "the retry is part of its turn"
