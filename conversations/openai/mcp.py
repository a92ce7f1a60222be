"""Issue 32 on /v1: a Responses caller names MCP servers of this Arbor's, as OpenAI's hosted MCP tool does
(`{"type": "mcp", "server_label": …, "allowed_tools": […], "require_approval": "never"}`), and their tools run here.

Only the servers staff configured (`ARBOR_MCP_SERVERS`, listed by `GET /api/tools/`) can be named: a server URL,
connector or credentials of the caller's is refused, as this server fetches nothing it was not set up to reach.
Only tools that need no person's approval run on /v1: a tool with effects waits for a person's click on the chat
page (F3, D4), never for a caller's `mcp_approval_response`, so a request that asks for approvals is refused.
Arbor's MCP tools are never offered unless a request names their server. MCP servers and the caller's own function
tools are not mixed in one request: a round whose calls were partly the client's could not both run here and be
handed back.
"""

from __future__ import annotations

from typing import Any

from config.errors import BadInput
from conversations.tools.mcp.servers import configured
from conversations.turns.tool_policy import ServerTools

_NOT_REACHED = ("server_url", "connector_id", "headers", "authorization")


def servers_named(value: Any) -> ServerTools | None:
    """The request's MCP tools as the servers they name (None: it names none); BadInput (400) for one this server
    will not run."""
    if not isinstance(value, list) or not any(isinstance(tool, dict) and tool.get("type") == "mcp" for tool in value):
        return None
    known = sorted(server.name for server in configured())
    allowed: dict[str, frozenset[str] | None] = {}
    for index, tool in enumerate(value):
        where = f"tools[{index}]"
        if not isinstance(tool, dict) or tool.get("type") != "mcp":
            raise BadInput(f"{where}: MCP servers and function tools cannot be sent together here; send them in "
                           "separate calls.", param="tools")
        label = tool.get("server_label")
        if label not in known:
            raise BadInput(f"{where}.server_label: {label!r} is no MCP server of this Arbor's (it has "
                           f"{', '.join(known) or 'none'}; GET /api/tools/ lists their tools).", param="tools")
        if label in allowed:
            raise BadInput(f"{where}.server_label: {label!r} is named twice.", param="tools")
        for key in _NOT_REACHED:
            if tool.get(key) is not None:
                raise BadInput(f"{where}.{key}: this server reaches only the MCP servers its staff configured, by "
                               "server_label, with their own credentials.", param="tools")
        allowed[label] = _narrowed(_allowed_tools(tool.get("allowed_tools"), where),
                                   _never_asked(tool.get("require_approval"), where))
    return ServerTools(allowed=allowed)


def _narrowed(allowed: frozenset[str] | None, never: frozenset[str] | None) -> frozenset[str] | None:
    return never if allowed is None else allowed if never is None else allowed & never


def _never_asked(value: Any, where: str) -> frozenset[str] | None:
    """`require_approval`: "never" (or left out) for every tool, or `{"never": {"tool_names": […]}}` for those
    alone (OpenAI's reading: any other would ask, and asking is refused here); None for every tool."""
    if value is None or value == "never":
        return None
    if isinstance(value, dict) and set(value) == {"never"} and isinstance(value["never"], dict) and set(
            value["never"]) == {"tool_names"}:
        return _allowed_tools(value["never"].get("tool_names"), f"{where}.require_approval.never")
    raise BadInput(f"{where}.require_approval: a tool that needs approval waits for a person's click on Arbor's "
                   "chat page, never for a caller's; on /v1 only tools that need none run. Send \"never\" or leave "
                   "it out.", param="tools")


def _allowed_tools(value: Any, where: str) -> frozenset[str] | None:
    """`allowed_tools`: a list of the server's tool names, or `{"tool_names": […]}`; None for all of them."""
    if value is None:
        return None
    if isinstance(value, dict):
        if value.get("read_only") is not None:
            raise BadInput(f"{where}.allowed_tools.read_only: not read here; name the tools in tool_names (only "
                           "tools that need no approval run on /v1).", param="tools")
        value = value.get("tool_names")
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise BadInput(f"{where}.allowed_tools: expected a list of tool names.", param="tools")
    return frozenset(value)
