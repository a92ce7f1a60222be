"""Issue 28: text nested deeper than json's decoder may recurse is read by a loop (`config.api._loads_deep`), to
the same values json.loads gives, with the same refusals, and the same strict checks after it (D5)."""

from __future__ import annotations

import json
import random

import pytest

from config.api import DECODER_DEPTH, UnsafeJSON, _loads_deep, strict_loads


def _value(rng: random.Random, depth: int):
    roll = rng.random()
    if depth > 6 or roll < 0.3:
        return rng.choice([0, -1, 2.5, -3e-7, 10**18, "", 'a"b', "é\n", "\u2028", "\\", None, True, False])
    if roll < 0.65:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {f"k{i}é": _value(rng, depth + 1) for i in range(rng.randint(0, 4))}


def test_issue_28_the_loop_reads_what_json_reads():
    """Issue 28: 3,000 random documents, compact and indented, decode to what json.loads gives."""
    rng = random.Random(28)
    for _ in range(3000):
        text = json.dumps(_value(rng, 0), indent=rng.choice([None, 2]), ensure_ascii=rng.random() < 0.5)
        assert _loads_deep(text) == json.loads(text), text


@pytest.mark.parametrize("text", ["", " ", "{", "[1,]", '{"a" 1}', '{"a": 1,}', "[1 2]", '{"a": 1} x', "{1: 2}",
                                  '["\x01"]', "nul", "[-]", '["a]', "[1]]", '{"a": }', "01"])
def test_issue_28_the_loop_refuses_what_json_refuses(text):
    """Issue 28, D5: malformed text is a ValueError, as json's."""
    with pytest.raises(ValueError, match=r"Expecting|Extra data|Invalid control|Unterminated"):
        json.loads(text)
    with pytest.raises(ValueError, match=r"Expecting|Extra data|Invalid control|Unterminated"):
        _loads_deep(text)


def test_issue_28_deep_text_is_read_and_still_checked_strictly():
    """Issue 28, D5: text nested far past the decoder's depth is read, and a NUL or an out-of-range number deep
    inside it is still refused with where it is."""
    depth = DECODER_DEPTH * 5
    deep = '{"c": [' * depth + '"end"' + "]}" * depth
    value = strict_loads(deep, max_depth=depth * 2 + 2)
    for _ in range(depth):
        value = value["c"][0]
    assert value == "end"
    with pytest.raises(UnsafeJSON, match="NUL"):
        strict_loads('{"c": [' * depth + '"a\\u0000"' + "]}" * depth, max_depth=depth * 2 + 2)
    with pytest.raises(UnsafeJSON, match="whole number"):
        strict_loads("[" * depth + str(2**70) + "]" * depth, max_depth=depth + 1)
