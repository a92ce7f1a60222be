"""What every app's pages share: the signed-in page shell with its Content-Security-Policy, and a way to run
a long view off the one thread that ASGI gives every sync view. Imports no app."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps

from asgiref.sync import sync_to_async
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.handlers.asgi import ASGIRequest
from django.db import connections
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from config.errors import ArborError, NotFound

# Scripts and styles come only from our own static files: markup that slipped past the sanitiser
# still could not run a script.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'; object-src 'none'"
)


def page(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A signed-in page: our errors become a message and a redirect, every response gets the CSP header."""

    @login_required
    @wraps(view)
    def run(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        try:
            response = view(request, *args, **kwargs)
        except NotFound as error:
            raise Http404(error.message) from None
        except ArborError as error:
            messages.error(request, error.message)
            back = request.META.get("HTTP_REFERER", "")
            safe = url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()})
            response = redirect(back if safe else reverse("chat"))
        response.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        return response

    return run


def off_the_shared_thread(view: Callable) -> Callable:
    """Run a long (model-calling) view in a thread of its own under ASGI.

    Under ASGI, Django runs every sync view on one shared thread; a turn lasting seconds there would
    hold up every other request (an edit's immediate 409, say). Under WSGI nothing is shared.
    """

    def run(request, *args, **kwargs):
        try:
            return view(request, *args, **kwargs)
        finally:
            connections.close_all()  # this thread's connections, not the server's

    async def wrapper(request, *args, **kwargs):
        if isinstance(request, ASGIRequest):
            return await sync_to_async(run, thread_sensitive=False)(request, *args, **kwargs)
        return await sync_to_async(view, thread_sensitive=True)(request, *args, **kwargs)

    for attribute in ("cls", "initkwargs", "csrf_exempt", "view_class", "view_initkwargs"):
        if hasattr(view, attribute):
            setattr(wrapper, attribute, getattr(view, attribute))
    return wrapper
