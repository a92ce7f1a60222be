"""An export as the products deliver it: a `.zip` (ChatGPT's and Claude.ai's data exports hold `conversations.json`
beside the account's other files and the images). The conversations file is read from it; the images and files
stay placeholders in the messages that showed them.

An archive is untrusted: it is read only as far as its directory allows. Refused: more than MAX_ENTRIES entries,
a name that leaves the archive (`..`, an absolute path), an entry that unpacks past ARBOR_IMPORT_MAX_BYTES or more
than MAX_RATIO times its packed size (a zip bomb), and an entry whose directory lies about its size (its checksum
fails)."""

from __future__ import annotations

import io
import posixpath
import zipfile

from django.conf import settings

from config.errors import TooLarge
from conversations.transfer.plan import ImportRefused

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
