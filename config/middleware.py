"""Headers every response carries, whichever view, middleware or error handler made it. Imports no app."""

from __future__ import annotations

from collections.abc import Callable

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest, HttpResponseBase
from django.utils.decorators import sync_and_async_middleware

# Scripts and styles come only from our own static files: markup that slipped past the sanitiser
# still could not run a script.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; connect-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'; object-src 'none'"
)


@sync_and_async_middleware
def content_security_policy(get_response: Callable) -> Callable:
    """Give every response the Content-Security-Policy header (issue 14 finding 7), unless it set its own.

    Both a sync and an async middleware, whichever the chain below it is: under ASGI it never moves a
    request onto the one shared thread (MiddlewareMixin would, to run process_response).
    """
    if iscoroutinefunction(get_response):

        async def middleware_async(request: HttpRequest) -> HttpResponseBase:
            response = await get_response(request)
            response.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
            return response

        return middleware_async

    def middleware(request: HttpRequest) -> HttpResponseBase:
        response = get_response(request)
        response.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        return response

    return middleware



@sync_and_async_middleware
def sync_views_straight_under_wsgi(get_response: Callable) -> Callable:
    """Under WSGI (the test client, `manage.py runserver`), call a view wrapped by `off_the_shared_thread` as
    the sync view it wraps, in the request's own thread.

    Django would run the async wrapper in an event loop of its own, which hands the view back to this very
    thread: two context hops per request for nothing. Python 3.11's contextvars can corrupt a context when
    a garbage collection runs inside such a hop (CPython gh-148891: CI once saw "unhashable type:
    'hamt_bitmap_node'" in asgiref's context restore). Under ASGI nothing changes: this is a pass-through.
    Last in MIDDLEWARE, so every other middleware's process_view (CSRF) has run.
    """
    if iscoroutinefunction(get_response):
        return get_response
    return _SyncViewsStraight(get_response)


class _SyncViewsStraight:
    def __init__(self, get_response: Callable) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        return self.get_response(request)

    def process_view(self, request: HttpRequest, view: Callable, args: tuple, kwargs: dict) -> HttpResponseBase | None:
        wrapper, sync_view = getattr(view, "sync_view", (None, None))
        return sync_view(request, *args, **kwargs) if wrapper is view else None
