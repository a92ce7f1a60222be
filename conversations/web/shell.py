"""The chat shell every signed-in page shows (sidebar, palette, model list, the person's theme), as a template
context processor,
so the other apps' pages get it without importing this app's pages.

Read lazily: a page whose template never shows the sidebar (the admin, the sign-in page) costs no query.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from django.conf import settings
from django.http import HttpRequest
from django.urls import reverse

from conversations.apis.serializers import ModelsField
from conversations.models import Conversation, Project
from conversations.selectors import conversation_list, user_theme

SIDEBAR_SIZE = 200
SIDEBAR_SHOWS = "sidebar_shows"  # the session's key for the origin the sidebar lists ("": every conversation)


def chat_shell(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}

    shows = request.session.get(SIDEBAR_SHOWS, "") if hasattr(request, "session") else ""

    @cache
    def sidebar() -> list:
        listed = conversation_list(user=user).select_related("project").only(
            "id", "title", "origin", "updated_at", "project__id", "project__name")
        return list((listed.filter(origin=shows) if shows else listed)[:SIDEBAR_SIZE])

    def sidebar_groups() -> list[tuple[Any, list]]:
        """Issue 30: the conversations outside any project, then each project's, newest first in each and the
        projects by their newest conversation."""
        groups: dict[Any, list] = {None: []}
        for item in sidebar():
            groups.setdefault(item.project, []).append(item)
        return [(project, items) for project, items in groups.items() if project is None or items]

    def palette() -> list[dict[str, str]]:
        return [{"title": c.title or f"Conversation {c.pk}", "url": reverse("chat-conversation", args=[c.pk])}
                for c in sidebar()]

    @cache
    def projects() -> list:
        return list(Project.objects.filter(owner_id=user.pk).only("id", "name").order_by("name", "id"))

    @cache
    def theme() -> str:
        return user_theme(user_id=user.pk)

    return {"sidebar": sidebar, "sidebar_groups": sidebar_groups, "projects_of_mine": projects,
            "sidebar_shows": shows, "sidebar_origins": Conversation.Origin.choices, "palette": palette,
            "models": settings.ARBOR_MODELS, "models_at_once": ModelsField.most, "theme": theme}
