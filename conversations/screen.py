"""What a person sees of a conversation: its bubbles in path order, each with its turn's branch place (T8),
compaction markers (C3) and whether it can still be edited (T10). Read by the chat pages and the API."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from django.db import connection
from django.db.models import BooleanField, Q
from django.db.models.expressions import RawSQL

from conversations.context import PathNode, is_compaction_root
from conversations.models import Bubble, Conversation, Node
from conversations.selectors import history_subquery, opens_turn, screen_history

_NODE = Node._meta.db_table


@dataclass(frozen=True)
class BranchInfo:
    index: int
    count: int
    siblings: list[int]


def _asks_question() -> RawSQL:
    """In SQL, `question_of(sent) is not None`: does the node send a user item? (No JSON to decode.)"""
    if connection.vendor == "postgresql":
        sql = f"""jsonb_path_exists({_NODE}.sent, '$[*] ? (@.type == "user")')"""
    else:
        sql = (f"EXISTS (SELECT 1 FROM json_each({_NODE}.sent) "
               "WHERE json_extract(json_each.value, '$.type') = 'user')")
    return RawSQL(sql, [], output_field=BooleanField())


def branch_infos(*, conversation: Conversation, path: list[PathNode]) -> dict[int, BranchInfo]:
    """For every turn-opening node on the path, its place among the turns that share its parent (T8).

    A turn whose parent is a compaction root counts as a child of the root's original (C3): an edit or a
    question that compacted first hangs below a new root, yet it is another version of the turns below
    that original, so both stay siblings on the screen (T7).
    """
    openers = [p for p in path if opens_turn(p)]
    if not openers:
        return {}
    on_path = {p.id: p for p in path}

    def key_of(parent_id: int | None) -> int | None:
        parent = on_path.get(parent_id)
        return parent.compacted_from_id if parent is not None and is_compaction_root(parent) else parent_id

    # Subqueries over the history of the path's tip (a superset of the path), not lists of thousands of
    # ids: the turns below any of its nodes are read, those below other parents than the openers' dropped.
    history = history_subquery(path[-1].id)
    scope = Q(conversation=conversation) | Q(id__in=history)
    keys = {key_of(p.parent_id) for p in openers}  # None: the first question's versions
    # The roots made from those originals: the turns below them are siblings too. A conversation makes
    # few roots (one every few turns): read its own, plus shared ones on the path (P3), and pick here.
    roots = {root_id: original for root_id, original in Node.objects.filter(
        Q(conversation=conversation) | Q(id__in=[p.id for p in path if is_compaction_root(p)]),
        kind=Node.Kind.COMPACTION, parent__isnull=True, window_root=False).values_list("id", "compacted_from_id")
        if original in keys}
    below = Q(parent_id__in=history) | Q(parent_id__in=roots.keys())
    if any(p.parent_id is None for p in openers):
        below |= Q(parent__isnull=True, conversation=conversation)
    candidates = (Node.objects.can_be_head().filter(scope, below, kind=Node.Kind.TURN)
                  .alias(asks=_asks_question()).filter(asks=True).values_list("id", "parent_id"))
    by_key: dict[int | None, list[int]] = {}
    for node_id, parent_id in candidates.order_by("id"):
        key = roots.get(parent_id, parent_id)
        if key in keys:
            by_key.setdefault(key, []).append(node_id)
    infos = {}
    for opener in openers:
        siblings = by_key.get(key_of(opener.parent_id)) or [opener.id]
        if opener.id not in siblings:
            siblings = sorted([*siblings, opener.id])
        infos[opener.id] = BranchInfo(index=siblings.index(opener.id) + 1, count=len(siblings), siblings=siblings)
    return infos


class ShownBubble(NamedTuple):
    """The columns of a bubble the screen, the API and exports read (a NamedTuple: a long history shows
    tens of thousands, and model instances cost more than the query). `id` is None for a marker."""

    id: int | None
    node_id: int
    role: str
    content: str
    data: dict[str, Any]

    @property
    def pk(self) -> int | None:
        return self.id


class BubbleView(NamedTuple):
    bubble: ShownBubble
    branch: BranchInfo | None
    # T10: a question behind a compaction root cannot be edited (nor regenerated) any more.
    editable: bool = True


COMPACTION_ROLE = "compaction"


def _compaction_marker(root: PathNode) -> ShownBubble:
    """A bubble-like entry, never saved, where a compaction happened on the shown history."""
    return ShownBubble(None, root.id, COMPACTION_ROLE,
                       "Earlier messages were compacted: from here on the model sees a summary of them.",
                       {"compaction": root.id, "compacted_from": root.compacted_from_id})


def path_bubbles(*, conversation: Conversation, path: list[PathNode] | None = None) -> list[BubbleView]:
    """The bubbles of the nodes on the path, in path order, each with its turn's branch info (T8).

    Reads the history of the path's tip (default: the head) with `screen_history`, then its bubbles in
    one query. Behind a compaction root the original path's bubbles are shown too (C3), with a marker entry
    (role `compaction`, no id) where compaction happened; bubbles before the last one are not editable.
    """
    tip = conversation.head_id if path is None else path[-1].id if path else None
    return screen_bubbles(conversation=conversation, tip=tip)[0]


def screen_bubbles(*, conversation: Conversation, tip: int | None, last: int | None = None
                   ) -> tuple[list[BubbleView], bool]:
    """`path_bubbles` for the last `last` nodes of the history only; also say whether earlier ones were left out.

    A long conversation's screen shows its end: the history, branch infos and bubbles are then read for
    those nodes alone, so the cost follows `last`, not the whole history. (Whatever lies before the shown
    part, every shown node is after its compaction roots that are not shown: editability needs no more.)
    """
    path = screen_history(tip, last=last)
    if not path:
        return [], False
    hidden = last is not None and len(path) > last
    if hidden:
        path = path[1:]  # the one read past the window: it only says there is more
    last_root = max((i for i, p in enumerate(path) if is_compaction_root(p)), default=-1)
    order = {p.id: i for i, p in enumerate(path)}
    infos = branch_infos(conversation=conversation, path=path)
    opener_of: dict[int, int] = {}
    current: int | None = None
    for p in path:
        if p.id in infos:
            current = p.id
        if current is not None:
            opener_of[p.id] = current
    nodes = [p.id for p in path] if hidden else history_subquery(path[-1].id)
    shown = Bubble.objects.filter(node_id__in=nodes).values_list("id", "node_id", "role", "content", "data")
    bubbles = [*(ShownBubble(*row) for row in shown),
               *(_compaction_marker(p) for p in path if is_compaction_root(p))]
    bubbles.sort(key=lambda b: (order[b.node_id], b.id or 0))
    views = [BubbleView(bubble=b, branch=None if b.pk is None else infos.get(opener_of.get(b.node_id, -1)),
                        editable=order[b.node_id] > last_root) for b in bubbles]
    return views, hidden


@dataclass(frozen=True)
class Message:
    """One bubble as the chat shows it: the bubble, its turn's branch place, what its controls act on."""

    bubble: Bubble
    branch: BranchInfo | None
    is_head: bool
    editable: bool = True  # T10: nothing before the latest compaction is edited, regenerated or switched

    @property
    def question_node(self) -> int | None:
        """The node that sent this bubble's question: what ✎, ↻ and compare act on."""
        return self.branch.siblings[self.branch.index - 1] if self.branch else None

    @property
    def has_siblings(self) -> bool:
        return bool(self.editable and self.branch and self.branch.count > 1)

    @property
    def previous_sibling(self) -> int | None:
        return self.branch.siblings[self.branch.index - 2] if self.has_siblings and self.branch.index > 1 else None

    @property
    def next_sibling(self) -> int | None:
        if self.has_siblings and self.branch.index < self.branch.count:
            return self.branch.siblings[self.branch.index]
        return None

    @property
    def other_sibling(self) -> int | None:
        """The sibling a compare link opens next to this one."""
        return self.next_sibling or self.previous_sibling

    @property
    def can_retry(self) -> bool:
        """F1: a failed call at the head can be called again; an overflow (F2) needs a shorter context."""
        return (self.bubble.role == Bubble.Role.ERROR and self.is_head
                and self.bubble.data.get("reason") != Node.FailureReason.CONTEXT_OVERFLOW)
