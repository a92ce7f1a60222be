"""Put bubbles into the search index. Idempotent: indexing a bubble twice leaves one entry."""

from __future__ import annotations

from collections.abc import Sequence

from django.conf import settings
from django.db import connection, transaction

from conversations.models import Bubble

INDEXED_ROLES = (Bubble.Role.USER, Bubble.Role.ASSISTANT)
_BUBBLES_OWNERS = "FROM conversations_bubble b JOIN conversations_conversation c ON c.id = b.conversation_id"


def unindexed_bubbles(*, conversation_id: int | None = None, nodes: list[int] | None = None,
                      limit: int = 5000) -> list[int]:
    """Bubbles to index, in id order: of the conversation, of `nodes` only (a turn's), or anyone's."""
    # No entry, or one without its owner (written by a process older than search's migration 0005): the left join
    # leaves the owner empty for both.
    bubbles = Bubble.objects.filter(document__owner__isnull=True, role__in=INDEXED_ROLES, conversation__isnull=False)
    if conversation_id is not None:
        bubbles = bubbles.filter(conversation_id=conversation_id)
    if nodes is not None:
        bubbles = bubbles.filter(node_id__in=nodes)
    return list(bubbles.order_by("id").values_list("id", flat=True)[:limit])


@transaction.atomic
def index_bubbles(bubble_ids: Sequence[int]) -> int:
    """Index these bubbles (again, if they already are); return how many were written."""
    ids = list(bubble_ids)
    if not ids:
        return 0
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"""INSERT INTO search_bubbledocument (bubble_id, owner_id, vector, indexed_at)
                   SELECT b.id, c.owner_id, to_tsvector(%s::regconfig, b.content), now() {_BUBBLES_OWNERS}
                   WHERE b.id = ANY(%s)
                   ON CONFLICT (bubble_id) DO UPDATE SET owner_id = EXCLUDED.owner_id, vector = EXCLUDED.vector,
                                                         indexed_at = EXCLUDED.indexed_at""",
                [settings.ARBOR_SEARCH_CONFIG, ids],
            )
            return cursor.rowcount
        marks = ", ".join("%s" for _ in ids)
        cursor.execute(f"DELETE FROM search_fts WHERE rowid IN ({marks})", ids)
        cursor.execute(f"INSERT INTO search_fts (rowid, content) SELECT id, content FROM conversations_bubble "
                       f"WHERE id IN ({marks})", ids)
        cursor.execute(f"INSERT OR REPLACE INTO search_bubbledocument (bubble_id, owner_id, indexed_at) "
                       f"SELECT b.id, c.owner_id, datetime('now') {_BUBBLES_OWNERS} WHERE b.id IN ({marks})", ids)
        return cursor.rowcount


def index_conversation(conversation_id: int, *, nodes: list[int] | None = None) -> int:
    """Index every bubble of the conversation not indexed yet (those of failed turns included); with `nodes`, of
    those nodes only (what a turn wrote: a job after each turn looks at the turn, not at the whole conversation,
    which made a conversation's life cost O(turns²); `jobs.run_given_up` runs again a job that gave up)."""
    total = 0
    while ids := unindexed_bubbles(conversation_id=conversation_id, nodes=nodes):
        total += index_bubbles(ids)
    return total
