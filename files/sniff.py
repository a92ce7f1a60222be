"""What a file is, read from its bytes (never from its name, which anyone can choose)."""

from __future__ import annotations

import io
import zipfile

from config.errors import ArborError

# Leading bytes -> (content type, kind)
_MAGIC: list[tuple[bytes, str, str]] = [
    (b"\x89PNG\r\n\x1a\n", "image/png", "image"),
    (b"\xff\xd8\xff", "image/jpeg", "image"),
    (b"GIF87a", "image/gif", "image"),
    (b"GIF89a", "image/gif", "image"),
    (b"%PDF-", "application/pdf", "document"),
]
# A text file's type, refined by its name's ending once its bytes are known to be text.
_TEXT_TYPES = {".md": "text/markdown", ".markdown": "text/markdown", ".csv": "text/csv", ".html": "text/html",
               ".htm": "text/html", ".json": "application/json"}
_OFFICE = {"word/document.xml": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
           "xl/workbook.xml": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
           "ppt/presentation.xml": "application/vnd.openxmlformats-officedocument.presentationml.presentation"}


class UnsupportedFile(ArborError):
    code = "unsupported_file"
    status = 415


def sniff(data: bytes, name: str) -> tuple[str, str]:
    """(content type, kind) of `data`; UnsupportedFile for bytes Arbor cannot send a model."""
    for magic, content_type, kind in _MAGIC:
        if data.startswith(magic):
            return content_type, kind
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp", "image"
    if data.startswith(b"PK\x03\x04"):
        return _office(data), "document"
    if _is_text(data):
        ending = name[name.rfind("."):].lower() if "." in name else ""
        return _TEXT_TYPES.get(ending, "text/plain"), "document"
    raise UnsupportedFile("This kind of file cannot be read: send an image (PNG, JPEG, GIF, WebP), a PDF, an "
                          "Office document or text.")


def _office(data: bytes) -> str:
    try:
        names = set(zipfile.ZipFile(io.BytesIO(data)).namelist())
    except zipfile.BadZipFile:
        names = set()
    for member, content_type in _OFFICE.items():
        if member in names:
            return content_type
    raise UnsupportedFile("A ZIP archive is no document: send the files in it one by one.")


def _is_text(data: bytes) -> bool:
    return decoded(data) is not None


def decoded(data: bytes) -> str | None:
    """`data` as text: UTF-8, else Windows-1252 (what a spreadsheet on Windows saves a CSV as) when nearly every
    character is printable; None for bytes that are no text."""
    if b"\x00" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    text = data.decode("cp1252", errors="replace")
    printable = sum(ch.isprintable() or ch in "\r\n\t" for ch in text)
    return text if printable >= 0.98 * len(text) and "\ufffd" not in text else None
