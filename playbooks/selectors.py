"""Reads and access checks for playbooks. Nothing here writes."""

from __future__ import annotations

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


def conversion_chain(node_id: int) -> list[Node]:
    """The tries of one conversion, first to last: from `node_id` up while the nodes are kind `playbook` (P1)."""
    chain: list[Node] = []
    node = Node.objects.filter(pk=node_id).first()
    while node is not None and node.kind == Node.Kind.PLAYBOOK:
        chain.append(node)
        node = Node.objects.filter(pk=node.parent_id).first() if node.parent_id else None
    return chain[::-1]


def playbook_versions(playbook: Playbook) -> list[PlaybookVersion]:
    return list(playbook.versions.order_by("-number"))
