"""`manage.py bench_files` (issue 29): how long a PDF takes from upload to ready, and the memory it takes.

A PDF of about `--megabytes` MB is built once: `--pages` pages of text (pypdf's own hello-world page, from its
test files) and an embedded attachment of random bytes making up the rest, as a scanned or image-heavy PDF has.
Each round uploads it through the files API's own view (multipart parsed by Django, the type sniffed, the bytes
hashed and stored), then runs the worker's extraction job (the text read by pypdf), and times both. The memory
round runs once more under tracemalloc (Python's own allocations: the peak of each step over what was held
before). Each round's file is deleted again; nothing stays behind.
"""

from __future__ import annotations

import io
import os
import resource
import statistics
import time
import tracemalloc
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from pypdf import PdfReader, PdfWriter
from rest_framework.test import APIRequestFactory, force_authenticate

from files import services
from files.apis import FileListCreate
from files.models import StoredFile

PAGE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "files" / "hello-world.pdf"


def build_pdf(megabytes: float, pages: int) -> bytes:
    page = PdfReader(PAGE).pages[0]
    writer = PdfWriter()
    for _ in range(pages):
        writer.add_page(page)
    writer.add_attachment("scan.bin", os.urandom(max(0, int(megabytes * 1024 * 1024) - PAGE.stat().st_size)))
    buffer = io.BytesIO()
    writer.write(buffer)
    return buffer.getvalue()


class Command(BaseCommand):
    help = "Upload-to-ready time and memory of a large PDF (issue 29)."

    def add_arguments(self, parser):
        parser.add_argument("--megabytes", type=float, default=20.0, help="the PDF's size (20)")
        parser.add_argument("--pages", type=int, default=200, help="its pages of text (200)")
        parser.add_argument("--repeat", type=int, default=5, help="timed rounds (5)")

    def handle(self, *args, megabytes: float, pages: int, repeat: int, **options):
        if megabytes <= 0 or pages < 1 or repeat < 1:
            raise CommandError("--megabytes above 0, --pages and --repeat at least 1.")
        pdf = build_pdf(megabytes, pages)
        user, _ = get_user_model().objects.get_or_create(username="bench-files")
        StoredFile.objects.filter(owner=user).delete()
        try:
            self._round(user, pdf)  # warm: imports, the first storage write
            timed = [self._round(user, pdf) for _ in range(repeat)]
            tracemalloc.start()
            memory = self._round(user, pdf, traced=True)
            tracemalloc.stop()
        finally:
            for stored in StoredFile.objects.filter(owner=user):
                services.file_delete(user=user, file_id=stored.pk)
        self._report(pdf, pages, timed, memory)

    def _round(self, user, pdf: bytes, *, traced: bool = False) -> dict[str, float]:
        request = APIRequestFactory().post("/api/files/", {"file": io.BytesIO(pdf)}, format="multipart")
        request.FILES  # noqa: B018 - nothing: the view parses it; the factory's body is built here, untimed
        force_authenticate(request, user=user)
        figures = {}
        started = time.perf_counter()
        if traced:
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
        response = FileListCreate.as_view()(request)
        figures["upload"] = time.perf_counter() - started
        if response.status_code != 201:
            raise CommandError(f"the upload was refused: {response.data}")
        if traced:
            figures["upload_peak"] = tracemalloc.get_traced_memory()[1] - base
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
        extracting = time.perf_counter()
        services.extract_job({"file": response.data["id"]})
        figures["extract"] = time.perf_counter() - extracting
        figures["total"] = time.perf_counter() - started
        if traced:
            figures["extract_peak"] = tracemalloc.get_traced_memory()[1] - base
        stored = StoredFile.objects.get(pk=response.data["id"])
        if stored.status != StoredFile.Status.READY or "Hello World" not in stored.text:
            raise CommandError(f"the PDF was not read: {stored.status} {stored.error}")
        figures["chars"] = len(stored.text)
        services.file_delete(user=user, file_id=stored.pk)
        return figures

    def _report(self, pdf: bytes, pages: int, timed: list[dict], memory: dict) -> None:
        def ms(key: str) -> str:
            values = sorted(round[key] * 1000 for round in timed)
            return f"median {statistics.median(values):7.0f} ms, max {values[-1]:7.0f} ms"

        out = self.stdout.write
        out(f"bench_files: a {len(pdf) / 1024 / 1024:.1f} MB PDF ({pages} pages of text, the rest an embedded "
            f"attachment), {len(timed)} rounds, text read: {timed[0]['chars']} characters")
        out(f"  upload (parse, sniff, hash, store): {ms('upload')}")
        out(f"  extract (worker job, pypdf):        {ms('extract')}")
        out(f"  upload to ready:                    {ms('total')}")
        out(f"  memory peak over the round's start (tracemalloc): upload {memory['upload_peak'] / 1024 / 1024:.1f} MB,"
            f" extract {memory['extract_peak'] / 1024 / 1024:.1f} MB")
        out(f"  process max RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
