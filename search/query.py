"""Full-text search over the caller's own conversations, across every branch (issue 7).

PostgreSQL: websearch_to_tsquery against the GIN-indexed tsvector, ranked with ts_rank, snippets from
ts_headline. SQLite: FTS5 MATCH, ranked with bm25, snippets from snippet(). Only the ranked page of hits
gets snippets, so a common word costs one ranking pass, not a headline per match.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from django.conf import settings
from django.db import connection
from django.utils.safestring import SafeString, mark_safe

from config.errors import BadInput
from conversations.models import Conversation
from conversations.selectors import history_ids

MAX_QUERY_CHARS = 200
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


def _snippet(raw: str) -> SafeString:
    return mark_safe(escape(raw).replace(_START, "<mark>").replace(_STOP, "</mark>"))  # noqa: S308 - escaped first


def _fts5_query(text: str, *, match_any: bool) -> str:
    """Each word as a quoted FTS5 string: a person's input is never FTS5 syntax."""
    return (" OR " if match_any else " ").join('"' + word.replace('"', '""') + '"' for word in text.split())


def _any_word(text: str) -> str:
    """websearch_to_tsquery input matching any of the words (retrieval asks with a whole question)."""
    return " or ".join(word.strip('"-') for word in text.split() if word.strip('"-'))


_POSTGRES_RANKED = """
SELECT b.id, b.node_id, b.role, c.id, c.title, ts_rank(d.vector, q.query) AS rank
FROM search_bubbledocument d
JOIN conversations_bubble b ON b.id = d.bubble_id
JOIN conversations_conversation c ON c.id = b.conversation_id,
     websearch_to_tsquery(%s::regconfig, %s) AS q(query)
WHERE c.owner_id = %s AND c.id IS DISTINCT FROM %s AND d.vector @@ q.query
ORDER BY rank DESC, b.id DESC
LIMIT %s
"""
_POSTGRES_SNIPPETS = """
SELECT b.id, ts_headline(
    %s::regconfig, b.content, websearch_to_tsquery(%s::regconfig, %s),
    'StartSel=' || chr(2) || ', StopSel=' || chr(3) || ', MaxWords=30, MinWords=10, MaxFragments=2')
FROM conversations_bubble b WHERE b.id = ANY(%s)
"""
_SQLITE_RANKED = """
SELECT b.id, b.node_id, b.role, c.id, c.title, -bm25(search_fts) AS rank,
       snippet(search_fts, 0, char(2), char(3), '…', 16)
FROM search_fts
JOIN conversations_bubble b ON b.id = search_fts.rowid
JOIN conversations_conversation c ON c.id = b.conversation_id
WHERE search_fts MATCH %s AND c.owner_id = %s AND c.id IS NOT %s
ORDER BY bm25(search_fts), b.id DESC
LIMIT %s
"""


def search_bubbles(*, user, query: str, limit: int = 20, match_any: bool = False,
                   exclude_conversation: int | None = None) -> list[Hit]:
    """The caller's bubbles that match `query`, best first, each marked with whether it is on the current branch.

    `match_any` finds bubbles with any of the words instead of all of them.
    """
    if not isinstance(query, str) or not query.strip():
        raise BadInput("`q` must be a non-empty search query.")
    if len(query) > MAX_QUERY_CHARS:
        raise BadInput(f"`q` is longer than {MAX_QUERY_CHARS} characters.")
    if any(ord(char) < 32 for char in query):
        raise BadInput("`q` may not hold control characters.")
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            config = settings.ARBOR_SEARCH_CONFIG
            query = _any_word(query) if match_any else query
            cursor.execute(_POSTGRES_RANKED, [config, query, user.pk, exclude_conversation, limit])
            rows = cursor.fetchall()
            cursor.execute(_POSTGRES_SNIPPETS, [config, config, query, [r[0] for r in rows]])
            snippets = dict(cursor.fetchall())
            rows = [(*row, snippets[row[0]]) for row in rows]
        else:
            cursor.execute(_SQLITE_RANKED, [_fts5_query(query, match_any=match_any), user.pk, exclude_conversation,
                                            limit])
            rows = cursor.fetchall()
    on_path = _current_paths({row[3] for row in rows})
    return [Hit(bubble=b, node=n, role=role, conversation=c, conversation_title=title or f"Conversation {c}",
                rank=float(rank), snippet=_snippet(snippet), on_current_path=n in on_path.get(c, ()))
            for b, n, role, c, title, rank, snippet in rows]


def _current_paths(conversation_ids: set[int]) -> dict[int, set[int]]:
    """The node ids each conversation shows now (its head's path, history behind compactions included)."""
    heads = Conversation.objects.filter(pk__in=conversation_ids).values_list("pk", "head_id")
    return {pk: set(history_ids(head)) for pk, head in heads}
