"""Run one tool call and always come back with a result (C4): errors become results, never gaps."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import jsonschema
from django.conf import settings

from conversations import items as it
from conversations.tools.cancel import running_with
from conversations.tools.catalog import get_tool
from conversations.tools.output import capped_text

logger = logging.getLogger("arbor.tools")

# A tool that times out keeps its thread until it returns; enough threads that a few hung ones do not
# stall every other turn.
_pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="arbor-tool")
STOP_POLL_SECONDS = 0.25


def run_tool_call(call: it.Item, *, approved: bool | None = None, max_bytes: int | None = None,
                  stop_requested: Callable[[], bool] = lambda: False, owner_id: int | None = None) -> it.Item:
    """Return the tool_result item for `call`. `approved=False` means a person refused it (F3).

    Its content is at most `max_bytes` (and ARBOR_TOOL_OUTPUT_MAX_BYTES) of UTF-8, read within the time
    limit in the tool's own thread: a tool's iterator (and the cursor behind it) is read there and no further.
    The run counts against `owner_id` (the person whose turn asked for it) until its thread ends: past
    ARBOR_MAX_TOOLS_PER_USER it is not started (issue 26.3). Without `owner_id` it is not counted.
    """
    name, call_id = call["name"], call["id"]
    total_max = min(settings.ARBOR_TOOL_OUTPUT_MAX_BYTES, max_bytes or settings.ARBOR_TOOL_OUTPUT_MAX_BYTES)

    def error(message: str) -> it.Item:  # a message may quote the arguments or the data: cut it like output
        return it.tool_result(call_id, name, capped_text(message, cell_max=total_max, total_max=total_max),
                              is_error=True)

    tool = get_tool(name)
    if tool is None:
        return error(f"error: there is no tool named {name!r}")
    if approved is False:
        return error("refused: the user did not approve this call, so it was not run")
    if tool.needs_approval and approved is not True:
        return error("error: this tool needs a person's approval and none was given")
    arguments, problem = _arguments(call, tool.parameters)
    if problem:
        return error(problem)

    cancel = threading.Event()

    def run() -> str:
        running_with(cancel)
        return capped_text(tool.function(**arguments), cell_max=settings.ARBOR_TOOL_CELL_MAX_BYTES,
                           total_max=total_max)

    try:
        text = _wait(_submit(run, owner_id=owner_id), stop_requested)
    except _Busy as busy:
        return error(f"You already have {busy.running} tools running; {name} was not started. Wait for one of "
                     "them to end (a stopped or timed-out one ends soon), then call it again.")
    except FutureTimeout:
        cancel.set()  # a tool that can stop (a query) ends now instead of running on unseen
        return error(f"error: {name} did not finish within {settings.ARBOR_TOOL_TIMEOUT_SECONDS:g} s")
    except _Stopped:
        cancel.set()
        return error(f"stopped: the turn was stopped while {name} ran; whether it finished is not known")
    except Exception as exc:  # a raising tool still yields a result (C4)
        logger.info("tool %s raised %r", name, exc)
        return error(f"error: {exc}")
    return it.tool_result(call_id, name, text)


def _arguments(call: it.Item, schema: dict) -> tuple[Any, str]:
    """The call's arguments checked against the tool's schema, and "" ; else why not, as the error result says."""
    try:
        arguments = json.loads(call.get("arguments") or "{}")
        jsonschema.validate(arguments, schema)
    except json.JSONDecodeError as exc:
        return None, f"error: the arguments are not valid JSON ({exc.msg})"
    except jsonschema.ValidationError as exc:
        return None, f"error: invalid arguments: {exc.message}"
    except Exception as exc:  # an MCP server's schema that cannot check anything (a $ref to nowhere): C4 holds
        return None, f"error: the tool's own argument schema is broken ({exc.__class__.__name__}); it was not run"
    if not isinstance(arguments, dict):
        return None, "error: the arguments must be a JSON object"
    return arguments, ""


class _Stopped(Exception):
    pass


# Tool threads still running, per person, in this process (issue 26.3). A thread cannot be killed: one whose call
# timed out or whose turn was stopped runs on until it returns, and counts until then, so nobody can pile up
# threads (and the queries in them) by asking and stopping again and again.
_running: dict[int, int] = {}
_running_lock = threading.Lock()


class _Busy(Exception):
    def __init__(self, running: int):
        super().__init__(running)
        self.running = running


def running_tools(owner_id: int) -> int:
    """How many of the person's tools run in this process now (cancelled ones included, until their thread ends)."""
    with _running_lock:
        return _running.get(owner_id, 0)


def _submit(run: Callable[[], str], *, owner_id: int | None) -> Future:
    """Start `run` in the pool, counted against `owner_id` until it ends in any way; `_Busy` past the limit."""
    if owner_id is None:
        return _pool.submit(run)
    limit = settings.ARBOR_MAX_TOOLS_PER_USER
    with _running_lock:
        running = _running.get(owner_id, 0)
        if limit and running >= limit:
            raise _Busy(running)
        _running[owner_id] = running + 1

    def counted() -> str:
        try:
            return run()
        finally:  # before the result is set: whoever reads it sees the count already down
            _release(owner_id)

    try:
        return _pool.submit(counted)
    except BaseException:
        _release(owner_id)
        raise


def _release(owner_id: int) -> None:
    with _running_lock:
        left = _running[owner_id] - 1
        if left:
            _running[owner_id] = left
        else:
            del _running[owner_id]


def _wait(future: Future, stop_requested: Callable[[], bool]) -> str:
    """The tool's text, within the time limit; a stop asked meanwhile is noticed within STOP_POLL_SECONDS
    (the tool's thread is left to finish on its own: a thread cannot be killed)."""
    deadline = time.monotonic() + settings.ARBOR_TOOL_TIMEOUT_SECONDS
    while True:
        try:
            return future.result(timeout=min(STOP_POLL_SECONDS, max(0.0, deadline - time.monotonic())))
        except FutureTimeout:
            if time.monotonic() >= deadline:
                raise
            if stop_requested():
                raise _Stopped() from None
