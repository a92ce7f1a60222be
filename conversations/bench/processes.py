"""What the benchmarks that start real server processes share: a free port, the database URL for the
servers, stopping a process, and deleting the conversations a run made."""

from __future__ import annotations

import socket
import subprocess

from django.core.management.base import CommandError
from django.db import connection, transaction
from django.db.models import QuerySet

from conversations.models import Conversation, Node, OutboxJob


def parse_counts(value: str) -> list[int]:
    """A command option such as "1,2,4": the distinct counts, in order, each at least 1."""
    try:
        found = sorted({int(part) for part in value.split(",") if part.strip()})
    except ValueError as error:
        raise CommandError(f"not a list of counts: {value!r}") from error
    if not found or found[0] < 1:
        raise CommandError(f"counts must be at least 1: {value!r}")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def database_url() -> str:
    """The database this process uses, for the servers it starts (in tests, the test database)."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    if connection.vendor != "postgresql":
        raise CommandError(f"the benchmarks support PostgreSQL and SQLite, not {connection.vendor}.")
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    return f"postgres://{db['USER']}{password}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def stop(process: subprocess.Popen) -> None:
    """Terminate, then kill if it will not go within 10 s."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
    process.wait(10)


def delete_conversations(conversations: QuerySet) -> None:
    """A bench's conversations with their nodes and after-turn jobs, in bulk: no other path uses them, and deleting
    thousands one by one (T11's `conversation_delete`) would take longer than the run."""
    ids = list(conversations.values_list("pk", flat=True))
    with transaction.atomic():
        Conversation.objects.filter(pk__in=ids).update(head=None)
        Node.objects.filter(conversation_id__in=ids).delete()
        OutboxJob.objects.filter(payload__conversation__in=ids).delete()
        Conversation.objects.filter(pk__in=ids).delete()
