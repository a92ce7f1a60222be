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

from conversations.selectors import conversation_list, user_theme

SIDEBAR_SIZE = 200


def chat_shell(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}

    @cache
    def sidebar() -> list:
        return list(conversation_list(user=user).only("id", "title", "updated_at")[:SIDEBAR_SIZE])

    def palette() -> list[dict[str, str]]:
        return [{"title": c.title or f"Conversation {c.pk}", "url": reverse("chat-conversation", args=[c.pk])}
                for c in sidebar()]

    @cache
    def theme() -> str:
        return user_theme(user_id=user.pk)

    return {"sidebar": sidebar, "palette": palette, "models": settings.ARBOR_MODELS, "theme": theme}
