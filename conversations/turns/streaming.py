"""A turn's log for async code (SSE, WebSockets): read from this process's memory on the caller's loop, so a
follower holds no thread and no database connection while it waits (issue 26, issue 34)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from conversations.turns import log


async def follow_log_batches(run_id, *, owner: int, after: int = 0) -> AsyncIterator[list]:
    """A run's numbered log entries (`log.follow`) for async code, in batches: what has come since the last
    batch. Read from this process's memory on the caller's loop, without a thread or a connection: the run's own
    copy if it runs here, else the one mirror this process keeps of it (`log.mirrored`)."""
    async with contextlib.aclosing(log.mirrored(run_id, owner=owner).follow_async(after)) as batches:
        async for batch in batches:
            yield batch


async def follow_log(run_id, *, owner: int, after: int = 0) -> AsyncIterator:
    """A run's numbered log entries, one by one (`follow_log_batches`)."""
    async with contextlib.aclosing(follow_log_batches(run_id, owner=owner, after=after)) as batches:
        async for batch in batches:
            for entry in batch:
                yield entry
