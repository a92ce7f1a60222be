"""What the playbooks app adds to pages it does not own, as a template context processor (the conversations app
never imports this one): on a playbook's edit conversation (P3), the playbook it edits, for the chat page's
"back to the playbook" and "Save as a new version". Read lazily: one query, only where the chat page asks."""

from __future__ import annotations

from functools import cache
from typing import Any

from django.http import HttpRequest

from playbooks.models import Playbook


def editing_playbook(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    match = getattr(request, "resolver_match", None)
    if user is None or not user.is_authenticated or match is None or match.url_name != "chat-conversation":
        return {}

    @cache
    def playbook() -> Playbook | None:
        return Playbook.objects.filter(owner=user, edit_conversation_id=match.kwargs.get("conversation_id")).first()

    return {"editing_playbook": playbook}
