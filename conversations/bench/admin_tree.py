"""Benchmark the staff tree page on a 5,000-node conversation: `python manage.py bench_admin_tree`.

Builds one conversation titled `arbor-bench-admin:tree` (bulk-created nodes with realistic items: a long
chain with side branches, a failed node, and a compaction node whose new chain holds the head), renders its
admin tree page with the test Client as the superuser `arbor-bench-admin` (created if missing), prints the
median of the renders in ms and the SQL query count, and deletes everything it created. SQLite and PostgreSQL.
"""

from __future__ import annotations

import statistics
import time

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.core.management.color import no_style
from django.db import connection, transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from conversations import items as it
from conversations.models import Conversation, Node
from conversations.services import head_move

TITLE = "arbor-bench-admin:tree"
ADMIN_USER = "arbor-bench-admin"
MODEL = "arbor/echo"
BRANCH_EVERY = 100  # a side branch hangs off every 100th chain node
BRANCH_LENGTH = 5
ANSWER = ("Revenue in the north rose 12% quarter on quarter, driven by the enterprise segment; the south was "
          "flat, and the west fell 3% after two large renewals slipped into the next quarter. Margins held.")


def _node(node_id: int, parent_id: int | None, conversation_id: int, index: int, now, **extra) -> Node:
    fields = {
        "id": node_id, "parent_id": parent_id, "conversation_id": conversation_id, "kind": "turn",
        "status": "succeeded", "provider": "arbor", "model": MODEL, "created_at": now, "finished_at": now,
        "sent": [it.user(f"Question {index}: how did revenue change by region last quarter, and why?")],
        "received": [it.text(f"Answer {index}: {ANSWER}")],
        "usage": {"prompt_tokens": 40 + index % 50, "completion_tokens": 60, "total_tokens": 100 + index % 50},
    }
    fields.update(extra)
    return Node(**fields)


def build(conversation: Conversation, total: int) -> int:
    """Bulk-create `total` nodes; returns the head's id. Ids are assigned here, then the sequence is reset."""
    now = timezone.now()
    first = (Node.objects.order_by("-id").values_list("id", flat=True).first() or 0) + 1
    nodes: list[Node] = []
    next_id = first

    def add(parent_id: int | None, **extra) -> int:
        nonlocal next_id
        nodes.append(_node(next_id, parent_id, conversation.pk, len(nodes), now, **extra))
        next_id += 1
        return next_id - 1

    chain_length = int(total * 0.8)
    parent = None
    chain: list[int] = []
    while len(nodes) < chain_length:
        parent = add(parent)
        chain.append(parent)
        if len(chain) % BRANCH_EVERY == 0:
            side = parent
            for _ in range(BRANCH_LENGTH):
                side = add(side)
    failed = add(chain[-1], status="failed", failure_reason="provider_error", failure_message="upstream 502",
                 received=[], usage={})
    head = add(None, kind="compaction", compacted_from_id=failed, provider="", model="",
               sent=[it.system("Summary of the conversation so far: revenue by region, quarter on quarter.")],
               received=[], usage={})
    while len(nodes) < total:
        head = add(head)
    with transaction.atomic():
        Node.objects.bulk_create(nodes, batch_size=500)
        with connection.cursor() as cursor:
            for sql in connection.ops.sequence_reset_sql(no_style(), [Node]):
                cursor.execute(sql)
        head_move(conversation=conversation, to=head)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {Node._meta.db_table}")
    return head


def drop(conversation: Conversation) -> None:
    """Delete the bench tree like `services.conversation_delete`: head to NULL, then every node in one
    statement; the database's deferred foreign keys check at commit that nothing points at a deleted node.
    (Unlinking first would break the compaction root's constraint: it must keep its original, C3.)"""
    with transaction.atomic():
        head_move(conversation=conversation, to=None)
        with connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {Node._meta.db_table} WHERE conversation_id = %s", [conversation.pk])
        conversation.delete()


class Command(BaseCommand):
    help = "Render the admin tree page of a 5,000-node conversation; print the median ms and the query count."

    def add_arguments(self, parser):
        parser.add_argument("--nodes", type=int, default=5000)
        parser.add_argument("--repeat", type=int, default=5)

    def handle(self, *args, nodes: int, repeat: int, **options):
        users = get_user_model().objects
        admin = users.filter(username=ADMIN_USER).first()
        created_admin = admin is None
        if created_admin:
            admin = users.create_superuser(username=ADMIN_USER, password=None)
        for stale in Conversation.objects.filter(title=TITLE):
            drop(stale)
        conversation = Conversation.objects.create(owner=admin, title=TITLE, model=MODEL)
        try:
            build(conversation, nodes)
            client = Client(HTTP_HOST="localhost")
            client.force_login(admin)
            url = reverse("admin:conversations_conversation_change", args=[conversation.pk])
            queries: list[str] = []

            def count(execute, sql, params, many, context):
                queries.append(sql)
                return execute(sql, params, many, context)

            # execute_wrapper, not CaptureQueriesContext: the request closes the connection (CONN_MAX_AGE 0).
            with connection.execute_wrapper(count):
                response = client.get(url)
            assert response.status_code == 200, response.status_code
            rendered = response.content.decode().count('<tr id="node-')
            samples = []
            for _ in range(repeat):
                begin = time.perf_counter()
                response = client.get(url)
                samples.append((time.perf_counter() - begin) * 1000)
                assert response.status_code == 200
            self.stdout.write(
                f"database: {connection.vendor}; tree page of {rendered:,} nodes ({len(response.content):,} bytes): "
                f"median {statistics.median(samples):.1f} ms of {repeat} renders "
                f"(min {min(samples):.1f}, max {max(samples):.1f}); {len(queries)} SQL queries"
            )
        finally:
            drop(conversation)
            if created_admin:
                admin.delete()
