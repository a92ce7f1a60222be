"""A project's knowledge files (issue 30, X2): every question asked in the project is looked for in them, and the
passages that bear on it go to that call only, as retrieved items marked ephemeral (R2): "What the model saw" shows
them, later calls do not carry them, and nothing of them is written into the conversation's record as its own.

Only the project's own files, of its owner, that have been read (`ready`); never across a project's border.
Passages are scored together over the project's files (BM25, files/chunks.py), best first, within
ARBOR_PROJECT_KNOWLEDGE_CHARS; a passage that shares no word with the question is not sent. The newest files are
read first, up to ARBOR_PROJECT_KNOWLEDGE_SCAN_CHARS of text a question (about 0.15 s of scoring on this machine),
so a project of many files never makes a question slow.
"""

from __future__ import annotations

from django.conf import settings

from conversations import items as it
from files.chunks import chunked, scored
from files.models import StoredFile


def knowledge_items(*, project_id: int, owner_id: int, question: str) -> list[it.Item]:
    files = StoredFile.objects.filter(project_id=project_id, owner_id=owner_id, kind=StoredFile.Kind.DOCUMENT,
                                      status=StoredFile.Status.READY).only("pk", "name", "text").order_by("-pk")
    passages, scanned = [], 0
    for stored in files.iterator(chunk_size=20):  # the newest first, up to the scan bound (D5: a call's cost)
        scanned += len(stored.text)
        if scanned > settings.ARBOR_PROJECT_KNOWLEDGE_SCAN_CHARS and passages:
            break
        passages.extend((stored, chunk) for chunk in chunked(stored.text))
    if not passages or not question.strip():
        return []
    scores = scored([chunk for _, chunk in passages], question)
    items, left = [], settings.ARBOR_PROJECT_KNOWLEDGE_CHARS
    for index in sorted(range(len(passages)), key=lambda i: (-scores[i], i)):
        stored, chunk = passages[index]
        if scores[index] <= 0 or len(chunk) > left:
            continue
        left -= len(chunk)
        item = it.system(f"From the project's file “{stored.name}”: {chunk.strip()}")
        items.append({**item, "ephemeral": True, "source": {"file": stored.pk}})
    return items
