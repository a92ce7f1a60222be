"""Reads and access checks for shares. Nothing here writes.

A share is found by its token alone (anyone holding the link may read it); its owner finds their own shares by
token too, and anyone else's is a 404, like an unknown one.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator

from django.db.models import QuerySet

from config.errors import NotFound
from conversations.screen import ShownBubble, history_bubbles
from conversations.selectors import conversation_has_node
from shares.models import Share, token_digest

MAX_TOKEN = 64  # secrets.token_urlsafe(32) is 43 characters; anything much longer is no token of ours
_GONE = "No such share: the link is wrong, or it was revoked."


def _matching(shares: QuerySet[Share], token: str) -> Share:
    """The share of `shares` that `token` names: looked up by the token's digest, then the token compared in
    constant time; NotFound otherwise."""
    share = shares.filter(digest=token_digest(token)).first() if token and len(token) <= MAX_TOKEN else None
    if share is None or not hmac.compare_digest(share.token.encode(), token.encode()):
        raise NotFound(_GONE)
    return share


def share_for_token(*, token: str) -> Share:
    """The live share `token` names, or NotFound.

    A share is live while its node is still in its conversation's tree: after the conversation is cleared (T11)
    nothing it held is shown, and after it is deleted the share is gone with it (CASCADE).
    """
    share = _matching(Share.objects.select_related("conversation"), token)
    if not conversation_has_node(conversation=share.conversation, node_id=share.node_id):
        raise NotFound(_GONE)
    return share


def share_list(*, user) -> QuerySet[Share]:
    """The caller's shares, newest first."""
    return Share.objects.filter(conversation__owner_id=user.pk).order_by("-created_at", "-id")


def share_for_owner(*, user, token: str) -> Share:
    """The caller's own share; anyone else's (or an unknown token) is a 404."""
    return _matching(share_list(user=user), token)


def share_bubbles(share: Share) -> Iterator[ShownBubble]:
    """The bubbles of the shared path, root first, ending at the shared node: a snapshot whatever the head does
    later (T8: only nodes on that path; C3: behind a compaction the original path, with its marker)."""
    return history_bubbles(share.node_id, owner=share.conversation.owner_id)
