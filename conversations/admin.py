"""A plain read-only admin; the tree explorer comes with its own issue."""

from django.contrib import admin

from conversations.models import Bubble, Conversation, Node


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Conversation)
class ConversationAdmin(ReadOnlyAdmin):
    list_display = ["id", "title", "owner", "model", "head", "updated_at"]
    search_fields = ["title", "owner__username"]


@admin.register(Node)
class NodeAdmin(ReadOnlyAdmin):
    list_display = ["id", "conversation", "parent", "kind", "status", "failure_reason", "model", "created_at"]
    list_filter = ["kind", "status", "failure_reason", "provider"]


@admin.register(Bubble)
class BubbleAdmin(ReadOnlyAdmin):
    list_display = ["id", "conversation", "node", "role"]
