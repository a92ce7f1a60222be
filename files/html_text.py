"""The text of HTML as a person reads it, for an uploaded page (`extract.py`) and an imported answer (Gemini's
Takeout, `conversations.transfer.gemini`): Markdown's shape (blocks apart by a blank line, list items and line
breaks on lines of their own, a `pre` block's lines kept), no markup, nothing of a script, a style, a page's head
or a form field. Hostile HTML is the point: it is read by a tokenizer of our own in linear time, where Python's
html.parser took a minute on 120 KB of unclosed attribute quotes and raised on `<![ ` (D5)."""

from __future__ import annotations

import html
import re

_BLOCKS = frozenset({"p", "div", "h1", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "table", "pre", "blockquote"})
_LINES = frozenset({"br", "li", "tr"})
_SKIPPED = frozenset({"script", "style", "noscript", "template", "textarea", "head", "title"})
# A tag, or a declaration or comment opener: each try stops at the next `<`, so reading is linear in the length
# (html.parser's is not: an unclosed quote in an attribute made 120 KB take a minute).
# A tag never closed (a browser shows none of it) is dropped the same way.
_TAG = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9]*)[^<>]*>|<[!?/][^<>]*>|<[A-Za-z!?/][^<>]*(?=<|\Z)")
MAX_HTML_CHARS = 4_000_000  # read at most: linear, and bounded whatever a file holds


class _Text:
    """The text of an answer's HTML as Markdown reads it: blocks apart by a blank line, list items and line breaks
    on lines of their own, a `pre` block's lines kept; what a script, a style or a form field holds is dropped."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.skipping = self.pre = 0
        self.breaks = 0  # the line breaks owed before the next text: 1 a line, 2 a blank line
        self.prefix = ""
        self.spaced = False  # the last text ended in white space: the next is a word apart

    def _break(self, tag: str) -> None:
        self.breaks = max(self.breaks, 2 if tag in _BLOCKS else 1 if tag in _LINES else 0)

    def start(self, tag: str) -> None:
        self.skipping += tag in _SKIPPED
        self.pre += tag == "pre"
        self._break(tag)
        if tag == "li":
            self.prefix = "- "

    def end(self, tag: str) -> None:
        if tag in _SKIPPED:
            self.skipping = max(0, self.skipping - 1)
        if tag == "pre":
            self.pre = max(0, self.pre - 1)
        self._break(tag)
        if tag == "li":
            self.prefix = ""  # an item with no text leaves nothing behind
        if tag in ("td", "th"):  # a table's cells, a word apart
            self.spaced = True

    def text(self, raw: str) -> None:
        data = html.unescape(raw)
        text = data.strip("\n") if self.pre else " ".join(data.split())
        if self.skipping or not text.strip():
            return
        if self.parts and self.breaks:
            self.parts.append("\n" * self.breaks)
        elif self.parts and (self.spaced or data[:1].isspace()):
            self.parts.append(" ")
        self.parts.append(self.prefix + text)
        self.breaks, self.prefix, self.spaced = 0, "", data[-1:].isspace()


def html_text(markup: str) -> str:
    reader, at = _Text(), 0
    markup = markup[:MAX_HTML_CHARS]
    for tag in _TAG.finditer(markup):
        reader.text(markup[at:tag.start()])
        if tag.group(2):
            (reader.end if tag.group(1) else reader.start)(tag.group(2).lower())
        at = tag.end()
    reader.text(markup[at:])
    return "".join(reader.parts).strip()
