"""bench_compaction runs end to end at tiny sizes and prints its figure lines (nothing timing-based)."""

from __future__ import annotations

import re

import pytest
from django.core.management import CommandError
from django.db import connection

from conversations.models import Conversation, Node
from tests.conversations.helpers import command_output

pytestmark = pytest.mark.bench


def _run(*args: str) -> str:
    return command_output("bench_compaction", *args)


@pytest.mark.django_db(transaction=True)
def test_bench_compaction_prints_prefix_shares_and_the_assembly_ratio():
    output = _run("--turns", "12", "--short", "12", "--long", "40", "--real", "12", "--repeat", "2",
                  "--allow-sqlite")
    shares = dict(re.findall(r"^(never compacted|compacted once, by hand, in the middle|compacted automatically)"
                             r".*prefix-stable (\d+/\d+)", output, re.M))
    assert shares["never compacted"] == "11/11", "without compaction every call extends the previous one"
    assert shares["compacted once, by hand, in the middle"] == "11/12", "one call starts afresh at the root"
    assert re.search(r"^turn +12 +paths of .* median .* ms", output, re.M)
    assert re.search(r"^turn +40 +paths of .* median .* ms", output, re.M)
    assert re.search(r"^\[(met|MISSED)\] turn 40 / turn 12: \d+\.\d\dx", output, re.M)
    assert "covers: the work before a call" in output, "the ratio says what it measures"
    for turn in (12, 40):
        assert re.search(rf"^turn +{turn} +screen history \(path_bubbles, [\d,]+ entries\) median .* ms +T10 check "
                         r"of the first question median .* ms", output, re.M), output
    long = Conversation.objects.get(title="arbor-bench-compaction:long")
    assert Node.objects.filter(conversation=long, kind="compaction", parent=None).count() >= 3
    _run("--turns", "6", "--short", "2", "--long", "3", "--real", "1", "--repeat", "1", "--allow-sqlite")
    assert Conversation.objects.filter(title="arbor-bench-compaction:long").count() == 1, "a rerun starts afresh"


@pytest.mark.django_db
@pytest.mark.skipif(connection.vendor != "sqlite", reason="the refusal is about SQLite")
def test_bench_compaction_refuses_sqlite_without_the_flag():
    with pytest.raises(CommandError, match="--allow-sqlite"):
        _run("--turns", "2")
