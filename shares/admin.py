"""Staff view of shares: which conversation and node each link shows, read-only like the tree explorer.

The token is not listed: staff see that a share exists and can delete (revoke) it, not read others' links.
"""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from shares.models import Share


@admin.register(Share)
class ShareAdmin(admin.ModelAdmin):
    list_display = ("id", "conversation_link", "node_link", "created_at")
    list_select_related = ("conversation",)
    fields = ("conversation_link", "node_link", "created_at")
    readonly_fields = fields
    search_fields = ("=conversation__id", "=node__id", "conversation__owner__username")

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    @admin.display(description="conversation")
    def conversation_link(self, share: Share):
        url = reverse("admin:conversations_conversation_change", args=[share.conversation_id])
        return format_html('<a href="{}">{}</a>', url, share.conversation)

    @admin.display(description="node")
    def node_link(self, share: Share):
        url = reverse("admin:conversations_node_change", args=[share.node_id])
        return format_html('<a href="{}">node {}</a>', url, share.node_id)
