"""Relative score fusion (R2, issue 18): two rankings of the same candidates, words and meaning, each scaled to
0..1 over the candidates, weighted and added up. Used by retrieval across conversations (`retrieval.fuse`) and by a
large document's parts chosen for a question (`files.chunks`), so both weigh the two signals alike."""

from __future__ import annotations

from collections.abc import Sequence

# Of the fused score; the words' is the rest. bench_retrieval's recall@5 is flat from 0.6 to 0.8 (two seeds,
# PostgreSQL and SQLite).
VECTOR_WEIGHT = 0.7


def scaled(values: dict[int, float], keys: Sequence[int], missing: float) -> dict[int, float]:
    """Each key's value scaled to 0..1 between the lowest and highest over `keys` (all 1 when they are equal)."""
    full = {key: values.get(key, missing) for key in keys}
    low, high = min(full.values()), max(full.values())
    return {key: (value - low) / (high - low) if high > low else 1.0 for key, value in full.items()}


def fused(words: dict[int, float], meaning: dict[int, float], keys: Sequence[int]) -> dict[int, float]:
    """Each key's fused score: its words' score (0 when missing) and its meaning's (the lowest when missing)."""
    text = scaled(words, keys, missing=0.0)
    near = scaled(meaning, keys, missing=min(meaning.values(), default=0.0))
    return {key: VECTOR_WEIGHT * near[key] + (1.0 - VECTOR_WEIGHT) * text[key] for key in keys}
