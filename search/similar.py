"""Similar messages (issue 18): the caller's bubbles nearest in meaning to a text, by the embedding model's
vectors, across every branch of the caller's own conversations. The search page shows them beside word
matches, and retrieval (R2) fuses them with the full-text rank.
"""

from __future__ import annotations

from html import escape

from django.conf import settings
from django.utils.safestring import mark_safe

from conversations import llm
from search.chunks import CHUNK_CHARS
from search.query import Hit, check_query, on_current_paths
from search.vectors import nearest

# A person (a search) or a question (retrieval) waits for the query's vector: an embedding provider that hangs
# costs it this much, then the words' hits go alone.
QUERY_TIMEOUT_SECONDS = 3.0


def similar_bubbles(*, user, query: str, limit: int = 20, timeout: float | None = None) -> list[Hit]:
    """What the search page and API show for a person's query (checked like a word search)."""
    check_query(query)
    vector = query_vector(query, timeout=timeout)
    return nearest_bubbles(user=user, vector=vector, limit=limit) if vector else []


def query_vector(text: str, *, timeout: float | None = None) -> list[float] | None:
    """The embedding model's vector of `text` (its first CHUNK_CHARS characters); None when no embedding model
    is set or there is no text. Raises `llm.LLMError` when the embedding call fails."""
    model = settings.ARBOR_EMBEDDING_MODEL
    if not model or not text.strip():
        return None
    (vector,) = llm.embed(model, [text[:CHUNK_CHARS]], timeout=timeout)
    return vector


def nearest_bubbles(*, user, vector: list[float], limit: int, min_similarity: float | None = None,
                    exclude_conversation: int | None = None, shown: bool = True) -> list[Hit]:
    """The bubbles nearest to `vector`, best first, `rank` the cosine similarity, at least `min_similarity`
    (ARBOR_RETRIEVAL_MIN_SIMILARITY by default). Hits not `shown` to a person get no branch mark (a query a
    conversation)."""
    floor = settings.ARBOR_RETRIEVAL_MIN_SIMILARITY if min_similarity is None else min_similarity
    found = nearest(owner_id=user.pk, model=settings.ARBOR_EMBEDDING_MODEL, query=vector, limit=limit,
                    min_similarity=floor, exclude_conversation=exclude_conversation)
    on_path = on_current_paths(((near.conversation, near.node) for near in found), owner=user.pk) if shown else set()
    return [Hit(bubble=near.bubble, node=near.node, role=near.role, conversation=near.conversation,
                conversation_title=near.conversation_title, rank=near.similarity,
                snippet=mark_safe(escape(near.text)),  # noqa: S308 - escaped
                on_current_path=near.node in on_path, start=near.start)
            for near in found]
