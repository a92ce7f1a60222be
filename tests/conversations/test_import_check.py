"""`manage.py import_check` (issue 15): an import's report, with its round trips, and nothing left behind."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from django.core.management import call_command

from conversations.models import Conversation, Node

pytestmark = pytest.mark.django_db

EXPORTS = Path(__file__).parent.parent / "fixtures" / "exports"


def _run(*files) -> list[str]:
    out = io.StringIO()
    call_command("import_check", *files, stdout=out)
    return out.getvalue().splitlines()[2:]


def test_issue_15_t8_import_check_reports_branches_and_lossless_round_trips_and_keeps_nothing(tmp_path):
    """A real branched ChatGPT export (3 tips: an edit and a regeneration) is reported with its bubbles and
    branches; its round trips through Arbor's JSON and ChatGPT's format lose nothing; nothing stays in the
    database. A file that would be refused says why."""
    bad = tmp_path / "notes.json"
    bad.write_text('{"hello": 1}')
    tree, refused = _run(EXPORTS / "chatgpt" / "librechat-chatgpt-tree.json", bad)
    cells = [c.strip() for c in tree.strip("|").split("|")]
    assert cells[0] == "librechat-chatgpt-tree.json"
    assert cells[1:5] == ["1", "6", "6 assistant, 6 user", "3"]
    assert int(cells[5]) > 0, "tokens counted (C1)"
    assert cells[6:] == ["0", "none", "none"]
    assert refused.startswith("| notes.json | refused: Unknown file: expected Arbor's tree export")
    assert not Conversation.objects.exists() and not Node.objects.exists()
