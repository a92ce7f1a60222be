"""What every app's pages share: the signed-in page shell, the pool of threads that long work runs in (every HTTP
request's view, `config.pooled_http`, and a socket's sync calls), and a long write's progress streamed to its page
(the Content-Security-Policy is config.middleware's, on every response). Imports no app."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import wraps
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from channels.auth import AuthMiddleware, get_user
from channels.sessions import CookieMiddleware, SessionMiddleware
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import connections
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from config.errors import ArborError, NotFound

T = TypeVar("T")
logger = logging.getLogger(__name__)


def page(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A signed-in page: our errors become a message and a redirect."""

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
        return response

    return run


_long_views: ThreadPoolExecutor | None = None


def _long_view_threads() -> ThreadPoolExecutor:
    """The pool long views run in: threads are made as needed, up to ARBOR_LONG_VIEW_THREADS, so a turn
    that waits a minute on its model holds one of hundreds, not one of the loop's default handful (six on
    two cores: a seventh JSON turn used to wait for one of the first six to end, issue 13)."""
    global _long_views
    if _long_views is None:
        _long_views = ThreadPoolExecutor(max_workers=settings.ARBOR_LONG_VIEW_THREADS,
                                         thread_name_prefix="arbor-view")
    return _long_views


async def in_pool_thread(function: Callable[..., T], *args: Any) -> T:
    """Run sync `function` in one of `_long_view_threads`, not the one thread ASGI shares between every sync
    call (Channels' `database_sync_to_async` uses that one: hundreds of chat sockets starting turns and
    signing in queued on it, issue 13); this thread's connections are closed after."""

    def run() -> T:
        try:
            return function(*args)
        finally:
            connections.close_all()

    return await sync_to_async(run, thread_sensitive=False, executor=_long_view_threads())()


class SocketAuthMiddleware(AuthMiddleware):
    """Channels' `AuthMiddleware`, its session and user read in `in_pool_thread` rather than on the shared
    thread: a socket's handshake does not wait behind every other socket's."""

    async def resolve_scope(self, scope) -> None:
        scope["user"]._wrapped = await in_pool_thread(get_user.func, scope)


def socket_auth_stack(inner):
    """`AuthMiddlewareStack` with `SocketAuthMiddleware`."""
    return CookieMiddleware(SessionMiddleware(SocketAuthMiddleware(inner)))


_DONE = object()


def wants_progress(request: HttpRequest) -> bool:
    """Did the page's script ask to watch a long write as it goes (`Accept: application/x-ndjson`)?"""
    return "application/x-ndjson" in request.headers.get("Accept", "")


def progress_response(work: Callable[[Callable[[dict], None]], dict]) -> StreamingHttpResponse:
    """Run `work(report)` in a thread of its own and stream what it reports as JSON lines, then its result as
    {"type": "result", …}, or {"type": "refused", "message", "code"} for an ArborError (names no reported event
    uses: a run reports its turn's own "done" and "error").

    The work starts when the response does, and goes on to its end if the person leaves: a started conversion
    or run is never cut short by a dropped connection (what it wrote is theirs either way); only the reporting
    stops. Events reach the response through the event loop (`call_soon_threadsafe`), so a watched job of
    minutes holds no thread of the loop's small default pool.
    """

    async def lines():
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def report(event) -> None:
            with contextlib.suppress(RuntimeError):  # the server's loop is gone: nobody is watching
                loop.call_soon_threadsafe(events.put_nowait, event)

        def run() -> None:
            try:
                report({"type": "result", **work(report)})
            except ArborError as error:
                report({"type": "refused", "code": error.code, "message": error.message})
            except Exception:
                logger.exception("a long write failed")
                report({"type": "refused", "code": "server_error", "message": "Something went wrong on the server."})
            finally:
                connections.close_all()
                report(_DONE)

        threading.Thread(target=run, name="arbor-progress", daemon=True).start()
        while (event := await events.get()) is not _DONE:
            yield (json.dumps(event, default=str) + "\n").encode()

    response = StreamingHttpResponse(lines(), content_type="application/x-ndjson")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # a proxy in front passes each line on as it comes
    return response
