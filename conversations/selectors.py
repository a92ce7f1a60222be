"""Reads and access checks. Nothing here writes."""

from __future__ import annotations

import heapq
import json
from array import array
from collections.abc import Iterable
from typing import Any, NamedTuple

from django.conf import settings
from django.db import connection
from django.db.models import Max, Q, QuerySet
from django.db.models.expressions import RawSQL

from config.errors import NotFound
from conversations.context import PathNode, is_compaction_root, readable_by
from conversations.errors import CorruptTree
from conversations.items import question_of
from conversations.models import Conversation, Node, Preferences, Project, walk_up
from conversations.tools.mcp.servers import configured

_NODE = Node._meta.db_table
# The history's ids alone, and the few columns the screen needs (no items but a turn's sent items, to
# tell questions): membership checks and the screen read thousands of nodes behind the roots.
_HISTORY_CTE = f"""
WITH RECURSIVE path AS (
    SELECT id, parent_id, compacted_from_id, 0 AS depth FROM {_NODE} WHERE id = %(node)s AND owner_id = %(owner)s
    UNION ALL
    SELECT n.id, n.parent_id, n.compacted_from_id, path.depth + 1
    FROM {_NODE} n JOIN path ON n.id = COALESCE(path.parent_id, path.compacted_from_id)
    WHERE n.owner_id = %(owner)s AND path.depth < %(limit)s
)"""
_HISTORY_IDS_SQL = f"{_HISTORY_CTE} SELECT id FROM path ORDER BY depth"
_SCREEN_SQL = f"""{_HISTORY_CTE}
SELECT n.id, n.parent_id, n.kind, n.status, CASE WHEN n.kind = 'turn' THEN n.sent END, n.compacted_from_id
FROM path JOIN {_NODE} n ON n.id = path.id AND n.owner_id = %(owner)s ORDER BY path.depth DESC"""


def asks_question_sql(table: str) -> str:
    """SQL for `question_of(sent) is not None` of a row of `table`: does the node send a user item? (T8; no JSON
    travels to Python to tell.)"""
    if connection.vendor == "postgresql":
        return f"""jsonb_path_exists({table}.sent, '$[*] ? (@.type == "user")')"""
    return (f"EXISTS (SELECT 1 FROM json_each({table}.sent) "
            "WHERE json_extract(json_each.value, '$.type') = 'user')")


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str | bytes) else value


def _read_up(head_id: int | None, *, owner: int, history: bool) -> list[PathNode]:
    rows = Node.objects.path_up(head_id, owner=owner, history=history)
    if rows and (rows[0][1] is not None or (history and rows[0][10] is not None)):
        # The walk stopped at a node that names no owner or another one: a call must never get a shortened
        # context without a word (issue 34's backfill or a writer that forgot the owner).
        raise CorruptTree(f"the path from node {head_id} leaves owner {owner}'s nodes at node {rows[0][0]}")
    return [PathNode(r[0], r[1], r[2], r[3], _json(r[4]), _json(r[5]), r[6], r[7], r[8], r[9], r[10]) for r in rows]


def node_path(head_id: int | None, *, owner: int) -> list[PathNode]:
    """Return the path from the root (or the compaction node) down to `owner`'s node `head_id`, in one query."""
    return _read_up(head_id, owner=owner, history=False)


def path_node(node: Node, *, shift: int = 0) -> PathNode:
    """A node already in memory as a path entry (what `node_path` would have read for it)."""
    return PathNode(id=node.pk, parent_id=node.parent_id, kind=node.kind, status=node.status, sent=node.sent,
                    received=node.received, provider=node.provider, model=node.model, tokens=node.tokens,
                    path_tokens=node.path_tokens + shift, compacted_from_id=node.compacted_from_id, shift=shift)


def history_path(head_id: int | None, *, owner: int) -> list[PathNode]:
    """Return everything the conversation went through to reach `head_id`, in one query: the path, and
    behind each compaction root its original path (C3). The roots stay in the list, where they happened."""
    return _read_up(head_id, owner=owner, history=True)


def history_ids(head_id: int | None, *, owner: int) -> list[int]:
    """The ids of `history_path(head_id)`, head first, without reading any items: for membership checks
    (T10, switching) that would otherwise read the whole history's JSON."""
    return [row[0] for row in walk_up(_HISTORY_IDS_SQL, head_id, owner)]


def screen_history(head_id: int | None, *, owner: int, last: int | None = None) -> list[PathNode]:
    """`history_path` for the screen, in one query: ids, links, kind and status, and only a turn's sent
    items (to tell questions, T8); no received items, nothing of a compaction root's kept turns.

    With `last`, the recursion stops after that many nodes above the head and one more, which only says
    there is more: the end of a long history costs what it shows.
    """
    if last is None:
        rows = walk_up(_SCREEN_SQL, head_id, owner)
    elif head_id is None:
        rows = []
    else:
        with connection.cursor() as cursor:
            cursor.execute(_SCREEN_SQL, {"node": head_id, "owner": owner, "limit": last})
            rows = cursor.fetchall()
    return [_screen_node(r) for r in rows]


def _screen_node(row: tuple) -> PathNode:
    return PathNode(row[0], row[1], row[2], row[3], _json(row[4]) or [], [], compacted_from_id=row[5])


class Stretch(NamedTuple):
    """Consecutive nodes of a history, root first, as `screen_history` reads them (issue 13: one page)."""

    nodes: list[PathNode]
    before: PathNode | None  # the node just before the first one; None at the history's start
    more: bool  # are there nodes after the last one?
    # T10: how many of `nodes`, from the first, lie before a compaction root (or are one) up to the tip.
    sealed: int
    # Forward pages: the last nodes of the pages that follow (a walk from one of them up to the one before costs a
    # page), and the latest compaction root after this page, if any (T10 for those pages).
    marks: tuple[int, ...] = ()
    root: int | None = None


# The history of a tip, walked up only as far as `stop` (kept), with each node's depth below the tip. Only a page
# of its rows is joined for their items (part 0); besides them, the latest compaction root walked (part 1, T10)
# and the last nodes of the next pages (part 2): `size` nodes apart, counted from the stop (or the root).
_AFTER_SQL = f"""
WITH RECURSIVE path AS (
    SELECT id, parent_id, compacted_from_id, kind, 0 AS depth FROM {_NODE} WHERE id = %(tip)s AND owner_id = %(owner)s
    UNION ALL
    SELECT n.id, n.parent_id, n.compacted_from_id, n.kind, path.depth + 1
    FROM {_NODE} n JOIN path ON n.id = COALESCE(path.parent_id, path.compacted_from_id)
    WHERE n.owner_id = %(owner)s AND path.id <> %(stop)s AND path.depth < %(limit)s
)
SELECT 0 AS part, n.id, n.parent_id, n.kind, n.status, CASE WHEN n.kind = 'turn' THEN n.sent END,
       n.compacted_from_id, page.depth
FROM (SELECT id, depth FROM path ORDER BY depth DESC LIMIT %(rows)s) page
     JOIN {_NODE} n ON n.id = page.id AND n.owner_id = %(owner)s
UNION ALL
SELECT 1, id, NULL, NULL, NULL, NULL, NULL, depth FROM (
    SELECT id, depth FROM path WHERE kind = 'compaction' AND parent_id IS NULL ORDER BY depth LIMIT 1) latest
UNION ALL
SELECT 2, id, NULL, NULL, NULL, NULL, NULL, depth FROM (
    SELECT id, depth FROM path, (SELECT MAX(depth) AS top FROM path) walked
    WHERE depth > 0 AND top - depth + %(offset)s >= 2 * %(size)s AND (top - depth + %(offset)s) %% %(size)s = 0
    ORDER BY depth DESC LIMIT %(marks)s) marks
ORDER BY part, depth DESC"""


def history_after(tip: int, *, owner: int, after: int | None, size: int, marks: int = 0, root: int | None = None,
                  ) -> Stretch | None:
    """Up to `size` nodes of `tip`'s history that come after node `after` (from the root when None), in one query.

    The walk goes up from the tip and stops at `after`, so a page costs the distance from the tip to it, never the
    table, and what lies before it is never read: new turns below the tip add to the end, they shift nothing
    (issue 13). It also returns the last nodes of up to `marks` following pages: walked from one of those, a page
    costs its own length. For such a walk (`marks` 0) `root` is the latest compaction root that lay ahead (T10).
    None when `after` is not on the history.
    """
    params = {"tip": tip, "owner": owner, "stop": after or 0,  # no node has id 0
              "limit": settings.ARBOR_PATH_DEPTH_LIMIT, "rows": size + (2 if after else 1),
              "offset": 0 if after else 1, "size": size, "marks": marks}
    with connection.cursor() as cursor:
        cursor.execute(_AFTER_SQL, params)
        rows = cursor.fetchall()
    page = [row[1:] for row in rows if row[0] == 0]
    latest = next(((row[1], row[7]) for row in rows if row[0] == 1), None)
    before = None
    if after is not None:
        if not page or page[0][0] != after:
            return None
        before, page = _screen_node(page[0]), page[1:]
    more, page = len(page) > size, page[:size]
    if marks == 0 and latest is None and root is not None:  # it lies ahead of the page: all of it is before it
        sealed, ahead = len(page), root
    else:
        sealed, ahead = _sealed(page, latest)
    return Stretch([_screen_node(row) for row in page], before, more, sealed,
                   tuple(row[1] for row in rows if row[0] == 2), ahead)


def _sealed(page: list[tuple], latest: tuple[int, int] | None) -> tuple[int, int | None]:
    """How many of the page's nodes lie up to the latest compaction root walked (`latest`: its id and depth), and
    that root if it lies ahead of the page (T10: nothing before it can be edited)."""
    if latest is None:
        return 0, None
    sealed = sum(1 for row in page if row[6] >= latest[1])
    return sealed, latest[0] if page and latest[1] < page[-1][6] else None


def history_before(node_id: int, *, owner: int, size: int, include: bool = False) -> Stretch:
    """Up to `size` nodes of the history just before `node_id` (ending with it if `include`), root first: a walk
    of `size` + 2 steps up, whatever the history's length or what the head did since. `sealed` counts the nodes up
    to the last compaction root among them."""
    rows = screen_history(node_id, owner=owner, last=size if include else size + 1)
    if not include:
        rows = rows[:-1]
    more = len(rows) > size
    before, nodes = (rows[0], rows[1:]) if more else (None, rows)
    sealed = max((i + 1 for i, p in enumerate(nodes) if is_compaction_root(p)), default=0)
    return Stretch(nodes, before, not include, sealed)


_OPENER_SQL = """
WITH RECURSIVE path AS (
    SELECT id, parent_id, compacted_from_id, kind = 'turn' AND {asks} AS opens, 0 AS depth FROM {node}
    WHERE id = %(node)s AND owner_id = %(owner)s
    UNION ALL
    SELECT n.id, n.parent_id, n.compacted_from_id, n.kind = 'turn' AND {asks_n}, path.depth + 1
    FROM {node} n JOIN path ON n.id = COALESCE(path.parent_id, path.compacted_from_id)
    WHERE n.owner_id = %(owner)s AND NOT path.opens AND path.depth < %(limit)s
)
SELECT n.id, n.parent_id, n.kind, n.status, n.sent, n.compacted_from_id FROM path
JOIN {node} n ON n.id = path.id AND n.owner_id = %(owner)s WHERE path.opens"""


def turn_opener(node_id: int, *, owner: int) -> PathNode | None:
    """The node that opened the turn holding `node_id` (itself if it does), found by walking up only as far as
    that: what a page that starts inside a turn needs for its branch place (T8)."""
    sql = _OPENER_SQL.format(node=_NODE, asks=asks_question_sql(_NODE), asks_n=asks_question_sql("n"))
    with connection.cursor() as cursor:
        cursor.execute(sql, {"node": node_id, "owner": owner, "limit": settings.ARBOR_PATH_DEPTH_LIMIT})
        row = cursor.fetchone()
    return _screen_node(row) if row else None


def history_walk(tip: int | None, *, owner: int) -> tuple[array, dict[int, int]]:
    """The history's ids root first, as 8 bytes each, and its compaction roots with their originals (C3): what
    an export walks in chunks without holding the nodes (issue 13)."""
    ids = array("q")
    roots: dict[int, int] = {}
    if tip is None:
        return ids, roots
    sql = f"""{_HISTORY_CTE} SELECT path.id, path.parent_id IS NULL AND n.kind = 'compaction', path.compacted_from_id
              FROM path JOIN {_NODE} n ON n.id = path.id AND n.owner_id = %(owner)s ORDER BY path.depth DESC"""
    with connection.cursor() as cursor:
        cursor.execute(sql, {"node": tip, "owner": owner, "limit": settings.ARBOR_PATH_DEPTH_LIMIT})
        while rows := cursor.fetchmany(2000):
            for node_id, is_root, original in rows:
                ids.append(node_id)
                if is_root:
                    roots[node_id] = original
    return ids, roots


def context_path(path: list[PathNode], provider: str | None, *, owner: int) -> list[PathNode]:
    """The path a call to `provider` assembles from (C3): when `provider` cannot read the compaction
    result the path starts with, the original path behind it takes the root's place, recursively.

    Token counts after the root are moved onto the expanded path so budget checks stay O(1).
    """
    if not path or not is_compaction_root(path[0]) or readable_by(path[0].sent, provider):
        return path
    original = context_path(node_path(path[0].compacted_from_id, owner=owner), provider, owner=owner)
    offset = (original[-1].path_tokens if original else 0) - path[0].tokens
    return [*original, *(p._replace(path_tokens=p.path_tokens + offset, shift=p.shift + offset) for p in path[1:])]


def opens_turn(node: PathNode) -> bool:
    """A turn node that sent a question. A compaction root's kept items hold questions too, but the
    root opens nothing: its questions belong to the original turns (T10)."""
    return node.kind == Node.Kind.TURN and question_of(node.sent) is not None


def conversation_for_user(*, user, conversation_id: Any) -> Conversation:
    """Return the caller's conversation; anyone else's is a 404, like a missing one."""
    try:
        return Conversation.objects.get(pk=int(conversation_id), owner_id=user.pk)
    except (Conversation.DoesNotExist, TypeError, ValueError):
        raise NotFound("No such conversation.") from None


def user_instructions(*, user_id: int) -> str:
    return Preferences.objects.filter(user_id=user_id).values_list("instructions", flat=True).first() or ""


def user_theme(*, user_id: int) -> str:
    return Preferences.objects.filter(user_id=user_id).values_list("theme", flat=True).first() or ""


def instructions_for(conversation: Conversation, *, owner_instructions: str | None = None,
                     project_instructions: str | None = None) -> str:
    """The system instructions a call of this conversation gets: the owner's own, then its project's (issue 30),
    then the conversation's; each read here unless given (the turn lock reads them with the conversation)."""
    if owner_instructions is None:
        owner_instructions = user_instructions(user_id=conversation.owner_id)
    if project_instructions is None and conversation.project_id is not None:
        project_instructions = Project.objects.filter(pk=conversation.project_id).values_list(
            "instructions", flat=True).first()
    parts = [owner_instructions, project_instructions, conversation.instructions]
    return "\n\n".join(part.strip() for part in parts if part and part.strip())


def tool_servers_of(conversation: Conversation) -> list[str] | None:
    """The MCP servers whose tools the conversation's calls are offered (issue 32): its own choice, else its
    project's; None: every server. Read only when there are servers to choose from."""
    if conversation.tool_servers is not None:
        return conversation.tool_servers
    if conversation.project_id is None or not configured():
        return None
    return Project.objects.filter(pk=conversation.project_id).values_list("tool_servers", flat=True).first()


def project_for_user(*, user, project_id: Any) -> Project:
    """The caller's project; anyone else's is a 404, like a missing one (issue 30)."""
    try:
        return Project.objects.get(pk=int(project_id), owner_id=user.pk)
    except (Project.DoesNotExist, TypeError, ValueError, OverflowError):
        raise NotFound("No such project.") from None


def conversation_list(*, user) -> QuerySet[Conversation]:
    return Conversation.objects.filter(owner_id=user.pk).order_by("-updated_at", "-id")


def node_for_user(*, user, node_id: Any) -> Node:
    """Return a node that one of the caller's conversations created or passes through (P3). A node whose
    conversation is gone is theirs only while one of their heads still rests on it: a cleared conversation's
    nodes are not shown again (T11)."""
    try:
        node = Node.objects.select_related("conversation").get(pk=int(node_id), owner_id=user.pk)
    except (Node.DoesNotExist, TypeError, ValueError, OverflowError):
        raise NotFound("No such node.") from None
    if node.conversation_id is not None:
        return node
    sql = f"""
    WITH RECURSIVE below(id) AS (
        SELECT id FROM {_NODE} WHERE id = %(node)s AND owner_id = %(owner)s
        UNION ALL
        SELECT n.id FROM {_NODE} n JOIN below ON n.parent_id = below.id WHERE n.owner_id = %(owner)s
    )
    SELECT 1 FROM {Conversation._meta.db_table} c JOIN below ON c.head_id = below.id
    WHERE c.owner_id = %(owner)s LIMIT 1
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, {"node": node.pk, "owner": user.pk})
        if cursor.fetchone():
            return node
    raise NotFound("No such node.")


def tree_scope(conversation: Conversation, path_ids: Iterable[int]) -> Q:
    """The nodes of a conversation's tree: those it created, and shared ones on its path (P3), all its owner's."""
    return Q(owner_id=conversation.owner_id) & (Q(conversation=conversation) | Q(id__in=list(path_ids)))


def conversation_has_node(*, conversation: Conversation, node_id: int) -> bool:
    """Is `node_id` in the conversation's tree (created by it, or shared history on its path, behind
    compactions too: C3)?"""
    path_ids = history_ids(conversation.head_id, owner=conversation.owner_id)
    return Node.objects.filter(tree_scope(conversation, path_ids), pk=node_id).exists()


def conversation_nodes(*, conversation: Conversation) -> QuerySet[Node]:
    """Every node of the conversation's tree: the ones it created and any shared ones on its history.

    A plain indexed query: tree fields (django-tree-queries) cost seconds on a 2,000-deep conversation.
    """
    path_ids = history_ids(conversation.head_id, owner=conversation.owner_id)
    return Node.objects.filter(tree_scope(conversation, path_ids)).order_by("id")


# What /nodes/ shows of a node (NodeSummaryOut): never its items, which may be large.
NODE_SUMMARY_FIELDS = ("id", "parent", "conversation", "kind", "status", "failure_reason", "provider", "model",
                       "usage", "compacted_from", "created_at", "summary_call", "tokens", "path_tokens")

_SHARED_ON_HISTORY_SQL = f"""{_HISTORY_CTE}
SELECT n.id FROM path JOIN {_NODE} n ON n.id = path.id
WHERE (n.conversation_id IS NULL OR n.conversation_id <> %(conversation)s) AND n.id {{op}} %(bound)s
ORDER BY n.id {{order}} LIMIT %(size)s"""


def node_page(*, conversation: Conversation, after: int | None = None, before: int | None = None,
              size: int) -> tuple[list[Node], bool]:
    """Up to `size` nodes of `conversation_nodes`, in id order, after `after` (or before `before`); and whether
    there are more that way. A keyset page (issue 13): nodes added meanwhile have larger ids, so they never shift
    or repeat a page. Its own nodes come by the (conversation, id) index; shared ones on its history (P3) by one
    walk of ids up the history: the cost follows the page and the path, not the table."""
    backwards = before is not None
    bound = before if backwards else after or 0
    own = Node.objects.of(conversation).filter(**{"id__lt" if backwards else "id__gt": bound})
    nodes = list(own.only(*NODE_SUMMARY_FIELDS).order_by("-id" if backwards else "id")[:size + 1])
    if conversation.head_id is not None:
        sql = _SHARED_ON_HISTORY_SQL.format(op="<" if backwards else ">", order="DESC" if backwards else "ASC")
        with connection.cursor() as cursor:
            cursor.execute(sql, {"node": conversation.head_id, "owner": conversation.owner_id, "conversation":
                                 conversation.pk, "bound": bound, "size": size + 1,
                                 "limit": settings.ARBOR_PATH_DEPTH_LIMIT})
            shared = [row[0] for row in cursor.fetchall()]
        if shared:
            nodes += Node.objects.filter(pk__in=shared).only(*NODE_SUMMARY_FIELDS)
            nodes.sort(key=lambda n: n.pk, reverse=backwards)
    more = len(nodes) > size
    nodes = nodes[:size]
    return (nodes[::-1] if backwards else nodes), more


def turn_start(path: list[PathNode], index: int | None = None) -> int | None:
    """Return the index in `path` of the node that opened the turn holding `path[index]` (default: the head)."""
    position = len(path) - 1 if index is None else index
    while position >= 0:
        if opens_turn(path[position]):
            return position
        position -= 1
    return None


def latest_tip(*, conversation: Conversation, node_id: int) -> int | None:
    """Return the latest node a head can rest on in the branch from `node_id` down, if there is one (T8).

    Down means through children and through compactions (C3): a compaction root has no parent, so the
    branch goes on below the roots whose original lies in it, or a compacted branch could not be reached.
    """
    below = RawSQL(
        f"""WITH RECURSIVE below AS (
            SELECT id FROM {_NODE} WHERE id = %s
            UNION
            SELECT n.id FROM {_NODE} n JOIN below ON n.parent_id = below.id OR n.compacted_from_id = below.id
            WHERE n.owner_id = %s AND n.conversation_id = %s
        ) SELECT id FROM below""",
        [node_id, conversation.owner_id, conversation.pk],
    )
    return Node.objects.can_be_head().filter(id__in=below).aggregate(tip=Max("id"))["tip"]


# Where a conversation's tree leaves its own nodes: what its nodes and its head point at that it did not create
# (shared history, P3; originals and summarising calls of someone else's compaction). No join: the own ids are an
# index-only scan, so the cost follows the conversation, never the table.
_ENTRIES_SQL = f"""
SELECT DISTINCT ref FROM (
    SELECT parent_id AS ref FROM {_NODE} WHERE owner_id = %(owner)s AND conversation_id = %(c)s
    UNION ALL SELECT compacted_from_id FROM {_NODE} WHERE owner_id = %(owner)s AND conversation_id = %(c)s
    UNION ALL SELECT summary_call_id FROM {_NODE} WHERE owner_id = %(owner)s AND conversation_id = %(c)s
    UNION ALL SELECT head_id FROM {Conversation._meta.db_table} WHERE id = %(c)s
) refs
WHERE ref IS NOT NULL AND ref NOT IN (SELECT id FROM {_NODE} WHERE owner_id = %(owner)s AND conversation_id = %(c)s)"""

# From one node up (a walk from one row: index lookups), with what each node's summarising call is.
_ENTRY_WALK_SQL = f"""{_HISTORY_CTE}
SELECT n.id, n.summary_call_id FROM path JOIN {_NODE} n ON n.id = path.id AND n.owner_id = %(owner)s"""


def tree_node_ids(conversation: Conversation) -> array:
    """The ids of every node an export of the conversation holds, ascending, 8 bytes each (issue 13: an export
    then reads the nodes themselves a chunk at a time): its own nodes, its head, and every node they point at,
    transitively (shared history, originals behind a compaction, summarising calls), so its paths are whole."""
    own = array("q", Node.objects.of(conversation).order_by("id")
                .values_list("id", flat=True).iterator(chunk_size=5000))
    with connection.cursor() as cursor:
        cursor.execute(_ENTRIES_SQL, {"c": conversation.pk, "owner": conversation.owner_id})
        todo = [row[0] for row in cursor.fetchall()]
        outside: set[int] = set()
        while todo:  # rare and short: shared history read up to its root, and what its roots point at
            entry = todo.pop()
            if entry in outside:
                continue
            cursor.execute(_ENTRY_WALK_SQL, {"node": entry, "owner": conversation.owner_id,
                                             "limit": settings.ARBOR_PATH_DEPTH_LIMIT})
            for node_id, summary_call in cursor.fetchall():
                outside.add(node_id)
                if summary_call is not None and summary_call not in outside:
                    todo.append(summary_call)
    if not outside:
        return own
    merged = array("q")
    for node_id in heapq.merge(own, sorted(outside)):  # both ascending; a node in both comes once
        if not merged or merged[-1] != node_id:
            merged.append(node_id)
    return merged
