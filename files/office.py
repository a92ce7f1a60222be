"""The text of Word, Excel and PowerPoint files (Office Open XML: .docx, .xlsx, .pptx), read from their XML.

Streamed and bounded, not loaded whole: each part is read through a cap on its unpacked bytes (a file that unpacks
into gigabytes, a "zip bomb", stops at ARBOR_OFFICE_XML_MAX_BYTES), parsed element by element and let go, and reading
ends once the text reaches ARBOR_FILE_TEXT_MAX_CHARS. Python's expat refuses external entities and bounds entity
expansion, so a crafted document cannot read the server's files or blow up in memory.
"""

from __future__ import annotations

import io
import re
import zipfile
import zlib
from collections.abc import Iterator
from xml.etree.ElementTree import ParseError, iterparse

from django.conf import settings

W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
S = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"
A = "{http://schemas.openxmlformats.org/drawingml/2006/main}"
R = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}"


MAX_ELEMENTS = 1_000_000  # a real document past this has long passed the text bound, where reading stops


class OfficeUnreadable(Exception):
    """Why the document's text could not be read, in words a person reads."""


def office_text(data: bytes, content_type: str) -> str:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        reader = {"wordprocessingml": _word, "spreadsheetml": _sheets, "presentationml": _slides}
        kind = next(key for key in reader if key in content_type)
        return _joined(reader[kind](_Parts(archive)))
    except (zipfile.BadZipFile, KeyError, ParseError, EOFError, RuntimeError, NotImplementedError, ValueError,
            zlib.error) as error:
        raise OfficeUnreadable(f"The document could not be read ({error.__class__.__name__}).") from None


def _joined(blocks: Iterator[str]) -> str:
    """Blocks of text, one a line, up to the text bound (the rest is never read)."""
    kept, length = [], 0
    for block in blocks:
        if block.strip():
            kept.append(block)
            length += len(block) + 1
            if length >= settings.ARBOR_FILE_TEXT_MAX_CHARS:
                break
    return "\n".join(kept)


class _Parts:
    """The archive's XML parts, each read through one shared cap on unpacked bytes."""

    def __init__(self, archive: zipfile.ZipFile):
        self.archive = archive
        self.left = settings.ARBOR_OFFICE_XML_MAX_BYTES
        self.elements = 0

    def names(self) -> set[str]:
        return set(self.archive.namelist())

    def events(self, name: str, tags: set[str]) -> Iterator[tuple[str, object]]:
        """(event, element) for the start and end of elements of `tags` in part `name`. Every element is let go
        once it ends (cleared and taken off its parent), so memory holds one path of the document, not its tree;
        past MAX_ELEMENTS elements (a small file of millions of empty ones) the document is refused."""
        open_elements: list = []
        self.elements = 0  # each part on its own: a workbook's strings and its sheets are counted apart
        with self.archive.open(name) as raw:
            for event, element in iterparse(_Capped(raw, self), events=("start", "end")):
                if event == "start":
                    self.elements += 1
                    if self.elements > MAX_ELEMENTS:
                        raise OfficeUnreadable("The document holds more elements than Arbor reads: save it as PDF or "
                                               "text.")
                    open_elements.append(element)
                if element.tag in tags:
                    yield event, element
                if event == "end":
                    open_elements.pop()
                    element.clear()
                    if open_elements:
                        open_elements[-1].remove(element)


class _Capped(io.RawIOBase):
    def __init__(self, raw, parts: _Parts):
        self.raw, self.parts = raw, parts

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        chunk = self.raw.read(min(len(buffer), 1 << 16))
        self.parts.left -= len(chunk)
        if self.parts.left < 0:
            raise OfficeUnreadable("The document unpacks into more than Arbor reads: save it as PDF or text.")
        buffer[:len(chunk)] = chunk
        return len(chunk)


def _word(parts: _Parts) -> Iterator[str]:
    """A paragraph a line; a table row's cells separated by " | "."""
    line: list[str] = []
    row: list[str] | None = None
    for event, element in parts.events("word/document.xml", {f"{W}p", f"{W}t", f"{W}tab", f"{W}br", f"{W}tr"}):
        tag = element.tag
        if event == "start" and tag == f"{W}tr":
            row = []
        elif event == "end" and tag == f"{W}t":
            line.append(element.text or "")
        elif event == "end" and tag in (f"{W}tab", f"{W}br"):
            line.append("\t" if tag == f"{W}tab" else "\n")
        elif event == "end" and tag == f"{W}p":
            text, line = "".join(line), []
            if row is not None:
                row.append(text)
            else:
                yield text
        elif event == "end" and tag == f"{W}tr" and row is not None:
            yield " | ".join(row) if any(cell.strip() for cell in row) else ""
            row = None


def _sheets(parts: _Parts) -> Iterator[str]:
    """Each sheet under its name, a row a line, cells separated by tabs (as a spreadsheet copies them)."""
    shared = list(_shared_strings(parts)) if "xl/sharedStrings.xml" in parts.names() else []
    left = settings.ARBOR_FILE_TEXT_MAX_CHARS  # a shared string repeated in every cell is counted each time
    for title, path in _sheet_paths(parts):
        heading = f"# {title}"  # given only before the sheet's first row with text
        cells: list[str] = []
        kind, value = "", ""
        for event, element in parts.events(path, {f"{S}row", f"{S}c", f"{S}v", f"{S}t"}):
            tag = element.tag
            if event == "start" and tag == f"{S}c":
                kind, value = element.get("t", ""), ""
            elif event == "end" and tag in (f"{S}v", f"{S}t"):
                value += element.text or ""
            elif event == "end" and tag == f"{S}c":
                text = (shared[int(value)] if kind == "s" and value.isascii() and value.isdigit()
                        and int(value) < len(shared) else value)[:max(0, left)]
                left -= len(text) + 1
                cells.append(text)
            elif event == "end" and tag == f"{S}row":
                row, cells = "\t".join(cells).rstrip("\t"), []
                if row.strip():
                    yield from (heading, row) if heading else (row,)
                    heading = ""
                if left <= 0:
                    return


def _shared_strings(parts: _Parts) -> Iterator[str]:
    """The workbook's strings in order, up to four times the text bound: a cell that names one past them reads as
    empty, as the text bound would have stopped the reading before it anyway (in all but contrived files)."""
    texts: list[str] = []
    left = 4 * settings.ARBOR_FILE_TEXT_MAX_CHARS
    for event, element in parts.events("xl/sharedStrings.xml", {f"{S}si", f"{S}t"}):
        if event == "end" and element.tag == f"{S}t":
            texts.append(element.text or "")
        elif event == "end" and element.tag == f"{S}si":
            text, texts = "".join(texts), []
            left -= len(text)
            yield text
            if left <= 0:
                return


def _sheet_paths(parts: _Parts) -> list[tuple[str, str]]:
    """(name, part) of each sheet in the workbook's order, through the workbook's relationships."""
    targets = {}
    rels = "xl/_rels/workbook.xml.rels"
    if rels in parts.names():
        for event, element in parts.events(rels, {"{http://schemas.openxmlformats.org/package/2006/relationships}"
                                                  "Relationship"}):
            if event == "end":
                target = element.get("Target", "").lstrip("/")
                targets[element.get("Id")] = target if target.startswith("xl/") else f"xl/{target}"
    sheets = []
    for event, element in parts.events("xl/workbook.xml", {f"{S}sheet"}):
        if event == "end" and targets.get(element.get(f"{R}id")) in parts.names():
            sheets.append((element.get("name", "Sheet"), targets[element.get(f"{R}id")]))
    return sheets


def _slides(parts: _Parts) -> Iterator[str]:
    """Each slide under its number, a paragraph a line (speaker notes are left out)."""
    slides = sorted((name for name in parts.names() if re.fullmatch(r"ppt/slides/slide\d+\.xml", name)),
                    key=lambda name: int(re.search(r"\d+", name)[0]))
    for number, path in enumerate(slides, start=1):
        heading = f"# Slide {number}"  # given only before the slide's first text
        line: list[str] = []
        for event, element in parts.events(path, {f"{A}p", f"{A}t"}):
            if event == "end" and element.tag == f"{A}t":
                line.append(element.text or "")
            elif event == "end" and element.tag == f"{A}p":
                text, line = "".join(line), []
                if text.strip():
                    yield from (heading, text) if heading else (text,)
                    heading = ""
