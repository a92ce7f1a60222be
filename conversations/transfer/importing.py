"""Importing an uploaded file: reading it, and handing it to its format.

`parse` refuses what is too big or nested too deep before building anything from it; `import_any` hands
the document to its format's module (`arbor_tree.py`, `chatgpt.py`), each of which plans and writes it
through `plan.py`.
"""

from __future__ import annotations

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
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ImportRefused("The file is not UTF-8 text.") from None
    try:
        # The API's strict reading: deep nesting, NUL, lone surrogates and out-of-range numbers are refused.
        return strict_loads(text, max_depth=MAX_DEPTH)
    except UnsafeJSON as error:  # "$.nodes[0].sent[0].text: a NUL character (\u0000) cannot be stored"
        raise ImportRefused(str(error)) from None
    except ValueError as error:
        raise ImportRefused(f"The file is not valid JSON: {error}") from None


def import_any(*, owner, document: Any) -> list[Conversation]:
    """Import Arbor's tree format or ChatGPT's, whichever `document` is."""
    if isinstance(document, dict) and document.get("format") == arbor_tree.TREE_FORMAT:
        return [arbor_tree.import_tree(owner=owner, document=document)]
    if isinstance(document, dict) and "mapping" in document:
        document = [document]
    if isinstance(document, list) and document and all(isinstance(c, dict) and "mapping" in c for c in document):
        plans = [chatgpt.chatgpt_plan(c, index) for index, c in enumerate(document)]
        with transaction.atomic():
            return [write(owner=owner, plan=plan) for plan in plans]
    raise ImportRefused("Unknown file: expected Arbor's tree export or ChatGPT's conversations.json.")
