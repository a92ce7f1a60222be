"""Issue 29 (X1, D5): Word, Excel and PowerPoint files are read as text, from real files made by those programs
(tests/fixtures/files/SOURCES.md), bounded against crafted ones: a "zip bomb" stops at the unpacked-bytes bound,
an external entity is never fetched, and reading ends at the text bound."""

from __future__ import annotations

import io
import zipfile

import pytest

from files import extract
from files.sniff import sniff
from tests.files.test_files import FIXTURES, ready

pytestmark = pytest.mark.django_db

WORD = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
W = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'


def _text(name: str) -> str:
    data = (FIXTURES / name).read_bytes()
    return extract.text_of(data, sniff(data, name)[0])


def _docx(document_xml: str) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", "<Types/>")
        archive.writestr("word/document.xml", document_xml)
    return buffer.getvalue()


def test_x1_a_word_documents_paragraphs_and_table_rows_are_its_text():
    text = _text("tables.docx")
    assert text.splitlines()[:3] == ["1 | 2 | 3", "4 | 5 | 6", "7 | 8 | 9"], "a row a line, cells apart"
    assert "4 | 6" in text.splitlines(), "merged cells read once"


def test_x1_a_workbooks_sheets_go_by_name_with_rows_of_cells():
    assert _text("sheets.xlsx").splitlines() == ["# Sheet1", "Foo", "123", "# Sheet3", "Foo", "Bar", "234"], \
        "shared strings and numbers in the workbook's order; the empty sheet says nothing"


def test_x1_a_decks_slides_go_in_order():
    lines = _text("slides.pptx").splitlines()
    assert lines[0] == "# Slide 1" and lines[1] == "Text frame having no auto-size setting"
    assert lines.index("# Slide 2") < lines.index("abc")


def test_x1_an_uploaded_workbook_is_read_by_the_worker_and_the_model_gets_its_text(api, conversation, user):
    file = ready(api, "sheets.xlsx", (FIXTURES / "sheets.xlsx").read_bytes())
    assert file["status"] == "ready", file
    answered = api.post(f"/api/conversations/{conversation.pk}/turns/", {"content": "Sum?", "files": [file["id"]]},
                        format="json")
    assert answered.status_code == 201, answered.content
    assert "[file sheets.xlsx: # Sheet1" in answered.json()["answer"], "the echo model's digest of what it got"


def test_d5_a_document_that_unpacks_past_the_bound_is_refused(settings):
    settings.ARBOR_OFFICE_XML_MAX_BYTES = 1_000_000
    bomb = _docx(f"<w:document {W}><w:body>" + "<w:p/>" * 2_000_000 + "</w:body></w:document>")
    assert len(bomb) < 100_000, "12 MB of XML in a small file"
    with pytest.raises(extract.Unreadable, match="unpacks into more than Arbor reads"):
        extract.text_of(bomb, WORD)


def test_d5_a_documents_text_stops_at_the_bound_without_reading_on(settings):
    settings.ARBOR_FILE_TEXT_MAX_CHARS = 100
    settings.ARBOR_OFFICE_XML_MAX_BYTES = 2_000_000
    many = _docx(f"<w:document {W}><w:body>" + "<w:p><w:r><w:t>words and words</w:t></w:r></w:p>" * 100_000
                 + "</w:body></w:document>")  # 5 MB of XML: the bound is reached long before the cap
    assert len(extract.text_of(many, WORD)) == 100


def test_d5_an_external_entity_is_never_fetched():
    crafted = _docx(f'<?xml version="1.0"?><!DOCTYPE d [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
                    f"<w:document {W}><w:body><w:p><w:r><w:t>&x;</w:t></w:r></w:p></w:body></w:document>")
    with pytest.raises(extract.Unreadable) as refused:
        extract.text_of(crafted, WORD)
    assert "root:" not in str(refused.value)


@pytest.mark.parametrize("data", [
    b"PK\x03\x04 not a zip at all",
    _docx("<w:document"),  # cut off
])
def test_x1_a_broken_office_file_says_it_could_not_be_read(data):
    with pytest.raises(extract.Unreadable, match="could not be read"):
        extract.text_of(data, WORD)


def test_x1_tabs_and_breaks_in_a_paragraph_are_kept_and_an_unknown_type_is_not_read():
    document = _docx(f"<w:document {W}><w:body><w:p><w:r><w:t>a</w:t><w:tab/><w:t>b</w:t><w:br/><w:t>c</w:t></w:r>"
                     "</w:p></w:body></w:document>")
    assert extract.text_of(document, WORD) == "a\tb\nc"
    with pytest.raises(extract.Unreadable, match="This kind of file is not read"):
        extract.text_of(b"\x00\x01", "application/octet-stream")


def test_d5_a_workbook_of_many_strings_is_read_up_to_the_bound_not_refused(settings, monkeypatch):
    """Shared strings are read up to four times the text bound, so a workbook of very many different strings is
    read (its first cells) rather than refused for its element count."""
    from files import office

    settings.ARBOR_FILE_TEXT_MAX_CHARS = 60
    monkeypatch.setattr(office, "MAX_ELEMENTS", 400)
    ns = 'xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"'
    rel = 'xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships"'
    strings = "".join(f"<si><t>word{n}</t></si>" for n in range(1000))  # 2,000 elements
    cells = "".join(f'<row><c t="s"><v>{n}</v></c></row>' for n in range(50))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", "<Types/>")
        archive.writestr("xl/workbook.xml", f'<workbook {ns} {rel}><sheets><sheet name="S" r:id="r1"/></sheets>'
                                            "</workbook>")
        archive.writestr("xl/_rels/workbook.xml.rels", '<Relationships xmlns="http://schemas.openxmlformats.org/'
                         'package/2006/relationships"><Relationship Id="r1" Target="worksheets/s.xml"/>'
                         "</Relationships>")
        archive.writestr("xl/sharedStrings.xml", f"<sst {ns}>{strings}</sst>")
        archive.writestr("xl/worksheets/s.xml", f"<worksheet {ns}><sheetData>{cells}</sheetData></worksheet>")
    text = extract.text_of(buffer.getvalue(), "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet")
    assert text.startswith("# S\nword0\nword1\n") and len(text) <= 60
