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

    Both a sync and an async middleware, whichever the chain below it is (`config.pooled_http` runs the chain
    sync, in one pool thread).
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
