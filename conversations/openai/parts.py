"""A user message's content parts as the gateway reads them (issue 29, X1): text, and the files the parts carry.

Chat Completions sends `image_url` (a data URL) and `file` (`file_data` as a data URL, or `file_id`) parts;
Responses `input_image` and `input_file`; Anthropic `image` and `document` blocks (converted to these in
`messages.py`). A file comes back as a pending reference: its bytes, or an Arbor file id (`file-12` or `12`, a
file of `/api/files/`). `files.services.resolve_pending` turns it into the person's file before anything is
written. The server fetches nothing: a remote URL is refused.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from typing import Any

from django.conf import settings

from config.errors import BadInput, TooLarge

TEXT_PARTS = frozenset({"text", "input_text"})
_DATA_URL = re.compile(r"data:([\w.+-]+/[\w.+-]+)?(;[\w-]+=[^;,]*)*;base64,(.*)", re.DOTALL)
_ENDINGS = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp",
            "application/pdf": "pdf", "text/plain": "txt", "text/markdown": "md", "text/csv": "csv"}


def user_content(content: Any, where: str, *, text_parts: frozenset[str] = TEXT_PARTS) -> tuple[str, list[dict]]:
    """The text of a user message's content (its text parts, one a line) and the files its parts carry, as
    pending references (see the module)."""
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    if not isinstance(content, list):
        raise BadInput(f"{where}.content: expected text or a list of content parts.")
    texts: list[str] = []
    files: list[dict] = []
    for index, part in enumerate(content):
        at = f"{where}.content[{index}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in text_parts and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind in ("image_url", "input_image"):
            files.append(_image(part, at, len(files)))
        elif kind in ("file", "input_file"):
            files.append(_file(part.get("file") if kind == "file" else part, at, len(files)))
        else:
            raise BadInput(f"{at}: this server reads text, image and file parts (got {kind!r}).")
    return "\n".join(texts), files


def _image(part: dict, where: str, index: int) -> dict:
    url = part.get("image_url")
    if isinstance(url, dict):
        url = url.get("url")
    if url is None and part.get("file_id") is not None:
        return _by_id(part["file_id"], where)
    return _inline(url, None, where, f"image-{index + 1}")


def _file(value: Any, where: str, index: int) -> dict:
    if not isinstance(value, dict):
        raise BadInput(f"{where}: a file part holds `file_data` (a data URL) or a `file_id`.")
    if value.get("file_id") is not None:
        return _by_id(value["file_id"], where)
    return _inline(value.get("file_data"), value.get("filename"), where, f"file-{index + 1}")


def _inline(url: Any, name: Any, where: str, fallback: str) -> dict:
    if not isinstance(url, str) or not url.startswith("data:"):
        raise BadInput(f"{where}: send the file's bytes as a data URL (data:<type>;base64,…); this server fetches "
                       "nothing from a URL.")
    found = _DATA_URL.fullmatch(url)
    if found is None:
        raise BadInput(f"{where}: not a base64 data URL.")
    try:
        data = base64.b64decode(found.group(3), validate=True)
    except (binascii.Error, ValueError):
        raise BadInput(f"{where}: the data URL's base64 does not decode.") from None
    if len(data) > settings.ARBOR_FILE_MAX_BYTES:
        raise TooLarge(f"{where}: the file is larger than {settings.ARBOR_FILE_MAX_BYTES} bytes.")
    if not isinstance(name, str) or not name.strip():
        name = f"{fallback}.{_ENDINGS.get(found.group(1) or '', 'bin')}"
    return {"pending": "bytes", "name": name[:255], "data": data, "sha256": hashlib.sha256(data).hexdigest()}


def _by_id(value: Any, where: str) -> dict:
    return {"pending": "id", "id": file_id(value, where)}


def file_id(value: Any, where: str) -> int:
    """The id in a `file_id` (`file-<id>` of /api/files/, or the bare number)."""
    text = str(value).removeprefix("file-")
    if not text.isdigit() or not 0 < int(text) < 2**63:
        raise BadInput(f"{where}.file_id: {value!r} names no file of this server (`file-<id>` of /api/files/).")
    return int(text)
