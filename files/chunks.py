"""A large document's parts that bear on a question (X1, R2): a document longer than ARBOR_FILE_WHOLE_CHARS goes
to a call as its best chunks for the call's question, in the document's order, as many as fit in that bound.

Chunks are scored by the question's words (BM25 over the document's own chunks) and, once the worker has
embedded the document (`files.embedding`), by meaning too: the two fused as retrieval fuses them
(`search.fusion`). Words alone choose while it has no vectors, or when the question's embedding call fails, so a
call never waits on the worker.
"""

from __future__ import annotations

import math
import re
from collections import Counter

from search.fusion import fused

CHUNK_CHARS = 2000
_WORD = re.compile(r"\w{2,}", re.UNICODE)


def chunked(text: str, size: int = CHUNK_CHARS) -> list[str]:
    """`text` in pieces of about `size` characters, cut at a paragraph or line break, else a space, when one is
    near the end."""
    pieces, start = [], 0
    while start < len(text):
        end = min(len(text), start + size)
        if end < len(text):
            cut = max(text.rfind("\n\n", start, end), text.rfind("\n", start, end), text.rfind(" ", start, end))
            end = cut + 1 if cut > start + size // 2 else end
        pieces.append(text[start:end])
        start = end
    return pieces


def best_chunks(text: str, question: str, budget_chars: int, closeness: list[float] | None = None
                ) -> tuple[list[int], list[str], int]:
    """The indexes and text of the chunks of `text` that score best for `question`, as many as fit in
    `budget_chars`, in the document's order (the document's first chunks when the question shares no word with
    it and nothing is nearer in meaning), and how many chunks it has. `closeness`: each chunk's cosine similarity
    to the question, when the document's vectors are at hand."""
    chunks = chunked(text)
    scores = scored(chunks, question)
    if closeness is not None and len(closeness) == len(chunks):
        keys = range(len(chunks))
        score = fused(dict(enumerate(scores)), dict(enumerate(closeness)), keys)
        scores = [score[index] for index in keys]
    chosen, used = [], 0
    for index in sorted(range(len(chunks)), key=lambda i: (-scores[i], i)):
        if used + len(chunks[index]) > budget_chars:
            continue
        chosen.append(index)
        used += len(chunks[index])
    chosen.sort()
    return chosen, [chunks[index] for index in chosen], len(chunks)


def scored(chunks: list[str], question: str) -> list[float]:
    """Each chunk's BM25 score for the question's words, over these chunks (0: it shares no word)."""
    words = [Counter(w.lower() for w in _WORD.findall(chunk)) for chunk in chunks]
    asked = {w.lower() for w in _WORD.findall(question)}
    having = {word: sum(1 for counts in words if word in counts) for word in asked}
    average = sum(sum(c.values()) for c in words) / max(1, len(words))

    def score(counts: Counter) -> float:
        length = sum(counts.values())
        return sum(math.log(1 + (len(chunks) - having[w] + 0.5) / (having[w] + 0.5)) * counts[w] * 2.2
                   / (counts[w] + 1.2 * (0.25 + 0.75 * length / max(1, average))) for w in asked if counts[w])

    return [score(counts) for counts in words]
