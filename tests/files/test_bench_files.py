"""bench_files (issue 29) runs end to end at a tiny size: it prints the upload, extraction and memory figures, the
PDF it built was read, and it leaves no file behind. Nothing timing-based is asserted."""

from __future__ import annotations

import pytest

from files.models import StoredFile
from tests.conversations.helpers import command_output

pytestmark = [pytest.mark.bench, pytest.mark.django_db]


def test_bench_files_prints_its_figures_and_leaves_nothing():
    output = command_output("bench_files", "--megabytes", "0.2", "--pages", "3", "--repeat", "1")
    assert "0.2 MB PDF (3 pages of text" in output and "text read: " in output
    for line in ("upload (parse, sniff, hash, store): median", "extract (worker job, pypdf):", "upload to ready:",
                 "memory peak over the round's start (tracemalloc): upload", "process max RSS:"):
        assert line in output, output
    assert StoredFile.objects.count() == 0


def test_bench_files_refuses_nonsense_sizes():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="--megabytes above 0"):
        command_output("bench_files", "--repeat", "0")
