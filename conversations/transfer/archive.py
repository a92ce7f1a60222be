"""An export as the products deliver it: a `.zip` (ChatGPT's and Claude.ai's data exports hold `conversations.json`
beside the account's other files and the images). The conversations file is read from it; an image a person sent
ChatGPT, which its messages name by id (`sediment://file_…`, `file-service://file-…`) and the archive holds as
`file_…-name.png`, becomes a file of the importer's, sent with that question again when the conversation goes on
(X1); one the archive does not hold, or that Arbor does not read, stays the placeholder it was.

An archive is untrusted: it is read only as far as its directory allows. Refused: more than MAX_ENTRIES entries,
a name that leaves the archive (`..`, an absolute path), an entry that unpacks past ARBOR_IMPORT_MAX_BYTES or more
than MAX_RATIO times its packed size (a zip bomb), and an entry whose directory lies about its size (its checksum
fails)."""

from __future__ import annotations

import io
import posixpath
import re
import zipfile
from typing import Any

from django.conf import settings

from config.errors import TooLarge
from conversations.transfer.plan import ImportRefused, Plan, show_files
from files.sniff import UnsupportedFile, sniff

MAGIC = b"PK\x03\x04"
MAX_ENTRIES = 20_000
MAX_RATIO = 200  # text packs well (JSON of chats about 5-15×); more than this is a bomb, not an export
CONVERSATIONS = ("conversations.json",)


def is_archive(raw: bytes) -> bool:
    return raw.startswith(MAGIC)


def conversations_file(raw: bytes) -> bytes:
    """The bytes of the archive's conversations file, bounded; ImportRefused for anything else."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(raw))
    except zipfile.BadZipFile as error:
        raise ImportRefused(f"The file looks like a .zip archive but cannot be read: {error}.") from None
    with archive:
        entries = archive.infolist()
        if len(entries) > MAX_ENTRIES:
            raise ImportRefused(f"The archive holds {len(entries)} entries; an export holds at most {MAX_ENTRIES}.")
        for entry in entries:
            _check_name(entry.filename)
        found = [e for e in entries if not e.is_dir() and posixpath.basename(e.filename) in CONVERSATIONS
                 and e.filename.count("/") <= 1]
        if not found:
            raise ImportRefused("The archive holds no conversations.json: export your data again and upload the "
                                ".zip as it came, or the conversations.json inside it.")
        found.sort(key=lambda e: e.filename.count("/"))
        return _read(archive, found[0])


def _check_name(name: str) -> None:
    normal = posixpath.normpath(name.replace("\\", "/"))
    if name.startswith(("/", "\\")) or normal == ".." or normal.startswith("../") or ":" in name.split("/")[0]:
        raise ImportRefused(f"The archive names a file outside itself ({name!r}): it is refused.")


def _read(archive: zipfile.ZipFile, entry: zipfile.ZipInfo) -> bytes:
    limit = settings.ARBOR_IMPORT_MAX_BYTES
    if entry.file_size > limit:
        raise TooLarge(f"{entry.filename} unpacks to {entry.file_size} bytes; the limit is {limit}.")
    if entry.compress_size and entry.file_size / entry.compress_size > MAX_RATIO:
        raise ImportRefused(f"{entry.filename} unpacks to {entry.file_size // max(1, entry.compress_size)} times its "
                            "packed size: refused as a zip bomb.")
    try:
        # zipfile reads no more than the directory's size for the entry, and a directory that lies about it fails
        # the entry's checksum: what is read stays within the limit checked above.
        with archive.open(entry) as stream:
            return stream.read()
    except (zipfile.BadZipFile, NotImplementedError, RuntimeError, EOFError) as error:
        raise ImportRefused(f"{entry.filename} cannot be unpacked: {error}.") from None


POINTER = re.compile(r"(?:file-service|sediment)://(file[-_][A-Za-z0-9]+)")
_MEMBER_ID = re.compile(r"^(file[-_][A-Za-z0-9]+)")


class ArchiveFiles:
    """The files beside an archive's conversations, found by the id its messages name them by, each read at most
    once and bounded as an upload is: ARBOR_FILE_MAX_BYTES a file, ARBOR_IMPORT_MAX_BYTES in all, no bomb."""

    def __init__(self, raw: bytes):
        self._archive = zipfile.ZipFile(io.BytesIO(raw))
        self._by_id: dict[str, zipfile.ZipInfo] = {}
        for entry in self._archive.infolist():
            found = _MEMBER_ID.match(posixpath.basename(entry.filename))
            if found and not entry.is_dir():
                self._by_id.setdefault(found[1], entry)
        self._left = settings.ARBOR_IMPORT_MAX_BYTES
        self._read: dict[str, tuple[str, bytes, str] | None] = {}

    def __bool__(self) -> bool:
        return bool(self._by_id)

    def get(self, file_id: str) -> tuple[str, bytes, str] | None:
        """(name, bytes, kind) of the file the messages call `file_id`; None when the archive holds none Arbor
        reads (then the message keeps its placeholder)."""
        if file_id not in self._read:
            self._read[file_id] = self._load(file_id)
        return self._read[file_id]

    def _load(self, file_id: str) -> tuple[str, bytes, str] | None:
        entry = self._by_id.get(file_id)
        if entry is None or entry.file_size > min(settings.ARBOR_FILE_MAX_BYTES, self._left):
            return None
        data = _read(self._archive, entry)
        self._left -= len(data)
        name = posixpath.basename(entry.filename)
        try:
            _, kind = sniff(data, name)
        except UnsupportedFile:
            return None
        return name, data, kind


def with_archive_files(plan: Plan, files: ArchiveFiles) -> Plan:
    """`plan` with each question that names an image (or a file) the archive holds carrying it as a file of its
    own (X1): the placeholder text stays, as the person saw it; the bytes go in `plan.files`, which the writer
    makes the importer's."""
    for node in plan.nodes.values():
        sent, added = [], []
        for item in node.fields.get("sent") or []:
            if item.get("type") == "user" and isinstance(item.get("text"), str):
                refs = _refs(item, files, plan)
                if refs:
                    item, added = {**item, "files": refs}, refs
            sent.append(item)
        node.fields["sent"] = sent
        show_files(node, added)
    return plan


def _refs(item: dict[str, Any], files: ArchiveFiles, plan: Plan) -> list[dict[str, Any]]:
    refs = list(item.get("files") or [])
    for file_id in dict.fromkeys(POINTER.findall(item["text"])):
        found = files.get(file_id)
        if found is None or len(refs) >= settings.ARBOR_FILES_PER_TURN:
            continue
        name, data, kind = found
        plan.files[file_id] = {"name": name, "data": data}
        refs.append({"id": file_id, "name": name, "kind": kind})
    return refs
