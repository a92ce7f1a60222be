"""Issue 29 (X1, R2): a document longer than ARBOR_FILE_WHOLE_CHARS goes to a call as its parts that bear on the
call's question, said as such in what the model saw; each later call chooses again for its own question, and a
call's record shows the parts that call got. Once the worker has embedded the document (R4), the parts are chosen by
meaning as well as by words: through arbor/echo-embed, and a loopback OpenAI-compatible server's /v1/embeddings
(`stub`) where the provider must fail."""

from __future__ import annotations

import json
import re

import pytest

from conversations.jobs import worker
from conversations.models import Node, OutboxJob
from conversations.turns.detached import run_here
from conversations.turns.seen import call_context
from conversations.turns.start import turn_ask
from files import embedding
from files.attached import BY_MEANING, BY_WORDS
from files.chunks import best_chunks, chunked
from files.models import FileChunkVector, StoredFile
from tests.files.test_files import ready
from tests.support.openai_stub import Reply

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
    assert re.search(r"\[file handbook.txt, parts [\d, ]+ of 8, chosen for this question by [a-z ]+: Chapter",
                     asked[-1].data["answer"]), "the digest says the call got parts, not the whole"
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


STUB_MODEL = "openai/text-embedding-3-small"
VOLCANIC = "Tell me about volcanic eruptions"  # no word of the handbook's: words alone give its beginning


def _ask(user, conversation, content: str, files=()) -> Node:
    events = run_here(turn_ask(user=user, conversation_id=conversation.pk, content=content, files=list(files)))
    assert events[-1].type == "done", events[-1].data
    return Node.objects.get(pk=events[-1].data["head"])


def test_issue_29_r2_r4_a_large_document_is_embedded_after_reading_and_its_parts_chosen_by_meaning_too(
        api, conversation, user, settings):
    settings.ARBOR_FILE_WHOLE_CHARS = 4500
    small = ready(api, "note.txt", b"A short note, sent whole.")
    book = ready(api, "handbook.txt", handbook())
    worker.run_due()
    jobs = OutboxJob.objects.filter(kind="embed_file")
    assert [job.payload["file"] for job in jobs] == [book["id"]], "only a document chosen from by parts is embedded"
    assert FileChunkVector.objects.filter(file_id=book["id"], model="arbor/echo-embed").count() == 8
    assert not FileChunkVector.objects.filter(file_id=small["id"]).exists()
    assert best_chunks(handbook().decode(), VOLCANIC, 4500)[0] == [0, 1], "by words: nothing matches"

    node = _ask(user, conversation, VOLCANIC, [book["id"]])
    got = _document_part(node)
    assert f"chosen for this question {BY_MEANING}" in got and "Chapter 3: the volcano." in got
    assert node.file_parts == {str(book["id"]): {"chunks": [0, 2], "by": BY_MEANING}}

    FileChunkVector.objects.all().delete()  # what an embedding would say now no longer decides a past call
    assert _document_part(Node.objects.get(pk=node.pk)) == got, "what the model saw is what that call got"
    later = _ask(user, conversation, VOLCANIC + " again")
    assert f"parts 1, 2 of 8, chosen for this question {BY_WORDS}" in _document_part(later), "no vectors: words"


def test_issue_29_r4_an_embedding_provider_down_leaves_words_to_choose_and_loses_nothing(
        api, conversation, user, settings, stub):
    settings.ARBOR_FILE_WHOLE_CHARS = 4500
    settings.ARBOR_EMBEDDING_MODEL = STUB_MODEL
    stub.script(Reply.server_error())  # the worker's embedding call fails: the job is retried, the file is ready
    book = ready(api, "handbook.txt", handbook())
    worker.run_due()
    job = OutboxJob.objects.get(kind="embed_file")
    assert job.status == "pending" and job.attempts == 1 and "InternalServerError" in job.last_error
    assert StoredFile.objects.get(pk=book["id"]).status == "ready" and not FileChunkVector.objects.exists()
    node = _ask(user, conversation, VOLCANIC, [book["id"]])
    assert node.file_parts[str(book["id"])]["by"] == BY_WORDS, "a call never waits on the worker"

    OutboxJob.objects.filter(pk=job.pk).update(run_after=job.created_at)  # its backoff is over
    worker.run_due()
    assert FileChunkVector.objects.filter(model=STUB_MODEL).count() == 8
    assert _ask(user, conversation, VOLCANIC + "?").file_parts[str(book["id"])]["by"] == BY_MEANING
    stub.script(Reply.server_error())  # now the question's own embedding fails: words choose, the call goes on
    assert _ask(user, conversation, VOLCANIC + "!").file_parts[str(book["id"])]["by"] == BY_WORDS


def test_issue_29_after_a_change_of_embedding_model_the_sweep_embeds_documents_again(api, user, settings, stub):
    settings.ARBOR_FILE_WHOLE_CHARS = 4500
    book = ready(api, "handbook.txt", handbook())
    unread = ready(api, "other.txt", handbook() + b"\n\nAn appendix.")
    worker.run_due()
    assert set(FileChunkVector.objects.values_list("model", flat=True)) == {"arbor/echo-embed"}
    StoredFile.objects.filter(pk=unread["id"]).update(status="failed")  # no longer sent: its old vectors only go
    settings.ARBOR_EMBEDDING_MODEL = STUB_MODEL
    assert embedding.backfill() is True
    assert set(FileChunkVector.objects.values_list("model", "file_id")) == {(STUB_MODEL, book["id"])}
    assert FileChunkVector.objects.count() == 8 and embedding.backfill() is False, "done: nothing left"
    embedding.embed_file_job({"file": book["id"]})  # again: idempotent, no call
    assert FileChunkVector.objects.count() == 8
    settings.ARBOR_EMBEDDING_MODEL = ""
    assert embedding.backfill() is False and not embedding.wants_vectors("x" * 5000, 1)


def test_issue_29_a_file_deleted_while_its_parts_are_embedded_gets_no_vectors(api, user, settings, monkeypatch):
    settings.ARBOR_FILE_WHOLE_CHARS = 4500
    settings.ARBOR_EMBEDDING_MODEL = ""  # read, not embedded yet
    book = ready(api, "handbook.txt", handbook())
    real = embedding.vectors_of

    def deleted_meanwhile(model, texts):
        vectors = real(model, texts)
        assert api.delete(f"/api/files/{book['id']}/").status_code == 204  # the person deletes it meanwhile
        return vectors

    monkeypatch.setattr(embedding, "vectors_of", deleted_meanwhile)
    assert embedding.embed_file(book["id"], "arbor/echo-embed") == 0
    assert not FileChunkVector.objects.exists() and not StoredFile.objects.exists()


def test_issue_29_a_document_read_while_no_model_was_set_is_embedded_once_a_call_chooses_from_it(
        api, conversation, user, settings):
    settings.ARBOR_FILE_WHOLE_CHARS = 4500
    settings.ARBOR_EMBEDDING_MODEL = ""
    book = ready(api, "handbook.txt", handbook())
    worker.run_due()
    assert not OutboxJob.objects.filter(kind="embed_file").exists()
    settings.ARBOR_EMBEDDING_MODEL = "arbor/echo-embed"
    assert _ask(user, conversation, VOLCANIC, [book["id"]]).file_parts[str(book["id"])]["by"] == BY_WORDS
    _ask(user, conversation, VOLCANIC + "?")
    assert OutboxJob.objects.filter(kind="embed_file", status="pending").count() == 1, "one job, however many calls"
    worker.run_due()
    assert FileChunkVector.objects.filter(file_id=book["id"], model="arbor/echo-embed").count() == 8
    assert _ask(user, conversation, VOLCANIC + "!").file_parts[str(book["id"])]["by"] == BY_MEANING


def test_issue_29_the_parts_a_call_got_travel_with_its_export_to_another_person(api, other_api, conversation, user,
                                                                                   settings):
    from conversations.transfer import arbor_tree

    settings.ARBOR_FILE_WHOLE_CHARS = 4500
    book = ready(api, "handbook.txt", handbook())
    worker.run_due()
    node = _ask(user, conversation, VOLCANIC, [book["id"]])
    got = _document_part(node)
    document = arbor_tree.export_tree(conversation)
    imported = other_api.post("/api/conversations/import/", data=json.dumps(document), content_type="application/json")
    assert imported.status_code == 201, imported.content
    copy = Node.objects.get(conversation_id=imported.json()["conversations"][0]["id"], sent__0__text=VOLCANIC)
    (theirs,) = copy.file_parts
    assert theirs != str(book["id"]) and copy.file_parts[theirs] == node.file_parts[str(book["id"])]
    assert _document_part(copy) == got, "what the model saw, in the importer's copy too"
