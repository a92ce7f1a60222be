"""Run one tool call and always come back with a result (C4): errors become results, never gaps."""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import jsonschema
from django.conf import settings

from conversations import items as it
from conversations.tools.registry import get_tool, result_text

logger = logging.getLogger("arbor.tools")

# A tool that times out keeps its thread until it returns; enough threads that a few hung ones do not
# stall every other turn.
_pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="arbor-tool")


def run_tool_call(call: it.Item, *, approved: bool | None = None) -> it.Item:
    """Return the tool_result item for `call`. `approved=False` means a person refused it (F3)."""
    name, call_id = call["name"], call["id"]

    def error(message: str) -> it.Item:
        return it.tool_result(call_id, name, message, is_error=True)

    tool = get_tool(name)
    if tool is None:
        return error(f"error: there is no tool named {name!r}")
    if approved is False:
        return error("refused: the user did not approve this call, so it was not run")
    if tool.needs_approval and approved is not True:
        return error("error: this tool needs a person's approval and none was given")
    try:
        arguments = json.loads(call.get("arguments") or "{}")
        jsonschema.validate(arguments, tool.parameters)
    except json.JSONDecodeError as exc:
        return error(f"error: the arguments are not valid JSON ({exc.msg})")
    except jsonschema.ValidationError as exc:
        return error(f"error: invalid arguments: {exc.message}")
    future = _pool.submit(tool.function, **arguments)
    try:
        value = future.result(timeout=settings.ARBOR_TOOL_TIMEOUT_SECONDS)
    except FutureTimeout:
        return error(f"error: {name} did not finish within {settings.ARBOR_TOOL_TIMEOUT_SECONDS:g} s")
    except Exception as exc:  # a raising tool still yields a result (C4)
        logger.info("tool %s raised %r", name, exc)
        return error(f"error: {exc}")
    return it.tool_result(call_id, name, result_text(value))
