"""One process's connections to its MCP servers (issue 32): each server is started (stdio) or reached
(streamable HTTP) once per process and kept, not started per call; one that ended (crashed, or its address went
away) is started again on the next use.

The official `mcp` SDK is asynchronous; Arbor's tools run in threads. So the connections live in one event loop
on a thread of their own, and a tool's thread hands it each call and waits, looking every STOP_POLL_SECONDS at
whether anybody still waits for it (`tools.cancel`): a stopped or timed-out call is cancelled in the server too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, Tool

from conversations.tools.mcp.servers import ServerConfig

logger = logging.getLogger("arbor.tools.mcp")

START_SECONDS = 20.0  # a server that takes longer to start (or answer its handshake) counts as down
LIST_SECONDS = 10.0
PING_SECONDS = 5.0
RETRY_SECONDS = 30.0  # a server that could not be started is tried again after this
TOOLS_FRESH_SECONDS = 60.0  # a server's tool list is listed again after this
POLL_SECONDS = 0.25
MAX_TOOL_PAGES = 20


class ServerDown(Exception):
    """The server could not be started or reached, or it ended while a call ran."""


class CallStopped(Exception):
    """Nobody waits for the call any more (Stop, or the tool's time ran out): it was cancelled."""


class Connection:
    """One server's client, held open by a task of the loop. Every method runs in the loop."""

    def __init__(self, server: ServerConfig):
        self.server = server
        self._client: Client | None = None
        self._closing: asyncio.Event | None = None
        self._opening: asyncio.Lock | None = None
        self._tools: tuple[float, list[Tool]] | None = None
        self._down: tuple[float, str] | None = None  # until when a server that did not start is not tried again
        self.starts = 0  # how many times it was started (a crash starts it again)

    async def client(self) -> Client:
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._client is None:
                if self._down is not None and time.monotonic() < self._down[0]:
                    raise ServerDown(self._down[1])  # not started again on every turn while it cannot start
                try:
                    await self._start()
                except ServerDown as down:
                    self._down = (time.monotonic() + RETRY_SECONDS, f"{down} (tried again after {RETRY_SECONDS:g} s)")
                    raise
                self._down = None
                self.starts += 1
            return self._client

    async def _start(self) -> None:
        ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        self._closing = asyncio.Event()
        task = asyncio.create_task(self._hold(ready, self._closing))
        try:
            await asyncio.wait_for(asyncio.shield(ready), START_SECONDS)
        except (TimeoutError, asyncio.CancelledError) as stopped:
            # Nobody waits for it (it took too long, or the call was stopped): its process ends with its task.
            ready.add_done_callback(_consumed)
            task.cancel()
            if isinstance(stopped, asyncio.CancelledError):
                raise
            raise ServerDown(f"the MCP server {self.server.name!r} did not start within {START_SECONDS:g} s") from None

    async def alive(self) -> Client:
        """The client, once its server has answered a request: one that died while idle is started again before
        a call goes to it, so the call is never spent on a server that was already gone. (The 2026-07-28 protocol
        has no ping: a tool listing, past the SDK's cache, is the question asked.)"""
        client = await self.client()
        try:
            await asyncio.wait_for(client.list_tools(cache_mode="bypass"), PING_SECONDS)
        except TimeoutError:
            return client  # slow, not gone: its calls under way go on
        except Exception as exc:  # noqa: BLE001 -- whatever it met, the connection is not to be trusted
            if not self._ended_if_closed(exc):
                return client  # it answered, if only with an error: it is there
            client = await self.client()
        return client

    async def _hold(self, ready: asyncio.Future, closing: asyncio.Event) -> None:
        """Open the client, hand it over, and keep it open (its task groups live in this task) until closed."""
        try:
            async with contextlib.AsyncExitStack() as held:
                target = self._target()
                if isinstance(target, httpx2.AsyncClient):  # closed with the connection, never left open
                    http = await held.enter_async_context(target)
                    target = streamable_http_client(self.server.url, http_client=http)
                client = await held.enter_async_context(Client(target, mode="auto"))
                self._client = client
                ready.set_result(client)
                await closing.wait()
        except Exception as exc:  # noqa: BLE001 -- any failure to start or to stay up is the server being down
            if not ready.done():
                ready.set_exception(ServerDown(f"the MCP server {self.server.name!r} could not be started or "
                                               f"reached: {_leaf(exc)}"))
            logger.info("MCP server %s ended: %r", self.server.name, exc)
        finally:
            if closing is self._closing:
                self._client, self._tools = None, None
            if not ready.done():
                ready.set_exception(ServerDown(f"the MCP server {self.server.name!r} was closed"))

    def _target(self) -> Any:
        if self.server.command:
            program, *args = self.server.command
            # The server's environment is its own: the basics a program needs, then the configured variables;
            # never Arbor's own secrets.
            env = {key: os.environ[key] for key in ("PATH", "HOME", "LANG", "TZ") if key in os.environ}
            return StdioServerParameters(command=program, args=args, env={**env, **dict(self.server.env)})
        return httpx2.AsyncClient(headers=dict(self.server.headers),
                                  timeout=httpx2.Timeout(30.0, read=self.server.call_timeout() + 5))

    def close(self) -> None:
        if self._closing is not None:
            self._closing.set()
        self._client, self._tools = None, None

    async def tools(self) -> list[Tool]:
        if self._tools is not None and time.monotonic() - self._tools[0] < TOOLS_FRESH_SECONDS:
            return self._tools[1]
        client = await self.client()
        listed, cursor = [], None
        try:
            for _ in range(MAX_TOOL_PAGES):  # a server that pages forever cannot hang the listing
                page = await client.list_tools(cursor=cursor)
                listed.extend(page.tools)
                cursor = page.next_cursor
                if not cursor:
                    break
        except Exception as exc:  # noqa: BLE001
            self._ended_if_closed(exc)
            raise ServerDown(f"the MCP server {self.server.name!r} did not list its tools: {_leaf(exc)}") from None
        self._tools = (time.monotonic(), listed)
        return listed

    async def call(self, tool: str, arguments: dict) -> CallToolResult:
        client = await self.alive()
        try:
            return await client.call_tool(tool, arguments, read_timeout_seconds=self.server.call_timeout())
        except Exception as exc:
            if self._ended_if_closed(exc):
                raise ServerDown(f"the MCP server {self.server.name!r} ended while {tool} ran; whether it "
                                 "finished is not known (it is started again for the next call)") from None
            raise

    def _ended_if_closed(self, exc: BaseException) -> bool:
        """Whether `exc` says the connection is gone; if so, the next use starts the server again."""
        gone = isinstance(exc, (OSError, httpx2.TransportError)) and not isinstance(exc, TimeoutError)
        if "closed" in str(exc).lower() or gone:
            self.close()
            return True
        return False


def _consumed(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


def _leaf(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return str(exc) or type(exc).__name__


# --- the loop and its connections ----------------------------------------------------------------------------

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_loop_pid: int | None = None
_connections: dict[str, Connection] = {}


def _the_loop() -> asyncio.AbstractEventLoop:
    global _loop, _loop_pid
    if _loop is None or _loop_pid != os.getpid():  # a forked worker starts its own: threads do not survive a fork
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, name="arbor-mcp", daemon=True).start()
        _loop, _loop_pid = loop, os.getpid()
        _connections.clear()
    return _loop


def connection(server: ServerConfig) -> tuple[asyncio.AbstractEventLoop, Connection]:
    """The process's connection to `server`; one whose configuration changed is closed and opened anew."""
    with _lock:
        loop = _the_loop()
        held = _connections.get(server.name)
        if held is None or held.server != server:
            if held is not None:
                loop.call_soon_threadsafe(held.close)
            held = _connections[server.name] = Connection(server)
        return loop, held


def run(server: ServerConfig, work: Callable[[Connection], Coroutine[Any, Any, Any]], *, timeout: float,
        cancelled: Callable[[], bool] = lambda: False) -> Any:
    """Run `work(connection)` in the loop and wait for it, at most `timeout` seconds; CallStopped (and the work
    cancelled) once `cancelled()` says nobody waits any more."""
    loop, held = connection(server)
    future = asyncio.run_coroutine_threadsafe(work(held), loop)
    deadline = time.monotonic() + timeout
    while True:
        try:
            return future.result(timeout=min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))
        except FutureTimeout:
            if cancelled() or time.monotonic() >= deadline:
                future.cancel()
                raise CallStopped() from None


def list_tools(server: ServerConfig) -> list[Tool]:
    return run(server, lambda held: held.tools(), timeout=START_SECONDS + LIST_SECONDS)


def call_tool(server: ServerConfig, tool: str, arguments: dict, *, cancelled: Callable[[], bool]) -> CallToolResult:
    return run(server, lambda held: held.call(tool, arguments), timeout=START_SECONDS + server.call_timeout(),
               cancelled=cancelled)


def close_all() -> None:
    """Close every connection of this process (its stdio servers end)."""
    with _lock:
        if _loop is not None:
            for held in _connections.values():
                _loop.call_soon_threadsafe(held.close)
        _connections.clear()
