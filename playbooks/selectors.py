"""Reads and access checks for playbooks. Nothing here writes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import QuerySet

from conversations.errors import NotFound
from conversations.models import Node
from playbooks.models import Playbook, PlaybookVersion


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
