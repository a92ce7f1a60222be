"""What can be done with a person's files (X1): upload, read, delete, and the worker's text extraction."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import connection, transaction
from django.db.models import ProtectedError
from django.utils import timezone

from config.errors import ArborError, NotFound, TooLarge
from conversations import llm, outbox
from conversations.models import OutboxJob, Project
from files import extract
from files.embedding import vectors_wanted, wants_vectors
from files.models import FileChunkVector, StoredFile
from files.sniff import sniff

logger = logging.getLogger("arbor.files")


def too_large() -> TooLarge:
    return TooLarge(f"The file is larger than {settings.ARBOR_FILE_MAX_BYTES} bytes.")


def file_upload(*, user, name: str, data: bytes, project_id: int | None = None) -> StoredFile:
    """Keep `data` as `user`'s file: checked whole before anything is stored. Its bytes are kept once per
    person (a second upload of the same bytes shares them); a document's text is read by the worker."""
    if len(data) > settings.ARBOR_FILE_MAX_BYTES:
        raise too_large()
    name = (name or "file").replace("\\", "/").rsplit("/", 1)[-1][:255] or "file"
    content_type, kind = sniff(data, name)
    if kind == StoredFile.Kind.IMAGE and len(data) > settings.ARBOR_IMAGE_MAX_BYTES:
        raise TooLarge(f"An image goes to a model whole, and models take images up to "
                       f"{settings.ARBOR_IMAGE_MAX_BYTES // (1024 * 1024)} MB; this one is "
                       f"{len(data) / (1024 * 1024):.1f} MB: send it smaller.")
    project = None
    if project_id is not None:
        project = Project.objects.filter(pk=project_id, owner=user).first()
        if project is None:
            raise NotFound(f"No project {project_id} of yours.")
    sha = hashlib.sha256(data).hexdigest()
    path = f"files/{user.pk}/{sha}"
    ready = kind == StoredFile.Kind.IMAGE
    with transaction.atomic():
        _bytes_lock(path)  # a delete of the same bytes waits: it cannot take them from under this file
        if not default_storage.exists(path):
            path = default_storage.save(path, ContentFile(data))
        stored = StoredFile.objects.create(
            owner=user, project=project, name=name, content_type=content_type, kind=kind, size=len(data),
            sha256=sha, blob=path, status=StoredFile.Status.READY if ready else StoredFile.Status.PROCESSING)
        if not ready:
            outbox.enqueue(kind="extract", payload={"file": stored.pk})
    if (made := _made_here.get()) is not None:
        made.append((stored.pk, path))
    return stored


_made_here: ContextVar[list[tuple[int, str]] | None] = ContextVar("arbor_files_made_here", default=None)


@contextmanager
def files_made_here() -> Iterator[list[tuple[int, str]]]:
    """The files a request makes from its own content (a gateway call's image and file parts), as (id, bytes path):
    for `drop_unsent` when the request is refused, since a refused request changes nothing."""
    made: list[tuple[int, str]] = []
    token = _made_here.set(made)
    try:
        yield made
    finally:
        _made_here.reset(token)


DROP_AFTER_SECONDS = 60.0


def drop_unsent(made: list[tuple[int, str]]) -> None:
    """Have the worker delete the files `made` that no call sent, a minute from now: by then another request of the
    same person that found the same bytes (and took this file) has recorded its call, which keeps the file."""
    job = outbox.enqueue(kind="drop_unsent", payload={"files": [[file_id, path] for file_id, path in made]})
    OutboxJob.objects.filter(pk=job.pk).update(run_after=timezone.now() + timedelta(seconds=DROP_AFTER_SECONDS))


def drop_unsent_job(payload: dict[str, Any]) -> None:
    """The worker's `drop_unsent` job: the files a refused call made go, unless a call sent them (its node keeps
    them), with their bytes when no other file shares them."""
    for file_id, path in payload["files"]:
        with transaction.atomic():
            _bytes_lock(path)
            StoredFile.objects.select_for_update().filter(pk=file_id).first()  # its vectors written first (`embedding`)
            try:
                StoredFile.objects.filter(pk=file_id).delete()
            except ProtectedError:
                continue
            if not StoredFile.objects.filter(blob=path).exists():
                default_storage.delete(path)


def file_for_user(*, user, file_id: int) -> StoredFile:
    stored = StoredFile.objects.filter(pk=file_id, owner=user).first()
    if stored is None:
        raise NotFound(f"No file {file_id} of yours.")
    return stored


def file_delete(*, user, file_id: int) -> None:
    """Delete a file nothing sent (X1: a node's reference keeps it); its bytes go when no other file shares them."""
    stored = file_for_user(user=user, file_id=file_id)
    with transaction.atomic():
        _bytes_lock(stored.blob.name)  # an upload of the same bytes waits, then stores them again if they went
        # The worker's `embed_file` holds this row while it writes the file's vectors: the delete sees them all.
        StoredFile.objects.select_for_update().filter(pk=stored.pk).first()
        try:
            stored.delete()
        except ProtectedError:
            raise ArborError("This file was sent in a conversation: it stays while that conversation does.",
                             code="file_in_use", status=409) from None
        if not StoredFile.objects.filter(blob=stored.blob.name).exists():
            default_storage.delete(stored.blob.name)


def _bytes_lock(path: str) -> None:
    """Hold, until the transaction ends, the lock of one person's bytes at `path` (PostgreSQL; SQLite has one
    writer at a time anyway), so an upload and a delete of the same bytes never interleave."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [path])


def orphan_blobs_sweep(*, older_than_seconds: float) -> list[str]:
    """Delete the stored bytes no file refers to (left by an import that rolled back, a process killed between
    storing bytes and recording the file, or a person's or staff's delete that cascaded): each older than
    `older_than_seconds`, so an upload under way is never swept. Returns what was deleted."""
    cutoff = timezone.now() - timedelta(seconds=older_than_seconds)
    swept = []
    try:
        owners, _ = default_storage.listdir("files")
    except FileNotFoundError:
        return swept
    for owner in owners:
        _, names = default_storage.listdir(f"files/{owner}")
        for name in names:
            path = f"files/{owner}/{name}"
            try:
                with transaction.atomic():
                    _bytes_lock(path)
                    if (not StoredFile.objects.filter(blob=path).exists()
                            and default_storage.get_modified_time(path) < cutoff):
                        default_storage.delete(path)
                        swept.append(path)
            except Exception:  # gone meanwhile, or the store or database busy: the next sweep looks again
                logger.info("files_sweep: %s left for the next sweep", path, exc_info=True)
    return swept


def extract_job(payload: dict[str, Any]) -> None:
    """The worker's `extract` job (R4): read a document's text once; idempotent (a file already read is left)."""
    stored = StoredFile.objects.filter(pk=payload["file"], status=StoredFile.Status.PROCESSING).first()
    if stored is None:
        return
    with default_storage.open(stored.blob.name, "rb") as handle:
        data = handle.read()
    try:
        text, status, error = extract.text_of(data, stored.content_type), StoredFile.Status.READY, ""
    except extract.Unreadable as reason:
        text, status, error = "", StoredFile.Status.FAILED, str(reason)
    except Exception as error:  # a reader's own failure on hostile bytes: said, never a file stuck in processing
        logger.exception("reading file %s failed", stored.pk)
        text, status, error = "", StoredFile.Status.FAILED, f"The file could not be read ({error.__class__.__name__})."
    with transaction.atomic():
        StoredFile.objects.filter(pk=stored.pk).update(text=text, status=status, error=error[:500])
        # A call chooses its parts (`embedding`): a large document, or a project's knowledge (as it is now: the
        # file may have joined a project while it was read)
        project = StoredFile.objects.filter(pk=stored.pk).values_list("project_id", flat=True).first()
        if status == StoredFile.Status.READY and wants_vectors(text, project):
            outbox.enqueue(kind="embed_file", payload={"file": stored.pk})


def files_to_send(*, user, file_ids: list[int]) -> list[dict[str, Any]]:
    """The references a turn's question carries (X1), each file `user`'s own and ready; refused otherwise
    before anything is written: 404 for a file not theirs, 409 for one still being read, 400 for one unread."""
    _check_count(len(file_ids))
    found = {f.pk: f for f in StoredFile.objects.filter(pk__in=file_ids, owner=user)}
    references = []
    for file_id in dict.fromkeys(file_ids):
        stored = found.get(file_id)
        if stored is None:
            raise NotFound(f"No file {file_id} of yours.")
        if stored.status == StoredFile.Status.PROCESSING:
            raise ArborError(f"The file {stored.name!r} is still being read; send it in a moment.",
                             code="file_not_ready", status=409)
        if stored.status == StoredFile.Status.FAILED:
            raise ArborError(f"The file {stored.name!r} could not be read: {stored.error}", code="bad_input",
                             status=400)
        references.append(reference(stored))
    return references


def _check_count(count: int) -> None:
    if count > settings.ARBOR_FILES_PER_TURN:
        raise ArborError(f"Attach at most {settings.ARBOR_FILES_PER_TURN} files to one message.", code="bad_input",
                         status=400)


def reference(stored: StoredFile) -> dict[str, Any]:
    """What a question keeps of a file (X1): its id, name and kind, its bytes' digest (a resent list is matched
    by it) and what it adds to a call (C1)."""
    return {"id": stored.pk, "name": stored.name, "kind": stored.kind, "sha256": stored.sha256,
            "tokens": _tokens(stored)}


def imported_files(*, user, files: dict[Any, dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    """The files an import carries (by the file's own key: name and bytes) as `user`'s, each a question's
    reference: the same bytes kept before are that file; a document is read now, so the conversation goes on
    at once."""
    return {key: reference(_kept(user, {**entry, "sha256": hashlib.sha256(entry["data"]).hexdigest()}))
            for key, entry in files.items()}


def resolve_pending(*, user, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`items` with the files the gateway read from content parts (`conversations.openai.parts`) made `user`'s
    own: bytes are kept as a file (the same bytes again are the file kept before; a document is read now, since
    the call needs its text), an id must name a file of theirs. Checked like any question's files
    (`files_to_send`); nothing pending is ever stored."""
    waiting = [item for item in items if item.get("type") == "user" and any("pending" in r for r in item.get(
        "files", ()))]
    for item in waiting:  # what can be refused is refused before any bytes are kept
        _check_count(len(item["files"]))
        if named := [ref["id"] for ref in item["files"] if ref["pending"] == "id"]:
            files_to_send(user=user, file_ids=named)
    resolved = []
    for item in items:
        if item in waiting:
            ids = [ref["id"] if ref["pending"] == "id" else _kept(user, ref).pk for ref in item["files"]]
            item = {**item, "files": files_to_send(user=user, file_ids=ids)}
        resolved.append(item)
    return resolved


def _kept(user, pending: dict[str, Any]) -> StoredFile:
    """The file of `user` holding the pending bytes: one kept before (one that could not be read says so again),
    or a new one."""
    same = StoredFile.objects.filter(owner=user, sha256=pending["sha256"]).order_by("id").first()
    stored = same or file_upload(user=user, name=pending["name"], data=pending["data"])
    if stored.status == StoredFile.Status.PROCESSING:
        extract_job({"file": stored.pk})  # the call needs the text now; the queued job then finds it read
        stored.refresh_from_db()
    return stored


# What one image costs a call, about: OpenAI counts 765 tokens for a 1024x1024 picture in detail, Anthropic about
# 1,600 for its largest; the larger, so compaction (C1) comes early rather than late.
IMAGE_TOKENS = 1600


def _tokens(stored: StoredFile) -> int:
    """About what `stored` adds to a call (C1): an image's fixed cost, a document's text at four characters a
    token, with its label."""
    if stored.kind == StoredFile.Kind.IMAGE:
        return IMAGE_TOKENS
    sent = stored.text[:settings.ARBOR_FILE_WHOLE_CHARS]  # a large document goes as its best parts (`chunks`)
    return llm.estimate_tokens([{"type": "text", "text": f"[file {stored.name}]\n{sent}"}])


@transaction.atomic
def project_files_set(*, user, project: Project, file_ids: list[int]) -> None:
    """Make exactly `file_ids` (the person's own files) the project's knowledge files (issue 30); a file taken out
    stays the person's. NotFound, changing nothing, when one is not theirs."""
    wanted = set(file_ids)
    found = set(StoredFile.objects.filter(pk__in=wanted, owner_id=user.pk).values_list("pk", flat=True))
    if found != wanted:
        raise NotFound(f"No file {min(wanted - found)} of yours.")
    StoredFile.objects.filter(project=project).exclude(pk__in=wanted).update(project=None)
    StoredFile.objects.filter(pk__in=wanted).update(project=project)
    # A question in the project chooses among its passages by meaning too (`embedding.closeness`).
    if settings.ARBOR_EMBEDDING_MODEL:
        embedded = FileChunkVector.objects.filter(file_id__in=wanted, model=settings.ARBOR_EMBEDDING_MODEL)
        ready = StoredFile.objects.filter(pk__in=wanted, kind=StoredFile.Kind.DOCUMENT, status=StoredFile.Status.READY)
        vectors_wanted(list(ready.exclude(pk__in=embedded.values("file_id")).values_list("pk", flat=True)))
