"""Issue 18 on PostgreSQL with pgvector: the HNSW scorer (search/scoring_pgvector.py).

This machine's PostgreSQL has no pgvector, so the test starts the PostgreSQL 16 with pgvector 0.6 that the
`pgserver` wheel bundles (a requirement), migrates a database there, and runs tests/support/pgvector_scenario.py
in `manage.py shell`: real turns with arbor/echo, the real worker, the real scorers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pgvector_url(tmp_path_factory):
    import pgserver

    server = pgserver.get_server(tmp_path_factory.mktemp("pgvector"), cleanup_mode="stop")
    server.psql("CREATE DATABASE arbor_pgvector;")
    socket_dir = urllib.parse.parse_qs(urllib.parse.urlparse(server.get_uri()).query)["host"][0]
    yield f"postgres://postgres@{urllib.parse.quote(socket_dir, safe='')}/arbor_pgvector"
    server.cleanup()


def _manage(url: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DATABASE_URL": url, "REDIS_URL": "", "ARBOR_EMBEDDING_MODEL": "arbor/echo-embed"}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_the_pgvector_scorer_ranks_like_exact_scoring_per_owner_with_an_hnsw_index(pgvector_url):
    migrated = _manage(pgvector_url, "migrate", "-v0")
    assert migrated.returncode == 0, migrated.stderr
    script = (ROOT / "tests" / "support" / "pgvector_scenario.py").read_text()
    ran = _manage(pgvector_url, "shell", "-c", script)
    assert ran.returncode == 0, ran.stderr[-3000:]
    (line,) = [ln for ln in ran.stdout.splitlines() if ln.startswith("SCENARIO ")]
    seen = json.loads(line.removeprefix("SCENARIO "))
    assert seen["backend"] == "pgvector, HNSW"
    assert seen["missing"] == 0, "every stored vector is in the pgvector column too"
    (index,) = seen["indexes"]
    assert "USING hnsw" in index and "vector_cosine_ops" in index and "'arbor/echo-embed'" in index, index
    assert "search_chunk_hnsw_" in seen["plan"], seen["plan"]
    for case in seen["same_order"]:  # the small owner's rows are few among the large owner's: still all found
        assert case["pgvector"] == case["exact"] and case["largest_difference"] < 1e-5, case
        assert len(case["pgvector"]) == 5, case
    assert [first for (first,) in seen["top"]] == seen["mine"], "each query finds its fact, owner-scoped"
    assert seen["deleted"] not in seen["after_delete"], "T11: a deleted conversation's vectors are gone"
