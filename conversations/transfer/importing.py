"""Importing an uploaded file: reading it, and handing it to its format.

`parse` refuses what is too big or nested too deep before building anything from it; `import_any` hands
the document to its format's module (`arbor_tree.py`; the peers' `chatgpt.py`, `openwebui.py`, `librechat.py`,
`claude.py`, `chatbotui.py`, which build their nodes with `message_tree.py`), each of which plans and writes
it through `plan.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction

from config.api import TooDeep, UnsafeJSON, strict_loads
from config.errors import TooLarge
from conversations.models import Conversation, Project
from conversations.transfer import (
    aistudio,
    arbor_tree,
    archive,
    chatbotui,
    chatgpt,
    claude,
    deepseek,
    gemini,
    grok,
    librechat,
    openwebui,
    project_file,
    sharegpt,
    sillytavern,
)
from conversations.transfer.plan import ImportRefused, Plan, write


def max_depth() -> int:
    """How deep a file may nest. Arbor's own files nest about 8 deep, but LibreChat's "recursive" export nests two
    levels a message (each reply in its message's `children`), so a file may nest two levels a node it may hold
    (issue 28: 500 messages were refused). Deep text is read without recursion (`config.api`); what is stored is
    held to MAX_JSON_DEPTH (plan.shallow). Hostile nesting stays bounded by the file's size and this."""
    return 2 * settings.ARBOR_IMPORT_MAX_NODES + 8


def parse(raw: bytes) -> Any:
    """Decode the upload; refuse what is too big or nested too deep before building anything from it."""
    if len(raw) > settings.ARBOR_IMPORT_MAX_BYTES:
        raise TooLarge(f"The file is larger than {settings.ARBOR_IMPORT_MAX_BYTES} bytes.")
    beside = None
    if archive.is_archive(raw):  # ChatGPT's and Claude.ai's exports arrive as a .zip (issue 28)
        raw, beside = archive.conversations_file(raw), archive.ArchiveFiles(raw)
    document = _decoded(raw)
    if beside and isinstance(document, list):  # the images beside the conversations go with them (X1)
        document = Archived(document)
        document.files = beside
    return document


class Archived(list):
    """The conversations read from an export's archive, with the files the archive holds beside them."""

    files: archive.ArchiveFiles


def _decoded(raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8-sig")  # a byte order mark, as some editors save the file, is no part of it
    except UnicodeDecodeError:
        raise ImportRefused("The file is not UTF-8 text.") from None
    try:
        # The API's strict reading: deep nesting, NUL, lone surrogates and out-of-range numbers are refused.
        return strict_loads(text, max_depth=max_depth())
    except TooDeep as error:
        raise ImportRefused(f"{error} A conversation file nests at most two levels a message, and holds at most "
                            f"{settings.ARBOR_IMPORT_MAX_NODES} of them.") from None
    except UnsafeJSON as error:  # "$.nodes[0].sent[0].text: a NUL character (\u0000) cannot be stored"
        raise ImportRefused(str(error)) from None
    except ValueError as error:
        lines = _json_lines(text)
        if lines is None:
            raise ImportRefused(f"The file is not valid JSON: {error}") from None
        return lines


def _json_lines(text: str) -> list | None:
    """JSON Lines (SillyTavern's chats, ShareGPT data): a value a line, read as the list of them, as strictly as a
    whole file. None when the text is not that either (then it is reported as the JSON it is not)."""
    lines = [(number, line) for number, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if len(lines) < 2 or not all(line.lstrip().startswith(("{", "[")) for _, line in lines):
        return None
    values = []
    for number, line in lines:
        try:
            values.append(strict_loads(line, max_depth=max_depth()))
        except TooDeep as error:
            raise ImportRefused(f"line {number}: {error}") from None
        except UnsafeJSON as error:
            raise ImportRefused(f"line {number}: {error}") from None
        except ValueError as error:
            if number == lines[0][0]:
                return None  # not JSON Lines at all
            raise ImportRefused(f"The file is JSON Lines, but line {number} is not valid JSON: {error}") from None
    return values


@dataclass(frozen=True)
class Imported:
    conversations: list[Conversation]
    skipped: list[dict[str, Any]]  # {"index", "error"}: the file's entries that could not be read
    project: Project | None = None  # a project file's new project (issue 30)


# Each peer format: its name, its entries when a document is one of its files (else None), one entry's plan.
_FORMATS: list[tuple[str, Callable[[Any], list | None], Callable[[Any, int], Plan]]] = [
    ("DeepSeek", deepseek.entries, deepseek.plan),  # before ChatGPT: its files have a `mapping` too
    ("ChatGPT", chatgpt.entries, chatgpt.chatgpt_plan),
    ("Open WebUI", openwebui.entries, openwebui.plan),
    ("LibreChat", librechat.entries, librechat.plan),
    ("Claude.ai", claude.entries, claude.plan),
    ("chatbot-ui", chatbotui.entries, chatbotui.plan),
    ("SillyTavern", sillytavern.entries, sillytavern.plan),
    ("ShareGPT", sharegpt.entries, sharegpt.plan),
    ("Grok", grok.entries, grok.plan),
    ("Google AI Studio", aistudio.entries, aistudio.plan),
    ("Gemini", gemini.entries, gemini.plan),
]
ACCEPTED = ("Arbor's tree export, or an export of ChatGPT, Open WebUI, LibreChat, Claude.ai or chatbot-ui, of "
            "DeepSeek or Grok, Gemini's activity from Google Takeout (MyActivity.json), a Google AI Studio prompt, a "
            "SillyTavern chat (.jsonl) or ShareGPT data")


def import_any(*, owner, document: Any) -> Imported:
    """Import whichever of the accepted formats `document` is. An entry of a file of several that cannot be read
    is skipped and named, and the others import; nothing readable is refused whole (and creates nothing)."""
    if isinstance(document, dict) and document.get("format") == arbor_tree.TREE_FORMAT:
        return Imported([arbor_tree.import_tree(owner=owner, document=document)], [])
    if isinstance(document, dict) and document.get("format") == project_file.PROJECT_FORMAT:
        project, conversations = project_file.import_project(owner=owner, document=document)
        return Imported(conversations, [], project=project)
    found = next(((name, entries, plan_of) for name, entries_of, plan_of in _FORMATS
                  if (entries := entries_of(document)) is not None), None)
    if found is None:
        raise ImportRefused(f"Unknown file: expected {ACCEPTED}.")
    name, entries, plan_of = found
    plans, skipped = [], []
    for index, entry in enumerate(entries):
        try:
            plan = plan_of(entry, index)
        except ImportRefused as refused:
            skipped.append({"index": index, "error": refused.message})
            continue
        except (TypeError, AttributeError, KeyError, ValueError) as error:
            # A field of a type the reader never met (a number where the format has a list): this entry cannot
            # be read, which is the file's fault, not the server's (issue 26: a 500 before).
            skipped.append({"index": index, "error": f"conversation {index}: a field holds a value of a type "
                                                     f"a {name} export does not have ({error})."})
            continue
        if not plan.nodes:  # nothing readable: no empty conversation is made of it (issue 26)
            skipped.append({"index": index, "error": f"conversation {index}: it holds no message that could be "
                                                     "read."})
            continue
        plans.append(archive.with_archive_files(plan, document.files) if isinstance(document, Archived) else plan)
    if not plans:
        raise ImportRefused(f"Nothing in this {name} file could be imported: "
                            + "; ".join(entry["error"] for entry in skipped[:5]))
    with transaction.atomic():
        return Imported([write(owner=owner, plan=plan) for plan in plans], skipped)
