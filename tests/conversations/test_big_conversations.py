"""Big conversations and big tables (issue 13): `/bubbles/` and `/nodes/` a page at a time, with cursors that turns
added meanwhile neither shift nor repeat; branch places (T8) that cost a page, not the history or the table;
exports that stream; the chat page loading earlier messages a page at a time; and no request holding more than a
few MB, whatever the conversation's size."""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
import tracemalloc

import pytest
import requests
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from rest_framework.authtoken.models import Token
from rest_framework.serializers import Serializer
from selenium.webdriver.common.by import By

from conversations import items as it
from conversations import services
from conversations.apis.serializers import BubbleOut
from conversations.apis.transfer import _from_a_thread
from conversations.jobs.recount import recount
from conversations.models import Bubble, Conversation, Node
from conversations.screen import branch_infos, latest_bubbles, path_bubbles
from conversations.selectors import conversation_nodes, screen_history
from conversations.transfer import arbor_tree
from conversations.transfer.plan import _allocate_ids
from conversations.turns.detached import run_here
from conversations.turns.start import turn_compact, turn_edit
from tests.conversations.helpers import ask, head
from tests.conversations.test_transfer import _normalised, _rich_tree
from tests.support.browser import screenshot, sign_in, wait
from tests.test_api_schema_contract import _validate

pytestmark = pytest.mark.django_db

MIB = 2**20
MEMORY_BOUND = 20 * MIB  # issue 13: what one request may hold, whatever the conversation's size


def bulk_conversation(owner, *, turns: int, branch_every: int = 10, compact_every: int = 0,
                      title: str = "big") -> Conversation:
    """A conversation of `turns` turn nodes written in bulk, as the importer writes them (seconds for 10,000): a
    chain where every `branch_every`-th question is an edit (a sibling of the one before), a compaction root every
    `compact_every` turns (C2, C3), two bubbles a turn, every node counted for its model as an import counts it
    (C1); the head at the end."""
    conversation = services.conversation_create(owner=owner, title=title)
    roots = (turns - 1) // compact_every if compact_every else 0
    ids = _allocate_ids(turns + roots)
    nodes, bubbles = [], []
    tip = above = None  # the path's last node and its parent
    for k in range(turns):
        if compact_every and k and k % compact_every == 0:
            root = Node(id=next(ids), conversation=conversation, kind=Node.Kind.COMPACTION,
                        status=Node.Status.SUCCEEDED, compacted_from_id=tip, sent=[it.system(f"summary up to {k}")])
            nodes.append(root)
            tip, above = root.id, None
        edit = bool(branch_every) and k % branch_every == branch_every // 2 and above is not None
        node = Node(id=next(ids), parent_id=above if edit else tip, conversation=conversation,
                    status=Node.Status.SUCCEEDED, sent=[it.user(f"question {k}")],
                    received=[it.text(f"echo: question {k} " + "lorem ipsum " * 15)], provider="arbor",
                    model="arbor/echo")
        nodes.append(node)
        bubbles += [Bubble(conversation=conversation, node_id=node.id, role="user", content=f"question {k}"),
                    Bubble(conversation=conversation, node_id=node.id, role="assistant",
                           content=f"echo: question {k} " + "lorem ipsum " * 15)]
        if not edit:
            above = tip
        tip = node.id
    Node.objects.bulk_create(nodes, batch_size=1000)
    recount(conversation, model="arbor/echo")
    Bubble.objects.bulk_create(bubbles, batch_size=2000)
    services.head_move(conversation=conversation, to=tip)
    conversation.refresh_from_db()
    return conversation


def _url(conversation: Conversation, name: str) -> str:
    return f"/api/conversations/{conversation.pk}/{name}/"


def read_pages(api, url: str, *, link: str = "next") -> list[dict]:
    """Every page from `url` on, following `link`."""
    pages = []
    while url:
        response = api.get(url)
        assert response.status_code == 200, response.content
        pages.append(response.json())
        url = pages[-1][link]
    return pages


def _whole_path(conversation: Conversation) -> list[dict]:
    conversation.refresh_from_db()
    return BubbleOut(path_bubbles(conversation=conversation), many=True).data


def _results(pages: list[dict]) -> list[dict]:
    return [entry for page in pages for entry in page["results"]]


def _questions(entries: list[dict]) -> list[str]:
    return [b["content"] for b in entries if b["role"] == "user"]


# --- /bubbles/ ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_bubble_pages_together_are_the_whole_path_and_read_back_with_previous_t8(api, conversation, settings, size):
    """Issue 13, T8, T10, C3: following `next` from the first page gives exactly the path's bubbles in order (branch
    places, compaction markers, editability and the tool rounds of a turn cut by a page's edge included), each once;
    following `previous` from the last page gives the same pages back."""
    _rich_tree(conversation, settings)
    before = Node.objects.count()
    ask(conversation, '#tool sql_query {"sql": "select 1 as a"} #tool sql_query {"sql": "select 2 as b"}')
    assert Node.objects.count() - before == 3, "a turn of three calls: a page may begin at its last"
    ask(conversation, "last question")
    settings.ARBOR_PAGE_NODES = size
    pages = read_pages(api, _url(conversation, "bubbles"))
    assert len(pages) > 1 and pages[0]["previous"] is None and pages[-1]["next"] is None
    assert _results(pages) == _whole_path(conversation)
    assert any(b["role"] == "compaction" for b in _results(pages)) and any(b["role"] == "tool" for b in _results(pages))
    back = read_pages(api, pages[-1]["previous"], link="previous")
    assert [page["results"] for page in reversed(back)] == [page["results"] for page in pages[:-1]]


def test_a_bubble_is_shown_as_drf_would_show_it(conversation, settings):
    """Issue 13: BubbleOut builds its answer directly (a page holds hundreds); it is what DRF's own walk through the
    declared fields gives, for every kind of bubble (branch place or none, compaction marker, tool data)."""
    _rich_tree(conversation, settings)
    conversation.refresh_from_db()
    views = path_bubbles(conversation=conversation)
    generic = Serializer.to_representation
    assert [BubbleOut(view).data for view in views] == [generic(BubbleOut(), view) for view in views]
    assert {v.bubble.role for v in views} >= {"user", "assistant", "tool", "error", "compaction"}


def test_a_short_conversation_is_one_page(api, conversation):
    """Issue 13: the default page (ARBOR_PAGE_NODES, 200 nodes) holds a short conversation whole."""
    for n in range(3):
        ask(conversation, f"question {n}")
    page = api.get(_url(conversation, "bubbles")).json()
    assert page["next"] is None and page["previous"] is None and len(page["results"]) == 6


def test_turns_added_while_a_client_pages_come_at_the_end_and_shift_nothing(api, conversation, settings):
    """Issue 13: a cursor names the node a page ended at, never an offset: turns added while a client reads move
    no page; they come at the end; a `next` link read twice gives the same page."""
    settings.ARBOR_PAGE_NODES = 2
    for n in range(6):
        ask(conversation, f"question {n}")
    first = api.get(_url(conversation, "bubbles")).json()
    second = api.get(first["next"]).json()
    ask(conversation, "added 1")
    ask(conversation, "added 2")
    assert api.get(first["next"]).json()["results"] == second["results"]
    entries = first["results"] + _results(read_pages(api, first["next"]))
    assert _questions(entries) == [*(f"question {n}" for n in range(6)), "added 1", "added 2"]
    assert entries == _whole_path(conversation)


def test_pages_finish_the_path_they_began_when_the_head_moves_to_another_branch_t7_t8(api, user, conversation,
                                                                                      settings):
    """Issue 13, T7: an edit in the middle of paging moves the head to a new branch; the pages under way finish the
    path they began (nothing twice, nothing from the other branch), and a new first page shows the new branch."""
    settings.ARBOR_PAGE_NODES = 2
    for n in range(6):
        ask(conversation, f"question {n}")
    before = _whole_path(conversation)
    first = api.get(_url(conversation, "bubbles")).json()
    edited = Node.objects.get(conversation=conversation, sent=[it.user("question 1")])
    run_here(turn_edit(user=user, conversation_id=conversation.pk, node_id=edited.pk, content="question 1, edited"))
    assert first["results"] + _results(read_pages(api, first["next"])) == before
    assert _questions(_results(read_pages(api, _url(conversation, "bubbles")))) == ["question 0", "question 1, edited"]


def test_a_cleared_conversation_pages_nothing_whatever_the_cursor_t11(api, conversation, settings):
    """T11, issue 13: after a clear nothing is shown, also to a client holding a cursor from before."""
    settings.ARBOR_PAGE_NODES = 1
    for n in range(3):
        ask(conversation, f"question {n}")
    first = api.get(_url(conversation, "bubbles")).json()
    second = api.get(first["next"]).json()
    services.conversation_clear(conversation=conversation)
    for url in (first["next"], second["previous"]):
        assert api.get(url).json() == {"next": None, "previous": None, "results": []}


def test_a_cursor_is_good_for_its_own_list_of_its_own_conversation_only(api, user, conversation, settings):
    """Issue 13: cursors are signed for their list and conversation; one changed, or taken to another list or
    conversation, is a 404 (no such page, as DRF's cursor pages answer) and shows nothing: a cursor names a node to
    walk the history from."""
    settings.ARBOR_PAGE_NODES = 1
    for n in range(2):
        ask(conversation, f"question {n}")
    other = services.conversation_create(owner=user)
    ask(other, "someone else's path")
    link = api.get(_url(conversation, "bubbles")).json()["next"]
    cursor = link.split("cursor=", 1)[1]
    for url in (f"{_url(conversation, 'bubbles')}?cursor={cursor}x", f"{_url(conversation, 'nodes')}?cursor={cursor}",
                f"{_url(other, 'bubbles')}?cursor={cursor}", f"{_url(conversation, 'bubbles')}?cursor=%00"):
        response = api.get(url)
        assert response.status_code == 404 and response.json()["error"]["code"] == "not_found", url
    assert api.get(f"{_url(conversation, 'bubbles')}?cursor=").json()["previous"] is None, "empty: the first page"


# --- /nodes/ --------------------------------------------------------------------------------------------------


def test_node_pages_hold_the_whole_tree_by_id_shared_history_included_p3(api, user, conversation, settings):
    """Issue 13, P3: /nodes/ pages are the conversation's nodes and the shared history on its path, in id order,
    each once; nodes added while a client reads come at the end; `previous` reads back."""
    for n in range(4):
        ask(conversation, f"source {n}")
    shared = Conversation.objects.create(owner=user, model=conversation.model, head=head(conversation))
    ask(shared, "own 1")
    settings.ARBOR_PAGE_NODES = 2
    first = api.get(_url(shared, "nodes")).json()
    ask(shared, "own 2")
    pages = [first, *read_pages(api, first["next"])]
    listed = [n["id"] for n in _results(pages)]
    assert listed == list(conversation_nodes(conversation=shared).values_list("id", flat=True))
    assert len(listed) == 6 and listed == sorted(set(listed))
    assert {n["conversation"] for n in _results(pages)} == {conversation.pk, shared.pk}
    back = read_pages(api, pages[-1]["previous"], link="previous")
    assert [page["results"] for page in reversed(back)] == [page["results"] for page in pages[:-1]]


def test_pages_match_the_schema_and_the_schema_names_the_cursor(api, conversation, settings):
    """Issue 13 (and the schema contract the fuzzer holds the API to): both lists declare the page shape
    (`next`, `previous`, `results`) and their `cursor` parameter, and real pages validate against it."""
    schema = json.loads(api.get("/api/schema/?format=json").content)
    settings.ARBOR_PAGE_NODES = 1
    for n in range(2):
        ask(conversation, f"question {n}")
    for name in ("bubbles", "nodes"):
        operation = schema["paths"][f"/api/conversations/{{conversation_id}}/{name}/"]["get"]
        assert "cursor" in {p["name"] for p in operation["parameters"] if p["in"] == "query"}
        declared = operation["responses"]["200"]["content"]["application/json"]["schema"]
        for page in read_pages(api, _url(conversation, name)):
            _validate(schema, page, declared)


# --- cost: queries and memory ---------------------------------------------------------------------------------


def _queries(call) -> int:
    return _counted(call)[1]


def _counted(call) -> tuple[object, int]:
    """What `call()` returns, and how many queries it made."""
    with CaptureQueriesContext(connection) as captured:
        result = call()
    return result, len(captured.captured_queries)


@pytest.mark.slow
def test_a_page_costs_the_same_queries_whatever_the_conversations_size_t8(api, user, settings):
    """Issue 13, T8: the branch places of a page are read for that page (by its openers' parents), so the queries
    of a /bubbles/ or /nodes/ page, the chat screen and a page's branch places do not grow with the conversation."""
    settings.ARBOR_PAGE_NODES = 50
    settings.ARBOR_SCREEN_NODES = 50
    counts = []
    for turns in (300, 3000):
        conversation = bulk_conversation(user, turns=turns, compact_every=120)
        page = latest_bubbles(conversation=conversation, tip=conversation.head_id, size=50)
        rows = screen_history(conversation.head_id, owner=conversation.owner_id, last=50)
        middle = api.get(_url(conversation, "bubbles")).json()["next"]
        counts.append((
            _queries(lambda c=conversation: api.get(_url(c, "bubbles"))),
            _queries(lambda m=middle: api.get(m)),
            _queries(lambda c=conversation: api.get(_url(c, "nodes"))),
            _queries(lambda c=conversation: api.get(f"/chat/{c.pk}/messages/")),
            _queries(lambda c=conversation, r=rows: branch_infos(conversation=c, path=r[1:], known=r[:1])),
        ))
        assert len(page.views) >= 100
    assert counts[0] == counts[1], counts
    assert max(counts[0][:3]) <= 8 and counts[0][4] <= 2, counts


def _held(read) -> tuple[object, int]:
    """What `read()` returns, and the most memory it held meanwhile (tracemalloc)."""
    tracemalloc.start()
    try:
        result = read()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _exported(api, conversation: Conversation, export_format: str, *, keep: bool = True, into=None) -> list[bytes]:
    """The export's body in the parts it came in (with `keep` False, only their sizes, each part written `into` a
    file if given: a client writing a file)."""
    response = api.get(f"{_url(conversation, 'export')}?format={export_format}")
    assert response.status_code == 200 and response.streaming, "issue 13: an export streams its body"
    parts = []
    for part in response.streaming_content:
        if into is not None:
            into.write(part)
        parts.append(part if keep else str(len(part)).encode())
    return parts


@pytest.mark.slow
def test_a_10000_node_conversation_is_read_page_by_page_and_exported_in_bounded_memory(api, user):
    """Issue 13: a 10,000-node conversation (an edit every 10 turns, a compaction every 2,500): every page of
    /bubbles/ and /nodes/ and every export is one request holding under 20 MB (tracemalloc), with a page's queries
    as few as for a small conversation; the pages hold the whole path and tree, each entry once."""
    small = bulk_conversation(user, turns=200, compact_every=100, title="small")
    conversation = bulk_conversation(user, turns=10_000, compact_every=2_500)
    for name in ("bubbles", "nodes"):
        small_queries = _queries(lambda n=name: api.get(_url(small, n)))
        url, entries, worst = _url(conversation, name), [], 0
        while url:
            # One request measured both ways (the few queries' text it keeps is bytes against the bound's 20 MB).
            (response, queries), held = _held(lambda u=url: _counted(lambda: api.get(u)))
            assert response.status_code == 200 and held < MEMORY_BOUND, (name, url, held)
            assert queries <= small_queries, (name, url)
            worst = max(worst, held)
            entries += response.json()["results"]
            url = response.json()["next"]
        keys = [(e.get("node"), e["id"], e.get("role")) for e in entries]
        assert len(keys) == len(set(keys)), f"/{name}/: an entry twice"
        print(f"/{name}/: {len(entries)} entries, the largest request held {worst / MIB:.1f} MiB")
        if name == "bubbles":
            assert _questions(entries)[-1] == "question 9999" and len(_questions(entries)) == 9_000
            assert sum(b["role"] == "compaction" for b in entries) == 3
        else:
            assert len(entries) == Node.objects.filter(conversation=conversation).count() == 10_003
    for export_format in ("md", "json", "chatgpt"):
        with tempfile.TemporaryFile() as kept:  # one export, written out as a client writes a file
            sizes, held = _held(lambda f=export_format, k=kept: _exported(api, conversation, f, keep=False, into=k))
            kept.seek(0)
            text = kept.read()
        print(f"export {export_format}: {len(text) / MIB:.1f} MiB in {len(sizes)} parts, held {held / MIB:.1f} MiB")
        assert held < MEMORY_BOUND and len(sizes) > 10 and sum(map(int, sizes)) == len(text), export_format
        if export_format == "json":
            assert len(json.loads(text)["nodes"]) == 10_003
        elif export_format == "chatgpt":
            (entry,) = json.loads(text)
            assert entry["mapping"][entry["current_node"]]["message"]["metadata"]["arbor_node"] == conversation.head_id


# --- exports ----------------------------------------------------------------------------------------------------


def test_a_streamed_export_of_a_compacted_branching_tree_imports_back_losslessly(api, user, settings):
    """Issue 13 (and issue 7's round trip): the tree JSON, now made a chunk of nodes at a time, imports back to the
    same tree, across many chunks, compaction roots and branches."""
    conversation = bulk_conversation(user, turns=450, compact_every=150)
    exported = b"".join(api.get(f"{_url(conversation, 'export')}?format=json").streaming_content)
    response = api.post("/api/conversations/import/", data=exported, content_type="application/json")
    assert response.status_code == 201, response.content
    copy = Conversation.objects.get(pk=response.json()["conversations"][0]["id"])
    again = b"".join(api.get(f"{_url(copy, 'export')}?format=json").streaming_content)
    assert _normalised(json.loads(again)) == _normalised(json.loads(exported))
    assert _results(read_pages(api, _url(copy, "bubbles"))) != [] and copy.head_id is not None


def test_a_shared_history_is_exported_whole_and_imports_back_p3_c3(api, user, conversation, settings):
    """Issue 13, P3, C3: a conversation whose head began on another's compacted path exports its own nodes and the
    shared history its paths need (the root, its summarising call, the original path behind it), found by walking
    up from where its tree leaves its own nodes; the import shows the same path."""
    settings.ARBOR_COMPACTION_KEEP_TURNS = 1
    for n in range(3):
        ask(conversation, f"source {n}")
    turn_compact(user=user, conversation_id=conversation.pk)
    ask(conversation, "after the compaction")
    shared = Conversation.objects.create(owner=user, model=conversation.model, head=head(conversation))
    ask(shared, "my own question")
    document = json.loads(b"".join(_exported(api, shared, "json")))
    exported = {n["id"] for n in document["nodes"]}
    root = Node.objects.get(conversation=conversation, kind="compaction", parent__isnull=True)
    assert {root.pk, root.summary_call_id, root.compacted_from_id} <= exported
    assert exported == {n.pk for n in Node.objects.filter(conversation__in=[conversation, shared])} - {
        n.pk for n in Node.objects.filter(conversation=conversation, kind="title")}
    response = api.post("/api/conversations/import/", data=json.dumps(document), content_type="application/json")
    copy = Conversation.objects.get(pk=response.json()["conversations"][0]["id"])
    shown = [(b["role"], b["content"]) for b in _results(read_pages(api, _url(copy, "bubbles")))]
    assert shown == [(b["role"], b["content"]) for b in _results(read_pages(api, _url(shared, "bubbles")))]


async def test_under_asgi_the_body_is_made_in_a_thread_of_its_own_which_stops_when_the_client_leaves():
    """Issue 13: Django would read a synchronous body whole before sending it under ASGI; the export's body is made
    in a thread of its own and handed over a few parts at a time. A client that leaves stops that thread, and an
    error while making it reaches the server where the body is being sent."""
    made_in: set[str] = set()

    def produce():
        for n in range(50):
            made_in.add(threading.current_thread().name)
            yield f"{n},"

    assert b"".join([part async for part in _from_a_thread(produce)]) == "".join(f"{n}," for n in range(50)).encode()
    assert made_in == {"arbor-export"}
    stopped, made = threading.Event(), []

    def endless():
        try:
            while True:
                made.append(1)
                yield "x" * 1000
        finally:
            stopped.set()

    body = _from_a_thread(endless)
    assert await anext(body) == b"x" * 1000
    await body.aclose()
    assert await asyncio.to_thread(stopped.wait, 10), "the thread ends when its reader leaves"
    assert len(made) < 20, "it made no more than a few parts ahead"

    def broken():
        yield "first"
        raise RuntimeError("the database went away")

    body = _from_a_thread(broken)
    assert await anext(body) == b"first"
    with pytest.raises(RuntimeError, match="went away"):
        await anext(body)


@pytest.mark.django_db(transaction=True)
def test_an_export_is_one_snapshot_on_postgresql(user):
    """Issue 13: an export reads its tree in many queries; on PostgreSQL they share one repeatable-read snapshot,
    so a call that completes while the export streams (its node read as pending, its bubbles written after) is in
    it as it was when the export began, never half (SQLite has one writer: there an export reads as it goes)."""
    if connection.vendor != "postgresql":
        pytest.skip("a snapshot across queries is PostgreSQL's; SQLite exports read as they go")
    conversation = bulk_conversation(user, turns=600)
    pending = Node.objects.create(parent_id=conversation.head_id, conversation=conversation,
                                  sent=[it.user("a question under way")])  # T3: pending, the head not on it yet
    parts = arbor_tree.tree_chunks(conversation)
    text = ""
    while not text.endswith('"bubbles": '):  # every node is read; the bubbles are not yet
        text += next(parts)

    def complete_meanwhile():
        try:
            Node.objects.filter(pk=pending.pk).update(status="succeeded", received=[it.text("the answer")])
            Bubble.objects.bulk_create([Bubble(conversation=conversation, node=pending, role="user",
                                               content="a question under way"),
                                        Bubble(conversation=conversation, node=pending, role="assistant",
                                               content="the answer")])
        finally:
            connections.close_all()

    writer = threading.Thread(target=complete_meanwhile)
    writer.start()
    writer.join()
    document = json.loads(text + "".join(parts))
    (node,) = [n for n in document["nodes"] if n["id"] == pending.pk]
    assert node["status"] == "pending" and not [b for b in document["bubbles"] if b["node"] == pending.pk]
    assert Bubble.objects.filter(node=pending).count() == 2


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_an_export_streams_through_the_asgi_server(asgi_server, user):
    """Issue 13: under ASGI (Daphne) the export goes out in parts as it is made, from a thread of its own (Django
    would read a synchronous body whole first), and what arrives is the whole tree."""
    conversation = bulk_conversation(user, turns=1_500, compact_every=500)
    token, _ = Token.objects.get_or_create(user=user)
    with requests.get(f"{asgi_server.url}{_url(conversation, 'export')}?format=json", stream=True, timeout=60,
                      headers={"Authorization": f"Token {token.key}"}) as response:
        assert response.status_code == 200 and "Content-Length" not in response.headers
        parts = list(response.iter_content(chunk_size=None))
    document = json.loads(b"".join(parts))
    assert len(parts) > 3 and len(document["nodes"]) == 1_502
    assert document["conversation"]["head"] == conversation.head_id


# --- the chat page ----------------------------------------------------------------------------------------------


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_scrolling_up_loads_the_earlier_messages_a_page_at_a_time(browser, asgi_server, user):
    """Issue 13: a 1,000-turn chat opens on its latest part (ARBOR_SCREEN_NODES, 400 nodes) at the bottom;
    scrolling up to the top loads the page before (ARBOR_PAGE_NODES, 200) above it, again and again, until the
    first question: every question once, in order."""
    conversation = bulk_conversation(user, turns=1_000, branch_every=0)
    sign_in(browser, asgi_server, user)
    browser.get(f"{asgi_server.url}/chat/{conversation.pk}/")

    def questions(driver) -> list[str]:
        return driver.execute_script(
            "return [...document.querySelectorAll('#message-list article.msg.user .body')].map(e => e.textContent)")

    wait(browser).until(lambda d: questions(d)[-1:] == ["question 999"])
    opened = questions(browser)
    assert opened[0] == "question 600" and len(opened) == 400
    assert browser.execute_script("const b = document.getElementById('messages');"
                                  "return b.scrollTop + b.clientHeight >= b.scrollHeight - 2"), "opens at the bottom"
    for _ in range(10):
        if not browser.find_elements(By.CSS_SELECTOR, "[data-earlier]"):
            break
        shown = len(questions(browser))
        browser.execute_script("document.getElementById('messages').scrollTop = 0")
        wait(browser).until(lambda d, n=shown: len(questions(d)) > n or not d.find_elements(
            By.CSS_SELECTOR, "[data-earlier]"))
    screenshot(browser, "chat-earlier-messages")
    assert questions(browser) == [f"question {k}" for k in range(1_000)]
