"""Full-text search over the caller's own conversations, across every branch (issue 7).

PostgreSQL: a to_tsquery of the typed words against the caller's tsvectors (one GIN index of each owner's own words,
issue 34), ranked with ts_rank, snippets from ts_headline. SQLite: FTS5 MATCH, ranked with bm25, snippets from
snippet().
Only the ranked page of hits gets snippets and joins, so a common word costs one ranking pass, not a headline per
match; branch marks walk each conversation's history only as far as its hits need.

A person's words match as prefixes ("sal" finds "sales", issue 16) from MIN_PREFIX characters on; word forms come
from the database's stemming where it has one (SQLite's index uses the Porter stemmer, English; PostgreSQL's
ARBOR_SEARCH_CONFIG, e.g. `english`; the default `simple` keeps every language's words as they are). Retrieval
(`match_any`, any word of a whole question) matches a long word by its first letters (`_term`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from html import escape

from django.conf import settings
from django.db import connection
from django.utils.safestring import SafeString, mark_safe

from config.errors import BadInput
from config.replica import reading_connection
from conversations.models import Conversation, Node
from conversations.selectors import history_ids

MAX_QUERY_CHARS = 200
_NODE = Node._meta.db_table
_START, _STOP = "\x02", "\x03"  # highlight marks that cannot come from HTML escaping


@dataclass(frozen=True)
class Hit:
    bubble: int
    node: int
    role: str
    conversation: int
    conversation_title: str
    rank: float
    snippet: SafeString  # escaped text with <mark> around the matched words
    on_current_path: bool  # False: the hit is on another branch; opening it switches there (T8)
    start: int = 0  # where in the bubble's text the hit starts (a similar message's chunk)


def _snippet(raw: str) -> SafeString:
    return mark_safe(escape(raw).replace(_START, "<mark>").replace(_STOP, "</mark>"))  # noqa: S308 - escaped first


MIN_PREFIX = 3  # shorter words match whole: "a" as a prefix would match every word that starts with it
MAX_TERMS = 32


def _terms(text: str) -> list[str]:
    """The words of a query, as the indexes split them (letters and digits of any script); never query syntax."""
    return re.findall(r"\w+", text.lower())[:MAX_TERMS]


TRUNCATE = 5  # retrieval's words longer than this match by their first TRUNCATE letters


def _term(term: str, *, match_any: bool) -> tuple[str, bool]:
    """The word as the index is asked for it, and whether as a prefix. A person's words are prefixes from
    MIN_PREFIX letters. A question's words (`match_any`) are cut to their first TRUNCATE letters when longer:
    n-letter truncation, a stemmer for any language with spaces (Mayfield and McNamee, SIGIR 2003), so
    "cancellation" finds "cancelling" whatever ARBOR_SEARCH_CONFIG stems or not."""
    if match_any:
        return (term[:TRUNCATE], True) if len(term) > TRUNCATE else (term, False)
    return term, len(term) >= MIN_PREFIX


def _fts5_query(terms: list[str], *, match_any: bool) -> str:
    """Each word as a quoted FTS5 string (a prefix query with `*`)."""
    quoted = [f'"{t}"' + "*" * prefix for t, prefix in (_term(t, match_any=match_any) for t in terms)]
    return (" OR " if match_any else " ").join(quoted)


def _tsquery(terms: list[str], *, match_any: bool) -> str:
    """to_tsquery input: each word quoted as a lexeme (`:*` a prefix), joined by & (all) or | (any)."""
    quoted = [f"'{t}'" + ":*" * prefix for t, prefix in (_term(t, match_any=match_any) for t in terms)]
    return (" | " if match_any else " & ").join(quoted)


# `{match}`: the tsquery itself for a person's search (all the words); for retrieval's (`match_any`) the union of
# each word's own index scan, a list the ranking reads by id. PostgreSQL's planner prices a GIN prefix scan far
# above its cost and, for an OR of several, chose a scan of every document instead (20-40x slower on
# bench_retrieval's 100,000 pieces); one word at a time it chooses the index.
# The caller's matches are ranked and ordered on their own, and only the best few are joined to their bubbles and
# conversations (issue 34): joining every match first cost a common word 30-50 ms. ts_rank and the order (rank,
# then the newest bubble) are the same as ever.
_POSTGRES_RANKED = """
SELECT b.id, b.node_id, b.role, c.id, c.title, d.rank
FROM (SELECT d.bubble_id, ts_rank(d.vector, q.query) AS rank
      FROM search_bubbledocument d, to_tsquery(%s::regconfig, %s) AS q(query)
      WHERE {match}
      ORDER BY rank DESC, d.bubble_id DESC) AS d
JOIN conversations_bubble b ON b.id = d.bubble_id
JOIN conversations_conversation c ON c.id = b.conversation_id
WHERE c.owner_id = %s AND b.owner_id = c.owner_id AND c.id IS DISTINCT FROM %s
  AND (%s::bigint IS NULL OR c.project_id = %s)
ORDER BY d.rank DESC, d.bubble_id DESC
LIMIT %s
"""
# The index is asked for the caller's entries only (issue 34, search's migration 0006): its keys are the owner's id
# and the lexeme ("7:revenue"), so a word or a prefix of one person's is one narrow range of the index, read and
# planned alike however many entries other people have. The conversation's owner is checked as well.
_OWNED = "search_owned_words({table}owner_id, {table}vector) @@ search_owned_query(%s, {query})"
_POSTGRES_ALL = _OWNED.format(table="d.", query="q.query")
_POSTGRES_ANY = "d.owner_id = %s AND d.bubble_id = ANY(ARRAY({matches}))"
_POSTGRES_MATCHES = ("SELECT bubble_id FROM search_bubbledocument WHERE "
                     + _OWNED.format(table="", query="to_tsquery(%s::regconfig, %s)"))
_POSTGRES_COUNT = ("(SELECT count(*) FROM (SELECT 1 FROM search_bubbledocument WHERE "
                   + _OWNED.format(table="", query="to_tsquery(%s::regconfig, %s)") + " LIMIT %s) AS s)")
# FTS5 has no owner to ask by: it walks everyone's matches of a word, reading each one's owner beside it. A word
# with at least `walk` matches of anyone's is common too (the count says COMMON), whatever the person's own count:
# ranking it would walk them all again (bm25 over every match).
_SQLITE_COUNT = ("(SELECT CASE WHEN count(*) >= %s THEN %s ELSE coalesce(sum(mine), 0) END FROM ("
                 "SELECT d.owner_id = %s AS mine FROM search_fts JOIN search_bubbledocument d "
                 "ON d.bubble_id = search_fts.rowid WHERE search_fts MATCH %s LIMIT %s))")
_POSTGRES_SNIPPETS = """
SELECT b.id, ts_headline(
    %s::regconfig, b.content, to_tsquery(%s::regconfig, %s),
    'StartSel=' || chr(2) || ', StopSel=' || chr(3) || ', MaxWords=30, MinWords=10, MaxFragments=2')
FROM conversations_bubble b WHERE b.id = ANY(%s) AND b.owner_id = %s
"""
_SQLITE_RANKED = """
SELECT b.id, b.node_id, b.role, c.id, c.title, -bm25(search_fts) AS rank,
       snippet(search_fts, 0, char(2), char(3), '…', 16)
FROM search_fts
JOIN conversations_bubble b ON b.id = search_fts.rowid
JOIN conversations_conversation c ON c.id = b.conversation_id
WHERE search_fts MATCH %s AND c.owner_id = %s AND b.owner_id = c.owner_id AND c.id IS NOT %s
  AND (%s IS NULL OR c.project_id = %s)
ORDER BY bm25(search_fts), b.id DESC
LIMIT %s
"""


# A question's word found in at least this many of the person's own messages is too common to choose retrieval's
# candidates by: ranking every message that has it is what made a question's words cost 100 ms at 100,000 pieces,
# and a word that common says little about what the question is about. A number, not a share of the person's
# messages, so that a word's cost is bounded however many they have (1% of bench_retrieval's 100,000 pieces).
# Counted among the person's messages only: nobody else's make a word common or slow for them (on PostgreSQL;
# SQLite, the embedded default for one person, also counts a word that WALK times as common in anyone's as common).
COMMON = 1000
WALK = 10


def distinctive_terms(cursor, terms: list[str], *, owner_id: int) -> list[str]:
    """Retrieval's words found in some of the owner's messages but fewer than COMMON (each counted only up to
    that); maybe none."""
    if connection.vendor == "postgresql":
        config = settings.ARBOR_SEARCH_CONFIG
        counts = [(_POSTGRES_COUNT, [owner_id, config, _tsquery([t], match_any=True), COMMON]) for t in terms]
    else:
        walk = WALK * COMMON
        counts = [(_SQLITE_COUNT, [walk, COMMON, owner_id, _fts5_query([t], match_any=True), walk]) for t in terms]
    cursor.execute("SELECT " + ", ".join(sql for sql, _ in counts), [p for _, params in counts for p in params])
    return [term for term, found in zip(terms, cursor.fetchone(), strict=True) if 0 < found < COMMON]


def check_query(query: object) -> None:
    """What a person may search for (400 otherwise): words, at most MAX_QUERY_CHARS, no control character."""
    if not isinstance(query, str) or not query.strip():
        raise BadInput("`q` must be a non-empty search query.")
    if len(query) > MAX_QUERY_CHARS:
        raise BadInput(f"`q` is longer than {MAX_QUERY_CHARS} characters.")
    if any(ord(char) < 32 for char in query):
        raise BadInput("`q` may not hold control characters.")


def search_bubbles(*, user, query: str, limit: int = 20, match_any: bool = False,
                   exclude_conversation: int | None = None, shown: bool = True, project: int | None = None
                   ) -> list[Hit]:
    """The caller's bubbles that match `query`, best first, each marked with whether it is on the current branch;
    with `project`, only its conversations' (issue 30).

    `match_any` (retrieval's) finds bubbles with any of the words instead of all of them, leaving out the common
    words when others are there (`distinctive_terms`). Hits that are not `shown` to a person (retrieval's) get no
    snippet and no branch mark, which cost a query a conversation.
    """
    check_query(query)
    terms = _terms(query)
    if not terms:
        return []  # punctuation alone: no word to look for
    with reading_connection().cursor() as cursor:  # the replica's in a search (issue 34)
        rows, used = [], terms
        # Retrieval asks by its distinctive words first; when they find nothing here (none, or only in the
        # excluded conversation), by all of them: a slower search beats none.
        if match_any and (distinctive := distinctive_terms(cursor, terms, owner_id=user.pk)) != terms:
            rows, used = _ranked(cursor, distinctive, user=user, exclude_conversation=exclude_conversation,
                                 limit=limit, match_any=True, project=project), distinctive
        if not rows:
            rows, used = _ranked(cursor, terms, user=user, exclude_conversation=exclude_conversation, limit=limit,
                                 match_any=match_any, project=project), terms
        if connection.vendor == "postgresql":
            snippets: dict[int, str] = {}
            if shown and rows:
                config = settings.ARBOR_SEARCH_CONFIG
                cursor.execute(_POSTGRES_SNIPPETS, [config, config, _tsquery(used, match_any=match_any),
                                                    [r[0] for r in rows], user.pk])
                snippets = dict(cursor.fetchall())
            rows = [(*row, snippets.get(row[0], "")) for row in rows]
    on_path = on_current_paths(((row[3], row[1]) for row in rows), owner=user.pk) if shown else set()
    return [Hit(bubble=b, node=n, role=role, conversation=c, conversation_title=title or f"Conversation {c}",
                rank=float(rank), snippet=_snippet(snippet), on_current_path=n in on_path)
            for b, n, role, c, title, rank, snippet in rows]


def _ranked(cursor, terms: list[str], *, user, exclude_conversation: int | None, limit: int,
            match_any: bool, project: int | None = None) -> list[tuple]:
    """The best `limit` of the caller's bubbles with all (any, `match_any`) of `terms`; SQLite's with snippets."""
    if not terms:
        return []
    if connection.vendor != "postgresql":
        cursor.execute(_SQLITE_RANKED, [_fts5_query(terms, match_any=match_any), user.pk, exclude_conversation,
                                        project, project, limit])
        return cursor.fetchall()
    config = settings.ARBOR_SEARCH_CONFIG
    query = _tsquery(terms, match_any=match_any)
    if match_any:
        match = _POSTGRES_ANY.format(matches=" UNION ".join([_POSTGRES_MATCHES] * len(terms)))
        owned = [user.pk, *(p for t in terms for p in (user.pk, config, _tsquery([t], match_any=True)))]
    else:
        match, owned = _POSTGRES_ALL, [user.pk]
    cursor.execute(_POSTGRES_RANKED.format(match=match),
                   [config, query, *owned, user.pk, exclude_conversation, project, project, limit])
    return cursor.fetchall()


# Branch marks (issue 34): one walk a conversation from its head up its history (a compaction root's old path
# included), all of them in one statement, carrying the hits still open: each hit's next node up (its parent, or for
# a compaction root the head it replaced; a parentless hit itself). Reaching that node settles the hit, which was
# passed on the way if it is on the path and is on another branch if not; the walk ends once every hit of its
# conversation is settled. So a hit on the path or on a branch that leaves it beside the hit costs the walk down to
# it, not a person's whole long conversation, and only the hits' ids come back.
_ON_PATHS = f"""
WITH RECURSIVE hit AS (
    SELECT h.conversation, h.node, COALESCE(n.parent_id, n.compacted_from_id, n.id) AS up
    FROM unnest(%(conversations)s::bigint[], %(nodes)s::bigint[]) AS h(conversation, node)
    JOIN {_NODE} n ON n.id = h.node AND n.owner_id = %(owner)s
), walk AS (
    SELECT c.id AS conversation, n.id, COALESCE(n.parent_id, n.compacted_from_id) AS next,
           array_remove(ARRAY(SELECT DISTINCT up FROM hit WHERE hit.conversation = c.id), n.id) AS open, 0 AS depth
    FROM conversations_conversation c JOIN {_NODE} n ON n.id = c.head_id AND n.owner_id = %(owner)s
    WHERE c.owner_id = %(owner)s AND c.id IN (SELECT conversation FROM hit)
    UNION ALL
    SELECT w.conversation, n.id, COALESCE(n.parent_id, n.compacted_from_id), array_remove(w.open, n.id), w.depth + 1
    FROM walk w JOIN {_NODE} n ON n.id = w.next
    WHERE n.owner_id = %(owner)s AND cardinality(w.open) > 0 AND w.depth < %(limit)s
)
SELECT walk.id FROM walk JOIN hit ON hit.conversation = walk.conversation AND hit.node = walk.id
"""


def on_current_paths(hits: Iterable[tuple[int, int]], *, owner: int) -> set[int]:
    """Of these (conversation, node) hits of `owner`'s, the nodes on their conversation's current branch (its head's
    history)."""
    pairs = sorted(set(hits))
    if not pairs:
        return set()
    if connection.vendor != "postgresql":
        paths = current_paths({conversation for conversation, _ in pairs}, owner=owner)
        return {node for conversation, node in pairs if node in paths.get(conversation, ())}
    with reading_connection().cursor() as cursor:  # the replica's in a search (issue 34)
        cursor.execute(_ON_PATHS, {"conversations": [c for c, _ in pairs], "nodes": [n for _, n in pairs],
                                   "owner": owner, "limit": settings.ARBOR_PATH_DEPTH_LIMIT})
        return {row[0] for row in cursor.fetchall()}


def current_paths(conversation_ids: set[int], *, owner: int) -> dict[int, set[int]]:
    """The node ids each of `owner`'s conversations shows now (its head's path, history behind compactions
    included)."""
    heads = Conversation.objects.filter(owner_id=owner, pk__in=conversation_ids).values_list("pk", "head_id")
    return {pk: set(history_ids(head, owner=owner)) for pk, head in heads}
