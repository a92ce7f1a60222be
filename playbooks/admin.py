"""Staff view of playbooks: each version's conversion chain, every try linked to its node page (P1).

Read-only, like the tree explorer; the node page (conversations.admin) shows each try's parent,
children, what it was sent (the previous draft's errors) and what the model saw.
"""

from __future__ import annotations

import json

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from conversations.admin import ReadOnlyAdmin
from playbooks.models import Playbook, PlaybookRun, PlaybookVersion
from playbooks.selectors import conversion_chain


def _node_link(node_id: int | None):
    if node_id is None:
        return "—"
    return format_html('<a href="{}">node {}</a>', reverse("admin:conversations_node_change", args=[node_id]), node_id)


def _conversation_link(conversation_id: int | None):
    if conversation_id is None:
        return "—"
    url = reverse("admin:conversations_conversation_change", args=[conversation_id])
    return format_html('<a href="{}">conversation {}</a>', url, conversation_id)


def _chain(node_id: int):
    """The tries of one conversion, first to last: `node 12 (succeeded) → node 13 (succeeded)`."""
    return format_html_join(
        " → ", '<a href="{}">node {}</a> ({})',
        ((reverse("admin:conversations_node_change", args=[n.pk]), n.pk, n.status) for n in conversion_chain(node_id)),
    )


class PlaybookVersionInline(admin.TabularInline):
    model = PlaybookVersion
    extra = 0
    can_delete = False
    fields = ["number", "created_at", "from_conversation", "from_head", "conversion_chain"]
    readonly_fields = fields
    ordering = ["-number"]

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="converted from")
    def from_conversation(self, version: PlaybookVersion):
        return _conversation_link(version.conversation_id)

    @admin.display(description="head")
    def from_head(self, version: PlaybookVersion):
        return _node_link(version.head_id)

    @admin.display(description="conversion chain (P1)")
    def conversion_chain(self, version: PlaybookVersion):
        return _chain(version.conversion_node_id)


@admin.register(Playbook)
class PlaybookAdmin(ReadOnlyAdmin):
    list_display = ["id", "name", "owner", "source", "version_count", "updated_at"]
    list_select_related = ["owner"]
    search_fields = ["name", "owner__username", "=id"]
    inlines = [PlaybookVersionInline]
    fields = ["name", "owner", "description", "source", "source_head_link", "current_chain", "edit",
              "definition_json", "created_at", "updated_at"]

    def get_readonly_fields(self, request, obj=None):
        return self.fields

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="source conversation")
    def source(self, playbook: Playbook):
        return _conversation_link(playbook.source_conversation_id)

    @admin.display(description="source head")
    def source_head_link(self, playbook: Playbook):
        return _node_link(playbook.source_head_id)

    @admin.display(description="current version's conversion chain")
    def current_chain(self, playbook: Playbook):
        return _chain(playbook.conversion_node_id)

    @admin.display(description="edit conversation")
    def edit(self, playbook: Playbook):
        return _conversation_link(playbook.edit_conversation_id)

    @admin.display(description="versions")
    def version_count(self, playbook: Playbook) -> int:
        return playbook.versions.count()

    @admin.display(description="definition")
    def definition_json(self, playbook: Playbook):
        return format_html("<pre>{}</pre>", json.dumps(playbook.definition, indent=2, ensure_ascii=False))


@admin.register(PlaybookRun)
class PlaybookRunAdmin(ReadOnlyAdmin):
    list_display = ["id", "playbook", "version", "run_conversation", "created_at"]
    list_select_related = ["playbook"]

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="conversation")
    def run_conversation(self, run: PlaybookRun):
        return _conversation_link(run.conversation_id)
