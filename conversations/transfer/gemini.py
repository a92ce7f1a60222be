"""Google Gemini (Gemini Apps, before that Bard) as Google Takeout exports it: "My Activity", narrowed to Gemini
Apps, gives `MyActivity.json` (or `My Activity.json`), a flat log of activity records, newest first:
`{"header": "Gemini Apps", "title": "Prompted <the question>", "time": "<ISO 8601>", "safeHtmlItem": [{"html":
"<p>the answer</p>"}, …], "subtitles": […], "imageFile": "…", "attachedFiles": […], "details": […]}`.

Only `Prompted` records are turns: the others ("Created …" a canvas, "Used …", "Gave feedback …", "Selected
preferred draft") are what the app did, and are skipped. An answer may come in several `safeHtmlItem`s: they are
joined. It is HTML, read as text: paragraphs, line breaks, headings and list items as lines; no markup is kept (a
person sees the answer as they read it; nothing of it runs). Files and images sent with a question are placeholders.

The log names no conversation in older exports: records that name a chat (`gemini.google.com/app/<id>` in
`details` or `titleUrl`) are grouped by it; the others by time, a new conversation after `GAP` without a question.
Each conversation is one chain, in time order (Takeout keeps no edits or regenerations)."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from conversations import items as it
from conversations.transfer.message_tree import RECEIVED, SENT, At, Read, capped, placeholder, tree_plan
from conversations.transfer.plan import ImportRefused, Plan

HEADERS = frozenset({"Gemini Apps", "Bard"})
PROMPTED = "Prompted "
GAP = timedelta(minutes=30)
_CHAT = re.compile(r"https://gemini\.google\.com/(?:u/\d+/)?app/([0-9A-Za-z_-]+)")


def _is_record(record: Any) -> bool:
    return (isinstance(record, dict) and record.get("header") in HEADERS and isinstance(record.get("title"), str)
            and isinstance(record.get("time"), str))


def entries(document: Any) -> list | None:
    """The conversations the log's questions make, oldest first; None if `document` is no Gemini activity log."""
    if not isinstance(document, list) or not any(_is_record(r) for r in document):
        return None
    asked = [r for r in document if _is_record(r) and r["title"].startswith(PROMPTED)]
    if not asked:
        raise ImportRefused("This Gemini activity log holds no question (no `Prompted …` record): only what the app "
                            "did, which is no conversation.")
    # Oldest first; records of one moment keep the order they were asked in (the log lists the newest first).
    asked = [record for _, record in sorted(enumerate(asked), key=lambda pair: (_when(pair[1]), -pair[0]))]
    chats: dict[str, list[dict]] = {}
    unnamed: list[list[dict]] = []
    for record in asked:
        chat = _chat_of(record)
        if chat is not None:
            chats.setdefault(chat, []).append(record)
        elif unnamed and _when(record) - _when(unnamed[-1][-1]) <= GAP:
            unnamed[-1].append(record)
        else:
            unnamed.append([record])
    return sorted([*chats.values(), *unnamed], key=lambda records: _when(records[0]))


def _when(record: dict) -> datetime:
    try:
        when = datetime.fromisoformat(record["time"].replace("Z", "+00:00"))
    except ValueError:
        raise ImportRefused(f"A Gemini record's time is not a date: {record['time'][:40]!r}.") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _chat_of(record: dict) -> str | None:
    """The chat a record names, in newer exports: its address in `details` or `titleUrl`."""
    places, details = [record.get("titleUrl")], record.get("details")
    for detail in details if isinstance(details, list) else []:
        if isinstance(detail, dict):
            places += [detail.get("url"), detail.get("name")]
    return next((found.group(1) for place in places if isinstance(place, str) and (found := _CHAT.search(place))),
                None)


def plan(entry: Any, index: int) -> Plan:
    where = f"conversation {index}"  # `entries` made it: a list of questions, none empty
    keys = list(range(len(entry)))
    children: dict[Any, list[int]] = {None: keys[:1], **{k - 1: [k] for k in keys[1:]}}

    def read(key: int, at: At) -> list[Read]:
        return _read(entry[key], f"{where}, question {key}")

    title = " ".join(entry[0]["title"].removeprefix(PROMPTED).split())[:80]
    return tree_plan(children=children, read=read, total=len(entry), current=keys[-1], title=title, where=where)


def _read(record: dict, where: str) -> list[Read]:
    question = record["title"].removeprefix(PROMPTED)
    shown = "\n".join(x for x in (question, *_attachments(record)) if x.strip())
    parts = record.get("safeHtmlItem") or []
    if not isinstance(parts, list):
        raise ImportRefused(f"{where}: `safeHtmlItem` is not a list.")
    answer = "\n\n".join(text for part in parts if isinstance(part, dict) and isinstance(part.get("html"), str)
                         if (text := html_text(part["html"])))
    reads = [Read(SENT, (it.user(capped(shown)),))] if shown else []
    return [*reads, Read(RECEIVED, (it.text(capped(answer)),))] if answer and reads else reads


def _attachments(record: dict) -> list[str]:
    """Files and images sent with the question (their names), as a person and a model can read."""
    shown = []
    for field, kind in (("imageFile", "image"), ("attachedFiles", "file")):
        values = record.get(field)
        for value in values if isinstance(values, list) else [values]:
            if isinstance(value, str) and value:
                shown.append(placeholder(kind, value))
    return shown


_BLOCKS = frozenset({"p", "div", "h1", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "table", "pre", "blockquote"})
_LINES = frozenset({"br", "li", "tr"})
_SKIPPED = frozenset({"script", "style", "noscript", "template", "textarea"})
# A tag, or a declaration or comment opener: each try stops at the next `<`, so reading is linear in the length
# (html.parser's is not: an unclosed quote in an attribute made 120 KB take a minute).
# A tag never closed (a browser shows none of it) is dropped the same way.
_TAG = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9]*)[^<>]*>|<[!?/][^<>]*>|<[A-Za-z!?/][^<>]*(?=<|\Z)")
MAX_HTML_CHARS = 400_000  # of one answer part: more than any answer shown, and bounded whatever a file holds


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
