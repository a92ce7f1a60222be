"""Importing an uploaded file: reading it, and handing it to its format.

`parse` refuses what is too big or nested too deep before building anything from it; `import_any` hands
the document to its format's module (`arbor_tree.py`, `chatgpt.py`), each of which plans and writes it
through `plan.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction

from config.api import UnsafeJSON, strict_loads
from config.errors import TooLarge
from conversations.models import Conversation
from conversations.transfer import arbor_tree, chatgpt
from conversations.transfer.plan import ImportRefused, write

MAX_DEPTH = 32  # JSON nesting; Arbor's own files nest about 8 deep


def parse(raw: bytes) -> Any:
    """Decode the upload; refuse what is too big or nested too deep before building anything from it."""
    if len(raw) > settings.ARBOR_IMPORT_MAX_BYTES:
        raise TooLarge(f"The file is larger than {settings.ARBOR_IMPORT_MAX_BYTES} bytes.")
    try:
        text = raw.decode("utf-8-sig")  # a byte order mark, as some editors save the file, is no part of it
    except UnicodeDecodeError:
        raise ImportRefused("The file is not UTF-8 text.") from None
    try:
        # The API's strict reading: deep nesting, NUL, lone surrogates and out-of-range numbers are refused.
        return strict_loads(text, max_depth=MAX_DEPTH)
    except UnsafeJSON as error:  # "$.nodes[0].sent[0].text: a NUL character (\u0000) cannot be stored"
        raise ImportRefused(str(error)) from None
    except ValueError as error:
        raise ImportRefused(f"The file is not valid JSON: {error}") from None


@dataclass(frozen=True)
class Imported:
    conversations: list[Conversation]
    skipped: list[dict[str, Any]]  # {"index", "error"}: the file's entries that could not be read


def import_any(*, owner, document: Any) -> Imported:
    """Import Arbor's tree format or ChatGPT's conversations.json, whichever `document` is. An entry of a
    file of several that cannot be read is skipped and named, and the others import; nothing readable is
    refused whole (and creates nothing)."""
    if isinstance(document, dict) and document.get("format") == arbor_tree.TREE_FORMAT:
        return Imported([arbor_tree.import_tree(owner=owner, document=document)], [])
    entries = [document] if isinstance(document, dict) else document
    if not isinstance(entries, list) or not any(isinstance(e, dict) and "mapping" in e for e in entries):
        raise ImportRefused("Unknown file: expected Arbor's tree export or ChatGPT's conversations.json.")
    plans, skipped = [], []
    for index, entry in enumerate(entries):
        try:
            if not isinstance(entry, dict) or "mapping" not in entry:
                raise ImportRefused(f"conversations[{index}]: not a ChatGPT conversation (it has no mapping).")
            plans.append(chatgpt.chatgpt_plan(entry, index))
        except ImportRefused as refused:
            skipped.append({"index": index, "error": refused.message})
    if not plans:
        raise ImportRefused("Nothing in the file could be imported: "
                            + "; ".join(entry["error"] for entry in skipped[:5]))
    with transaction.atomic():
        return Imported([write(owner=owner, plan=plan) for plan in plans], skipped)
