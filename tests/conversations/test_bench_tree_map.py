"""bench_tree_map runs end to end at a tiny size and prints its figure lines (nothing timing-based)."""

from __future__ import annotations

import re

import pytest

from conversations.models import Conversation
from tests.conversations.helpers import command_output
from tests.support.browser import CHROMEDRIVER, CHROMIUM

pytestmark = pytest.mark.bench


@pytest.mark.django_db(transaction=True)
def test_bench_tree_map_prints_the_server_and_browser_figures_and_leaves_nothing():
    output = command_output("bench_tree_map", "--turns", "40", "--repeat", "2")
    assert "== tree map, 40 turns (40 marks" in output
    assert re.search(r"^server tree_map\(\): +median +[\d.]+ ms +p95 +[\d.]+ ms +\(n=2\)$", output, re.M)
    if CHROMIUM.exists() and CHROMEDRIVER.exists():
        assert re.search(r"^browser open and draw: +median +[\d.]+ ms .*target 300 ms \[(met|missed)\]$", output, re.M)
    assert not Conversation.objects.filter(title="arbor-bench-tree-map").exists()
