"""Django's ASGI handler with each HTTP request's middleware and view run in one thread, reached in one hop.

Django's own handler runs every sync middleware's hooks (sessions, CSRF, auth, messages…) through
`sync_to_async(thread_sensitive=True)`: under ASGI that is a thread made for each request (its
`ThreadSensitiveContext`) and a hop to it and back for each hook, about a dozen a request, and the view another.
Under fifty quick turns a second those hops, the threads made and the event loop's share of them were a large part
of the server's CPU (issue 34). Here the whole sync chain runs as under WSGI, in one of the long-view threads
(`config.web.in_pool_thread`): a view that waits a minute on its model holds that thread, never the loop, nor
another request. What needs the loop stays there: reading the body, sending the response (a stream's async
iterator included).

The server's handler (`PooledASGIHandler`) also sends the `request_started` and `request_finished` signals in that
thread, around the chain, as WSGI does, and closes a whole response there before it is sent. Django sent them from
the loop through a thread made for the request (its `ThreadSensitiveContext`), and joined that thread through yet
another one, although their receivers (this thread's old database connections, its queries) concern the view's own
thread. Each start blocks the loop until the new thread first holds the GIL: with hundreds of streams running,
bench_load's stack dumps found the loop in `Thread.start` in two thirds of its samples (issue 34). A streamed
response is sent in such a context still, so a sync iterator (a file's) is read in a thread of its own request,
never in the one thread Channels' sockets share; the context makes its thread only for that, and the response is
closed in the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading

from asgiref.sync import ThreadSensitiveContext
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.http import FileResponse
from django.urls import set_script_prefix

from config.web import in_pool_thread

logger = logging.getLogger(__name__)


class RequestsInPool:
    """For a Django handler under ASGI (the server's, or the tests' `AsyncClientHandler`): `get_response_async`
    runs the sync middleware chain and the view in one pool thread."""

    _in_thread: BaseHandler | None = None
    _building = threading.Lock()  # the first requests come in several pool threads at once: one chain is built

    def _chain(self) -> BaseHandler:
        if self._in_thread is None:
            with self._building:
                if self._in_thread is None:
                    chain = BaseHandler()
                    chain.load_middleware(is_async=False)
                    self._in_thread = chain
        return self._in_thread

    async def get_response_async(self, request):
        return await in_pool_thread(self._chain().get_response, request)


class PooledASGIHandler(RequestsInPool, ASGIHandler):
    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        await self.handle(scope, receive, send)  # no ThreadSensitiveContext for the request (above)

    async def handle(self, scope, receive, send):
        """Django's `ASGIHandler.handle`, with the signals and a whole response's close in the pool thread (above).
        A client that leaves while the view runs is let go as Django lets it go; the view's thread ends its work, and
        its response is closed when it does (the request's body with it)."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            try:
                await self.send_response(error_response, send)
            finally:
                await in_pool_thread(self._refused, scope, error_response)
                body_file.close()
            return
        view = asyncio.ensure_future(in_pool_thread(self._response, scope, request))
        tasks = [asyncio.create_task(self.listen_for_disconnect(receive)),
                 asyncio.create_task(self._send(view, send))]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in tasks:
                if task.done():
                    with contextlib.suppress(RequestAborted):  # the client left
                        task.result()
                else:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        except BaseException:  # a failure, or this request cancelled (a server shutting down)
            for task in tasks:
                task.cancel()
            view.add_done_callback(functools.partial(_close_later, body_file=body_file, told=True))
            raise
        # A stream is closed once sent, or once its view ends when the client left first: its close gives back its
        # person's stream slot (`config.streams`), which a stream left unclosed would hold for the process's life.
        if view.done():
            await _closed(view, body_file)
        else:
            view.add_done_callback(functools.partial(_close_later, body_file=body_file, told=False))

    async def _send(self, view: asyncio.Future, send) -> None:
        response = await asyncio.shield(view)  # a client leaving mid-view cancels this wait, never the view's future
        with contextlib.suppress(asyncio.CancelledError):  # one leaving mid-send: let go, as Django's handler does
            if not response.streaming:
                await self.send_response(response, send)  # closed already (`_response`)
                return
            async with ThreadSensitiveContext():  # a sync iterator is read in a thread of this request's (above)
                await self.send_response(response, send)

    def _response(self, scope, request):
        """In the pool thread: the request's signals, its chain and view, and a whole response closed."""
        signals.request_started.send(sender=self.__class__, scope=scope)
        response = self._chain().get_response(request)
        response._handler_class = self.__class__
        if isinstance(response, FileResponse):  # as Django's handler: the server chunks it
            response.block_size = self.chunk_size
        if not response.streaming:
            response.close()  # sends request_finished here, in the view's thread; the content stays to be sent
        return response

    def _refused(self, scope, response) -> None:
        """A request Django could not read (400, 413): its signals, as any other's, in a pool thread."""
        signals.request_started.send(sender=self.__class__, scope=scope)
        response.close()


async def _closed(view: asyncio.Future, body_file) -> None:
    """Close the streamed response `view` made (a whole one was closed in its thread), in the pool; and the
    request's body, which the view may read until it ends."""
    try:
        if not view.cancelled() and view.exception() is None and view.result().streaming:
            await in_pool_thread(view.result().close)
    finally:
        body_file.close()


_closing: set[asyncio.Task] = set()  # the closes of views whose request had ended before they did


def _close_later(view: asyncio.Future, *, body_file, told: bool) -> None:
    """`_closed`, once `view` has ended after its request did. `told`: its failure reached the server already."""
    if not told and not view.cancelled() and view.exception() is not None:
        logger.error("a view whose client had left failed", exc_info=view.exception())
    task = view.get_loop().create_task(_closed(view, body_file))
    _closing.add(task)
    task.add_done_callback(_closing.discard)
