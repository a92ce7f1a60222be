"""bench_gateway (issues 27 and 34) runs end to end at a tiny size against a real server process on PostgreSQL: it
prints each case's percentiles and what the gateway adds, every gateway call recorded a node, and it leaves
nothing behind. Nothing timing-based is asserted."""

from __future__ import annotations

import re

import pytest
from django.db import connection

from conversations.models import Conversation, Node
from tests.conversations.helpers import command_output

pytestmark = [pytest.mark.bench, pytest.mark.django_db(transaction=True)]


def test_bench_gateway_prints_each_case_and_what_the_gateway_adds_and_leaves_nothing(monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("bench_gateway runs on PostgreSQL")
    recorded = []
    real_clear = __import__("conversations.bench.gateway", fromlist=["Command"]).Command._clear

    def counting_clear(self, user):  # the calls and conversations there were, seen before the bench clears them
        recorded.append((Node.objects.filter(conversation__owner=user, kind=Node.Kind.TURN).count(),
                         Conversation.objects.filter(owner=user).count()))
        real_clear(self, user)

    monkeypatch.setattr("conversations.bench.gateway.Command._clear", counting_clear)
    output = command_output("bench_gateway", "--batch", "2", "--repeat", "1", "--rate", "100", "--history", "50")
    for streamed in ("plain", "streamed"):
        assert streamed in output
    assert "the caller has 50 earlier conversations" in output
    rows = re.findall(r"^\s+(direct|new|continued|resent|seam)\s+[\d.]+\s+[\d.]+\s+[\d.]+(.*)$", output, re.M)
    assert [kind for kind, _ in rows] == ["direct", "new", "continued", "resent"] * 2 + ["seam"]
    assert all("added over" not in added and (kind == "direct") == (added == "") for kind, added in rows)
    # Calls: 50 earlier ones; warm-up, 2 a gateway kind, and the resent list's stored question; measured, 2 calls x 2
    # modes x 3 gateway kinds. Conversations: the earlier ones, the named one, one a new call (warm-up and measured),
    # and the resent kind's warm-up and stored one: its measured lists went on in the stored one.
    assert recorded == [(0, 0), (50 + 6 + 1 + 12, 50 + 1 + 6 + 3)], output
    assert not Conversation.objects.filter(owner__username="bench-gateway").exists()
