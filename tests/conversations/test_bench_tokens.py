"""bench_tokens runs end to end at a tiny size and prints its three figure lines (nothing timing-based)."""

from __future__ import annotations

import re

import pytest

from conversations.models import Conversation
from tests.conversations.helpers import command_output

pytestmark = pytest.mark.bench


@pytest.mark.django_db(transaction=True)
def test_bench_tokens_prints_the_cpu_of_a_token_for_each_case_and_leaves_nothing():
    output = command_output("bench_tokens", "--words", "20", "--repeat", "2")
    lines = re.findall(r"^ *([\d.]+) µs  \(min [\d.]+, max [\d.]+\)  (.+)$", output, re.M)
    assert [name.split(",")[0] for _, name in lines] == ["litellm stream handling"] * 2 + ["a whole turn (events"]
    assert all(float(value) > 0 for value, _ in lines)
    assert not Conversation.objects.filter(title="arbor-bench-tokens").exists()
