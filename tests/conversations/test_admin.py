"""The staff tree explorer in the admin: read-only pages, bounded queries, and the one head move (T2, T9, C3)."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from conversations import services
from conversations.context import assemble
from conversations.models import Conversation, Node
from conversations.selectors import node_path
from conversations.turns.start import turn_ask, turn_compact
from tests.conversations.helpers import ask, give_back, head, owner_of
from tests.support.trees import TreeBuilder

pytestmark = pytest.mark.django_db


def tree_url(conversation):
    return reverse("admin:conversations_conversation_change", args=[conversation.pk])


def node_url(node_id):
    return reverse("admin:conversations_node_change", args=[node_id])


def move_url(conversation):
    return reverse("admin:conversations_conversation_move_head", args=[conversation.pk])


@pytest.fixture
def tree(conversation):
    """q1 → q2 → failed (#fail, F1 head); a playbook node under the head; then a compaction of it."""
    conversation.instructions = "be brief"
    conversation.save()
    ask(conversation, "first question")
    ask(conversation, "second question")
    ask(conversation, "#fail please")
    failed = head(conversation)
    assert failed.status == "failed"
    tree = TreeBuilder(conversation)
    playbook = tree.node(kind="playbook", parent=failed, sent=[{"type": "user", "text": "draft a playbook"}],
                         received=[{"type": "text", "text": "{}"}])
    compaction = tree.move_head(tree.compaction(of=failed, summary="summary"))
    ask(conversation, "after compaction")
    conversation.refresh_from_db()
    return {"conversation": conversation, "failed": failed, "playbook": playbook, "compaction": compaction,
            "head": conversation.head}


def test_changelist_shows_counts_tokens_and_turn_state(admin_client, tree):
    conversation = tree["conversation"]
    response = admin_client.get(reverse("admin:conversations_conversation_changelist"))
    assert response.status_code == 200
    row = response.context["cl"].result_list[0]
    nodes = list(Node.objects.filter(conversation=conversation))
    assert row.node_total == len(nodes) == 6
    # leaves: the playbook node and the turn after compaction (the failed node has the playbook below it)
    assert row.leaf_total == 2
    assert row.token_total == sum(n.usage.get("total_tokens", 0) for n in nodes) > 0
    assert b"ada" in response.content


def test_changelist_search_and_filters(admin_client, tree, django_user_model):
    url = reverse("admin:conversations_conversation_changelist")
    assert admin_client.get(url, {"q": "ada"}).context["cl"].result_count == 1
    assert admin_client.get(url, {"q": "nobody"}).context["cl"].result_count == 0
    assert admin_client.get(url, {"model": tree["conversation"].model}).context["cl"].result_count == 1


def test_tree_page_shows_badges_path_and_compaction_links(admin_client, tree):
    conversation, failed, compaction = tree["conversation"], tree["failed"], tree["compaction"]
    response = admin_client.get(tree_url(conversation))
    assert response.status_code == 200
    html = response.content.decode()
    for badge in ("kind-turn", "kind-playbook", "kind-compaction", "status-succeeded", "status-failed",
                  "provider_error"):
        assert badge in html
    rows = {r.node.pk: r for r in response.context["rows"]}
    assert len(rows) == Node.objects.filter(conversation=conversation).count()
    path_ids = [p.id for p in node_path(conversation.head_id, owner=conversation.owner_id)]
    assert path_ids == [compaction.pk, conversation.head_id]
    assert {pk for pk, r in rows.items() if r.on_path} == set(path_ids)
    assert f'id="node-{conversation.head_id}" class="on-path is-head"' in html
    assert f'id="node-{compaction.pk}" class="on-path"' in html
    assert f'id="node-{failed.pk}" class=""' in html
    # C3 both ways: the compaction links to its original, the original says what it was compacted into
    assert f'href="{node_url(failed.pk)}">original #{failed.pk}' in html
    assert f'href="{node_url(compaction.pk)}">compacted into #{compaction.pk}' in html
    assert "first question" in html and "Move head here" in html


def test_per_branch_totals_sum_root_to_tip(admin_client, tree):
    response = admin_client.get(tree_url(tree["conversation"]))
    branches = {b["tip"].pk: b for b in response.context["branches"]}
    playbook = tree["playbook"]
    expected = sum(Node.objects.get(pk=p.id).usage.get("total_tokens", 0) for p in
                   node_path(playbook.pk, owner=playbook.owner_id))
    assert branches[playbook.pk]["tokens"] == expected > 0
    assert branches[playbook.pk]["nodes"] == 4
    head = tree["head"]
    assert branches[head.pk]["tokens"] == head.usage["total_tokens"]
    assert branches[head.pk]["on_path"]


def test_node_page_shows_json_links_path_and_context(admin_client, tree):
    failed, compaction = tree["failed"], tree["compaction"]
    response = admin_client.get(node_url(failed.pk))
    assert response.status_code == 200
    html = response.content.decode()
    path = node_path(failed.pk, owner=owner_of(failed.pk))
    assert len(path) == 3
    for p in path[:-1]:
        assert f'href="{node_url(p.id)}">#{p.id}' in html
    assert f'class="parent" href="{node_url(failed.parent_id)}"' in html
    assert f'class="child" href="{node_url(tree["playbook"].pk)}"' in html
    assert f'href="{node_url(compaction.pk)}">compacted into #{compaction.pk}' in html
    context = assemble(node_path(failed.parent_id, owner=failed.owner_id), failed.sent, instructions="be brief",
                       provider=failed.provider)
    assert response.context["context_json"] == json.dumps(context, indent=2, ensure_ascii=False)
    assert context[0] == {"role": "system", "content": "be brief"} and "#fail please" in html
    assert "failed" in html and "provider_error" in html
    page = admin_client.get(node_url(compaction.pk)).content.decode()
    assert f'class="compacted-from" href="{node_url(failed.pk)}"' in page
    assert "&quot;summary&quot;" in page  # the sent items as pretty JSON


def test_pages_are_read_only(admin_client, tree):
    node = tree["head"]
    assert admin_client.post(node_url(node.pk), {"status": "failed"}).status_code == 405
    assert admin_client.post(tree_url(tree["conversation"]), {"title": "x"}).status_code == 405
    assert admin_client.get(reverse("admin:conversations_node_add")).status_code == 403
    assert admin_client.get(reverse("admin:conversations_conversation_add")).status_code == 403
    assert admin_client.get(reverse("admin:conversations_node_delete", args=[node.pk])).status_code == 403


def test_a_view_only_staff_user_can_open_the_pages_but_not_move_the_head(client, django_user_model, tree):
    staff = django_user_model.objects.create_user(username="viewer", password="pw-view-12345", is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(codename__in=["view_conversation", "view_node"]))
    client.force_login(staff)
    conversation = tree["conversation"]
    assert client.get(reverse("admin:conversations_conversation_changelist")).status_code == 200
    page = client.get(tree_url(conversation))
    assert page.status_code == 200 and "Move head here" not in page.content.decode()
    assert client.get(node_url(tree["failed"].pk)).status_code == 200
    assert client.get(reverse("admin:conversations_node_changelist")).status_code == 200
    before = conversation.head_id
    assert client.post(move_url(conversation), {"node": tree["failed"].pk}).status_code == 403
    conversation.refresh_from_db()
    assert conversation.head_id == before


def test_move_head_here_moves_the_head(admin_client, tree):
    conversation, failed = tree["conversation"], tree["failed"]
    response = admin_client.post(move_url(conversation), {"node": failed.pk}, follow=True)
    assert response.status_code == 200
    assert f"The head moved to node #{failed.pk}" in response.content.decode()
    conversation.refresh_from_db()
    assert conversation.head_id == failed.pk
    # a playbook node is no place for a head (P2): refused without moving
    response = admin_client.post(move_url(conversation), {"node": tree["playbook"].pk}, follow=True)
    assert "the head may rest on" in response.content.decode()
    conversation.refresh_from_db()
    assert conversation.head_id == failed.pk
    assert admin_client.get(move_url(conversation)).status_code == 405


def test_move_head_here_is_refused_while_a_turn_runs(admin_client, tree):
    """T9: the admin moves the head only through head_move, which a running turn's lock refuses."""
    conversation, failed = tree["conversation"], tree["failed"]
    before = conversation.head_id
    turn = turn_ask(user=conversation.owner, conversation_id=conversation.pk, content="x")
    try:
        listing = admin_client.get(reverse("admin:conversations_conversation_changelist"))
        assert listing.context["cl"].result_list[0].turn_running
        response = admin_client.post(move_url(conversation), {"node": failed.pk}, follow=True)
        assert response.status_code == 200
        assert "Refused: a turn is running on this conversation" in response.content.decode()
        conversation.refresh_from_db()
        assert conversation.head_id == before
    finally:
        give_back(turn)
    admin_client.post(move_url(conversation), {"node": failed.pk})
    conversation.refresh_from_db()
    assert conversation.head_id == failed.pk


def test_move_head_needs_csrf(django_user_model, tree):
    admin = django_user_model.objects.create_superuser(username="root", password="pw-root-12345")
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(admin)
    assert strict.post(move_url(tree["conversation"]), {"node": tree["failed"].pk}).status_code == 403


def _grow(user, turns_count, index):
    conversation = services.conversation_create(owner=user, title=f"c{index}")
    for i in range(turns_count):
        ask(conversation, f"q{i}")
    conversation.refresh_from_db()
    return conversation


def _count(client, url):
    with CaptureQueriesContext(connection) as queries:
        assert client.get(url).status_code == 200
    return len(queries)


@pytest.mark.slow
def test_query_counts_do_not_grow_with_the_tree_or_the_list(admin_client, user, django_user_model):
    small = _grow(user, 5, 0)
    small_tree = _count(admin_client, tree_url(small))
    small_node = _count(admin_client, node_url(small.head_id))
    listing = reverse("admin:conversations_conversation_changelist")
    small_list = _count(admin_client, listing)

    large = _grow(user, 50, 1)
    for i in range(2, 12):  # more rows in the list, more owners for the filter
        owner = django_user_model.objects.create_user(username=f"u{i}", password="pw-12345678")
        _grow(owner, 1, i)
    assert _count(admin_client, tree_url(large)) == small_tree
    assert _count(admin_client, node_url(large.head_id)) == small_node
    assert _count(admin_client, listing) == small_list
    assert small_tree <= 8 and small_node <= 8 and small_list <= 8
    print(f"queries: changelist={small_list} tree={small_tree} node={small_node}")


def test_a_5000_node_chain_renders_without_recursion(admin_client, conversation):
    """The tree is a flat list built by an iterative walk: depth never reaches Python's recursion limit."""
    start = 1_000_000
    Node.objects.bulk_create([
        Node(id=start + i, parent_id=start + i - 1 if i else None, conversation=conversation, status="succeeded",
             sent=[{"type": "user", "text": f"q{i}"}], received=[{"type": "text", "text": f"a{i}"}],
             usage={"total_tokens": 2})
        for i in range(5000)
    ])
    Conversation.objects.filter(pk=conversation.pk).update(head_id=start + 4999)
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(tree_url(conversation))
    assert response.status_code == 200
    assert len(queries) <= 8
    rows = response.context["rows"]
    assert len(rows) == 5000 and all(r.on_path for r in rows) and rows[-1].is_head
    assert response.content.decode().count('<tr id="node-') == 5000  # rendered in Python, one string
    assert response.context["branches"][0]["tokens"] == 10_000


def test_tree_rows_escape_what_people_typed(admin_client, conversation):
    ask(conversation, '<script>alert("x")</script> & more')
    ask(conversation, "second")
    html = admin_client.get(tree_url(conversation)).content.decode()
    assert "<script>alert" not in html
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; more" in html
    # one form, one CSRF token for every "Move head here" button
    assert html.count('form="arbor-move-head"') == 1 and html.count('id="arbor-move-head"') == 1


def test_cost_is_summed_per_branch_and_per_conversation(admin_client, tree):
    """Usage's cost_usd (recorded for priced models) adds up root to tip and over the conversation."""
    path_ids = [p.id for p in node_path(tree["playbook"].pk, owner=owner_of(tree["playbook"].pk))]
    for node_id in path_ids[:2]:
        node = Node.objects.get(pk=node_id)
        Node.objects.filter(pk=node_id).update(usage={**node.usage, "cost_usd": 0.0125})
    branches = {b["tip"].pk: b for b in admin_client.get(tree_url(tree["conversation"])).context["branches"]}
    assert branches[tree["playbook"].pk]["cost"] == "$0.0250"
    changelist = admin_client.get(reverse("admin:conversations_conversation_changelist"))
    assert b"$0.0250" in changelist.content


def test_c2_the_compaction_node_page_links_its_summarising_call_and_back(admin_client, conversation, settings):
    """C2, C3: staff reach the summarising call from the compaction node, and the node from the call."""
    settings.ARBOR_COMPACTION_KEEP_TURNS = 1
    for i in range(3):
        ask(conversation, f"question {i}")
    root = turn_compact(user=conversation.owner, conversation_id=conversation.pk)
    page = admin_client.get(node_url(root.pk)).content.decode()
    assert f'class="summary-call" href="{node_url(root.summary_call_id)}"' in page
    assert f'class="compacted-from" href="{node_url(root.compacted_from_id)}"' in page
    call_page = admin_client.get(node_url(root.summary_call_id)).content.decode()
    assert f'class="summary-for" href="{node_url(root.pk)}"' in call_page
    assert f'class="parent" href="{node_url(root.compacted_from_id)}"' in call_page
    tree_page = admin_client.get(tree_url(conversation)).content.decode()
    assert f'id="node-{root.summary_call_id}"' in tree_page, "the summarising call is in the tree explorer"


def test_issue_16_a_title_call_is_never_a_branch_tip_and_does_not_hide_the_real_one(admin_client, conversation):
    """R4: the title side call hangs below the first answer; the admin listed it as a branch tip (and, being the
    answer's child, hid the answer as the tip). Side calls are never tips; the branch count says 1."""
    from conversations.jobs import worker

    services.conversation_update(conversation=conversation, title="")
    ask(conversation, "first question")
    worker.run_due()
    title_call = Node.objects.get(conversation=conversation, kind=Node.Kind.TITLE)
    answer = head(conversation)
    assert title_call.parent_id == answer.pk
    response = admin_client.get(tree_url(conversation))
    assert [b["tip"].pk for b in response.context["branches"]] == [answer.pk]
    listed = admin_client.get(reverse("admin:conversations_conversation_changelist"))
    (row,) = [c for c in listed.context["cl"].result_list if c.pk == conversation.pk]
    assert row.leaf_total == 1
