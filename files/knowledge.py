"""A project's knowledge files (issue 30, X2): every question asked in the project is looked for in them, and the
passages that bear on it go to that call only, as retrieved items marked ephemeral (R2): "What the model saw" shows
them, later calls do not carry them, and nothing of them is written into the conversation's record as its own.

Only the project's own files, of its owner, that have been read (`ready`); never across a project's border.
Passages are scored together over the project's files by the question's words (BM25, files/chunks.py) and, once
the worker has embedded every file read (`files.embedding`; one still waiting would rank below all by meaning), by
meaning too, the two fused as retrieval fuses them (`search.fusion`); the best go first, within
ARBOR_PROJECT_KNOWLEDGE_CHARS. A passage is sent only when it shares a word with the question or is at least
ARBOR_RETRIEVAL_MIN_SIMILARITY near it in meaning, the floor retrieval across conversations keeps. The newest files
are read first, up to ARBOR_PROJECT_KNOWLEDGE_SCAN_CHARS of text a question (about 0.15 s of scoring on this machine),
so a project of many files never makes a question slow.
"""

from __future__ import annotations

from django.conf import settings

from conversations import items as it
from files import embedding
from files.chunks import chunked, scored
from files.models import StoredFile
from search.fusion import fused


def knowledge_items(*, project_id: int, owner_id: int, question: str) -> list[it.Item]:
    files = StoredFile.objects.filter(project_id=project_id, owner_id=owner_id, kind=StoredFile.Kind.DOCUMENT,
                                      status=StoredFile.Status.READY).only("pk", "name", "text").order_by("-pk")
    passages, texts, scanned = [], {}, 0
    for stored in files.iterator(chunk_size=20):  # the newest first, up to the scan bound (D5: a call's cost)
        scanned += len(stored.text)
        if scanned > settings.ARBOR_PROJECT_KNOWLEDGE_SCAN_CHARS and passages:
            break
        if stored.text:
            texts[stored.pk] = stored.text
            passages.extend((stored, number, chunk) for number, chunk in enumerate(chunked(stored.text)))
    if not passages or not question.strip():
        return []
    words = dict(enumerate(scored([chunk for _, _, chunk in passages], question)))
    near = embedding.closeness(texts, question, owner=owner_id)
    if near.keys() != texts.keys():  # a file not embedded yet would rank below every other by meaning: words alone
        near = {}
    meaning = {index: near[stored.pk][number] for index, (stored, number, _) in enumerate(passages)
               if stored.pk in near}
    floor = settings.ARBOR_RETRIEVAL_MIN_SIMILARITY
    wanted = [index for index in words if words[index] > 0 or meaning.get(index, floor - 1) >= floor]
    if not wanted:
        return []
    score = fused(words, meaning, wanted) if meaning else words
    items, left = [], settings.ARBOR_PROJECT_KNOWLEDGE_CHARS
    for index in sorted(wanted, key=lambda i: (-score[i], i)):
        stored, _, chunk = passages[index]
        if len(chunk) > left:
            continue
        left -= len(chunk)
        item = it.system(f"From the project's file “{stored.name}”: {chunk.strip()}")
        items.append({**item, "ephemeral": True, "source": {"file": stored.pk}})
    return items
