"""Cut a bubble's text into pieces an embedding model reads whole (issue 18).

A piece ends at a paragraph, a line, a sentence or a word where it can, so a piece is about one thing; a text
with no such place is cut at CHUNK_CHARS. A bubble gives at most MAX_CHUNKS pieces: a pasted book is embedded
by its first MAX_CHUNKS * CHUNK_CHARS characters (its words are all in the full-text index).
"""

from __future__ import annotations

CHUNK_CHARS = 1000
MAX_CHUNKS = 100
_BREAKS = ("\n\n", "\n", ". ", "? ", "! ", " ")


def chunk_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each piece, in order; white space between pieces belongs to none."""
    spans: list[tuple[int, int]] = []
    start = 0
    while len(spans) < MAX_CHUNKS:
        while start < len(text) and text[start].isspace():
            start += 1
        if start >= len(text):
            break
        end = min(len(text), start + CHUNK_CHARS)
        if end < len(text):
            window = text[start:end]
            cut = next((window.rfind(mark) for mark in _BREAKS if window.rfind(mark) > CHUNK_CHARS // 2), -1)
            if cut > 0:
                end = start + cut + 1
        spans.append((start, end))
        start = end
    return spans
