"""Issue 28: exports as the products deliver them, a .zip (ChatGPT's and Claude.ai's data exports: conversations.json
beside the other files and the images), import as they arrive; a hostile archive is refused and creates nothing.
The conversations inside are real files (tests/fixtures/exports/SOURCES.md); the archives are built here in the
exports' layout."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest

from conversations.models import Conversation, Node
from conversations.transfer import archive

pytestmark = pytest.mark.django_db

EXPORTS = Path(__file__).resolve().parent.parent / "fixtures" / "exports"
CHATGPT = EXPORTS / "chatgpt" / "librechat-chatgpt-tree.json"
CLAUDE = EXPORTS / "claude" / "owi-importer-claude-export-last2-of-85.json"


def _zip(files: dict[str, bytes], *, compression=zipfile.ZIP_DEFLATED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=compression) as made:
        for name, data in files.items():
            made.writestr(name, data)
    return buffer.getvalue()


def _post(api, raw: bytes):
    return api.post("/api/conversations/import/", data=raw, content_type="application/zip")


def test_issue_28_chatgpts_zip_imports_as_it_arrives(api):
    """Issue 28: ChatGPT's export .zip (conversations.json, chat.html, user.json, message_feedback.json and the
    images at the top) imports the conversations as the bare conversations.json would, in one folder or none."""
    conversations = CHATGPT.read_bytes()
    expected = len(json.loads(conversations))
    for prefix in ("", "0a1b2c-2026-12-01/"):
        raw = _zip({f"{prefix}conversations.json": conversations, f"{prefix}chat.html": b"<html></html>",
                    f"{prefix}user.json": b'{"id": "user-1"}', f"{prefix}message_feedback.json": b"[]",
                    f"{prefix}file-AbC123-image.png": b"\x89PNG\r\n\x1a\n" + b"\x00" * 64})
        response = _post(api, raw)
        assert response.status_code == 201, response.json()
        assert len(response.json()["conversations"]) == expected
    assert Conversation.objects.count() == 2 * expected


def test_issue_28_claudes_zip_imports_as_it_arrives(api):
    """Issue 28: Claude.ai's export .zip (conversations.json beside users.json and projects.json)."""
    raw = _zip({"conversations.json": CLAUDE.read_bytes(), "users.json": b"[]", "projects.json": b"[]"})
    zipped = _post(api, raw)
    bare = api.post("/api/conversations/import/", data=CLAUDE.read_bytes(), content_type="application/json")
    assert zipped.status_code == bare.status_code == 201, zipped.json()
    assert [c["title"] for c in zipped.json()["conversations"]] == [c["title"] for c in bare.json()["conversations"]]
    assert zipped.json()["skipped"] == bare.json()["skipped"]


@pytest.mark.parametrize(("files", "needle"), [
    pytest.param({"../../etc/conversations.json": b"[]"}, "outside itself", id="a-path-outside"),
    pytest.param({"/abs/conversations.json": b"[]"}, "outside itself", id="an-absolute-path"),
    pytest.param({"chat.html": b"<html>"}, "no conversations.json", id="no-conversations"),
    pytest.param({"a/b/c/conversations.json": b"[]"}, "no conversations.json", id="buried-too-deep"),
    pytest.param({"conversations.json": b"\x00" * 5_000_000}, "zip bomb", id="a-bomb"),
])
def test_issue_28_d5_a_hostile_archive_is_refused_and_creates_nothing(api, files, needle):
    """Issue 28, D5: an archive that names a path outside itself, holds no conversations file, or unpacks a
    thousand times its size is refused with why, and nothing is created."""
    response = _post(api, _zip(files))
    assert response.status_code == 400 and needle in response.json()["error"]["message"], response.json()
    assert not Conversation.objects.exists() and not Node.objects.exists()


def test_issue_28_d5_an_archive_of_too_many_entries_or_past_the_size_limit_is_refused(api, settings, monkeypatch):
    """Issue 28, D5: entries are counted before any is read; a conversations file that unpacks past the import
    limit is 413, whatever the archive's size."""
    monkeypatch.setattr(archive, "MAX_ENTRIES", 10)
    response = _post(api, _zip({f"file-{n}.png": b"x" for n in range(11)} | {"conversations.json": b"[]"}))
    assert response.status_code == 400 and "12 entries" in response.json()["error"]["message"]
    settings.ARBOR_IMPORT_MAX_BYTES = 50_000
    response = _post(api, _zip({"conversations.json": json.dumps([f"{n} " * 20 for n in range(1000)]).encode()}))
    assert response.status_code == 413 and "unpacks to" in response.json()["error"]["message"]
    assert not Conversation.objects.exists()


def test_issue_28_d5_a_broken_archive_is_refused(api):
    """Issue 28, D5: bytes that start like a .zip but are not one: a clear refusal."""
    response = _post(api, archive.MAGIC + b"\x00" * 100)
    assert response.status_code == 400 and "cannot be read" in response.json()["error"]["message"]


def test_issue_28_d5_an_archive_whose_directory_lies_about_a_size_is_refused(api):
    """Issue 28, D5: an entry whose directory claims fewer bytes than it holds is read no further than the claim,
    and fails its checksum: refused, nothing created (never read past what was checked)."""
    raw = bytearray(_zip({"conversations.json": CHATGPT.read_bytes()}))
    central = raw.rfind(b"PK\x01\x02")
    raw[central + 24:central + 28] = (100).to_bytes(4, "little")  # its uncompressed size
    response = _post(api, bytes(raw))
    assert response.status_code == 400 and "cannot be unpacked" in response.json()["error"]["message"]
    assert not Conversation.objects.exists()


def test_issue_28_x1_an_image_the_person_sent_chatgpt_comes_back_as_their_file(api, user):
    """The archive holds the image a question showed (`sediment://file_…` in the message, `file_…-name.png` at the
    archive's top, as ChatGPT's 2025-26 exports lay it out): it becomes the importer's file, the question's again,
    so the next call sends it to a model that can see; an image the archive lacks stays its placeholder. The
    messages are built in the shape of the real files named in SOURCES.md (see test_import_chatgpt_today)."""
    from files.models import StoredFile
    from tests.conversations.test_import_chatgpt_today import _conversation, _message
    from tests.files.test_files import png

    def image(pointer):
        return {"content_type": "image_asset_pointer", "asset_pointer": pointer, "width": 2, "height": 1,
                "metadata": {}}

    document = _conversation(
        _message("u", "client-created-root", "user", {"content_type": "multimodal_text", "parts": [
            image("sediment://file_00000000a1b2"), image("file-service://file-Missing9"), "What is on it?"]}),
        _message("a", "u", "assistant", {"content_type": "text", "parts": ["A dot."]}),
    )
    picture = png(2, 1)
    raw = _zip({"conversations.json": json.dumps([document]).encode(), "file_00000000a1b2-screenshot.png": picture,
                "file-Other1-notes.bin": b"\x7fELF not a file Arbor reads"})
    response = _post(api, raw)
    assert response.status_code == 201, response.json()
    conversation = Conversation.objects.get(pk=response.json()["conversations"][0]["id"])
    (stored,) = StoredFile.objects.filter(owner=user)
    assert stored.name == "file_00000000a1b2-screenshot.png" and stored.kind == "image"
    question = Node.objects.get(conversation=conversation, parent=None)
    (item,) = question.sent
    assert [(ref["id"], ref["kind"]) for ref in item["files"]] == [(stored.pk, "image")]
    assert "file-service://file-Missing9" in item["text"], "the one the archive lacks stays a placeholder"
    answer = api.post(f"/api/conversations/{conversation.pk}/turns/", {"content": "And now?"}, format="json")
    assert answer.status_code == 201, answer.content
    assert "[image file_00000000a1b2-screenshot.png]" in answer.json()["answer"], "sent to the model again"
    bubble = api.get(f"/api/conversations/{conversation.pk}/bubbles/").json()["results"][0]
    assert [f["name"] for f in bubble["data"]["files"]] == ["file_00000000a1b2-screenshot.png"]


def test_issue_28_d5_archive_files_past_the_bounds_stay_placeholders(api, user, settings):
    from files.models import StoredFile
    from tests.conversations.test_import_chatgpt_today import _conversation, _message
    from tests.files.test_files import png

    settings.ARBOR_FILE_MAX_BYTES = 50
    document = _conversation(_message("u", "client-created-root", "user", {"content_type": "multimodal_text",
        "parts": [{"content_type": "image_asset_pointer", "asset_pointer": "sediment://file_big"}, "Big?"]}))
    raw = _zip({"conversations.json": json.dumps([document]).encode(), "file_big-large.png": png(40, 40) + b"\0" * 99})
    assert _post(api, raw).status_code == 201
    assert not StoredFile.objects.filter(owner=user).exists()
