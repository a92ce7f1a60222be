"""Staff view of people's files (issue 29): sizes, status and why a file could not be read, and which nodes sent
each; read-only (the bytes stay their owner's: the admin links to no content)."""

from __future__ import annotations

from django.contrib import admin
from django.template.defaultfilters import filesizeformat
from django.urls import reverse
from django.utils.html import format_html_join

from config.replica import ListsMayLag
from files.models import StoredFile


@admin.register(StoredFile)
class StoredFileAdmin(ListsMayLag, admin.ModelAdmin):
    list_display = ("id", "name", "owner", "kind", "content_type", "size_shown", "status", "created_at")
    list_filter = ("status", "kind")
    list_select_related = ("owner",)
    search_fields = ("name", "owner__username", "=sent_by__node__conversation__id")
    fields = ("name", "owner", "project", "kind", "content_type", "size_shown", "status", "error", "sent_in",
              "created_at")
    readonly_fields = fields

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    @admin.display(description="size", ordering="size")
    def size_shown(self, stored: StoredFile) -> str:
        return filesizeformat(stored.size)

    @admin.display(description="sent by")
    def sent_in(self, stored: StoredFile):
        sent = stored.sent_by.select_related("node")[:50]
        return format_html_join(", ", '<a href="{}">node {}</a> (conversation {})', (
            (reverse("admin:conversations_node_change", args=[s.node_id]), s.node_id, s.node.conversation_id)
            for s in sent)) or "—"
