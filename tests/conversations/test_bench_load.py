"""bench_load runs end to end at tiny settings, on real server processes against PostgreSQL and Redis, and prints
issue 13's figures and targets; the tiny load completes with no errors (nothing timing-based is asserted).

On PostgreSQL the benchmark runs in the test database; on SQLite in its own PostgreSQL database (its default), and
the test is skipped when PostgreSQL or Redis cannot be reached, unless CI is set."""

from __future__ import annotations

import os
import re

import psycopg
import pytest
import redis
from django.conf import settings
from django.db import connection

from conversations.bench import load
from tests.conversations.helpers import command_output

pytestmark = [pytest.mark.bench, pytest.mark.slow]

# Quick turns enough for the quick load to outlast a few of the probe's GETs (one each PROBE_SECONDS): six lasted
# 0.06 s once a quick answer came as one token event, and the load had no GET to report.
TINY = ["--users", "1,3", "--quick-users", "3", "--quick-turns", "12", "--processes", "1", "--repeat", "1",
        "--words", "3", "--stacks", "1"]
LOADS = ["SSE 1p N=1", "SSE 1p N=3", "WS 1p N=1", "WS 1p N=3", "quick JSON 1p N=3"]


def bench_database_url() -> str:
    db = connection.settings_dict
    if connection.vendor != "postgresql":
        return load.database_url(None)
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    return f"postgres://{db['USER']}{password}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def unreachable(url: str) -> str | None:
    """Why the benchmark cannot run here, if it cannot."""
    try:
        load.connect(url, dbname="postgres").close()
    except psycopg.OperationalError as error:
        return f"PostgreSQL is not reachable ({error})"
    try:
        redis.Redis.from_url(settings.REDIS_URL or load.DEFAULT_REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError as error:
        return f"Redis is not reachable ({error})"
    return None


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("server", ["daphne", "uvicorn"])
def test_bench_load_prints_every_load_and_the_targets_with_no_errors_at_a_tiny_load(server):
    """Either server it compares runs Arbor's SSE and chat socket to the end with no error."""
    url = bench_database_url()
    reason = unreachable(url)
    if reason and not os.environ.get("CI"):
        pytest.skip(f"bench_load needs PostgreSQL and Redis: {reason}")
    output = command_output("bench_load", *TINY, "--server", server, "--database-url", url)

    assert re.search(r"^database: PostgreSQL \S+ at .*; turn logs and cache: Redis ", output, re.M), output
    assert f"servers: {server} config.asgi" in output, output
    for label in LOADS:
        line = re.search(rf"^run 1 {label}: (\d+)/(\d+) turns, [\d.]+ turns/s; latency p50/p95/p99 .*$", output,
                         re.M)
        assert line, f"{label}\n{output}"
        assert line[1] == line[2] and "; errors 0;" in line[0], output
        assert re.search(r"db connections peak \d+ \(\d+\); RSS peak \d+ MB .*GET p95 [\d.]+ ms", line[0]), line[0]
        if not label.startswith("quick"):
            assert re.search(r"first token p50/p95 [\d.]+/[\d.]+ s; gap p50/p95 [\d.]+/[\d.]+ s = [\d.]+x pacing",
                             line[0]), line[0]
    assert re.search(r"^run 1 idle: db connections peak .*GET p95 [\d.]+ ms \(n=\d+", output, re.M), output
    assert "== pooled over 1 run(s)" in output
    for transport in ("SSE", "WebSockets"):
        what = f"3 concurrent streaming turns on 1 process over {transport}"
        assert f"PASS    {what}: all complete, 0 errors (6/6 complete, 0 errors)" in output, output
        assert re.search(rf"^(PASS  |MISSED)  {what}: inter-token gap p95 [\d.]+ s = [\d.]+x the model's pacing",
                         output, re.M), output
        assert re.search(rf"^(PASS  |MISSED)  {what}: first token p95 [\d.]+ s = [\d.]+x a single stream's", output,
                         re.M), output
        assert re.search(rf"^(PASS  |MISSED)  quick GET p95 during 3 streaming turns over {transport} on 1 process "
                         rf"[\d.]+ ms = [\d.]+x idle", output, re.M), output
    assert "NOT MEASURED  2 processes vs 1 at N = 3 quick turns (needs --processes 1,2)" in output
    assert re.search(r"^== server-1's threads in 1 stack dumps during SSE 1p N=3", output, re.M), output
    assert re.search(r"^server-1: \d+ lines, 0 tracebacks$", output, re.M), output
    with load.connect(url) as db:
        left = db.execute("select count(*) from conversations_conversation where title like %s",
                          [f"{load.TITLE}%"]).fetchone()[0]
    assert left == 0, "it deletes its conversations"
