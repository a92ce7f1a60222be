"""An MCP server's tools as Arbor's registry sees them (issue 32): `SERVER__TOOL`, the server's own description
and input schema, and whether a person approves each call (X3).

A tool runs at once only when it says it only reads (`readOnlyHint: true`) and does not say it reaches an open
world (`openWorldHint: true`); any other waits for a person's Approve (F3, D4). Staff may override that per tool
(`approval`: "ask" or "auto"). A tool whose name or schema a provider would refuse is left out, with a log line.
"""

from __future__ import annotations

import json
import logging
import re
from functools import partial
from typing import Any

import jsonschema
from mcp_types import CallToolResult
from mcp_types import Tool as McpTool

from conversations.tools.cancel import cancelled
from conversations.tools.mcp import connection
from conversations.tools.mcp.servers import ServerConfig, by_name, configured
from conversations.tools.registry import Tool

logger = logging.getLogger("arbor.tools.mcp")

SEPARATOR = "__"
FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what OpenAI's (and so litellm's) function names allow
DESCRIPTION_MAX = 2000


class ToolFailed(Exception):
    """The server answered the call with an error result (`isError`)."""


def needs_approval(server: ServerConfig, tool: McpTool) -> bool:
    override = server.approval_of(tool.name)
    if override is not None:
        return override == "ask"
    hints = tool.annotations
    return not (hints is not None and hints.read_only_hint is True and hints.open_world_hint is not True)


def server_tools(server: ServerConfig) -> list[Tool]:
    """`server`'s tools (listed once a minute per process); ServerDown when it cannot be reached."""
    tools = []
    for listed in connection.list_tools(server):
        name = f"{server.name}{SEPARATOR}{listed.name}"
        schema = listed.input_schema if isinstance(listed.input_schema, dict) else {}
        if not FUNCTION_NAME.match(name) or not _usable(schema):
            logger.warning("MCP tool %r of %s left out: its name or input schema cannot be offered to a model",
                           listed.name, server.name)
            continue
        tools.append(Tool(name=name, description=(listed.description or listed.title or listed.name)[:DESCRIPTION_MAX],
                          parameters=schema, function=partial(_call, server, listed.name),
                          needs_approval=needs_approval(server, listed), server=server.name))
    return tools


def _usable(schema: dict) -> bool:
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError:
        return False
    return schema.get("type", "object") == "object"


def mcp_tool(name: str) -> Tool | None:
    """The MCP tool called `name` (`SERVER__TOOL`), if its server is configured, reachable and has it."""
    server_name, separator, _ = name.partition(SEPARATOR)
    server = by_name(server_name) if separator else None
    if server is None:
        return None
    try:
        return next((tool for tool in server_tools(server) if tool.name == name), None)
    except (connection.ServerDown, connection.CallStopped):
        return None


def offered(servers: list[str] | None) -> list[Tool]:
    """The tools of the servers named (None: every configured one); a server that is down offers none now."""
    tools = []
    for server in configured():
        if servers is not None and server.name not in servers:
            continue
        try:
            tools.extend(server_tools(server))
        except (connection.ServerDown, connection.CallStopped) as exc:
            logger.info("MCP server %s offers no tools now: %s", server.name, exc)
    return tools


def _call(server: ServerConfig, tool: str, **arguments: Any) -> str:
    """Run the call in the server; its result as text (an error result raises ToolFailed, which the runner turns
    into an error result: C4)."""
    result = connection.call_tool(server, tool, arguments, cancelled=cancelled)
    text = result_text(result)
    if result.is_error:
        raise ToolFailed(text or "the tool failed and said nothing more")
    return text


def result_text(result: CallToolResult) -> str:
    """The parts of a result as the model reads them: text as it is, structured content as JSON when there is no
    text, anything else named (an image, audio, a resource) but not inlined."""
    parts = []
    for part in result.content:
        kind = getattr(part, "type", "")
        if kind == "text":
            parts.append(part.text)
        elif kind == "resource" and hasattr(part.resource, "text"):
            parts.append(part.resource.text)
        elif kind == "resource_link":
            parts.append(f"[resource {part.uri}]")
        else:
            parts.append(f"[{kind or 'content'} {getattr(part, 'mime_type', '') or ''}]".replace(" ]", "]"))
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)
