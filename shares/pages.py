"""The share's page (issue 33, X5): the shared path, read-only, for anyone holding the link, signed in or not; and
"Continue as a new conversation of my own" for a signed-in visitor.

The page reads through `shares.selectors` and shows each bubble as the chat does (the same bubbles, the same
markdown and failure cards) with none of the chat's controls: nothing on it edits, regenerates, forks, switches,
approves or retries. It is kept out of search engines (a robots meta tag and X-Robots-Tag), names no referrer
(the token is in its address), is never cached (a revoked link must stop working at once), and carries the CSP
every page does (config.middleware).
"""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from config.errors import NotFound
from config.web import page
from shares import services
from shares.selectors import share_bubbles, share_for_token


@require_GET
@never_cache
def share_page(request: HttpRequest, token: str) -> HttpResponse:
    """The shared path up to its node, whoever asks; an unknown or revoked token is a plain 404."""
    try:
        share = share_for_token(token=token)
    except NotFound as error:
        raise Http404(error.message) from None
    context = {"share": share, "token": token, "title": share.conversation.title or "Untitled conversation",
               "bubbles": [{"bubble": b} for b in share_bubbles(share)]}  # as the chat's list holds them
    response = render(request, "shares/share.html", context)
    response["X-Robots-Tag"] = "noindex, nofollow"
    response["Referrer-Policy"] = "no-referrer"
    return response


@require_POST
@page
def share_continue_page(request: HttpRequest, token: str) -> HttpResponse:
    """Copy the shared path into a new conversation of the visitor's, then open it in the chat."""
    conversation = services.share_continue(user=request.user, token=token)
    messages.success(request, "This conversation is your own copy of the shared one: chat on from its last answer.")
    return redirect("chat-conversation", conversation.pk)


@require_POST
@page
def share_revoke_page(request: HttpRequest, token: str) -> HttpResponse:
    """Revoke on the settings page: the link is a 404 from now on; anyone else's share is a 404 here."""
    services.share_revoke(user=request.user, token=token)
    messages.success(request, "Revoked: that link shows nothing any more.")
    return redirect("preferences")
