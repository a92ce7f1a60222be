"""The registry of Arbor's own tools: a tool is a name, a JSON schema, a function and an approval flag. An MCP
server's tools take the same shape (`mcp.tools`); `catalog` finds a tool of either kind by name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON Schema of the arguments object
    function: Callable[..., Any]  # called with the arguments as keyword arguments
    needs_approval: bool = False
    server: str = ""  # the MCP server it comes from; "" for Arbor's own

    def spec(self) -> dict[str, Any]:
        """Return the OpenAI-style function spec that litellm expects."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


_TOOLS: dict[str, Tool] = {}


def register(tool: Tool) -> Tool:
    _TOOLS[tool.name] = tool
    return tool


def get_tool(name: str) -> Tool | None:
    return _TOOLS.get(name)


def all_tools() -> list[Tool]:
    return sorted(_TOOLS.values(), key=lambda tool: tool.name)

