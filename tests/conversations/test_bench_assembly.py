"""bench_assembly runs end to end on a tiny dataset and prints its figure lines (nothing timing-based)."""

from __future__ import annotations

import pytest
from django.core.management import CommandError
from django.db import connection

from conversations.models import Conversation, Node
from tests.conversations.helpers import command_output

pytestmark = pytest.mark.bench


def _run(*args: str) -> str:
    return command_output("bench_assembly", *args)


@pytest.mark.django_db(transaction=True)
def test_bench_assembly_prints_every_figure_on_a_tiny_dataset():
    output = _run("--nodes", "300", "--depths", "4,6,9", "--repeat", "2", "--allow-sqlite")
    for heading in ("== Arbor full assembly", "node_path(head) alone", "assemble(...) alone", "Tree grown 4x",
                    "== Raw-SQL floor", "== django-tree-queries", "without tree_filter, path 4",
                    "== SQL queries per whole arbor/echo turn", "== A whole turn at path depth 10", "== Targets"):
        assert heading in output
    for depth in (4, 6, 9):
        assert f"path {depth:>5}  normal  tree" in output and f"path {depth:>5}  bushier tree" in output
    figures = [line for line in output.splitlines() if line.startswith("path") and " median " in line]
    assert len(figures) == 6 * 5, "six trees, five timed figures each"
    assert "queries per turn" in output and output.count("[met]") + output.count("[MISSED]") == 5
    assert "statements per turn" in output and "overhead" in output
    assert "[met] queries per turn constant in depth" in output
    assert Node.objects.filter(conversation__title__startswith="arbor-bench:").count() >= 300

    kept = _run("--nodes", "300", "--depths", "4,6,9", "--repeat", "1", "--keep", "--allow-sqlite")
    assert "reusing the existing bench dataset" in kept
    assert Conversation.objects.get(title="arbor-bench:path-9").head.parent_id is not None


@pytest.mark.django_db
@pytest.mark.skipif(connection.vendor != "sqlite", reason="the refusal is about SQLite")
def test_bench_assembly_refuses_sqlite_without_the_flag():
    with pytest.raises(CommandError, match="--allow-sqlite"):
        _run("--nodes", "10")
