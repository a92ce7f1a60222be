"""One Redis connection pool per process for Django's cache (issue 34).

Django keeps a cache object per request context (its connection handler is an asgiref `Local` that is not
thread-critical), and each object makes its own connection pool: every API request opened a fresh connection to
Redis for its throttle count, with its handshake, and dropped it. Under 50 users' quick turns, making those
connections was a seventh of the stack samples of the server's busy threads (py-spy). The pool is redis-py's own,
shared by every cache object of the process with the same URL and options; it is thread-safe and makes itself anew
in a forked child.
"""

from __future__ import annotations

import threading

import redis

_POOLS: dict[tuple, redis.ConnectionPool] = {}
_LOCK = threading.Lock()


class SharedConnectionPool(redis.ConnectionPool):
    @classmethod
    def from_url(cls, url: str, **options) -> redis.ConnectionPool:
        key = (url, tuple(sorted(options.items())))
        with _LOCK:
            pool = _POOLS.get(key)
            if pool is None:
                pool = _POOLS[key] = super().from_url(url, **options)
        return pool
