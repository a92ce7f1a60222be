"""A document's text, for a model that reads it (X1). Runs in the worker (R4), never in a request.

Word, Excel and PowerPoint files are read from their XML (files/office.py). PDF is read by pypdf: pure Python (no
native library to build or patch), maintained, and it reads the text layer a PDF carries; a scanned PDF without
one says so instead of sending nothing.
"""

from __future__ import annotations

import io

from django.conf import settings

from files.html_text import html_text
from files.office import OfficeUnreadable, office_text
from files.sniff import decoded


class Unreadable(Exception):
    """The reason, in words a person reads, that a file's text could not be read."""


def text_of(data: bytes, content_type: str) -> str:
    """The text a model gets of a document, at most ARBOR_FILE_TEXT_MAX_CHARS characters."""
    if content_type == "application/pdf":
        text = _pdf_text(data)
    elif content_type == "text/html":
        text = html_text(decoded(data) or "")
    elif content_type.startswith("text/") or content_type == "application/json":
        text = decoded(data) or ""
    elif content_type.startswith("application/vnd.openxmlformats-officedocument."):
        try:
            text = office_text(data, content_type)
        except OfficeUnreadable as error:
            raise Unreadable(str(error)) from None
    else:
        raise Unreadable("This kind of file is not read: save it as PDF or text.")
    text = text.strip()
    if not text:
        raise Unreadable("The file holds no text to read (an empty document, or a scan without a text layer?).")
    return text[:settings.ARBOR_FILE_TEXT_MAX_CHARS]


def _pdf_text(data: bytes) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            raise Unreadable("The PDF is locked with a password.")
        pages, length = [], 0
        for page in reader.pages:  # stop once the bound is reached: a 2,000-page PDF is not read whole
            pages.append(page.extract_text() or "")
            length += len(pages[-1])
            if length >= settings.ARBOR_FILE_TEXT_MAX_CHARS:
                break
    except (PdfReadError, ValueError, KeyError, TypeError) as error:
        raise Unreadable(f"The PDF could not be read ({error.__class__.__name__}).") from None
    return "\n\n".join(pages)


