"""bench_admin_tree runs end to end at a tiny size and leaves nothing behind (nothing timing-based)."""

from __future__ import annotations

import re

import pytest

from conversations.models import Conversation, Node
from tests.conversations.helpers import command_output

pytestmark = pytest.mark.bench


@pytest.mark.django_db(transaction=True)
def test_bench_admin_tree_renders_and_cleans_up_its_compacted_tree():
    """Its tree holds a compaction root (C2, C3); deleting it must respect the root's constraint."""
    output = command_output("bench_admin_tree", "--nodes", "50", "--repeat", "1")
    assert re.search(r"tree page of \d+ nodes .* median .* ms", output)
    assert not Conversation.objects.filter(title="arbor-bench-admin:tree").exists()
    assert not Node.objects.exists()
