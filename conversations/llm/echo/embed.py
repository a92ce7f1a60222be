"""arbor/echo-embed: the offline embedding model, for the embedded default and the tests.

What it is: feature hashing of a text's crude word stems, word pairs and the character trigrams of each word
into DIMENSIONS signed buckets, normalised to length 1. It is deterministic (blake2b, not Python's salted
`hash`), needs no network and no model file, and costs microseconds a word. Texts that share words, word forms
("cancel", "cancelled", "cancellation") or most of a misspelt word ("subscripton") come out close; texts that
share nothing come out near 0 (hash collisions: within about ±0.2).

What it is not: a language model. It knows no synonym ("end" and "cancel" are as far apart as any two words),
no other language's meaning, no word order beyond neighbouring pairs. Paraphrases that share no word form
are not found by it; a real embedding model (ARBOR_EMBEDDING_MODEL) finds them.
"""

from __future__ import annotations

import hashlib
import math
import re
from functools import lru_cache

MODEL = "echo-embed"
DIMENSIONS = 384

# Words that carry no topic: left out, so "how do I" does not make two questions alike.
_STOPWORDS = """a an and are as at be been but by can could did do does doing for from had has have how i if in into
is it its me my no not of on or our so than that the their them then there these they this to was we were what when
where which who why will with would you your"""
STOPWORDS = frozenset(_STOPWORDS.split())
_SUFFIXES = ("ations", "ation", "ments", "ment", "ings", "ing", "ions", "ion", "ers", "er", "ies", "ied", "ed",
             "es", "ly", "s")
# Weights, chosen on a handful of related and unrelated pairs: a word's trigrams together weigh twice its stem,
# so a misspelt or inflected word still counts; unrelated texts stay below 0.15.
_STEM, _PAIR, _TRIGRAMS = 1.0, 0.5, 2.0


def _stem(word: str) -> str:
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            break
    if len(word) > 3 and word[-1] == word[-2] and word[-1] not in "aeiou":
        word = word[:-1]  # "cancelled" -> "cancell" -> "cancel"
    return word


@lru_cache(maxsize=65536)
def _bucket(feature: str) -> tuple[int, float]:
    """The feature's dimension and sign: a stable hash, the same in every process."""
    digest = int.from_bytes(hashlib.blake2b(feature.encode(), digest_size=8).digest(), "little")
    return digest % DIMENSIONS, 1.0 if digest >> 63 else -1.0


def _features(text: str) -> list[tuple[str, float]]:
    words = [w for w in re.findall(r"\w+", text.lower()) if w not in STOPWORDS]
    features: list[tuple[str, float]] = []
    for word in words:
        stem = _stem(word)
        features.append(("s:" + stem, _STEM))
        padded = f"<{stem}>"
        grams = [padded[i : i + 3] for i in range(len(padded) - 2)]
        features += [("t:" + gram, _TRIGRAMS / math.sqrt(len(grams))) for gram in grams]
    features += [("p:" + _stem(a) + " " + _stem(b), _PAIR) for a, b in zip(words, words[1:], strict=False)]
    return features


def embed_text(text: str) -> list[float]:
    """The text's vector: DIMENSIONS floats of length 1 (all zeros for a text with no word)."""
    vector = [0.0] * DIMENSIONS
    for feature, weight in _features(text):
        index, sign = _bucket(feature)
        vector[index] += sign * weight
    norm = math.sqrt(sum(v * v for v in vector))
    return [v / norm for v in vector] if norm else vector
