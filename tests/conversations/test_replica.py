"""Issue 34: reads that may lag go to a real PostgreSQL streaming replica (config/replica.py), and nothing else does.

The test starts a primary and its streaming replica of its own (initdb, pg_basebackup -R; PostgreSQL from Debian,
run as the postgres user, in a temporary directory, on free ports: the machine's own cluster is not touched),
migrates the primary, and runs Arbor (daphne) with DATABASE_URL on the primary and DATABASE_REPLICA_URL on the
replica. With the replica's replay paused, a conversation made and asked in meanwhile is answered (the turn reads
its own writes on the primary) and shown by its own page, tree map and export, while the list, the word search and
the admin's list do not show it yet; once the replica replays again, they do."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import psycopg
import pytest
import requests

from conversations.bench.processes import free_port
from tests.support.servers import ROOT, Server

pytestmark = pytest.mark.slow


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    assert found, f"PostgreSQL's {name} is not installed (apt-get install postgresql)"
    return found[-1]


def _as_postgres(*argv: str) -> None:
    subprocess.run(["runuser", "-u", "postgres", "--", *argv], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE)


@pytest.fixture(scope="module")
def primary_and_replica():
    """(primary URL, replica URL) of a primary and its streaming replica, both stopped and removed at the end."""
    assert shutil.which("runuser") and os.geteuid() == 0, "the clusters are run as the postgres user"
    place = tempfile.mkdtemp(prefix="arbor-replication-")  # not under pytest's directory: postgres cannot enter it
    shutil.chown(place, "postgres")
    ports = {"primary": free_port(), "replica": free_port()}
    options = "-c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=60 -k " + str(place)
    _as_postgres(_bin("initdb"), "-D", f"{place}/primary", "-A", "trust", "-U", "postgres")
    with open(f"{place}/primary/pg_hba.conf", "a") as hba:
        hba.write("host replication postgres 127.0.0.1/32 trust\n")
    started = []
    try:
        _as_postgres(_bin("pg_ctl"), "-D", f"{place}/primary", "-o", f"-p {ports['primary']} {options}", "-l",
                     f"{place}/primary.log", "-w", "start")
        started.append("primary")
        _as_postgres(_bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(ports["primary"]), "-U", "postgres", "-D",
                     f"{place}/replica", "-R", "-X", "stream")
        _as_postgres(_bin("pg_ctl"), "-D", f"{place}/replica", "-o", f"-p {ports['replica']} {options}", "-l",
                     f"{place}/replica.log", "-w", "start")
        started.append("replica")
        yield tuple(f"postgres://postgres@127.0.0.1:{ports[name]}/postgres" for name in ("primary", "replica"))
    finally:
        for name in reversed(started):
            _as_postgres(_bin("pg_ctl"), "-D", f"{place}/{name}", "-m", "immediate", "stop")
        shutil.rmtree(place, ignore_errors=True)


def _manage(database: str, *argv: str) -> str:
    done = subprocess.run([sys.executable, "manage.py", *argv], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "DATABASE_URL": database, "DJANGO_DEBUG": "0"}, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


TOKEN = """
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
user = get_user_model().objects.create_user("replica-reader", password="not used here")
get_user_model().objects.create_superuser("replica-staff", password="staff-pass-1")
print(Token.objects.create(user=user).key)
"""


def _staff_session(server: Server) -> requests.Session:
    """A signed-in staff member's browser session (the admin's sign-in form, with its CSRF token)."""
    staff = requests.Session()
    form = staff.get(server.url("/admin/login/"))
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
    signed = staff.post(server.url("/admin/login/"), data={"username": "replica-staff", "password": "staff-pass-1",
                                                           "csrfmiddlewaretoken": token, "next": "/admin/"},
                        headers={"Referer": server.url("/admin/login/")})
    assert signed.status_code == 200 and "/admin/login/" not in signed.url, signed.text[-500:]
    return staff


def _until(check, what: str, seconds: float = 20.0):
    deadline = time.monotonic() + seconds
    while not (found := check()):
        assert time.monotonic() < deadline, f"{what} did not happen within {seconds} s"
        time.sleep(0.2)
    return found


def test_issue_34_reads_that_may_lag_read_the_replica_and_a_turn_reads_the_primary(primary_and_replica):
    primary, replica = primary_and_replica
    _manage(primary, "migrate", "-v0")
    key = _manage(primary, "shell", "-c", TOKEN).strip().splitlines()[-1]
    api = requests.Session()
    api.headers["Authorization"] = f"Token {key}"
    with Server(DATABASE_URL=primary, DATABASE_REPLICA_URL=replica, ARBOR_MODELS="arbor/echo",
                ARBOR_EMBEDDING_MODEL="") as server:
        def listed() -> set[str]:
            response = api.get(server.url("/api/conversations/"))
            assert response.status_code == 200, response.text
            body = response.json()
            return {c["title"] for c in (body["results"] if isinstance(body, dict) else body)}

        def found(word: str) -> list:
            response = api.get(server.url("/api/search/"), params={"q": word})
            assert response.status_code == 200, response.text
            return response.json()["results"]

        def new_conversation(title: str, question: str) -> int:
            made = api.post(server.url("/api/conversations/"), json={"title": title})
            assert made.status_code == 201, made.text
            asked = api.post(server.url(f"/api/conversations/{made.json()['id']}/turns/"), json={"content": question})
            assert asked.status_code == 201 and asked.json()["answer"].startswith("echo: " + question), asked.text
            return made.json()["id"]

        new_conversation("alpha", "about walnuts")
        _until(lambda: "alpha" in listed(), "the replica showing alpha")
        with psycopg.connect(replica, autocommit=True) as paused:
            paused.execute("SELECT pg_wal_replay_pause()")
            try:
                beta = new_conversation("beta", "about chestnuts")  # the turn reads its own writes: the primary
                again = api.post(server.url(f"/api/conversations/{beta}/turns/"), json={"content": "and more"})
                assert again.status_code == 201 and "user:about chestnuts" in again.json()["answer"]
                assert api.get(server.url(f"/api/conversations/{beta}/")).json()["title"] == "beta"
                _manage(primary, "arbor_worker", "--once")  # indexes the new messages (R4), on the primary
                time.sleep(1)  # what would have reached a replica that replays
                assert "beta" not in listed() and "alpha" in listed(), "the list reads the replica, which lags"
                assert not found("chestnuts"), "the search reads the replica"
                staff = _staff_session(server)
                assert ">beta<" not in staff.get(server.url("/admin/conversations/conversation/")).text, \
                    "the admin's list reads the replica"
                own = staff.get(server.url(f"/admin/conversations/conversation/{beta}/change/"))
                assert own.status_code == 200 and "beta" in own.text, "an object's own page reads the primary"
                tree = api.get(server.url(f"/api/conversations/{beta}/tree/"))
                assert len(tree.json()["nodes"]) == 2, "the tree map a person marks and reads back: the primary's"
                exported = api.get(server.url(f"/api/conversations/{beta}/export/"))
                document = exported.json()
                assert {node["id"] for node in document["nodes"]} >= {document["conversation"]["head"]}, \
                    "an export is one snapshot, the primary's: its head is among its nodes"
            finally:
                paused.execute("SELECT pg_wal_replay_resume()")
        _until(lambda: "beta" in listed(), "the replica showing beta")
        assert ">beta<" in _staff_session(server).get(server.url("/admin/conversations/conversation/")).text
        assert _until(lambda: found("chestnuts"), "the search finding beta's words")
