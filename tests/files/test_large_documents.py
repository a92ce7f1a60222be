"""Issue 29 (X1, R2): a document longer than ARBOR_FILE_WHOLE_CHARS goes to a call as its parts that bear on the
call's question, said as such in what the model saw; each later call chooses again for its own question, and a
call's record shows the parts that call got."""

from __future__ import annotations

import re

import pytest

from conversations.models import Node
from conversations.turns.detached import run_here
from conversations.turns.seen import call_context
from conversations.turns.start import turn_ask
from files.chunks import best_chunks, chunked
from tests.files.test_files import ready

pytestmark = pytest.mark.django_db

TOPICS = ["harbour", "glacier", "volcano", "orchard", "lighthouse", "desert", "canyon", "meadow"]


def handbook() -> bytes:
    """Eight chapters of about 2,000 characters, each about one thing."""
    chapters = []
    for number, topic in enumerate(TOPICS, start=1):
        body = f"The {topic} is described here in detail. " * 48
        chapters.append(f"Chapter {number}: the {topic}.\n{body.strip()}")
    return "\n\n".join(chapters).encode()


def _document_part(node: Node) -> str:
    """The handbook's part of what `node`'s call got (its record: "what the model saw")."""
    for message in call_context(node):
        for part in message["content"] if isinstance(message["content"], list) else ():
            if part.get("text", "").startswith("[file handbook.txt"):
                return part["text"]
    raise AssertionError("the call got no handbook")


def test_x1_r2_a_large_document_sends_the_parts_that_answer_the_question(api, conversation, user, settings):
    settings.ARBOR_FILE_WHOLE_CHARS = 4500  # two chapters' worth
    book = ready(api, "handbook.txt", handbook())
    asked = run_here(turn_ask(user=user, conversation_id=conversation.pk, content="Tell me about the volcano",
                              files=[book["id"]]))
    assert re.search(r"\[file handbook.txt, parts [\d, ]+ of 8, chosen for this question: Chapter", asked[-1].data[
        "answer"]), "the digest says the call got parts, not the whole"
    first = Node.objects.get(pk=asked[-1].data["head"])
    got = _document_part(first)
    assert "Chapter 3: the volcano." in got and len(got) < 4700 and got.count("Chapter ") == 2

    later = run_here(turn_ask(user=user, conversation_id=conversation.pk, content="And the lighthouse?"))
    got_later = _document_part(Node.objects.get(pk=later[-1].data["head"]))
    assert "Chapter 5: the lighthouse." in got_later and "Chapter 3: the volcano." not in got_later
    assert _document_part(first) == got, "a call's record shows the parts that call got"


def test_x1_a_question_that_shares_no_word_gets_the_beginning_and_every_part_fits_the_bound():
    text = handbook().decode()
    pieces = chunked(text)
    assert "".join(pieces) == text and len(pieces) == 8 and all(len(p) <= 2000 for p in pieces)
    chosen, parts, total = best_chunks(text, "zzz qqq", 4500)
    assert (chosen, total) == ([0, 1], 8) and parts[0].startswith("Chapter 1")
    chosen, parts, _ = best_chunks(text, "desert canyon", 4500)
    assert chosen == [5, 6] and sum(map(len, parts)) <= 4500
    assert chunked("x" * 4100) == ["x" * 2000, "x" * 2000, "x" * 100], "no break: cut at the size"
