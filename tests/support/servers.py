"""Real server processes for tests: daphne on a free port, against the test database."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import requests

from conversations.bench.processes import database_url, free_port

ROOT = Path(__file__).resolve().parents[2]


class Server:
    """`daphne config.asgi:application` in a process of its own; `url(path)` reaches it."""

    def __init__(self, **env: str):
        self.port = free_port()
        self.env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_DEBUG": "0",
                    "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost", **env}
        self.process: subprocess.Popen | None = None

    def start(self) -> Server:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port), "config.asgi:application"],
            cwd=ROOT, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while True:
            try:
                requests.get(self.url("/api/"), timeout=5)
                return self
            except requests.ConnectionError:
                assert self.process.poll() is None, self.process.stderr.read().decode()[-2000:]
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.2)

    def url(self, path: str, scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
