"""The `index` job (R4): put a committed turn's bubbles into the search index. Idempotent."""

from __future__ import annotations

from typing import Any

from conversations.outbox import payload_nodes
from search.index import index_conversation


def run(payload: dict[str, Any]) -> None:
    index_conversation(int(payload["conversation"]), nodes=payload_nodes(payload))
