"""Issue 34: a person's search does not grow with other people's data, and its results are what they were.

PostgreSQL asks an index of the owner's own words (search's migration 0006: each lexeme keyed by its owner), ranks
the owner's matches before joining the best few, and marks branches by walking each conversation's history only as
far as its hits need. These tests hold the results to the plain query (every match of the words among the owner's
entries, ts_rank, newest first; the head's whole history for the marks) and record the SQL: every statement on the
search table asks by the caller's id. No timing here: `manage.py bench_search_import_worker` prints the figures.
"""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext

from conversations import items as it
from conversations import services
from conversations.jobs import worker
from conversations.models import Bubble, Node
from conversations.selectors import history_ids
from conversations.turns.detached import run_here
from conversations.turns.start import turn_edit
from search.index import index_conversation
from search.query import _terms, _tsquery, on_current_paths, search_bubbles
from search.retrieval import word_hits
from tests.conversations.helpers import ask, head, owner_of

pytestmark = pytest.mark.django_db

postgres_only = pytest.mark.skipif("connection.vendor != 'postgresql'",
                                   reason="the owner's words index is PostgreSQL's")

_PLAIN = """
SELECT b.id, b.node_id, c.id, ts_rank(d.vector, q.query) AS rank
FROM search_bubbledocument d JOIN conversations_bubble b ON b.id = d.bubble_id
JOIN conversations_conversation c ON c.id = b.conversation_id, to_tsquery(%s::regconfig, %s) AS q(query)
WHERE d.owner_id = %s AND d.vector @@ q.query AND c.owner_id = %s
ORDER BY rank DESC, b.id DESC LIMIT %s"""


def _plain(user, query: str, limit: int = 20) -> list[tuple]:
    """What search found before issue 34: the words matched in the owner's entries with no owner's index."""
    with connection.cursor() as cursor:
        cursor.execute(_PLAIN, [settings.ARBOR_SEARCH_CONFIG, _tsquery(_terms(query), match_any=False), user.pk,
                                user.pk, limit])
        return cursor.fetchall()


def _chain(conversation, texts: list[str], *, parent: Node | None = None) -> list[Node]:
    """Nodes one below the other (a question bubble each), the last one not made head."""
    made = []
    for text in texts:
        parent = Node.objects.create(conversation=conversation, parent=parent, kind="turn", status="succeeded",
                                     sent=[it.user(text)], received=[it.text("ok")], provider="arbor",
                                     model="arbor/echo")
        Bubble.objects.create(conversation=conversation, node=parent, role="user", content=text)
        made.append(parent)
    return made


@pytest.fixture
def busy(user, other_user):
    """The caller's conversations with branches, and another person's with the same words (more of them)."""
    mine = services.conversation_create(owner=user, title="mine")
    ask(mine, "revenue in Seoul grew")
    first = head(mine)
    ask(mine, "revenue report for the north region")
    run_here(turn_edit(user=user, conversation_id=mine.pk, node_id=head(mine).pk,
                       content="revenue reports for the south region"))
    ask(mine, "region revenue again")
    again = services.conversation_create(owner=user, title="again")
    ask(again, "revenues and regional growth")
    theirs = services.conversation_create(owner=other_user, title="theirs")
    for n in range(6):
        ask(theirs, f"revenue region report {n}")
    worker.run_due()
    return mine, first


@postgres_only
@pytest.mark.parametrize("query", ["revenue", "reven", "region rev", "reports", "seoul", "nothing-here", "rev reg gr"])
def test_issue_34_hits_and_their_order_are_the_plain_querys(user, busy, query):
    """The owner's words index finds exactly the owner's matches, ranked and ordered as the plain query (ts_rank, then
    the newest bubble), prefixes and all."""
    hits = search_bubbles(user=user, query=query)
    assert [(h.bubble, h.node, h.conversation, pytest.approx(h.rank)) for h in hits] == [
        (b, n, c, pytest.approx(r)) for b, n, c, r in _plain(user, query)]


@postgres_only
def test_issue_34_a_limit_cuts_the_same_ranking(user, busy):
    assert [h.bubble for h in search_bubbles(user=user, query="rev", limit=3)] == [
        row[0] for row in _plain(user, "rev", limit=3)]


@postgres_only
@pytest.mark.parametrize(("text", "query"), [
    ("O'Neil's revenue", "o'neil"), ("back\\slash path", "back\\slash"), ("revenue_report done", "revenue_report"),
    ("Monthly sales of apples", "monthly sal"), ("a phrase of words", "phrase of"), ("x" * 1500 + " tail", "tail"),
])
def test_issue_34_the_owners_words_match_as_the_words_do_and_only_for_that_owner(text, query):
    """search_owned_words / search_owned_query (migration 0006) keep positions, weights, quoting and phrases: a text
    matches a query under its owner exactly when the plain tsvector does, and never under another owner."""
    config = settings.ARBOR_SEARCH_CONFIG
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT to_tsvector(%s::regconfig, %s) @@ q, search_owned_words(7, to_tsvector(%s::regconfig, %s)) "
            "@@ search_owned_query(7, q), search_owned_words(7, to_tsvector(%s::regconfig, %s)) "
            "@@ search_owned_query(8, q) FROM to_tsquery(%s::regconfig, %s) AS q",
            [config, text, config, text, config, text, config, _tsquery(_terms(query), match_any=False)])
        plain, owned, others = cursor.fetchone()
    assert plain and owned and not others


def test_issue_34_branch_marks_are_the_heads_whole_history(user, busy):
    """T8 with issue 34's shorter walk: a hit is on the current branch exactly when the head's history holds it."""
    mine, _ = busy
    hits = search_bubbles(user=user, query="revenue")
    assert {h.on_current_path for h in hits} == {True, False}
    for hit in hits:
        conversation = mine if hit.conversation == mine.pk else mine.__class__.objects.get(pk=hit.conversation)
        assert hit.on_current_path == (hit.node in history_ids(head(conversation).pk, owner=conversation.owner_id))


def test_issue_34_marks_on_a_long_line_with_branches_near_and_far(user):
    """A long line with a branch beside a hit, a branch several turns deep, and a second root: the walk that stops
    once its hits are settled marks each as the whole history does."""
    conversation = services.conversation_create(owner=user, title="long")
    line = _chain(conversation, [f"line {n}" for n in range(60)])
    beside = _chain(conversation, ["beside"], parent=line[50])  # leaves the line at a node the walk reaches
    deep = _chain(conversation, ["deep 1", "deep 2", "deep 3"], parent=line[5])  # settled only further up
    other_root = _chain(conversation, ["another first question"])
    services.head_move(conversation=conversation, to=line[-1].pk)
    wanted = [line[-1], line[55], line[3], line[0], beside[0], deep[-1], other_root[0]]
    marked = on_current_paths(((conversation.pk, node.pk) for node in wanted), owner=conversation.owner_id)
    assert marked == {node.pk for node in wanted if node.pk in history_ids(line[-1].pk, owner=owner_of(line[-1].pk))}
    assert marked == {line[-1].pk, line[55].pk, line[3].pk, line[0].pk}
    assert on_current_paths([], owner=conversation.owner_id) == set()


def test_issue_34_marks_see_behind_a_compaction_root(user):
    """C3: the history behind a compaction root is on the branch (its `compacted_from`), as the screen shows it."""
    conversation = services.conversation_create(owner=user, title="compacted")
    old = _chain(conversation, ["old 1", "old 2"])
    side = _chain(conversation, ["old side"], parent=old[0])
    root = Node.objects.create(conversation=conversation, kind="compaction", status="succeeded",
                               compacted_from=old[-1], sent=[], received=[it.text("summary")], provider="arbor",
                               model="arbor/echo")
    after = _chain(conversation, ["after"], parent=root)
    services.head_move(conversation=conversation, to=after[-1].pk)
    pairs = [(conversation.pk, node.pk) for node in (*old, side[0], root, after[0])]
    assert on_current_paths(pairs, owner=conversation.owner_id) == {old[0].pk, old[1].pk, root.pk, after[0].pk}


def test_issue_34_a_long_conversations_hits_are_found_and_marked(user, other_user):
    """A person whose one conversation is long (the case issue 34 timed at 137 ms): hits on and off its branch."""
    conversation = services.conversation_create(owner=user, title="long")
    line = _chain(conversation, [f"turn {n} budget" if n % 7 == 0 else f"turn {n}" for n in range(200)])
    off = _chain(conversation, ["budget elsewhere"], parent=line[100])
    services.head_move(conversation=conversation, to=line[-1].pk)
    index_conversation(conversation.pk)
    hits = search_bubbles(user=user, query="budget", limit=50)
    assert {h.node for h in hits} == {n.pk for n in line[::7]} | {off[0].pk}
    assert {h.node for h in hits if not h.on_current_path} == {off[0].pk}
    assert not search_bubbles(user=other_user, query="budget")


@postgres_only
def test_issue_34_every_statement_on_the_search_table_asks_by_the_callers_id(user, busy):
    """Recorded SQL of a person's search, of retrieval's (any word) and of its common-word count: each statement
    that reads search_bubbledocument asks by the caller's id at every reading of it (the owner's words index, or the
    owner's column beside a list the index made); none reads the table unscoped."""
    with CaptureQueriesContext(connection) as queries:
        search_bubbles(user=user, query="revenue region")
        word_hits(user=user, question="Which revenue region grew?", limit=5, exclude_conversation=None)
    reads = [q["sql"] for q in queries.captured_queries if "search_bubbledocument" in q["sql"]]
    assert len(reads) >= 3
    for sql in reads:
        scoped = sql.count(f"search_owned_query({user.pk},") + sql.count(f"d.owner_id = {user.pk} ")
        assert sql.count("search_bubbledocument") == scoped, sql
