"""bench_search_import_worker runs end to end at tiny sizes and prints its figure lines (nothing timing-based)."""

from __future__ import annotations

import pytest
from django.core.management import CommandError
from django.db import connection

from conversations.bench import search_import_worker
from conversations.models import Conversation, Node
from tests.conversations.helpers import command_output

pytestmark = pytest.mark.bench


@pytest.mark.django_db(transaction=True)
def test_it_prints_search_worker_and_import_figures():
    try:
        output = command_output("bench_search_import_worker", "--bubbles", "400", "--queries", "8", "--jobs", "5",
                                "--import-nodes", "60", "--allow-sqlite", "--owners-total", "3000", "--owners-mine",
                                "300", "--owners-long", "300", "--owners-queries", "3", "--owners-rounds", "1",
                                "--turn-jobs-sizes", "3,12", "--turn-jobs-repeat", "2")
    finally:  # a bench that stopped half-way leaves no schema of copies behind (its index holds search's function)
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(f"DROP SCHEMA IF EXISTS {search_import_worker.SMALL} CASCADE")
    for line in ("== Search over 400 bubbles", "search median", "p95", "== Worker: 5 committed turns: 15 jobs",
                 "jobs/s  (15 done, 0 retried, 0 failed, 5 titled", "== Import of a 60-node export", "nodes/s",
                 "== Turn jobs: index and embed after one turn, 2 runs each way", "3 turns: ",
                 "12 turns: turn's nodes ", "; whole conversation "):
        assert line in output, line
    if connection.vendor == "postgresql":  # issue 34: one person's search among others' data, small here
        assert "== Issue 34: one person's search among others' data" in output
    assert Conversation.objects.filter(title="bench7:import-source").count() == 2, "the source and its import"
    assert not Conversation.objects.filter(title__startswith="bench7:turn-jobs").exists(), "its conversations go"
    assert Node.objects.filter(conversation__title="bench7:import-source").count() == 120


@pytest.mark.django_db
@pytest.mark.skipif(connection.vendor != "sqlite", reason="the refusal is about SQLite")
def test_it_refuses_sqlite_without_the_flag():
    with pytest.raises(CommandError, match="--allow-sqlite"):
        command_output("bench_search_import_worker", "--bubbles", "10")
