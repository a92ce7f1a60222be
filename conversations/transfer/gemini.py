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

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from conversations import items as it
from conversations.transfer.message_tree import RECEIVED, SENT, At, Read, capped, placeholder, tree_plan
from conversations.transfer.plan import ImportRefused, Plan
from files.html_text import html_text

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
