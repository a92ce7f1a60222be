"""The MCP servers this deployment connects: ARBOR_MCP_SERVERS (JSON, read once at start) and the ones staff add
in the admin (`ToolServer` rows), one shape for both.

A server is either `command` (a list: the program and its arguments, started over stdio, with `env`) or `url`
(streamable HTTP, with `headers`). `timeout` bounds each call (at most ARBOR_TOOL_TIMEOUT_SECONDS);
`approval` overrides, per tool, what its annotations say: "ask" (a person approves each call) or "auto" (it runs
at once).
"""

from __future__ import annotations

import json
import logging
import re
import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import DatabaseError, transaction

from config import news
from conversations.models import ToolServer

# A server's name starts its tools' names (`SERVER__TOOL`), which providers hold to [A-Za-z0-9_-]{1,64}; no "__"
# in it, so the first "__" of a tool's name always ends the server's.
NAME = re.compile(r"^(?!.*__)[A-Za-z0-9](?:[A-Za-z0-9_-]{0,28}[A-Za-z0-9-])?$")
APPROVALS = ("ask", "auto")
logger = logging.getLogger("arbor.tools.mcp")
NEWS_CHANNEL = "arbor_tool_servers"  # config.news: an admin's change reaches every process at once


@dataclass(frozen=True)
class ServerConfig:
    name: str
    command: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    url: str = ""
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # may carry a token: never shown
    timeout: float | None = None
    approval: tuple[tuple[str, str], ...] = ()

    @property
    def transport(self) -> str:
        return "stdio" if self.command else "http"

    def approval_of(self, tool: str) -> str | None:
        return dict(self.approval).get(tool)

    def call_timeout(self) -> float:
        limit = settings.ARBOR_TOOL_TIMEOUT_SECONDS
        return min(self.timeout, limit) if self.timeout else limit


OWN_LABEL = "arbor"  # the server_label /v1 gives a call of Arbor's own tools (issue 32): no server may take it


class BadServer(ValueError):
    """A server's configuration, with what is wrong and where."""


def server_config(name: Any, spec: Any) -> ServerConfig:
    """One server from its JSON shape, or BadServer saying what is wrong."""
    where = f"MCP server {name!r}"
    if not isinstance(name, str) or not NAME.match(name):
        raise BadServer(f"{where}: a name is 1 to 30 letters, digits, '-' or '_', without '__' and not ending in '_'")
    if name == OWN_LABEL:
        raise BadServer(f"{where}: {OWN_LABEL!r} names Arbor's own tools on /v1 (their mcp_call items); choose another")
    if not isinstance(spec, dict):
        raise BadServer(f"{where}: expected an object with `command` or `url`")
    unknown = set(spec) - {"command", "env", "url", "headers", "timeout", "approval"}
    if unknown:
        raise BadServer(f"{where}: unknown keys {sorted(unknown)}")
    command, url = _transport(where, spec)
    env, headers = _strings(spec.get("env", {}), f"{where}: `env`"), _strings(spec.get("headers", {}),
                                                                            f"{where}: `headers`")
    if command is None and env:
        raise BadServer(f"{where}: `env` is for a `command` server")
    if url is None and headers:
        raise BadServer(f"{where}: `headers` are for a `url` server")
    timeout, approval = _limits(where, spec)
    return ServerConfig(name=name, command=tuple(command or ()), env=tuple(sorted(env.items())), url=url or "",
                        headers=tuple(sorted(headers.items())), timeout=timeout,
                        approval=tuple(sorted(approval.items())))


def _transport(where: str, spec: dict) -> tuple[list[str] | None, str | None]:
    command, url = spec.get("command"), spec.get("url")
    if (command is None) == (url is None):
        raise BadServer(f"{where}: give exactly one of `command` (stdio) or `url` (streamable HTTP)")
    if command is not None and (not isinstance(command, list) or not command
                                or not all(isinstance(part, str) and part and "\0" not in part for part in command)):
        raise BadServer(f"{where}: `command` is a non-empty list of strings (the program, then its arguments)")
    if url is not None and (not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https")
                            or not urlsplit(url).netloc):
        raise BadServer(f"{where}: `url` is an http(s) address")
    return command, url


def _limits(where: str, spec: dict) -> tuple[float | None, dict[str, str]]:
    timeout = spec.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                                or not 0 < timeout <= 3600):
        raise BadServer(f"{where}: `timeout` is a number of seconds, above 0 and at most 3600")
    approval = _strings(spec.get("approval", {}), f"{where}: `approval`")
    wrong = {tool: how for tool, how in approval.items() if how not in APPROVALS}
    if wrong:
        raise BadServer(f"{where}: `approval` maps a tool to \"ask\" or \"auto\", not {wrong}")
    return (float(timeout) if timeout else None), approval


def _strings(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise BadServer(f"{where} is an object of strings")
    return value


def parse_servers(raw: str) -> list[ServerConfig]:
    """ARBOR_MCP_SERVERS: `{"name": {...}, …}`. BadServer names the server and what is wrong."""
    if not raw.strip():
        return []
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise BadServer(f"ARBOR_MCP_SERVERS is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadServer('ARBOR_MCP_SERVERS is a JSON object: {"name": {"command": [...]} or {"url": "..."}}')
    return [server_config(name, spec) for name, spec in data.items()]


_cache: tuple[str, list[ServerConfig]] | None = None
_cache_lock = threading.Lock()
_listening = False


def configured() -> list[ServerConfig]:
    """Every server this deployment connects, the environment's first. The admin's are read once a process and
    again only when one changes (`announce_change`, heard from any process): no query per turn. An admin row that
    names an environment server is left out."""
    global _cache, _listening
    raw = settings.ARBOR_MCP_SERVERS
    with _cache_lock:
        if _cache is not None and _cache[0] == raw:
            return _cache[1]
        if not _listening:  # a missed notice (the listener reconnecting) wakes every waiter: read again then
            news.subscribe(NEWS_CHANNEL, "changed", forget)
            _listening = True
    from_env = parse_servers(raw)
    taken = {server.name for server in from_env}
    try:
        from_admin = _from_admin()
    except DatabaseError:  # no database yet (a check before `migrate`, a schema built offline): read it again later
        logger.warning("the MCP servers of the admin could not be read; only ARBOR_MCP_SERVERS' are used now")
        return from_env
    servers = from_env + [server for server in from_admin if server.name not in taken]
    with _cache_lock:
        _cache = (raw, servers)
    return servers


def forget() -> None:
    """Read the servers again on the next use."""
    global _cache
    with _cache_lock:
        _cache = None


def announce_change() -> None:
    """An admin row was saved or deleted: every process reads the servers again, once this write commits."""
    news.announce(NEWS_CHANNEL, "changed")
    transaction.on_commit(forget)


def _from_admin() -> list[ServerConfig]:
    servers = []
    for row in ToolServer.objects.filter(enabled=True).order_by("name"):
        try:
            servers.append(row_config(row))
        except BadServer:  # saved before a rule tightened: left out, the admin page says why
            continue
    return servers


def row_config(row: ToolServer) -> ServerConfig:
    """An admin row in the environment's shape, checked by the same rules."""
    spec: dict[str, Any] = {key: value for key, value in (
        ("command", row.command), ("url", row.url), ("env", row.env), ("headers", row.headers),
        ("approval", row.approval), ("timeout", row.timeout)) if value not in (None, "", {})}
    return server_config(row.name, spec)


def by_name(name: str) -> ServerConfig | None:
    return next((server for server in configured() if server.name == name), None)
