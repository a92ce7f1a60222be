"""A share: an unguessable link to the path that ends at one node of one conversation (X5)."""

from __future__ import annotations

import hashlib

from django.db import models

from conversations.models import Conversation, Node


def token_digest(token: str) -> str:
    """What a share is looked up by: the SHA-256 of its token, so the database compares digests, never the token
    itself (a lookup's timing says nothing about the token)."""
    return hashlib.sha256(token.encode()).hexdigest()


class Share(models.Model):
    """One shared path. It names its node, not the head: later turns of the conversation never show (a snapshot).

    CASCADE both ways: deleting the conversation (T11) or the node takes its shares with it; revoking deletes the
    row. The token is kept beside its digest only so its owner can list their links again (`GET /api/shares/`).
    """

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="shares")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="shares")
    token = models.CharField(max_length=64)
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["conversation", "-created_at"])]

    def __str__(self) -> str:
        return f"share of node {self.node_id} (conversation {self.conversation_id})"
