"""An MCP server on the official SDK's low-level `Server` (2.3) that lists its tools a page at a time (a cursor,
as servers with many tools do), run over stdio: `python paged_server.py`. With PAGED_LISTING_FAILS set, listing
its tools is an error; with PAGED_BAD_REF, one more tool's schema refers to nothing."""

from __future__ import annotations

import os

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

TOOLS = [types.Tool(name=f"echo_{n}", description=f"Echo number {n}.",
                    input_schema={"type": "object", "properties": {"text": {"type": "string"}}},
                    annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False))
         for n in range(5)]
PAGE = 2
if os.environ.get("PAGED_BAD_REF"):  # a schema that points nowhere: it passes a schema check, and checks nothing
    TOOLS.append(types.Tool(name="bad_ref", description="Its schema refers to a definition it lacks.",
                            input_schema={"type": "object", "properties": {"x": {"$ref": "#/$defs/nowhere"}}},
                            annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False)))


async def list_tools(ctx, params) -> types.ListToolsResult:
    if os.environ.get("PAGED_LISTING_FAILS"):
        raise RuntimeError("the listing fails on purpose")
    start = int(params.cursor) if params and params.cursor else 0
    following = start + PAGE
    return types.ListToolsResult(tools=TOOLS[start:following],
                                 next_cursor=str(following) if following < len(TOOLS) else None)


async def call_tool(ctx, params) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text",
                                                           text=f"{params.name}: {params.arguments['text']}")])


server = Server("arbor-test-paged", on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
