"""Playbooks: reusable procedures distilled from a conversation (P1-P3).

A playbook points into the conversation tree but owns no part of it. Its conversion nodes (kind
`playbook`) hang below the head they were converted from and belong to the conversation they were
converted in (visible in its tree), but are never on a path; a version's nodes keep that history
alive when the source conversation is deleted (T11, P3). PROTECT on every node foreign key: a node
once written is never deleted under a playbook.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from conversations.models import Conversation, Node


class Playbook(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="playbooks")
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    source_conversation = models.ForeignKey(
        Conversation, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The head the first version was converted from (P3: where the first edit conversation starts).
    source_head = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="+")
    # The conversion node whose draft is the current definition: the last try of the latest version.
    conversion_node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="+")
    definition = models.JSONField()
    # The conversation "save" converts from: the latest edit conversation opened (P3).
    edit_conversation = models.ForeignKey(
        Conversation, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at", "-id"]
        indexes = [models.Index(fields=["owner", "-updated_at"])]

    def __str__(self) -> str:
        return self.name or f"Playbook {self.pk}"


class PlaybookVersion(models.Model):
    """One successful conversion: the definition, its last conversion node and where it came from."""

    playbook = models.ForeignKey(Playbook, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    definition = models.JSONField()
    conversion_node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="+")
    # The conversation and the head it was converted from (the source, or an edit conversation).
    conversation = models.ForeignKey(Conversation, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    head = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["playbook", "number"]
        constraints = [models.UniqueConstraint(fields=["playbook", "number"], name="playbook_version_number_unique")]

    def __str__(self) -> str:
        return f"{self.playbook} v{self.number}"


class PlaybookRun(models.Model):
    """One run: the parameter values and the new conversation its steps ran in."""

    playbook = models.ForeignKey(Playbook, on_delete=models.CASCADE, related_name="runs")
    # The version row the run read its definition from (N1): its number and its steps always match.
    playbook_version = models.ForeignKey(PlaybookVersion, null=True, on_delete=models.CASCADE, related_name="runs")
    version = models.PositiveIntegerField()
    values = models.JSONField(default=dict)
    conversation = models.ForeignKey(Conversation, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"run {self.pk} of {self.playbook}"
