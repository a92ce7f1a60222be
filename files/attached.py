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
from files import embedding
from files.chunks import best_chunks, chunked
from files.models import StoredFile

logger = logging.getLogger("arbor.files")


def contents(owner_id: int, path: Sequence[Any], new_items: Iterable[it.Item] = (), *, images_linked: bool = False,
             recorded: dict[str, Any] | None = None) -> dict[int, dict[str, Any]]:
    """The contents, by file id, of `owner_id`'s files that the questions on `path` (nodes with `sent`) and
    `new_items` refer to: one query, then one storage read an image. A file deleted since, or another person's
    (a reference no upload of this person made), is left out: its label stays, its bytes never go.
    `images_linked`: an image is its content URL instead of its bytes (what a person reads of a call).
    A document longer than ARBOR_FILE_WHOLE_CHARS is its parts that bear on the call's question (`chunks`), its
    entry saying which (`parts_chosen`); `recorded`: the parts a past call was sent (`Node.file_parts`), shown as
    they were (a past call that recorded none chose by words alone)."""
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
    files = sorted(mine.only("pk", "kind", "content_type", "blob", "text", "size"),
                   key=lambda f: newest_first.get(f.pk, 0))
    large = {f.pk: f.text for f in files if f.kind == StoredFile.Kind.DOCUMENT
             and len(f.text) > settings.ARBOR_FILE_WHOLE_CHARS}
    closeness = embedding.closeness(large, question, owner=owner_id) if recorded is None else {}
    for stored in files:
        if stored.kind == StoredFile.Kind.IMAGE:
            if stored.size <= images_left and (image := _image(stored, linked=images_linked)) is not None:
                images_left -= stored.size
                found[stored.pk] = image
        elif stored.pk not in large:
            found[stored.pk] = {"text": stored.text}
        else:
            found[stored.pk] = _parts(stored.text, question, closeness.get(stored.pk),
                                      (recorded or {}).get(str(stored.pk)))
    return found


def _image(stored: StoredFile, *, linked: bool) -> dict[str, Any] | None:
    """An image as a call gets it (its bytes as a data URL) or as a person reads it (`linked`: its content URL)."""
    if linked:
        return {"url": f"/api/files/{stored.pk}/content/"}
    try:
        with default_storage.open(stored.blob.name, "rb") as handle:
            data = base64.b64encode(handle.read()).decode()
    except OSError:  # its bytes are gone from the store: the call gets its label, the conversation goes on
        logger.error("file %s has no bytes at %s", stored.pk, stored.blob.name)
        return None
    return {"url": f"data:{stored.content_type};base64,{data}"}


BY_MEANING = "by meaning and words"
BY_WORDS = "by words"


def _parts(text: str, question: str, closeness: list[float] | None, recorded: dict[str, Any] | None
           ) -> dict[str, Any]:
    """A large document as a call gets it (R2): its best parts for `question`, or the ones a past call recorded,
    said as such."""
    chunks = chunked(text)
    if recorded is not None:
        chosen, how = [i for i in recorded["chunks"] if 0 <= i < len(chunks)], recorded["by"]
        parts, total = [chunks[i] for i in chosen], len(chunks)
    else:
        chosen, parts, total = best_chunks(text, question, settings.ARBOR_FILE_WHOLE_CHARS, closeness)
        how = BY_MEANING if closeness is not None else BY_WORDS
    numbers = ", ".join(str(index + 1) for index in chosen)
    return {"text": "\n[…]\n".join(parts), "parts": f"parts {numbers} of {total}, chosen for this question {how}",
            "chosen": {"chunks": chosen, "by": how}}


def parts_chosen(found: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """What a call records of the large documents `contents` gave it (`Node.file_parts`); None for none."""
    chosen = {str(file_id): content["chosen"] for file_id, content in found.items() if "chosen" in content}
    return chosen or None
