"""What a person sees of a conversation: its bubbles in path order, each with its turn's branch place (T8),
compaction markers (C3) and whether it can still be edited (T10). Read by the chat pages and the API a page at a
time (issue 13): a page costs what it shows, never the whole history or the node table."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from django.db.models import BooleanField, Q
from django.db.models.expressions import RawSQL

from conversations import items as it
from conversations.context import PathNode, is_compaction_root
from conversations.models import Bubble, Conversation, Node
from conversations.selectors import (
    Stretch,
    asks_question_sql,
    history_after,
    history_before,
    history_walk,
    opens_turn,
    screen_history,
    turn_opener,
)

_NODE = Node._meta.db_table
CHUNK = 500  # nodes whose branch places and bubbles one query reads, when a whole history is read


@dataclass(frozen=True)
class BranchInfo:
    """A turn's place among the turns that share its parent (T8). `siblings` are all of them, oldest first;
    `versions` the same turns grouped by the question they ask: an edit starts a group, a regenerate (T7, the
    same question again) joins its question's. The question's ◀ ▶ step through the groups, the answer's
    through the group."""

    index: int
    count: int
    siblings: list[int]
    versions: tuple[tuple[int, ...], ...] = ()

    @property
    def version(self) -> int:
        """The index, in `versions`, of the group this turn is in."""
        opener = self.siblings[self.index - 1]
        return next((i for i, group in enumerate(self.versions) if opener in group), 0)

    @property
    def regenerations(self) -> tuple[int, ...]:
        """The turns that ask this turn's question (itself among them), oldest first."""
        return self.versions[self.version] if self.versions else (self.siblings[self.index - 1],)


def branch_infos(*, conversation: Conversation, path: list[PathNode],
                 known: Iterable[PathNode] = ()) -> dict[int, BranchInfo]:
    """For every turn-opening node in `path`, its place among the turns that share its parent (T8).

    A turn whose parent is a compaction root counts as a child of the root's original (C3): an edit or a
    question that compacted first hangs below a new root, yet it is another version of the turns below that
    original, so both stay siblings on the screen (T7).

    `path` is any stretch of a history, a page say: the cost follows its openers, never the history or the node
    table (issue 13). Siblings are found by their parents (an index); of them count the conversation's own and
    the openers themselves (a shared history, P3, holds one turn below each of its nodes: the one on the path).
    A parent that is neither in `path` nor in `known` (the node before the page) is read, at most one.
    """
    openers = [p for p in path if opens_turn(p)]
    if not openers:
        return {}
    nodes = _with_parents(conversation, openers, {p.id: p for p in (*known, *path)})

    def key_of(parent_id: int | None) -> int | None:
        parent = nodes.get(parent_id)
        return parent.compacted_from_id if parent is not None and is_compaction_root(parent) else parent_id

    keys = {key_of(p.parent_id) for p in openers}  # None: the first question's versions
    roots = _roots_of(conversation, openers, nodes, originals=keys - {None})
    by_key = _siblings(conversation, keys, roots, opener_ids={p.id for p in openers})
    asked = {p.id: it.question_of(p.sent) for p in openers}
    infos = {}
    for opener in openers:
        found = by_key.get(key_of(opener.parent_id)) or {}
        questions = {opener.id: asked[opener.id], **found}
        siblings = sorted(questions)
        infos[opener.id] = BranchInfo(index=siblings.index(opener.id) + 1, count=len(siblings), siblings=siblings,
                                      versions=_versions(siblings, questions))
    return infos


def _versions(siblings: list[int], questions: dict[int, str | None]) -> tuple[tuple[int, ...], ...]:
    """`siblings` grouped by the question each asks, groups in the order their first turn was made."""
    groups: dict[str | None, list[int]] = {}
    for node_id in siblings:
        groups.setdefault(questions[node_id], []).append(node_id)
    return tuple(tuple(group) for group in groups.values())


def _with_parents(conversation: Conversation, openers: list[PathNode], nodes: dict[int, PathNode]
                  ) -> dict[int, PathNode]:
    """`nodes` and the openers' parents it lacks (one query; at most the node before a page)."""
    missing = {p.parent_id for p in openers if p.parent_id is not None} - nodes.keys()
    if missing:
        found = Node.objects.filter(owner_id=conversation.owner_id, pk__in=missing)
        for row in found.values_list("id", "parent_id", "kind", "compacted_from_id"):
            nodes[row[0]] = PathNode(row[0], row[1], row[2], "", [], [], compacted_from_id=row[3])
    return nodes


def _roots_of(conversation: Conversation, openers: list[PathNode], nodes: dict[int, PathNode], *,
              originals: set[int]) -> dict[int, int]:
    """The compaction roots made from `originals` (root id → original): the turns below them are siblings of
    the turns below their originals too. The conversation's own (a partial index holds each conversation's
    parentless nodes), and a shared one an opener hangs below (P3)."""
    roots = {p.id: p.compacted_from_id for p in map(nodes.get, {o.parent_id for o in openers})
             if p is not None and is_compaction_root(p) and p.compacted_from_id in originals}
    if originals:
        roots.update(Node.objects.filter(
            owner_id=conversation.owner_id, conversation=conversation, parent__isnull=True,
            kind=Node.Kind.COMPACTION, window_root=False,
            compacted_from_id__in=originals).values_list("id", "compacted_from_id"))
    return roots


def _siblings(conversation: Conversation, keys: set[int | None], roots: dict[int, int], *,
              opener_ids: set[int]) -> dict[int | None, dict[int, str | None]]:
    """The question-asking turns below each key (a parent, or None for the first question), each with its
    question: the conversation's own, and the openers themselves."""
    originals = keys - {None}
    below = Q(parent_id__in=[*originals, *roots])
    if None in keys:
        below |= Q(parent__isnull=True, conversation=conversation)
    candidates = (Node.objects.can_be_head().filter(below, owner_id=conversation.owner_id, kind=Node.Kind.TURN)
                  .alias(asks=RawSQL(asks_question_sql(_NODE), [], output_field=BooleanField())).filter(asks=True)
                  .filter(Q(conversation=conversation) | Q(pk__in=opener_ids))
                  .values_list("id", "parent_id", "sent"))
    by_key: dict[int | None, dict[int, str | None]] = {}
    for node_id, parent_id, sent in candidates:
        key = roots.get(parent_id, parent_id)
        if key in keys:
            by_key.setdefault(key, {})[node_id] = it.question_of(sent)
    return by_key


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
_BUBBLE_COLUMNS = ("id", "node_id", "role", "content", "data")


def _compaction_marker(root_id: int, original: int | None) -> ShownBubble:
    """A bubble-like entry, never saved, where a compaction happened on the shown history."""
    return ShownBubble(None, root_id, COMPACTION_ROLE,
                       "Earlier messages were compacted: from here on the model sees a summary of them.",
                       {"compaction": root_id, "compacted_from": original})


def _bubbles_of(path: list[PathNode], owner: int) -> list[ShownBubble]:
    """The bubbles of `path`'s nodes and a marker at each compaction root, in path order (one query)."""
    order = {p.id: i for i, p in enumerate(path)}
    shown = Bubble.objects.filter(owner_id=owner, node_id__in=list(order)).values_list(*_BUBBLE_COLUMNS)
    bubbles = [*(ShownBubble(*row) for row in shown),
               *(_compaction_marker(p.id, p.compacted_from_id) for p in path if is_compaction_root(p))]
    bubbles.sort(key=lambda b: (order[b.node_id], b.id or 0))
    return bubbles


def _views(conversation: Conversation, stretch: Stretch, *, sealed: int) -> list[BubbleView]:
    """The bubbles of a stretch of history, each with its turn's branch place (T8); those of its first `sealed`
    nodes lie behind a compaction root and cannot be edited (T10).

    A stretch may begin inside a turn (a page boundary between a question and its tool rounds): that turn's
    opener is then found above it, walking up no further than it, so its answers keep their branch place.
    """
    path = stretch.nodes
    if not path:
        return []
    lead = stretch.before
    if opens_turn(path[0]) or lead is None:
        lead = None
    elif not opens_turn(lead):
        lead = turn_opener(lead.id, owner=conversation.owner_id)
    rows = [lead, *path] if lead is not None else path
    infos = branch_infos(conversation=conversation, path=rows, known=[stretch.before] if stretch.before else [])
    opener_of: dict[int, int] = {}
    current: int | None = None
    for p in rows:
        if p.id in infos:
            current = p.id
        if current is not None:
            opener_of[p.id] = current
    order = {p.id: i for i, p in enumerate(path)}
    return [BubbleView(bubble=b, branch=None if b.pk is None else infos.get(opener_of.get(b.node_id, -1)),
                       editable=order[b.node_id] >= sealed) for b in _bubbles_of(path, conversation.owner_id)]


@dataclass(frozen=True)
class BubblePage:
    """One page of a history's bubbles (issue 13), and where the pages next to it start."""

    views: list[BubbleView]
    tip: int | None  # the node whose history the page lies on
    first: int | None  # its first and last nodes; None for an empty page
    last: int | None
    has_before: bool  # are there nodes before `first`, after `last`?
    has_after: bool
    sealed: bool  # T10: a compaction root lies at or after `first`: nothing before it can be edited
    ahead: tuple[int, ...] = ()  # the last nodes of the next pages, as far as the walk saw them
    root: int | None = None  # the latest compaction root after `last` (T10 for the next pages)


def _page(conversation: Conversation, tip: int | None, stretch: Stretch, *, sealed: int) -> BubblePage:
    path = stretch.nodes
    return BubblePage(views=_views(conversation, stretch, sealed=sealed), tip=tip,
                      first=path[0].id if path else None, last=path[-1].id if path else None,
                      has_before=stretch.before is not None, has_after=stretch.more, sealed=sealed > 0,
                      ahead=stretch.marks, root=stretch.root)


EMPTY = Stretch([], None, False, 0)
MARKS = 16  # the next pages' ends a forward page hands on: one walk from the tip serves that many pages


def bubbles_after(*, conversation: Conversation, tip: int | None, after: int | None = None, size: int,
                  ahead: tuple[int, ...] = (), root: int | None = None) -> BubblePage | None:
    """The bubbles of up to `size` nodes of `tip`'s history after node `after` (from the root without it).

    Read by walking up from the tip no further than `after`; the page also names the ends of the next MARKS
    pages. Given those (`ahead`, from the page before, with its `root`), the walk starts at this page's end and
    costs the page alone. None when `after` is not on the history walked.
    """
    if tip is None:
        return _page(conversation, tip, EMPTY, sealed=0)
    if ahead:
        stretch = history_after(ahead[0], owner=conversation.owner_id, after=after, size=size, root=root)
        if stretch is not None:  # a mark is never the tip: more follows it
            stretch = stretch._replace(more=True, marks=tuple(ahead[1:]))
    else:
        stretch = history_after(tip, owner=conversation.owner_id, after=after, size=size, marks=MARKS)
    return None if stretch is None else _page(conversation, tip, stretch, sealed=stretch.sealed)


def bubbles_before(*, conversation: Conversation, tip: int | None, before: int, size: int,
                   sealed: bool) -> BubblePage:
    """The bubbles of the `size` nodes of the history just before node `before`, read by walking up from it
    `size` + 2 steps (its history is the same whatever the head did since). `sealed`: a compaction root lies at
    or after `before` (T10), which this page cannot see."""
    stretch = history_before(before, owner=conversation.owner_id, size=size)
    return _page(conversation, tip, stretch, sealed=len(stretch.nodes) if sealed else stretch.sealed)


def latest_bubbles(*, conversation: Conversation, tip: int | None, size: int) -> BubblePage:
    """The bubbles of the last `size` nodes of `tip`'s history: what the chat screen opens on."""
    stretch = (history_before(tip, owner=conversation.owner_id, size=size, include=True) if tip is not None
               else EMPTY)
    return _page(conversation, tip, stretch, sealed=stretch.sealed)


def path_bubbles(*, conversation: Conversation, path: list[PathNode] | None = None) -> list[BubbleView]:
    """The bubbles of the nodes on the path, in path order, each with its turn's branch info (T8): all of them, in
    memory (pages are what a request should read: `latest_bubbles`, `bubbles_before`, `bubbles_after`).

    Reads the history of the path's tip (default: the head) with `screen_history` in one walk, then its branch
    places and bubbles CHUNK nodes at a time. Behind a compaction root the original path's bubbles are shown too
    (C3), with a marker entry (role `compaction`, no id) where compaction happened; bubbles before the last one are
    not editable.
    """
    tip = conversation.head_id if path is None else path[-1].id if path else None
    history = screen_history(tip, owner=conversation.owner_id)
    sealed = max((i + 1 for i, p in enumerate(history) if is_compaction_root(p)), default=0)
    views: list[BubbleView] = []
    for start in range(0, len(history), CHUNK):
        stretch = Stretch(history[start:start + CHUNK], history[start - 1] if start else None, False, 0)
        views += _views(conversation, stretch, sealed=max(0, sealed - start))
    return views


def history_bubbles(tip: int | None, *, owner: int, chunk_nodes: int = 100) -> Iterator[ShownBubble]:
    """Every bubble of `tip`'s history in order, with the compaction markers, the bubbles of `chunk_nodes` nodes
    in memory at a time and no branch places: for exports (issue 13)."""
    ids, roots = history_walk(tip, owner=owner)
    for start in range(0, len(ids), chunk_nodes):
        chunk = ids[start:start + chunk_nodes]
        order = {node_id: i for i, node_id in enumerate(chunk)}
        shown = [ShownBubble(*row) for row in
                 Bubble.objects.filter(owner_id=owner, node_id__in=list(chunk)).values_list(*_BUBBLE_COLUMNS)]
        shown += [_compaction_marker(node_id, roots[node_id]) for node_id in chunk if node_id in roots]
        shown.sort(key=lambda b: (order[b.node_id], b.id or 0))
        yield from shown


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
    def has_versions(self) -> bool:
        """Was the question edited: do the question's ◀ ▶ show?"""
        return self.has_siblings and len(self.branch.versions) > 1

    @property
    def has_regenerations(self) -> bool:
        """Was the answer regenerated: do the answer's ◀ ▶ show?"""
        return self.has_siblings and len(self.branch.regenerations) > 1

    def _step(self, steps: tuple[int, ...], here: int, by: int) -> int | None:
        return steps[here + by] if 0 <= here + by < len(steps) else None

    @property
    def previous_version(self) -> int | None:
        """The previous question's latest answer (its newest regeneration)."""
        versions = self.branch.versions
        return versions[self.branch.version - 1][-1] if self.has_versions and self.branch.version > 0 else None

    @property
    def next_version(self) -> int | None:
        versions = self.branch.versions
        if self.has_versions and self.branch.version + 1 < len(versions):
            return versions[self.branch.version + 1][-1]
        return None

    @property
    def regeneration_index(self) -> int:
        return self.branch.regenerations.index(self.question_node) + 1 if self.branch else 1

    @property
    def previous_regeneration(self) -> int | None:
        return self._step(self.branch.regenerations, self.regeneration_index - 1, -1) if self.branch else None

    @property
    def next_regeneration(self) -> int | None:
        return self._step(self.branch.regenerations, self.regeneration_index - 1, 1) if self.branch else None

    @property
    def other_sibling(self) -> int | None:
        """The sibling a compare link opens next to this one."""
        siblings, index = self.branch.siblings, self.branch.index
        return siblings[index] if index < len(siblings) else siblings[index - 2]

    @property
    def can_retry(self) -> bool:
        """F1: a failed call at the head can be called again; an overflow (F2) needs a shorter context."""
        return (self.bubble.role == Bubble.Role.ERROR and self.is_head
                and self.bubble.data.get("reason") != Node.FailureReason.CONTEXT_OVERFLOW)
