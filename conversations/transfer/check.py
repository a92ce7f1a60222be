"""`manage.py import_check FILE…`: what importing each file would keep, and whether it survives a round trip.

Each file is imported for a throwaway account inside a transaction that is rolled back, so nothing stays. For each
conversation it prints its nodes, its bubbles by role (what a person sees), its branches (turn nodes with no turn
below), its counted tokens (C1), then the differences after exporting it as Arbor's tree JSON and as ChatGPT's
`conversations.json` and importing that back: turn nodes whose items along their path (T5) have no equal in the
copy, either way, and whether the head's path shows the same bubbles.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Sum

from conversations.models import Bubble, Conversation, Node
from conversations.screen import path_bubbles
from conversations.transfer import arbor_tree, chatgpt
from conversations.transfer.importing import import_any, parse
from conversations.transfer.plan import ImportRefused


@dataclass(frozen=True)
class Kept:
    title: str
    nodes: int
    bubbles: dict[str, int]
    branches: int
    tokens: int
    arbor_differences: str
    chatgpt_differences: str


def item_paths(conversation: Conversation) -> set[str]:
    """Every turn node as the items on its path from the root, ids and models aside."""
    nodes = {n.pk: n for n in Node.objects.of(conversation).filter(kind=Node.Kind.TURN)}

    def path(node: Node | None) -> str:
        out = []
        while node is not None:
            out.append({"sent": node.sent, "received": node.received})
            node = nodes.get(node.parent_id)
        return json.dumps(out[::-1], sort_keys=True)

    return {path(n) for n in nodes.values()}


def _screen(conversation: Conversation) -> list[tuple[str, str, int]]:
    return [(v.bubble.role, v.bubble.content, v.branch.count) for v in path_bubbles(conversation=conversation)]


def _differences(original: Conversation, copy: Conversation) -> str:
    before, after = item_paths(original), item_paths(copy)
    lost, added = len(before - after), len(after - before)
    notes = [f"{lost} paths lost"] * bool(lost) + [f"{added} paths new"] * bool(added)
    if _screen(copy) != _screen(original):
        notes.append("head path shows other bubbles")
    return ", ".join(notes) or "none"


def _kept(owner, conversation: Conversation) -> Kept:
    turns = Node.objects.of(conversation).filter(kind=Node.Kind.TURN)
    parents = set(turns.exclude(parent=None).values_list("parent_id", flat=True))
    bubbles = Counter(Bubble.objects.filter(owner_id=conversation.owner_id, conversation=conversation)
                      .values_list("role", flat=True))
    tokens = Node.objects.of(conversation).aggregate(total=Sum("tokens"))["total"] or 0
    (as_tree,) = import_any(owner=owner, document=arbor_tree.export_tree(conversation)).conversations
    (as_chatgpt,) = import_any(owner=owner, document=[chatgpt.export_chatgpt(conversation)]).conversations
    return Kept(title=conversation.title, nodes=Node.objects.of(conversation).count(),
                bubbles=dict(sorted(bubbles.items())), branches=sum(n not in parents for n in turns.values_list(
                    "pk", flat=True)), tokens=tokens, arbor_differences=_differences(conversation, as_tree),
                chatgpt_differences=_differences(conversation, as_chatgpt))


def check(path: Path) -> tuple[list[Kept], list[dict[str, Any]]]:
    """Import `path` and report it; everything written is rolled back. ImportRefused if it would be refused."""
    with transaction.atomic():
        owner = get_user_model().objects.create_user(username=f"import-check-{uuid.uuid4().hex}")
        imported = import_any(owner=owner, document=parse(path.read_bytes()))
        report = [_kept(owner, conversation) for conversation in imported.conversations]
        transaction.set_rollback(True)
    return report, imported.skipped


__all__ = ["ImportRefused", "Kept", "check"]
