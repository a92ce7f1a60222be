"""An ASGI test client that serves requests as the server does (`config.pooled_http`): each request's middleware
and view in one pool thread. Django's own AsyncClient runs sync views one at a time on a shared thread, so a test
of "a turn never holds up another request" through it would test Django's handler, not Arbor's."""

from __future__ import annotations

from django.test import AsyncClient
from django.test.client import AsyncClientHandler

from config.pooled_http import RequestsInPool


class _PooledClientHandler(RequestsInPool, AsyncClientHandler):
    pass


class ServerAsyncClient(AsyncClient):
    """AsyncClient whose requests are handled as `config.asgi`'s are; `header` (name, value) goes on every one
    (the constructor's headers do not reach ASGI)."""

    def __init__(self, header: tuple[str, str] | None = None):
        super().__init__()
        self.handler = _PooledClientHandler(enforce_csrf_checks=False)
        self.header = header

    def generic(self, *args, headers=None, **kwargs):
        extra = dict([self.header]) if self.header else {}
        return super().generic(*args, headers={**extra, **(headers or {})}, **kwargs)
