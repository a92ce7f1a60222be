"""Issue 29 (X1, D5): what a file is, read from its bytes, and the text a model gets of a document, bounded.
The PDFs are pypdf's own test files (see test_files.py)."""

from __future__ import annotations

import io
import time
import zipfile

import pytest

from conversations.jobs import worker
from files import extract
from files.models import StoredFile
from files.sniff import UnsupportedFile, sniff
from tests.files.test_files import FIXTURES, png, ready, upload

pytestmark = pytest.mark.django_db


def office(member: str) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("[Content_Types].xml", "<Types/>")
        archive.writestr(member, "<document/>")
    return buffer.getvalue()


@pytest.mark.parametrize(("data", "name", "expected"), [
    (png(), "x.bin", ("image/png", "image")),
    (b"\xff\xd8\xff\xe0\x00\x10JFIF", "x", ("image/jpeg", "image")),
    (b"GIF89a\x01\x00", "x", ("image/gif", "image")),
    (b"RIFF\x24\x00\x00\x00WEBPVP8 ", "x", ("image/webp", "image")),
    (b"%PDF-1.7\n", "x.txt", ("application/pdf", "document")),
    (office("word/document.xml"), "x.zip",
     ("application/vnd.openxmlformats-officedocument.wordprocessingml.document", "document")),
    (office("xl/workbook.xml"), "x", ("application/vnd.openxmlformats-officedocument.spreadsheetml.sheet", "document")),
    (office("ppt/presentation.xml"), "x",
     ("application/vnd.openxmlformats-officedocument.presentationml.presentation", "document")),
    ("naïve café;3\n".encode("cp1252"), "prices.csv", ("text/csv", "document")),  # a CSV Excel saved on Windows
    (b"print('hi')\n", "x.py", ("text/plain", "document")),
    (b'{"a": 1}', "x.JSON", ("application/json", "document")),
])
def test_x1_the_type_comes_from_the_bytes(data, name, expected):
    assert sniff(data, name) == expected


@pytest.mark.parametrize("data", [
    office("content.xml"),  # a ZIP that is no Office document
    b"PK\x03\x04 not really a zip",
    b"\x7fELF\x02\x01\x01\x00\x00\x00",  # a program
    bytes(range(128, 256)) * 4,  # no text in any encoding Arbor reads
])
def test_x1_bytes_that_are_no_readable_file_are_refused(data):
    with pytest.raises(UnsupportedFile):
        sniff(data, "notes.txt")


def test_d5_a_documents_text_is_bounded_and_an_empty_or_office_one_says_why(settings):
    settings.ARBOR_FILE_TEXT_MAX_CHARS = 40
    assert extract.text_of(b"word " * 100, "text/plain") == ("word " * 100).strip()[:40]
    pdf = extract.text_of((FIXTURES / "hello-world.pdf").read_bytes(), "application/pdf")
    assert len(pdf) <= 40 and pdf.startswith("English:")
    assert extract.text_of("naïve".encode("cp1252"), "text/plain") == "naïve"
    for data, content_type, reason in [
        (b"   \n", "text/plain", "no text"),
        (b"<html><script>x()</script></html>", "text/html", "no text"),
        (office("word/document.xml"), sniff(office("word/document.xml"), "")[0], "no text"),
        (b"%PDF-1.4\n garbage that is no PDF", "application/pdf", "could not be read"),
    ]:
        with pytest.raises(extract.Unreadable, match=reason):
            extract.text_of(data, content_type)


def test_x1_the_same_bytes_are_stored_once_and_go_when_no_file_keeps_them(api, settings):
    first, second = upload(api, "a.png", png()).json(), upload(api, "b.png", png()).json()
    blobs = set(StoredFile.objects.values_list("blob", flat=True))
    assert len(blobs) == 1, "two files, one copy of their bytes"
    (blob,) = blobs
    from django.core.files.storage import default_storage

    assert api.delete(f"/api/files/{first['id']}/").status_code == 204 and default_storage.exists(blob)
    assert api.delete(f"/api/files/{second['id']}/").status_code == 204 and not default_storage.exists(blob)


def test_x1_a_file_in_a_project_must_be_in_one_of_yours(api, other_api, user, other_user):
    from conversations.models import Project

    mine = Project.objects.create(owner=user, name="Mine")
    theirs = Project.objects.create(owner=other_user, name="Theirs")
    kept = upload(api, "a.txt", b"a", project=mine.pk)
    assert kept.status_code == 201 and kept.json()["project"] == mine.pk
    refused = upload(api, "b.txt", b"b", project=theirs.pk)
    assert refused.status_code == 404 and StoredFile.objects.count() == 1


def test_x1_a_body_larger_than_the_limit_is_refused_before_it_is_read(api, settings):
    settings.ARBOR_FILE_MAX_BYTES = 10
    response = api.generic("POST", "/api/files/", b"x" * 200_000, content_type="multipart/form-data; boundary=b")
    assert response.status_code == 413 and StoredFile.objects.count() == 0


def test_x1_a_file_that_could_not_be_read_is_refused_on_a_question(api, conversation):
    locked = ready(api, "locked.pdf", (FIXTURES / "locked.pdf").read_bytes())
    response = api.post(f"/api/conversations/{conversation.pk}/turns/", {"content": "hi", "files": [locked["id"]]},
                        format="json")
    assert response.status_code == 400 and "password" in response.json()["error"]["message"]


def test_r4_extraction_runs_once(api):
    stored = upload(api, "a.txt", b"first").json()
    worker.run_due()
    StoredFile.objects.filter(pk=stored["id"]).update(text="kept")
    from files.services import extract_job

    extract_job({"file": stored["id"]})  # at least once: a second run leaves a read file as it is
    assert StoredFile.objects.get(pk=stored["id"]).text == "kept"
    extract_job({"file": 10**12})  # a file deleted before its job ran: nothing to do


def test_x1_the_service_refuses_bytes_past_the_limit_too(user, settings):
    from config.errors import TooLarge
    from files.services import file_upload

    settings.ARBOR_FILE_MAX_BYTES = 3
    with pytest.raises(TooLarge):
        file_upload(user=user, name="a.txt", data=b"abcd")


def test_d5_hostile_html_is_read_in_linear_time(settings):
    """An uploaded page that makes Python's html.parser rescan (unclosed attribute quotes, comment openers; 120 KB
    took it a minute, so a 25 MB upload hours of the worker) or raise (`<![ `) is read in a blink, as its text.
    These 1.2 MB pages would take the rescanning parser over an hour; read in linear time they take under a second
    (7 s once on a loaded 2-core CI machine), so the bound leaves a slow machine room and still fails by far."""
    started = time.monotonic()
    for hostile in ("<p>kept</p>" + "<a b='" * 200_000, "<p>kept</p>" + "<!--" * 300_000, "<p>kept</p><![ x]>"):
        assert extract.text_of(hostile.encode(), "text/html").startswith("kept")
    assert time.monotonic() - started < 60
