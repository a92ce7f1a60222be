"""Reads and access checks. Nothing here writes."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Max, Q, QuerySet
from django.db.models.expressions import RawSQL

from config.errors import NotFound
from conversations.context import PathNode, is_compaction_root, readable_by
from conversations.errors import CorruptTree
from conversations.items import question_of
from conversations.models import Conversation, Node, Preferences

_NODE = Node._meta.db_table
_PATH_COLUMNS = "id, parent_id, kind, status, sent, received, provider, model, tokens, path_tokens, compacted_from_id"
_UP_COLUMNS = ", ".join(f"n.{c.strip()}" for c in _PATH_COLUMNS.split(","))


def _up_sql(step: str) -> str:
    """One upward recursive query from a node: its cost follows the path's depth, never the table's
    size (T5). The depth guard stops a corrupt loop instead of recursing for ever."""
    return f"""
    WITH RECURSIVE path AS (
        SELECT {_PATH_COLUMNS}, 0 AS depth FROM {_NODE} WHERE id = %s
        UNION ALL
        SELECT {_UP_COLUMNS}, path.depth + 1
        FROM {_NODE} n JOIN path ON n.id = {step}
        WHERE path.depth < %s
    )
    SELECT {_PATH_COLUMNS} FROM path ORDER BY depth DESC
    """


# Assembly's path stops at a compaction root (C2); the history behind it goes on through the
# root's original (C3), for the screen and for T10.
_PATH_SQL = _up_sql("path.parent_id")
_HISTORY_SQL = _up_sql("COALESCE(path.parent_id, path.compacted_from_id)")


# The history's ids alone, and the few columns the screen needs (no items but a turn's sent items, to
# tell questions): membership checks and the screen read thousands of nodes behind the roots.
_HISTORY_CTE = f"""
WITH RECURSIVE path AS (
    SELECT id, parent_id, compacted_from_id, 0 AS depth FROM {_NODE} WHERE id = %s
    UNION ALL
    SELECT n.id, n.parent_id, n.compacted_from_id, path.depth + 1
    FROM {_NODE} n JOIN path ON n.id = COALESCE(path.parent_id, path.compacted_from_id)
    WHERE path.depth < %s
)"""
_HISTORY_IDS_SQL = f"{_HISTORY_CTE} SELECT id FROM path ORDER BY depth"
_SCREEN_SQL = f"""{_HISTORY_CTE}
SELECT n.id, n.parent_id, n.kind, n.status, CASE WHEN n.kind = 'turn' THEN n.sent END, n.compacted_from_id
FROM path JOIN {_NODE} n ON n.id = path.id ORDER BY path.depth DESC"""


def history_subquery(head_id: int) -> RawSQL:
    """The history's ids as a subquery (`id__in=`): no id list travels to the database and back."""
    return RawSQL(f"{_HISTORY_CTE} SELECT id FROM path", [head_id, settings.ARBOR_PATH_DEPTH_LIMIT])


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str | bytes) else value


def _rows_up(sql: str, head_id: int | None) -> list[tuple]:
    """Run an upward recursive query from `head_id` with its depth guard; a loop is a corrupt tree."""
    if head_id is None:
        return []
    limit = settings.ARBOR_PATH_DEPTH_LIMIT
    with connection.cursor() as cursor:
        cursor.execute(sql, [head_id, limit])
        rows = cursor.fetchall()
    if len(rows) > limit:
        raise CorruptTree(f"the path from node {head_id} is deeper than {limit} nodes: the tree has a loop")
    return rows


def _read_up(sql: str, head_id: int | None) -> list[PathNode]:
    rows = _rows_up(sql, head_id)
    return [PathNode(r[0], r[1], r[2], r[3], _json(r[4]), _json(r[5]), r[6], r[7], r[8], r[9], r[10]) for r in rows]


def node_path(head_id: int | None) -> list[PathNode]:
    """Return the path from the root (or the compaction node) down to `head_id`, in one query."""
    return _read_up(_PATH_SQL, head_id)


def path_node(node: Node, *, shift: int = 0) -> PathNode:
    """A node already in memory as a path entry (what `node_path` would have read for it)."""
    return PathNode(id=node.pk, parent_id=node.parent_id, kind=node.kind, status=node.status, sent=node.sent,
                    received=node.received, provider=node.provider, model=node.model, tokens=node.tokens,
                    path_tokens=node.path_tokens + shift, compacted_from_id=node.compacted_from_id, shift=shift)


def history_path(head_id: int | None) -> list[PathNode]:
    """Return everything the conversation went through to reach `head_id`, in one query: the path, and
    behind each compaction root its original path (C3). The roots stay in the list, where they happened."""
    return _read_up(_HISTORY_SQL, head_id)


def history_ids(head_id: int | None) -> list[int]:
    """The ids of `history_path(head_id)`, head first, without reading any items: for membership checks
    (T10, switching) that would otherwise read the whole history's JSON."""
    return [row[0] for row in _rows_up(_HISTORY_IDS_SQL, head_id)]


def screen_history(head_id: int | None, *, last: int | None = None) -> list[PathNode]:
    """`history_path` for the screen, in one query: ids, links, kind and status, and only a turn's sent
    items (to tell questions, T8); no received items, nothing of a compaction root's kept turns.

    With `last`, the recursion stops after that many nodes above the head and one more, which only says
    there is more: the end of a long history costs what it shows.
    """
    if last is None:
        rows = _rows_up(_SCREEN_SQL, head_id)
    elif head_id is None:
        rows = []
    else:
        with connection.cursor() as cursor:
            cursor.execute(_SCREEN_SQL, [head_id, last])
            rows = cursor.fetchall()
    return [PathNode(r[0], r[1], r[2], r[3], _json(r[4]) or [], [], compacted_from_id=r[5]) for r in rows]


def context_path(path: list[PathNode], provider: str | None) -> list[PathNode]:
    """The path a call to `provider` assembles from (C3): when `provider` cannot read the compaction
    result the path starts with, the original path behind it takes the root's place, recursively.

    Token counts after the root are moved onto the expanded path so budget checks stay O(1).
    """
    if not path or not is_compaction_root(path[0]) or readable_by(path[0].sent, provider):
        return path
    original = context_path(node_path(path[0].compacted_from_id), provider)
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


def instructions_for(conversation: Conversation) -> str:
    """The system instructions a call of this conversation gets: the owner's own, then the conversation's."""
    parts = [user_instructions(user_id=conversation.owner_id), conversation.instructions]
    return "\n\n".join(part.strip() for part in parts if part and part.strip())


def conversation_list(*, user) -> QuerySet[Conversation]:
    return Conversation.objects.filter(owner_id=user.pk).order_by("-updated_at", "-id")


def node_for_user(*, user, node_id: Any) -> Node:
    """Return a node that one of the caller's conversations created or passes through (P3)."""
    try:
        node = Node.objects.select_related("conversation").get(pk=int(node_id))
    except (Node.DoesNotExist, TypeError, ValueError):
        raise NotFound("No such node.") from None
    if node.conversation is not None and node.conversation.owner_id == user.pk:
        return node
    # Shared history (its creator is gone or is not the caller's): is it on one of the caller's paths?
    sql = f"""
    WITH RECURSIVE below(id) AS (
        SELECT id FROM {_NODE} WHERE id = %s
        UNION ALL
        SELECT n.id FROM {_NODE} n JOIN below ON n.parent_id = below.id
    )
    SELECT 1 FROM {Conversation._meta.db_table} c JOIN below ON c.head_id = below.id
    WHERE c.owner_id = %s LIMIT 1
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [node.pk, user.pk])
        if cursor.fetchone():
            return node
    raise NotFound("No such node.")


def tree_scope(conversation: Conversation, path_ids: Iterable[int]) -> Q:
    """The nodes of a conversation's tree: those it created, and shared ones on its path (P3)."""
    return Q(conversation=conversation) | Q(id__in=list(path_ids))


def conversation_has_node(*, conversation: Conversation, node_id: int) -> bool:
    """Is `node_id` in the conversation's tree (created by it, or shared history on its path, behind
    compactions too: C3)?"""
    path_ids = history_ids(conversation.head_id)
    return Node.objects.filter(tree_scope(conversation, path_ids), pk=node_id).exists()


def conversation_nodes(*, conversation: Conversation) -> QuerySet[Node]:
    """Every node of the conversation's tree: the ones it created and any shared ones on its history.

    A plain indexed query: tree fields (django-tree-queries) cost seconds on a 2,000-deep conversation.
    """
    return Node.objects.filter(tree_scope(conversation, history_ids(conversation.head_id))).order_by("id")


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
            WHERE n.conversation_id = %s
        ) SELECT id FROM below""",
        [node_id, conversation.pk],
    )
    return Node.objects.can_be_head().filter(id__in=below).aggregate(tip=Max("id"))["tip"]


NODE_REFERENCES = ("parent_id", "compacted_from_id", "summary_call_id")


def tree_nodes(conversation: Conversation) -> list[Node]:
    """The conversation's nodes, plus every node they point at (shared history, originals behind a
    compaction, summarising calls), so the export holds everything its paths need."""
    ids = set(conversation_nodes(conversation=conversation).values_list("id", flat=True))
    ids |= set(history_ids(conversation.head_id))
    while True:
        refs = Node.objects.filter(pk__in=ids).values_list(*NODE_REFERENCES)
        missing = {ref for row in refs for ref in row if ref is not None} - ids
        if not missing:
            break
        for node_id in missing:  # rare: shared history of another conversation, read up to its root
            ids |= set(history_ids(node_id))
    return list(Node.objects.filter(pk__in=ids).order_by("id"))
