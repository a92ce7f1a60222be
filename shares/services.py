"""Writes for shares: create, revoke, and continue a share as a new conversation of one's own.

Access checks come first (`conversation_for_user`, `conversation_has_node`, `share_for_owner`), and a refused
request writes nothing.
"""

from __future__ import annotations

import secrets
from typing import Any

from django.db import transaction

from config.errors import BadInput, NotFound
from conversations.models import Bubble, Conversation, Node, ToolApproval
from conversations.selectors import conversation_for_user, conversation_has_node, history_ids
from conversations.transfer import arbor_tree
from shares.models import Share, token_digest
from shares.selectors import share_for_owner, share_for_token


def _shared_node(conversation: Conversation, node: Any) -> int:
    """The node a new share names: `node`, or the head. It must be in the conversation's tree (else NotFound) and
    be an answer, a node a head may rest on (else BadInput)."""
    if node is None:
        if conversation.head_id is None:
            raise BadInput("This conversation has no answer to share yet.")
        return conversation.head_id
    if not conversation_has_node(conversation=conversation, node_id=node):
        raise NotFound(f"No node {node} in this conversation.")
    if not Node.objects.can_be_head().filter(pk=node).exists():
        raise BadInput(f"Node {node} is not an answer (a call under way, an overflow or a summarising call): "
                       "share an answer.", param="node")
    return node


def share_create(*, user, conversation_id: Any, node: int | None = None) -> tuple[Share, str]:
    """Share the path that ends at `node` (default: the head) of the caller's conversation; return the share and
    its token. The token (secrets.token_urlsafe(32)) is found again by its digest only."""
    conversation = conversation_for_user(user=user, conversation_id=conversation_id)
    node_id = _shared_node(conversation, node)
    token = secrets.token_urlsafe(32)
    share = Share.objects.create(conversation=conversation, node_id=node_id, token=token, digest=token_digest(token))
    return share, token


def share_revoke(*, user, token: str) -> None:
    """Revoke the caller's share: its link is a 404 from now on. Anyone else's share is a 404 here."""
    share_for_owner(user=user, token=token).delete()


# --- continue a share as a new conversation ----------------------------------------------------------------


def _copied_node(row: dict[str, Any]) -> dict[str, Any]:
    """A path node as Arbor's tree file holds it, less what was the sharer's own: their instructions (a node keeps
    the system instructions it was sent, the person's own among them), their branch names and star, and items
    retrieved from their other conversations (R2, `ephemeral`), which never were part of the shared path."""
    parent, original = row.pop("parent_id"), row.pop("compacted_from_id")
    return {**row, "parent": parent, "compacted_from": original, "summary_call": None, "instructions": "",
            "label": "", "starred": False, "sent": [item for item in row["sent"] if not item.get("ephemeral")],
            "finished_at": row["finished_at"].isoformat() if row["finished_at"] else None}


_NODE_COLUMNS = ("id", "parent_id", "compacted_from_id", *(f for f in arbor_tree.NODE_FIELDS if f != "path_tokens"),
                 "finished_at")


def _path_document(share: Share) -> dict[str, Any]:
    """The shared path (behind compactions, its originals too: C3) as an Arbor tree file whose head is the shared
    node: what `arbor_tree.import_tree` checks and writes as a new conversation."""
    owner = share.conversation.owner_id
    ids = history_ids(share.node_id, owner=owner)
    rows = Node.objects.filter(owner_id=owner, pk__in=ids).order_by("id").values(*_NODE_COLUMNS)
    nodes = [_copied_node(row) for row in rows]
    bubbles = [{"node": row["node_id"], "role": row["role"], "content": row["content"], "data": row["data"]}
               for row in Bubble.objects.filter(owner_id=owner, node_id__in=ids).order_by("node_id", "id")
               .values("node_id", "role", "content", "data")]
    approvals = [{"node": row["node_id"], "call_id": row["call_id"], "approved": row["approved"],
                  "result": row["result"]}
                 for row in ToolApproval.objects.filter(owner_id=owner, node_id__in=ids).order_by("node_id", "id")
                 .values("node_id", "call_id", "approved", "result")]
    source = share.conversation
    meta = {"title": f"{source.title or 'Untitled'} (shared)"[:200], "model": source.model, "instructions": "",
            "head": share.node_id}
    return {"format": arbor_tree.TREE_FORMAT, "version": arbor_tree.TREE_VERSION, "conversation": meta,
            "nodes": nodes, "bubbles": bubbles, "approvals": approvals}


def share_continue(*, user, token: str) -> Conversation:
    """Copy the shared path into a new conversation of `user`'s whose head is the copy of the shared node.

    Copied, not shared (unlike a fork, P3): the new conversation has another owner, and deleting or clearing
    either one (T11) must never reach into the other's nodes. The copy goes through the import of Arbor's own tree
    file, so it is checked and written as one (D5 bounds, where a head may rest); a decision on a tool call comes
    along only with the result it got (D4: nothing copied approves an action that has not run).
    """
    with transaction.atomic():
        share = share_for_token(token=token)
        return arbor_tree.import_tree(owner=user, document=_path_document(share))
