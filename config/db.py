"""Database plumbing every app shares. Imports no app."""

from __future__ import annotations

from django.db import connection


def release_connection() -> None:
    """Hold no database connection while a model thinks: give it back to the pool; the next query takes one.

    Inside a transaction the connection is kept (closing it would end the transaction)."""
    if not connection.in_atomic_block:
        connection.close()
