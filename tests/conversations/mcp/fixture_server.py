"""An MCP server written with the official `mcp` SDK (2.3), for the tests of issue 32: run as
`python fixture_server.py stdio` or `python fixture_server.py http PORT`.

Its tools: `lookup` says it only reads (readOnlyHint) and runs at once; `write_note` has effects (no hint)
and waits for a person; `slow` sleeps (timeouts and Stop); `crash` ends the process mid-call; `big` returns
more than any bound; `fail` raises (an error result); `count_notes` reads what `write_note` wrote (the effect
seen); `whoami` tells the headers and environment a call came with."""

from __future__ import annotations

import os
import sys
import time

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import EmbeddedResource, ImageContent, ResourceLink, TextResourceContents, ToolAnnotations

server = MCPServer("arbor-test-notes")
NOTES: list[str] = []
READ_ONLY = ToolAnnotations(readOnlyHint=True, openWorldHint=False)


@server.tool(annotations=READ_ONLY)
def lookup(word: str) -> str:
    """Look a word up in the test dictionary."""
    return f"{word}: a word of {len(word)} letters (pid {os.getpid()})"


@server.tool()
def write_note(text: str) -> str:
    """Write a note (an effect: it stays)."""
    NOTES.append(text)
    return f"noted #{len(NOTES)}: {text}"


@server.tool(annotations=READ_ONLY)
def count_notes() -> str:
    """How many notes were written."""
    return f"{len(NOTES)} notes: {NOTES}"


@server.tool(annotations=READ_ONLY)
def slow(seconds: float) -> str:
    """Sleep, then answer."""
    time.sleep(seconds)
    return f"slept {seconds}"


@server.tool(annotations=READ_ONLY)
def crash() -> str:
    """End the server's process in the middle of the call."""
    os._exit(3)


@server.tool(annotations=READ_ONLY)
def big(size: int) -> str:
    """Answer `size` characters."""
    return "x" * size


@server.tool(annotations=ToolAnnotations(readOnlyHint=True, openWorldHint=True))
def search_web(query: str) -> str:
    """Read-only but open-world: it reaches outside, so it waits for a person."""
    return f"results for {query}"


@server.tool(annotations=READ_ONLY)
def whoami(ctx: Context) -> str:
    """The Authorization header this call came with (over HTTP; none over stdio), and the process's secret."""
    headers = ctx.headers or {}
    return f"authorization={headers.get('authorization', '-')} secret={os.environ.get('ARBOR_SECRET_PROBE', '-')}"


@server.tool(annotations=READ_ONLY)
def mixed() -> list:
    """Answer an image, a link to a resource and an embedded text resource."""
    return [ImageContent(type="image", data="iVBORw0KGgo=", mime_type="image/png"),
            ResourceLink(type="resource_link", uri="file:///notes/1", name="note 1"),
            EmbeddedResource(type="resource", resource=TextResourceContents(uri="file:///notes/2", text="note two"))]


@server.tool(name="dotted.name", annotations=READ_ONLY)
def dotted() -> str:
    """A name no provider takes as a function name: left out."""
    return "never offered"


@server.tool(annotations=READ_ONLY)
def fail() -> str:
    """Raise: the client gets an error result."""
    raise ValueError("the fixture fails on purpose")


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
