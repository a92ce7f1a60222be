"""Django's ASGI handler with each HTTP request's middleware and view run in one thread, reached in one hop.

Django's own handler runs every sync middleware's hooks (sessions, CSRF, auth, messages…) through
`sync_to_async(thread_sensitive=True)`: under ASGI that is a thread made for each request (its
`ThreadSensitiveContext`) and a hop to it and back for each hook, about a dozen a request, and the view another.
Under fifty quick turns a second those hops, the threads made and the event loop's share of them were a large part
of the server's CPU (issue 34). Here the whole sync chain runs as under WSGI, in one of the long-view threads
(`config.web.in_pool_thread`): a view that waits a minute on its model holds that thread, never the loop, nor
another request. What needs the loop stays there: reading the body, sending the response (a stream's async
iterator included).
"""

from __future__ import annotations

from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.base import BaseHandler

from config.web import in_pool_thread


class RequestsInPool:
    """For a Django handler under ASGI (the server's, or the tests' `AsyncClientHandler`): `get_response_async`
    runs the sync middleware chain and the view in one pool thread."""

    _in_thread: BaseHandler | None = None

    async def get_response_async(self, request):
        if self._in_thread is None:
            chain = BaseHandler()
            chain.load_middleware(is_async=False)
            self._in_thread = chain
        return await in_pool_thread(self._in_thread.get_response, request)


class PooledASGIHandler(RequestsInPool, ASGIHandler):
    pass
