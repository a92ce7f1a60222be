"""Database reads for async tests that must not queue behind the server's shared sync thread."""

from __future__ import annotations

import asyncio

from asgiref.sync import sync_to_async
from django.db import connections

from conversations.models import Node


def in_own_thread(function):
    """Run `function` in a thread of its own, closing that thread's connections afterwards."""

    def run():
        try:
            return function()
        finally:
            connections.close_all()

    return sync_to_async(run, thread_sensitive=False)


async def settled_node(conversation) -> Node:
    """The conversation's only node, once it is written and no longer pending (a turn's thread records it)."""
    for _ in range(200):
        node = await in_own_thread(lambda: Node.objects.filter(conversation=conversation).first())()
        if node is not None and node.status != Node.Status.PENDING:
            return node
        await asyncio.sleep(0.05)
    raise AssertionError("no node was written, or it stayed pending")
