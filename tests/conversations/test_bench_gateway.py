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

    def counting_clear(self, user):  # how many calls the server recorded, seen before the bench clears them
        recorded.append(Node.objects.filter(conversation__owner=user, kind=Node.Kind.TURN).count())
        real_clear(self, user)

    monkeypatch.setattr("conversations.bench.gateway.Command._clear", counting_clear)
    output = command_output("bench_gateway", "--batch", "2", "--repeat", "1", "--rate", "100")
    for streamed in ("plain", "streamed"):
        assert streamed in output
    rows = re.findall(r"^\s+(direct|new|continued)\s+[\d.]+\s+[\d.]+\s+[\d.]+(.*)$", output, re.M)
    assert [kind for kind, _ in rows] == ["direct", "new", "continued"] * 2
    assert all("added over" not in added and (kind == "direct") == (added == "") for kind, added in rows)
    # warm-up: 2 a gateway kind; measured: 2 calls x 2 modes x 2 gateway kinds
    assert recorded == [0, 4 + 8], output
    assert not Conversation.objects.filter(owner__username="bench-gateway").exists()
