"""Whose tools a turn offers, and what a round's tool calls mean for the turn.

Arbor's own tools (the chat page, the API, playbooks) run here: a call to an acting tool waits for a person's
approval (F3, D4), the others run in the next round, and the last round offers none, so it must answer. A
caller of the OpenAI-compatible surface offers its own tools: they are always offered, their calls are marked
the client's (no later turn runs or approves them, whatever their names) and end the turn, for the client to
run and send back (T4). Such a caller may also name MCP servers of Arbor's (issue 32): their tools that need no
approval run here, round after round, as the chat page's do.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from conversations import items as it
from conversations.tools import get_tool, offered_tools, server_of
from conversations.tools.mcp.tools import SEPARATOR
from conversations.turns import calls


class RoundEnd(enum.Enum):
    ANSWERED = "answered"  # no calls, or calls handed back to the client: the turn is done
    WAITING = "waiting"  # calls that wait for a person's approval: the turn ends there (F3)
    RUN_CALLS = "run_calls"  # calls run here, in the next round; the head stays until the turn ends


def client_calls(received: list[it.Item]) -> list[it.Item]:
    """`received` with its tool calls marked the client's (`calls.is_clients`)."""
    return [{**item, "client": True} if item.get("type") == "tool_call" else item for item in received]


@dataclass(frozen=True)
class ArborTools:
    """Arbor's registered tools and the MCP servers' (`servers`: the ones on for the conversation; None: every
    one), run here."""

    servers: list[str] | None = None
    runs_calls = True  # open calls at the tip are run (or given results) before the next call

    def offered(self, *, last_round: bool) -> list[dict] | None:
        return None if last_round else [tool.spec() for tool in offered_tools(self.servers)]

    def allows(self, name: str) -> bool:
        """Whether a call to `name` may run in this conversation: Arbor's own tools always, an MCP server's only
        while the conversation (or its project) has that server on, whatever the model or an approval asked."""
        server = server_of(name)
        return server is None or self.servers is None or server in self.servers

    def received(self, received: list[it.Item]) -> list[it.Item]:
        return received

    def round_end(self, asked: list[it.Item], *, last_round: bool) -> tuple[RoundEnd, list[it.Item]]:
        """How the round ends, and the calls that wait for a person."""
        if not asked:
            return RoundEnd.ANSWERED, []
        # The last round offered no tools: calls asked anyway are left for the round limit to end the turn.
        waiting = [] if last_round else [call for call in asked if calls.needs_approval(call)]
        return (RoundEnd.WAITING, waiting) if waiting else (RoundEnd.RUN_CALLS, [])


@dataclass(frozen=True)
class CallerTools:
    """The tools a caller of the OpenAI-compatible surface sent with its call; it runs them itself."""

    specs: list[dict]
    runs_calls = False  # the caller sends every result itself (`turn_below` checks each call has one)

    def offered(self, *, last_round: bool) -> list[dict] | None:
        return self.specs

    def received(self, received: list[it.Item]) -> list[it.Item]:
        return client_calls(received)

    def round_end(self, asked: list[it.Item], *, last_round: bool) -> tuple[RoundEnd, list[it.Item]]:
        return RoundEnd.ANSWERED, []

    def allows(self, name: str) -> bool:
        return False  # nothing runs here: the caller runs its tools


@dataclass(frozen=True)
class ServerTools:
    """Issue 32: the MCP servers a caller of the OpenAI-compatible surface named (`{"type": "mcp", "server_label"}`),
    run here. Only their tools that need no person's approval are offered or run (approval is a person's click on
    the chat page, never a caller's word); `allowed`: the tool names a server may use (None: all of them)."""

    allowed: dict[str, frozenset[str] | None]
    runs_calls = True

    def tools(self) -> list:
        return [tool for tool in offered_tools(list(self.allowed)) if tool.server and not tool.needs_approval
                and self._named(tool.server, tool.name)]

    def _named(self, server: str, name: str) -> bool:
        names = self.allowed.get(server)
        return names is None or name.partition(SEPARATOR)[2] in names

    def offered(self, *, last_round: bool) -> list[dict] | None:
        return None if last_round else [tool.spec() for tool in self.tools()]

    def allows(self, name: str) -> bool:
        """Only a tool offered: of a server named, allowed, and needing no approval (whatever the model asked)."""
        server = server_of(name)
        if server not in self.allowed or not self._named(server, name):
            return False
        tool = get_tool(name)
        return tool is not None and not tool.needs_approval

    def received(self, received: list[it.Item]) -> list[it.Item]:
        return received

    def round_end(self, asked: list[it.Item], *, last_round: bool) -> tuple[RoundEnd, list[it.Item]]:
        return (RoundEnd.RUN_CALLS if asked else RoundEnd.ANSWERED), []


ToolPolicy = ArborTools | CallerTools | ServerTools
