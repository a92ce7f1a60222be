"""Real MCP servers for issue 32's tests: the fixture server (written with the official `mcp` SDK, fixture_server.py)
over stdio and over streamable HTTP, and a published reference server (`mcp-server-time`, from PyPI) over stdio."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conversations.tools.mcp import connection
from conversations.tools.mcp.servers import forget

FIXTURE = str(Path(__file__).with_name("fixture_server.py"))
NOTES = {"command": [sys.executable, FIXTURE, "stdio"]}
TIME = {"command": [sys.executable, "-m", "mcp_server_time"]}


@pytest.fixture
def mcp_servers(settings):
    """Set ARBOR_MCP_SERVERS to the given servers (a dict, as the JSON says); the connections stay open between
    tests, as a process keeps them, and are closed at the end of the session."""

    def configure(servers: dict) -> None:
        settings.ARBOR_MCP_SERVERS = json.dumps(servers)
        forget()

    yield configure
    forget()


@pytest.fixture(scope="session", autouse=True)
def _mcp_connections_closed():
    yield
    connection.close_all()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="session")
def http_notes_server():
    """The fixture server over streamable HTTP, in a process of its own: its URL."""
    port = _free_port()
    process = subprocess.Popen([sys.executable, FIXTURE, "http", str(port)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            if process.poll() is not None:
                raise RuntimeError("the MCP fixture server did not start") from None
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/mcp"
    process.terminate()
    process.wait(timeout=10)
