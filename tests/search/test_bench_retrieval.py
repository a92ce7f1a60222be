"""bench_retrieval runs end to end at tiny sizes and prints its figure lines, and leaves nothing (nothing
timing-based: the figures are the README's, printed by the command on the full sizes)."""

from __future__ import annotations

import re

import pytest

from conversations.models import Conversation
from search.bench import OTHER, USERNAME
from search.models import ChunkVector
from tests.conversations.helpers import command_output

pytestmark = pytest.mark.bench


@pytest.mark.django_db(transaction=True)
def test_it_prints_recall_latency_and_throughput_for_each_size_and_leaves_nothing():
    output = command_output("bench_retrieval", "--facts", "6", "--distractors", "12", "--sizes", "40,60",
                            "--queries", "3", "--repeat", "2", "--others", "30")
    assert "embedding model: arbor/echo-embed" in output
    assert re.search(r"another person has 30 pieces of the same words", output)
    for size in (40, 60):
        assert re.search(rf"== {size} chunks: the worker's embedding sweep embedded \d+ chunks", output)
        recall = re.search(rf"recall@5 at {size} chunks over 6 paraphrased questions: full-text ([\d.]+)  "
                           r"vectors ([\d.]+)  hybrid ([\d.]+)  hybrid by reciprocal rank fusion \(k=60\) ([\d.]+)",
                           output)
        assert recall, output
        assert all(f"{round(float(share) * 6) / 6:.3f}" == share for share in recall.groups()), "found / 6"
        for ranker in ("full-text", "vectors", "hybrid"):
            assert re.search(rf"latency at {size} chunks, {ranker}: median [\d.]+ ms  p95 [\d.]+ ms  \(6 queries, "
                             r"2 rounds, interleaved\)", output), ranker
        assert f"latency at {size} chunks, hybrid right after a write of the same person's vectors" in output
    # Another person's pieces (the same words) change none of this person's results: recall is the same without.
    alone = command_output("bench_retrieval", "--facts", "6", "--distractors", "12", "--sizes", "40,60",
                           "--queries", "3", "--repeat", "2")
    assert re.findall(r"recall@5 .*", alone) == re.findall(r"recall@5 .*", output)
    for username in (USERNAME, OTHER):
        assert not Conversation.objects.filter(owner__username=username).exists()
        assert not ChunkVector.objects.filter(owner__username=username).exists()
