"""The conversation's whole tree as a map (issue 16): one mark per turn, for the chat page's map and the API.

A turn is the node that asked (a question, an edit) with the tool rounds and retries that followed it: a node that
sends only tool results, or nothing (a retry, F1), is folded into the turn above it, so a person sees their
questions, not the calls. A turn's label and star are kept on its first node, which new rounds never change.
Compaction roots hang below the node they compacted (C3), playbook drafts and failures are marks of their own,
side calls (titles, summarising calls, window roots) are not on the map. One query for the nodes, one for the
head's path.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from conversations import items as it
from conversations.models import SIDE_CALL, Conversation, Node
from conversations.selectors import history_ids, tree_scope

SNIPPET_CHARS = 80


@dataclass
class Mark:
    id: int  # the turn's first node: switching there shows this turn's branch (T8); its label and star live here
    parent: int | None  # the mark above; a compaction root's is the mark of the node it compacted
    kind: str
    status: str  # of the turn's last node: how the turn ended
    failure_reason: str
    snippet: str
    label: str
    starred: bool
    on_path: bool
    last: int  # the turn's last node (its outcome)


def _snippet(kind: str, sent: list[dict[str, Any]], question: str | None) -> str:
    if kind == Node.Kind.COMPACTION:
        return "Compacted: the model reads a summary from here"
    text = " ".join((question or "").split())
    if not text:
        return "Tool results" if any(i.get("type") == "tool_result" for i in sent) else "(no question)"
    return text if len(text) <= SNIPPET_CHARS else text[: SNIPPET_CHARS - 1] + "…"


def tree_map(conversation: Conversation) -> dict[str, Any]:
    """`{"head": <mark id>, "nodes": [mark, …]}` in id order (a mark's parent comes before it)."""
    history = history_ids(conversation.head_id, owner=conversation.owner_id)
    on_path = set(history)
    rows = (Node.objects.filter(tree_scope(conversation, history)).exclude(SIDE_CALL).order_by("id")
            .values_list("id", "parent_id", "kind", "status", "failure_reason", "compacted_from_id", "sent", "label",
                         "starred"))
    marks: dict[int, Mark] = {}
    turn_of: dict[int, int] = {}  # node id -> the id of the mark it belongs to
    for node_id, parent, kind, status, reason, compacted_from, sent, label, starred in rows.iterator(chunk_size=2000):
        question = it.question_of(sent)
        above = turn_of.get(parent)
        if (kind == Node.Kind.TURN and question is None and above is not None
                and all(i.get("type") == "tool_result" for i in sent)):
            mark = marks[above]  # a tool round or a retry (F1): part of the turn that asked
            turn_of[node_id] = mark.id
            mark.status, mark.failure_reason, mark.last = status, reason, node_id
            mark.on_path = mark.on_path or node_id in on_path
            continue
        turn_of[node_id] = node_id
        marks[node_id] = Mark(
            id=node_id, parent=above if parent is not None else turn_of.get(compacted_from), kind=kind, status=status,
            failure_reason=reason, snippet=_snippet(kind, sent, question), label=label, starred=starred,
            on_path=node_id in on_path, last=node_id)
    return {"head": turn_of.get(conversation.head_id), "nodes": [asdict(m) for m in marks.values()]}
