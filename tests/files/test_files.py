"""Issue 29 (X1): a person's files. Uploaded through the API (type read from the bytes, bounded, private), read by
the worker (R4), sent by reference on a question, and what each call got shown by arbor/echo's digest and by a
real OpenAI-compatible server (the loopback stub) through litellm.

tests/fixtures/files/hello-world.pdf and locked.pdf are pypdf's own test files (github.com/py-pdf/pypdf,
resources/hello-world.pdf and resources/encryption/r6-user-password.pdf, commit f6853ccd)."""

from __future__ import annotations

import base64
import json
import struct
import zlib
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from conversations.jobs import worker
from conversations.models import Conversation, Node
from conversations.turns.detached import run_here
from conversations.turns.seen import call_context
from conversations.turns.start import turn_ask, turn_regenerate
from files.models import SentFile, StoredFile
from tests.conversations.helpers import answer, head

pytestmark = pytest.mark.django_db

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "files"


def png(width: int = 2, height: int = 1) -> bytes:
    """A real PNG (any decoder reads it): signature, IHDR, one IDAT of RGB rows, IEND."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def upload(api, name: str, data: bytes, **fields):
    return api.post("/api/files/", {"file": SimpleUploadedFile(name, data), **fields}, format="multipart")


def ready(api, name: str, data: bytes) -> dict:
    created = upload(api, name, data)
    assert created.status_code == 201, created.content
    worker.run_due()
    return api.get(f"/api/files/{created.json()['id']}/").json()


def test_x1_the_type_is_read_from_the_bytes_and_a_document_is_read_by_the_worker(api):
    created = upload(api, "notes.png", b"# Plan\n\nShip the files API first.\n")  # a name that lies
    assert created.status_code == 201
    body = created.json()
    assert (body["content_type"], body["kind"], body["status"]) == ("text/plain", "document", "processing")
    worker.run_due()  # R4: the text is read after the upload's commit, by the worker
    stored = StoredFile.objects.get(pk=body["id"])
    assert stored.status == "ready" and stored.text.startswith("# Plan")
    picture = upload(api, "photo.txt", png()).json()
    assert (picture["content_type"], picture["kind"], picture["status"]) == ("image/png", "image", "ready")
    pdf = ready(api, "hello.pdf", (FIXTURES / "hello-world.pdf").read_bytes())
    assert pdf["content_type"] == "application/pdf" and pdf["status"] == "ready"
    assert "Hello World" in StoredFile.objects.get(pk=pdf["id"]).text
    page = ready(api, "page.html", b"<html><head><script>steal()</script></head><body><p>Hi <b>there</b></p></body>")
    assert page["content_type"] == "text/html" and StoredFile.objects.get(pk=page["id"]).text == "Hi there"


def test_x1_an_unreadable_file_says_why_and_bad_bytes_are_refused_storing_nothing(api, settings):
    locked = ready(api, "locked.pdf", (FIXTURES / "locked.pdf").read_bytes())
    assert locked["status"] == "failed" and "password" in locked["error"]
    assert upload(api, "a.bin", b"\x00\x01\x02binary").status_code == 415
    settings.ARBOR_FILE_MAX_BYTES = 1000
    too_big = upload(api, "big.txt", b"x" * 1001)
    assert too_big.status_code == 413 and too_big.json()["error"]["code"] == "too_large"
    assert api.post("/api/files/", {}, format="multipart").status_code == 400
    assert StoredFile.objects.count() == 1, "only the locked PDF was kept"


def test_x1_files_are_private_and_their_bytes_never_show_as_a_page(api, other_api):
    stored = ready(api, "evil.html", b"<html><body><script>alert(1)</script>hello</body></html>")
    content = api.get(f"/api/files/{stored['id']}/content/")
    assert content.status_code == 200 and b"".join(content.streaming_content).startswith(b"<html>")
    assert content["Content-Disposition"].startswith("attachment") and content["X-Content-Type-Options"] == "nosniff"
    assert "sandbox" in content["Content-Security-Policy"]
    for path in (f"/api/files/{stored['id']}/", f"/api/files/{stored['id']}/content/"):
        assert other_api.get(path).status_code == 404
    assert other_api.delete(f"/api/files/{stored['id']}/").status_code == 404
    assert other_api.get("/api/files/").json()["count"] == 0 and api.get("/api/files/").json()["count"] == 1


def test_x1_echo_sees_an_image_as_an_image_part_and_a_document_as_its_text(api, conversation):
    picture = upload(api, "cat.png", png()).json()
    notes = ready(api, "notes.md", b"Meeting notes: ship on Friday.")
    response = api.post(f"/api/conversations/{conversation.pk}/turns/",
                        {"content": "What do these say?", "files": [picture["id"], notes["id"]]}, format="json")
    assert response.status_code == 201, response.content
    text = response.json()["answer"]
    assert "echo: What do these say?" in text
    assert "user:What do these say? [image cat.png] [file notes.md: Meeting notes: ship on Friday.]" in text
    node = head(conversation)
    assert [{k: ref[k] for k in ("id", "name", "kind")} for ref in node.sent[0]["files"]] == [
        {"id": picture["id"], "name": "cat.png", "kind": "image"},
        {"id": notes["id"], "name": "notes.md", "kind": "document"}]
    assert set(SentFile.objects.filter(node=node).values_list("file_id", flat=True)) == {picture["id"], notes["id"]}
    # A later call on the path gets the files again (they are the question's), read from the one stored copy.
    follow = api.post(f"/api/conversations/{conversation.pk}/turns/", {"content": "and now?"}, format="json")
    assert "user:What do these say? [image cat.png] [file notes.md: Meeting" in follow.json()["answer"]
    # What the model saw, as a person reads it: the image as a link to its bytes, never the bytes again.
    seen = call_context(node)
    parts = seen[-1]["content"]
    assert {"type": "image_url", "image_url": {"url": f"/api/files/{picture['id']}/content/"}} in parts


def test_x1_a_regenerated_question_keeps_its_files_and_a_sent_file_cannot_be_deleted(api, conversation, user):
    notes = ready(api, "notes.txt", b"The code word is marmalade.")
    run_here(turn_ask(user=user, conversation_id=conversation.pk, content="Word?", files=[notes["id"]]))
    again = run_here(turn_regenerate(user=user, conversation_id=conversation.pk))
    assert "[file notes.txt: The code word is marmalade.]" in answer(again)
    refused = api.delete(f"/api/files/{notes['id']}/")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "file_in_use"
    assert StoredFile.objects.filter(pk=notes["id"]).exists()
    unsent = ready(api, "draft.txt", b"draft")
    assert api.delete(f"/api/files/{unsent['id']}/").status_code == 204
    assert api.get(f"/api/files/{unsent['id']}/").status_code == 404
    assert api.delete(f"/api/conversations/{conversation.pk}/").status_code == 204
    assert api.delete(f"/api/files/{notes['id']}/").status_code == 204, "its conversation gone, the file may go"


def test_x1_a_turn_with_a_file_not_yours_not_read_or_too_many_changes_nothing(api, other_api, conversation, settings):
    theirs = ready(other_api, "theirs.txt", b"secret")
    mine = upload(api, "slow.txt", b"not read yet").json()  # the worker has not run
    for files, status in (([theirs["id"]], 404), ([mine["id"]], 409), ([10**12], 404)):
        response = api.post(f"/api/conversations/{conversation.pk}/turns/", {"content": "hi", "files": files},
                            format="json")
        assert response.status_code == status, (files, response.content)
    settings.ARBOR_FILES_PER_TURN = 1
    worker.run_due()
    second = ready(api, "two.txt", b"two")
    response = api.post(f"/api/conversations/{conversation.pk}/turns/",
                        {"content": "hi", "files": [mine["id"], second["id"]]}, format="json")
    assert response.status_code == 400
    assert Node.objects.count() == 0, "nothing was written for a refused question"


def test_x1_a_model_that_cannot_see_refuses_an_image_before_any_call(api, conversation, stub, settings):
    settings.ARBOR_MODELS = [*settings.ARBOR_MODELS, "openai/gpt-3.5-turbo"]
    conversation.model = "openai/gpt-3.5-turbo"  # litellm's list: no vision
    conversation.save()
    picture = upload(api, "cat.png", png()).json()
    response = api.post(f"/api/conversations/{conversation.pk}/turns/", {"content": "see?", "files": [picture["id"]]},
                        format="json")
    assert response.status_code == 400 and "cannot see images" in response.json()["error"]["message"]
    assert stub.requests == [] and Node.objects.count() == 0
    # Switched to such a model after the image was sent: the next call would send it too, so it refuses as well.
    Conversation.objects.filter(pk=conversation.pk).update(model="arbor/echo")
    assert api.post(f"/api/conversations/{conversation.pk}/turns/", {"content": "see?", "files": [picture["id"]]},
                    format="json").status_code == 201
    Conversation.objects.filter(pk=conversation.pk).update(model="openai/gpt-3.5-turbo")  # the head stays
    later = api.post(f"/api/conversations/{conversation.pk}/turns/", {"content": "and now?"}, format="json")
    assert later.status_code == 400 and "cannot see images" in later.json()["error"]["message"]
    assert stub.requests == [] and Node.objects.count() == 1


def test_x1_a_real_server_gets_the_image_as_a_data_url_and_the_document_as_text(api, conversation, stub):
    conversation.model = "openai/stub-model"
    conversation.save()
    picture = upload(api, "cat.png", png()).json()
    notes = ready(api, "notes.csv", b"name,score\nada,3\n")
    response = api.post(f"/api/conversations/{conversation.pk}/turns/",
                        {"content": "Read these", "files": [picture["id"], notes["id"]]}, format="json")
    assert response.status_code == 201, response.content
    (request,) = stub.requests
    parts = request["messages"][-1]["content"]
    assert parts[0] == {"type": "text", "text": "Read these"}
    image = next(part for part in parts if part["type"] == "image_url")
    assert image["image_url"]["url"].startswith("data:image/png;base64,iVBORw0KGgo")
    assert {"type": "text", "text": "[file notes.csv]\nname,score\nada,3"} in parts


def test_x1_an_export_carries_its_files_and_an_import_makes_them_the_importers(api, other_api, conversation, user,
                                                                              other_user):
    """Arbor JSON carries the files a conversation's questions sent (base64) and imports back whole: the importer
    gets them as files of their own, and the next call sees them as before."""
    secret = ready(api, "secret.txt", b"The vault code is 4711.")
    picture = upload(api, "cat.png", png()).json()
    run_here(turn_ask(user=user, conversation_id=conversation.pk, content="Keep this",
                      files=[secret["id"], picture["id"]]))
    document = json.loads(b"".join(api.get(f"/api/conversations/{conversation.pk}/export/",
                                           {"format": "json"}).streaming_content))
    assert [(f["name"], base64.b64decode(f["data"])[:4]) for f in document["files"]] == [
        ("secret.txt", b"The "), ("cat.png", b"\x89PNG")]
    imported = other_api.post("/api/conversations/import/", document, format="json")
    assert imported.status_code == 201, imported.content
    (copy,) = imported.json()["conversations"]
    theirs = StoredFile.objects.filter(owner=other_user).order_by("id")
    assert [(f.name, f.status) for f in theirs] == [("secret.txt", "ready"), ("cat.png", "ready")]
    follow = other_api.post(f"/api/conversations/{copy['id']}/turns/", {"content": "What was the code?"},
                            format="json")
    assert "seen: user:Keep this [file secret.txt: The vault code is 4711.] [image cat.png] | " in \
        follow.json()["answer"]
    (question,) = [n for n in Node.objects.filter(conversation_id=copy["id"]) if n.sent and n.sent[0].get("files")]
    assert {ref["id"] for ref in question.sent[0]["files"]} == set(theirs.values_list("pk", flat=True))
    assert SentFile.objects.filter(node=question).count() == 2


def test_x1_a_reference_the_import_does_not_carry_is_a_name_never_someones_file(api, other_api, conversation, user):
    """A crafted file naming another person's file id (without carrying it) reaches nothing: the reference is
    the file's name in the question's text."""
    secret = ready(api, "secret.txt", b"The vault code is 4711.")
    run_here(turn_ask(user=user, conversation_id=conversation.pk, content="Keep this", files=[secret["id"]]))
    document = json.loads(b"".join(api.get(f"/api/conversations/{conversation.pk}/export/",
                                           {"format": "json"}).streaming_content))
    document["files"] = []
    imported = other_api.post("/api/conversations/import/", document, format="json")
    (copy,) = imported.json()["conversations"]
    follow = other_api.post(f"/api/conversations/{copy['id']}/turns/", {"content": "What was the code?"},
                            format="json")
    seen = follow.json()["answer"]
    assert "seen: user:Keep this\n[file: secret.txt] | " in seen and "4711" not in seen
    for bad, error in ((["x"], "files[0]: each file needs an `id`"),
                       ([{"id": 1, "name": "a", "data": "@@"}], "files[0].data: not base64"),
                       ([{"id": 1, "name": "a.bin", "data": base64.b64encode(b"\x00\x01").decode()}],
                        "files[0]: This kind of file cannot be read")):
        refused = other_api.post("/api/conversations/import/", {**document, "files": bad}, format="json")
        assert refused.status_code == 400 and error in str(refused.json()), refused.json()


def test_x1_staff_see_a_conversations_files_with_size_status_and_the_nodes_that_sent_them(
        api, conversation, user, admin_client):
    notes = ready(api, "notes.txt", b"x" * 2048)
    run_here(turn_ask(user=user, conversation_id=conversation.pk, content="Read", files=[notes["id"]]))
    listing = admin_client.get("/admin/files/storedfile/", {"q": str(conversation.pk)})
    assert listing.status_code == 200 and "notes.txt" in listing.content.decode() and "2.0" in listing.content.decode()
    detail = admin_client.get(f"/admin/files/storedfile/{notes['id']}/change/").content.decode()
    assert f"node {head(conversation).pk}" in detail and f"(conversation {conversation.pk})" in detail


def test_x1_the_question_bubble_names_its_files_with_a_download_link(api, page, conversation, user):
    notes = ready(api, "plan.md", b"# Plan")
    run_here(turn_ask(user=user, conversation_id=conversation.pk, content="Read my plan", files=[notes["id"]]))
    html = page.get(f"/chat/{conversation.pk}/").content.decode()
    assert f'href="/api/files/{notes["id"]}/content/" download>📄 plan.md</a>' in html
    markdown = b"".join(api.get(f"/api/conversations/{conversation.pk}/export/", {"format": "md"}).streaming_content)
    assert "## Question\n\nRead my plan\n\n- File: plan.md\n" in markdown.decode()


def test_c1_a_questions_files_count_in_its_nodes_tokens(api, conversation, user):
    """C1: compaction knows what a file adds to every later call, without reading the file to count a path."""
    long = ready(api, "long.txt", b"lorem ipsum " * 2000)  # 24,000 characters: about 6,000 tokens
    picture = upload(api, "cat.png", png()).json()
    plain = run_here(turn_ask(user=user, conversation_id=conversation.pk, content="plain"))
    plain_tokens = Node.objects.get(pk=plain[-1].data["head"]).tokens
    with_files = run_here(turn_ask(user=user, conversation_id=conversation.pk, content="plain",
                                   files=[long["id"], picture["id"]]))
    node = Node.objects.get(pk=with_files[-1].data["head"])
    (text_ref, image_ref) = node.sent[0]["files"]
    assert 5900 < text_ref["tokens"] < 6200 and image_ref["tokens"] == 1600
    assert node.tokens >= plain_tokens + text_ref["tokens"] + image_ref["tokens"]
    assert node.path_tokens >= node.tokens


def test_t7_x1_an_edited_question_keeps_its_files_unless_told_otherwise(api, conversation, user):
    shot = upload(api, "shot.png", png()).json()
    notes = ready(api, "notes.txt", b"Second file.")
    run_here(turn_ask(user=user, conversation_id=conversation.pk, content="Whta is this?", files=[shot["id"]]))
    asked = head(conversation).pk
    fixed = api.post(f"/api/conversations/{conversation.pk}/edit/", {"node": asked, "content": "What is this?"},
                     format="json")
    assert "user:What is this? [image shot.png]" in fixed.json()["answer"], "a typo fixed keeps the screenshot"
    other = api.post(f"/api/conversations/{conversation.pk}/edit/",
                     {"node": head(conversation).pk, "content": "And this?", "files": [notes["id"]]}, format="json")
    assert "user:And this? [file notes.txt: Second file.]" in other.json()["answer"]
    assert "[image" not in other.json()["answer"]
    bare = api.post(f"/api/conversations/{conversation.pk}/edit/", {"node": head(conversation).pk,
                                                                    "content": "Nothing?", "files": []}, format="json")
    assert bare.json()["answer"].endswith("seen: user:Nothing?"), bare.json()["answer"]


def test_c2_x1_a_compaction_summary_reads_what_the_files_said(api, conversation, user, settings):
    from conversations.turns.start import turn_compact

    settings.ARBOR_COMPACTION_KEEP_TURNS = 1
    notes = ready(api, "notes.txt", b"The code word is marmalade.")
    run_here(turn_ask(user=user, conversation_id=conversation.pk, content="Remember this", files=[notes["id"]]))
    run_here(turn_ask(user=user, conversation_id=conversation.pk, content="Next"))
    root = turn_compact(user=user, conversation_id=conversation.pk)
    summary = Node.objects.get(pk=root.summary_call_id)
    assert "[file notes.txt: The code word is marmalade.]" in str(summary.received), summary.received


def test_x1_a_file_whose_bytes_are_gone_is_its_label_and_the_conversation_goes_on(api, conversation, user):
    from django.core.files.storage import default_storage

    picture = upload(api, "cat.png", png()).json()
    run_here(turn_ask(user=user, conversation_id=conversation.pk, content="See", files=[picture["id"]]))
    default_storage.delete(StoredFile.objects.get(pk=picture["id"]).blob.name)  # lost by the store, say
    follow = run_here(turn_ask(user=user, conversation_id=conversation.pk, content="Still there?"))
    assert follow[-1].type == "done" and "user:See | " in follow[-1].data["answer"]


def test_x1_a_crafted_bubble_naming_files_oddly_imports_without_them(other_api):
    document = {"format": "arbor.tree", "version": 1, "conversation": {"title": "t", "head": 1},
                "nodes": [{"id": 1, "parent": None, "kind": "turn", "status": "succeeded",
                           "sent": [{"type": "user", "text": "hi"}], "received": [{"type": "text", "text": "yo"}]}],
                "bubbles": [{"node": 1, "role": "user", "content": "hi", "data": {"files": [{"id": [1]}, "x"]}}]}
    imported = other_api.post("/api/conversations/import/", document, format="json")
    assert imported.status_code == 201, imported.content


def test_d5_x1_images_are_bounded_one_by_one_and_in_each_call(api, conversation, user, settings):
    settings.ARBOR_IMAGE_MAX_BYTES = len(png(40, 40)) - 1
    refused = upload(api, "big.png", png(40, 40))
    assert refused.status_code == 413 and "send it smaller" in refused.json()["error"]["message"]
    settings.ARBOR_IMAGE_MAX_BYTES = 10**6
    old, new = upload(api, "old.png", png(30, 30)).json(), upload(api, "new.png", png(31, 30)).json()
    settings.ARBOR_CALL_IMAGE_MAX_BYTES = StoredFile.objects.get(pk=new["id"]).size + 10  # room for one
    run_here(turn_ask(user=user, conversation_id=conversation.pk, content="First", files=[old["id"]]))
    second = run_here(turn_ask(user=user, conversation_id=conversation.pk, content="Second", files=[new["id"]]))
    seen = second[-1].data["answer"]
    assert "user:Second [image new.png]" in seen, "the newest image goes"
    assert "user:First | " in seen, "the older one goes as its name only (a label, no image part)"


def test_x1_what_the_model_saw_links_the_image_part_it_got(api, page, conversation, user):
    picture = upload(api, "cat.png", png()).json()
    run_here(turn_ask(user=user, conversation_id=conversation.pk, content="See", files=[picture["id"]]))
    html = page.get(f"/chat/nodes/{head(conversation).pk}/seen/").content.decode()
    assert f'<a href="/api/files/{picture["id"]}/content/" download>an image part' in html and "[image cat.png]" in html
