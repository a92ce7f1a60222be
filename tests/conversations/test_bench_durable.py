"""bench_durable runs end to end once, on real server processes, and prints issue 12's figures (nothing
timing-based is asserted; resuming must lose and repeat nothing)."""

from __future__ import annotations

import re

import pytest

from conversations.models import Conversation
from tests.conversations.helpers import command_output

pytestmark = [pytest.mark.bench, pytest.mark.slow]

SECONDS = r"min [\d.]+ s, median [\d.]+ s, max [\d.]+ s \(n=1\)"


@pytest.mark.django_db(transaction=True)
def test_bench_durable_prints_kill_stop_and_resume_figures():
    output = command_output("bench_durable", "--repeat", "1", "--cuts", "20")
    assert re.search(r"^run 1: next turn accepted [\d.]+ s after the kill; words received by the client \d+, kept "
                     r"on the node \d+, lost -?\d+; dead node failed/interrupted; kept text is a prefix", output, re.M)
    assert re.search(rf"^kill -9 -> next accepted turn: {SECONDS}$", output, re.M), output
    assert re.search(r"^words lost to the crash .*: min -?\d+, median -?[\d.]+, max -?\d+ \(n=1\); per run -?\d+$",
                     output, re.M), output
    assert re.search(r"^run 1 \(silent, tool\): silent [\d.]+ s .*; tool [\d.]+ s ", output, re.M), output
    assert re.search(rf"^stop while the model is silent -> failed/cancelled: {SECONDS}$", output, re.M), output
    assert re.search(rf"^stop while a tool runs -> failed/cancelled: {SECONDS}$", output, re.M), output
    assert re.search(r"^whole log: ids 1\.\.\d+ without gaps, last `done`; the live stream of the turn is the same",
                     output, re.M), output
    assert re.search(r"^resume at 20 random cut points: duplicated=0 missing=0 .*differ from the whole log: 0$",
                     output, re.M), output
    assert not Conversation.objects.filter(title__startswith="arbor-bench-durable:").exists(), "it cleans up"
