"""Every tool a turn may offer or run, by name: Arbor's own (the registry) and the MCP servers' (issue 32)."""

from __future__ import annotations

from dataclasses import dataclass

from conversations.tools import registry
from conversations.tools.mcp import tools as mcp
from conversations.tools.mcp.connection import CallStopped, ServerDown
from conversations.tools.mcp.servers import configured
from conversations.tools.registry import Tool


def get_tool(name: str) -> Tool | None:
    """Arbor's tool called `name`, else the MCP tool (`SERVER__TOOL`) if its server has it now."""
    return registry.get_tool(name) or mcp.mcp_tool(name)


def server_of(name: str) -> str | None:
    """The MCP server a tool name points into (`SERVER__TOOL`); None for Arbor's own tools."""
    if registry.get_tool(name) is not None:
        return None
    server, separator, _ = name.partition(mcp.SEPARATOR)
    return server if separator else None


def offered_tools(servers: list[str] | None) -> list[Tool]:
    """Arbor's tools, then those of the MCP servers named (None: every one configured)."""
    return [*registry.all_tools(), *mcp.offered(servers)]


@dataclass(frozen=True)
class ServerState:
    name: str
    transport: str
    reachable: bool
    error: str = ""


def listing() -> tuple[list[Tool], list[ServerState]]:
    """Every tool a conversation may use, and each MCP server's state (one that is down says why)."""
    tools, states = list(registry.all_tools()), []
    for server in configured():
        try:
            tools.extend(mcp.server_tools(server))
        except (ServerDown, CallStopped) as exc:
            states.append(ServerState(server.name, server.transport, False, str(exc) or "it did not answer in time"))
        else:
            states.append(ServerState(server.name, server.transport, True))
    return tools, states
