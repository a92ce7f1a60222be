"""Reads and access checks for playbooks. Nothing here writes."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db.models import QuerySet

from config.errors import NotFound
from conversations import items as it
from conversations.context import PathNode
from conversations.models import Conversation, Node
from conversations.selectors import conversation_nodes, node_path, opens_turn
from conversations.tools import get_tool
from playbooks import schema
from playbooks.models import Playbook, PlaybookRun, PlaybookVersion


def playbook_list(*, user) -> QuerySet[Playbook]:
    return Playbook.objects.filter(owner_id=user.pk).order_by("-updated_at", "-id")


def playbook_for_user(*, user, playbook_id: Any) -> Playbook:
    """Return the caller's playbook; anyone else's is a 404, like a missing one."""
    try:
        return Playbook.objects.get(pk=int(playbook_id), owner_id=user.pk)
    except (Playbook.DoesNotExist, TypeError, ValueError):
        raise NotFound("No such playbook.") from None


_NODE = Node._meta.db_table
# Up from each version's last try while the nodes are tries (kind `playbook`), in one recursive query:
# every chain of a playbook at once, each row tagged with the try it was reached from.
_CHAINS_SQL = f"""
    WITH RECURSIVE chain(tip, id, parent_id) AS (
        SELECT id, id, parent_id FROM {_NODE} WHERE id IN ({{tips}}) AND kind = %s
        UNION ALL
        SELECT chain.tip, n.id, n.parent_id FROM {_NODE} n JOIN chain ON n.id = chain.parent_id WHERE n.kind = %s
    )
    SELECT n.*, chain.tip AS chain_tip FROM {_NODE} n JOIN chain ON n.id = chain.id ORDER BY chain.tip, n.id
"""


def conversion_chains(node_ids: Iterable[int]) -> dict[int, list[Node]]:
    """The tries of each conversion ending at one of `node_ids`, first to last, in one query (P1, N4).

    A retry is created after, and below, the try before it, so id order is try order.
    """
    tips = sorted(set(node_ids))
    chains: dict[int, list[Node]] = {tip: [] for tip in tips}
    if not tips:
        return chains
    sql = _CHAINS_SQL.format(tips=", ".join(["%s"] * len(tips)))
    for node in Node.objects.raw(sql, [*tips, Node.Kind.PLAYBOOK, Node.Kind.PLAYBOOK]):
        chains[node.chain_tip].append(node)
    return chains


def conversion_chain(node_id: int) -> list[Node]:
    """The tries of one conversion, first to last (P1)."""
    return conversion_chains([node_id])[node_id]


def playbook_versions(playbook: Playbook) -> list[PlaybookVersion]:
    return list(playbook.versions.order_by("-number"))


# --- runs (S5, S4) -----------------------------------------------------------------------------------------


@dataclass
class RunView:
    """A run as it stands now, read from its conversation: an approved run shows its later state."""

    run: PlaybookRun
    status: str  # done | approval_required | failed | running | deleted (the run's conversation is gone)
    answer: str | None = None
    head: int | None = None
    nodes: list[Node] = field(default_factory=list)  # the run's path, and a turn still going below its head
    approval_required: list[dict[str, Any]] = field(default_factory=list)
    error: dict[str, Any] | None = None
    deviated: bool = False  # the tool calls on the run's path are not the rendered tool steps (S4)


def run_list(*, playbook: Playbook) -> QuerySet[PlaybookRun]:
    return playbook.runs.select_related("conversation").order_by("-id")


def run_for_user(*, user, playbook_id: Any, run_id: Any) -> PlaybookRun:
    """The caller's run of the caller's playbook; anything else is a 404."""
    playbook = playbook_for_user(user=user, playbook_id=playbook_id)
    try:
        return playbook.runs.select_related("conversation", "playbook_version").get(pk=int(run_id))
    except (PlaybookRun.DoesNotExist, TypeError, ValueError):
        raise NotFound("No such run.") from None


def _call_of(item: dict[str, Any]) -> dict[str, Any]:
    return {"call_id": item["id"], "name": item["name"], "arguments": item["arguments"]}


def expected_calls(run: PlaybookRun) -> list[tuple[str, Any]] | None:
    """The tool calls the run's steps ask for, rendered with its values; None when they cannot be known."""
    version = run.playbook_version
    if version is None:
        return None
    try:
        steps = [schema.render_step(step, run.values) for step in version.definition["steps"]]
    except (schema.UnsafeReference, KeyError):
        return None
    return [(step["tool"], step["arguments"]) for step in steps if "tool" in step]


def run_calls(path: list[PathNode]) -> list[tuple[str, Any]]:
    """The tool calls the model made in the run's turn (the first question on the path, up to the next)."""
    calls: list[tuple[str, Any]] = []
    for index, node in enumerate(path):
        if index and opens_turn(node):
            break
        for call in it.tool_calls(node.received):
            try:
                arguments = json.loads(call.get("arguments") or "{}")
            except json.JSONDecodeError:
                arguments = call.get("arguments")
            calls.append((call["name"], arguments))
    return calls


def run_deviated(run: PlaybookRun, path: list[PathNode], *, finished: bool) -> bool:
    """S4: did the model call other tools, or the same with other arguments, than the steps as rendered?

    A finished run must have made exactly the steps' calls; a paused or failed one, a first part of them.
    """
    expected = expected_calls(run)
    if expected is None:
        return False
    made = run_calls(path)
    return made != (expected if finished else expected[:len(made)])


def _below(nodes: list[Node], head_id: int | None) -> list[Node]:
    """The newest chain of turn nodes hanging below the head: a turn still going, or one that failed (F2)."""
    chain: list[Node] = []
    parent = head_id
    while True:
        children = [n for n in nodes if n.parent_id == parent and n.kind == Node.Kind.TURN and n.pk != head_id]
        if not children:
            return chain
        chain.append(children[-1])
        parent = children[-1].pk


def run_view(run: PlaybookRun) -> RunView:
    """S5: status, answer, head and nodes read from the run's conversation (its path in one query, T5).

    Turn nodes after the head mean a turn is still going (`running`), or ended failed with the head
    left behind (F2, `failed`); otherwise the head says it: failed (F1), waiting for approval (F3), done.
    """
    # Read now, not the run's cached conversation: its head has moved since the run was created.
    conversation = Conversation.objects.filter(pk=run.conversation_id).first() if run.conversation_id else None
    if conversation is None:
        return RunView(run=run, status="deleted")
    nodes = list(conversation_nodes(conversation=conversation))
    path = node_path(conversation.head_id, owner=conversation.owner_id)
    head = path[-1] if path else None
    after = _below(nodes, head.id if head else None)
    on_path = {p.id for p in path}
    view = RunView(run=run, status="done", head=conversation.head_id,
                   nodes=sorted([n for n in nodes if n.pk in on_path] + after, key=lambda n: n.pk))
    _settle_view(view, nodes, head, after)
    view.deviated = run_deviated(run, path, finished=view.status == "done")
    return view


def _settle_view(view: RunView, nodes: list[Node], head: PathNode | None, after: list[Node]) -> None:
    """The run's status (with its error, waiting calls or answer) from the head and the turn nodes after it."""
    if after and after[-1].status != Node.Status.FAILED:
        view.status = "running"
    elif after or head is None or head.status == Node.Status.FAILED:
        failed = after[-1] if after else next((n for n in nodes if head and n.pk == head.id), None)
        view.status = "failed"
        view.error = {"code": failed.failure_reason, "message": failed.failure_message} if failed else None
    elif it.tool_calls(head.received):
        view.status = "approval_required"
        view.approval_required = [_call_of(c) for c in it.tool_calls(head.received)
                                  if getattr(get_tool(c["name"]), "needs_approval", False)]
    else:
        view.answer = it.answer_text(head.received)
