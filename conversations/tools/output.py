"""A tool's return value as the text its result carries, cut while it is read.

Every tool goes through here (the tool runner calls `capped_text`), so no tool can hand a node more than
the limits allow: one text or binary value is cut at `cell_max` bytes, the whole result at `total_max`.
A tool that returns an iterator (sql_query's rows) is read one element at a time and closed once the
result is full, so a query that would give 140 MB stops after the first few kilobytes: the rest is never
fetched. A cut result says so in the text, for the model and the person alike.

The text is always valid JSON (or the tool's own string), and holds nothing PostgreSQL's jsonb refuses:
NUL characters and lone surrogates are replaced.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

TRUNCATED_KEY = "output_truncated"
_UNSET = object()


# Bytes held back until the first cut, so the small fields after a cut list still fit (sql_query's
# row_count and truncated follow its rows).
_RESERVE = 64


@dataclass
class _Budget:
    left: int
    cell_max: int
    cut: bool = False

    def take(self, size: int) -> bool:
        """Spend `size` bytes if they fit; the first refusal marks the result cut and frees the reserve."""
        if size > self.left:
            if not self.cut:
                self.cut, self.left = True, self.left + _RESERVE
            return False
        self.left -= size
        return True


def capped_text(value: Any, *, cell_max: int, total_max: int) -> str:
    """`value` as the result text, at most `total_max` bytes of UTF-8."""
    note = f"the tool's output passed the {total_max}-byte limit; the rest was not read"
    if isinstance(value, str | bytes | bytearray):
        text, cut = _cut(_as_text(value), max(0, total_max - len(note) - 3))
        return f"{text}\n[{note}]" if cut else text
    budget = _Budget(left=max(0, total_max - len(note) - 16 - _RESERVE), cell_max=cell_max)
    shown = _read(value, budget)
    if shown is _UNSET:
        shown = {} if isinstance(value, Mapping) else []
    if budget.cut:
        if isinstance(shown, dict):
            shown[TRUNCATED_KEY] = note
        else:
            shown.append(f"[{note}]")
    return json.dumps(shown, ensure_ascii=False)


def _read(value: Any, budget: _Budget) -> Any:
    """A JSON-ready copy of `value` that fits `budget`, or _UNSET; iterators are read only as far as it goes."""
    if isinstance(value, Mapping):
        return _read_mapping(value, budget)
    if isinstance(value, Iterable) and not isinstance(value, str | bytes | bytearray):
        return _read_sequence(iter(value), budget)
    leaf = _leaf(value, budget.cell_max)
    return leaf if budget.take(_size(leaf) + 2) else _UNSET


def _read_mapping(value: Mapping, budget: _Budget) -> Any:
    if not budget.take(2):
        return _UNSET
    shown: dict[str, Any] = {}
    # Values are read in order, each when its turn comes: a tool may fill a later field (sql_query's
    # row_count) while an earlier one (its rows) is read. After a cut, later fields still go in if they fit.
    for key, item in value.items():
        name = _clean(str(key))
        element = _read(item, budget) if budget.take(_size(name) + 4) else _skip(item)
        if element is not _UNSET:
            shown[name] = element
    return shown


def _read_sequence(elements: Iterator[Any], budget: _Budget) -> Any:
    """The elements that fit whole; an element cut on the way is left out, and reading stops there."""
    try:
        if budget.cut or not budget.take(2):
            return _UNSET
        shown: list[Any] = []
        for element in elements:
            copy = _read(element, budget)
            if copy is _UNSET or budget.cut:
                break
            shown.append(copy)
        return shown
    finally:
        _skip(elements)


def _skip(value: Any) -> Any:
    """Let go of a value that will not be read: a generator holding a cursor closes it now."""
    close = getattr(value, "close", None)
    if callable(close) and isinstance(value, Iterator):
        close()
    return _UNSET


def _leaf(value: Any, cell_max: int) -> Any:
    if value is None or isinstance(value, bool | int | float):
        return value if not isinstance(value, float) or math.isfinite(value) else str(value)  # JSON has no NaN
    text, cut = _cut(_as_text(value), cell_max)
    return f"{text}…[{cut} more bytes not shown]" if cut else text


def _as_text(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        try:
            text = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return f"<binary data, {len(value)} bytes>"
        return text if "\x00" not in text else f"<binary data, {len(value)} bytes>"
    return _clean(value if isinstance(value, str) else str(value))


def _clean(text: str) -> str:
    """No NUL and no lone surrogate: PostgreSQL's jsonb refuses both."""
    return text.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")


def _cut(text: str, max_bytes: int) -> tuple[str, int]:
    """The longest start of `text` within `max_bytes` of UTF-8, and how many bytes were left out."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text, 0
    return data[:max_bytes].decode("utf-8", "ignore"), len(data) - max_bytes


def _size(leaf: Any) -> int:
    return len(json.dumps(leaf, ensure_ascii=False).encode("utf-8"))
