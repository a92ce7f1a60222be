"""What a call's questions' files hold (X1), read once per call for `context.assemble`: a document's text, an
image's bytes as a data URL. The tree keeps only references; the bytes are read from storage when a call is
assembled, never copied per call."""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from django.conf import settings
from django.core.files.storage import default_storage

from conversations import items as it
from files.chunks import best_chunks
from files.models import StoredFile

logger = logging.getLogger("arbor.files")


def contents(owner_id: int, path: Sequence[Any], new_items: Iterable[it.Item] = (), *, images_linked: bool = False
             ) -> dict[int, dict[str, Any]]:
    """The contents, by file id, of `owner_id`'s files that the questions on `path` (nodes with `sent`) and
    `new_items` refer to: one query, then one storage read an image. A file deleted since, or another person's
    (a reference no upload of this person made), is left out: its label stays, its bytes never go.
    `images_linked`: an image is its content URL instead of its bytes (what a person reads of a call).
    A document longer than ARBOR_FILE_WHOLE_CHARS is its parts that bear on the call's question (`chunks`)."""
    new_items = list(new_items)
    ids = [*(i for node in path for i in it.file_ids(node.sent)), *it.file_ids(new_items)]
    if not ids:
        return {}
    question = next((q for q in (it.question_of(items) for items in [new_items, *(n.sent for n in reversed(path))])
                     if q is not None), "")
    found: dict[int, dict[str, Any]] = {}
    newest_first: dict[int, int] = {}
    for place, file_id in enumerate(reversed(ids)):
        newest_first.setdefault(file_id, place)
    images_left = settings.ARBOR_CALL_IMAGE_MAX_BYTES  # the newest images first; older ones go as their names
    mine = StoredFile.objects.filter(pk__in=set(ids), owner_id=owner_id)
    for stored in sorted(mine.only("pk", "kind", "content_type", "blob", "text", "size"),
                         key=lambda f: newest_first.get(f.pk, 0)):
        if stored.kind == StoredFile.Kind.IMAGE and stored.size > images_left:
            continue
        if stored.kind == StoredFile.Kind.IMAGE:
            images_left -= stored.size
        if stored.kind == StoredFile.Kind.IMAGE and images_linked:
            found[stored.pk] = {"url": f"/api/files/{stored.pk}/content/"}
        elif stored.kind == StoredFile.Kind.IMAGE:
            try:
                with default_storage.open(stored.blob.name, "rb") as handle:
                    data = base64.b64encode(handle.read()).decode()
            except OSError:  # its bytes are gone from the store: the call gets its label, the conversation goes on
                logger.error("file %s has no bytes at %s", stored.pk, stored.blob.name)
                continue
            found[stored.pk] = {"url": f"data:{stored.content_type};base64,{data}"}
        else:
            found[stored.pk] = _document(stored.text, question)
    return found


def _document(text: str, question: str) -> dict[str, Any]:
    """A document as a call gets it: whole, or (R2) its best parts for `question`, said as such."""
    if len(text) <= settings.ARBOR_FILE_WHOLE_CHARS:
        return {"text": text}
    chosen, parts, total = best_chunks(text, question, settings.ARBOR_FILE_WHOLE_CHARS)
    numbers = ", ".join(str(index + 1) for index in chosen)
    return {"text": "\n[…]\n".join(parts), "parts": f"parts {numbers} of {total}, chosen for this question"}
