"""Hybrid retrieval (R2, issue 18): the hits the turn runner attaches to a question, from the owner's other
conversations, every branch. Registered with `conversations.turns.retrieval` when the app is ready.

Two rankings give the candidates: full-text (any of the question's words) and the embedding model's nearest
chunks (at least ARBOR_RETRIEVAL_MIN_SIMILARITY). Every candidate is then scored by both signals, its words' rank
(0 when no word matched) and its cosine similarity, each scaled to 0..1 over the candidates, weighted (vectors
VECTOR_WEIGHT) and added up: relative score fusion over the union, so words decide between texts equally near
and meaning decides between texts that match the same words (PostgreSQL's ts_rank has no IDF: its ties are
many). Chosen by `manage.py bench_retrieval` over reciprocal rank fusion (the README has the figures).
When the embedding call fails (the provider is down) the question goes with the full-text hits alone:
retrieval never stops a question.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from django.conf import settings

from conversations.models import Conversation
from conversations.turns.retrieval import Hit
from search import query as words
from search.fusion import fused
from search.similar import QUERY_TIMEOUT_SECONDS, nearest_bubbles, query_vector
from search.vectors import similarities

QUERY_WORDS = 30  # the question's first distinct words make the query: a long question stays one cheap search
CANDIDATES = 20  # from each ranking, before fusion

logger = logging.getLogger("arbor.retrieval")


# English words that say nothing about a topic: a question's "how", "the" and "for" would match everything.
STOPWORDS = frozenset("""about all also and any are can could did does for from had has have her his how into its may
might must not our out she should that the their them then there these they this those too was were what when where
which who whom why will with would you your""".split())  # noqa: SIM905 - a list of 60 words reads better as text


def retrieval_query(question: str) -> str:
    """The question's first distinct words that say something, as many as fit a search query."""
    found = list(dict.fromkeys(w for w in re.findall(r"\w+", question.lower())
                               if len(w) > 2 and w not in STOPWORDS))[:QUERY_WORDS]
    while len(" ".join(found)) > words.MAX_QUERY_CHARS:
        found.pop()
    return " ".join(found)


def word_hits(*, user, question: str, limit: int, exclude_conversation: int | None) -> list[words.Hit]:
    query = retrieval_query(question)
    return words.search_bubbles(user=user, query=query, match_any=True, limit=limit,
                                exclude_conversation=exclude_conversation, shown=False) if query else []


def vector_hits(*, user, question: str, limit: int, exclude_conversation: int | None) -> list[words.Hit]:
    vector = query_vector(question, timeout=QUERY_TIMEOUT_SECONDS)
    return nearest_bubbles(user=user, vector=vector, limit=limit, exclude_conversation=exclude_conversation,
                           shown=False) if vector else []


def fuse(found_by_words: Sequence[words.Hit], found_by_vectors: Sequence[words.Hit],
         closeness: dict[int, float]) -> list[words.Hit]:
    """Relative score fusion over every candidate of either ranking, each scored by both signals: its words'
    rank (0 for a candidate no word matched) and its cosine similarity (`closeness` has it for the candidates
    only the words found), each scaled to 0..1 over the candidates, weighted and added up."""
    candidates = {hit.bubble: hit for hit in [*found_by_words, *found_by_vectors]}  # a vector hit's chunk wins
    order = list(candidates)
    if not order:
        return []
    cosine = {**closeness, **{hit.bubble: hit.rank for hit in found_by_vectors}}
    score = fused({hit.bubble: hit.rank for hit in found_by_words}, cosine, order)
    return [candidates[key] for key in sorted(order, key=lambda key: (-score[key], -key))]


def hybrid_hits(*, user, question: str, limit: int, exclude_conversation: int | None = None) -> list[words.Hit]:
    """Full-text and vector hits fused; the full-text ones alone when the embedding call fails."""
    found_by_words = word_hits(user=user, question=question, limit=CANDIDATES,
                               exclude_conversation=exclude_conversation)
    try:
        vector = query_vector(question, timeout=QUERY_TIMEOUT_SECONDS)
        if vector is None:
            return found_by_words[:limit]
        found_by_vectors = nearest_bubbles(user=user, vector=vector, limit=CANDIDATES, shown=False,
                                           exclude_conversation=exclude_conversation)
        closeness = similarities(owner_id=user.pk, model=settings.ARBOR_EMBEDDING_MODEL, query=vector,
                                 bubble_ids=[hit.bubble for hit in found_by_words])
    except Exception as error:  # the embedding provider is down or refused: words still find something
        logger.warning("vector retrieval failed, full-text only: %r", error)
        return found_by_words[:limit]
    return fuse(found_by_words, found_by_vectors, closeness)[:limit]


def find_hits(conversation: Conversation, question: str, limit: int) -> list[Hit]:
    """The hits for a question of `conversation`, never across its project's border (issue 30): a conversation in
    a project finds only that project's others (none when its memory is off), one outside any project only
    others outside any project."""
    project = conversation.project
    if project is not None and not project.memory:
        return []
    found = hybrid_hits(user=conversation.owner, question=question, limit=CANDIDATES,
                        exclude_conversation=conversation.pk)
    inside = set(Conversation.objects.filter(pk__in={h.conversation for h in found}, owner_id=conversation.owner_id,
                                             project_id=conversation.project_id).values_list("pk", flat=True))
    return [Hit(bubble=h.bubble, conversation=h.conversation, conversation_title=h.conversation_title, role=h.role,
                start=h.start) for h in found if h.conversation in inside][:limit]
