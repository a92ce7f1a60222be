"""OpenAI's Responses shapes, read from and written to Arbor's nodes. A response id is a node: `resp_<node id>`.

What a caller sends (`input`) becomes the new node's sent items; what the model answered (the node's received
items) becomes the response's `output`. Field sets follow the official SDK's models (openai 3.57,
types/responses/), which the tests parse with strict validation.
"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings

from config.errors import BadInput, NotFound, TooLarge
from conversations import items as it
from conversations.models import Node
from conversations.openai.parts import user_content
from conversations.tools.mcp.servers import OWN_LABEL
from conversations.tools.mcp.tools import SEPARATOR

RESPONSE_PREFIX = "resp_"


def response_id(node_id: int) -> str:
    return f"{RESPONSE_PREFIX}{node_id}"


def node_id_of(value: Any, *, field: str) -> int:
    """The node a `resp_…` id names; a NotFound (404, as OpenAI answers an unknown id) for anything else."""
    if isinstance(value, str) and value.startswith(RESPONSE_PREFIX) and value[len(RESPONSE_PREFIX):].isdigit():
        number = int(value[len(RESPONSE_PREFIX):])
        if number < 2**63:
            return number
    raise NotFound(f"No response with id {value!r} ({field}).")


# --- what a caller sends -------------------------------------------------------------------------------------

_ROLES = {"user": it.user, "system": it.system, "developer": it.system}


MAX_INSTRUCTIONS_CHARS = 20000  # as a conversation's own instructions


def instructions_text(value: Any, where: str = "instructions") -> str:
    """A call's own instructions: text, at most MAX_INSTRUCTIONS_CHARS; none is "" (never the account's)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadInput(f"`{where}` must be text.")
    if len(value) > MAX_INSTRUCTIONS_CHARS:
        raise TooLarge(f"`{where}` is longer than {MAX_INSTRUCTIONS_CHARS} characters.")
    return value


def _message_text(content: Any, where: str, parts: tuple[str, ...] = ("input_text", "text")) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for index, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in parts or not isinstance(
                    part.get("text"), str):
                raise BadInput(f"{where}.content[{index}]: only text parts (`input_text`) are read by this server.")
            texts.append(part["text"])
        return "\n".join(texts)
    raise BadInput(f"{where}.content: expected text or a list of `input_text` parts.")


def tools_of(value: Any) -> list[dict[str, Any]] | None:
    """The caller's function tools, in the Chat Completions shape the model seam takes; None for none."""
    if value in (None, []):
        return None
    if not isinstance(value, list):
        raise BadInput("`tools` must be a list of function tools.")
    tools = []
    for index, tool in enumerate(value):
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            raise BadInput(f"tools[{index}]: only function tools (type function, with a name) are served here.")
        parameters = tool.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(tool.get("description") or "", str):
            raise BadInput(f"tools[{index}].description: expected text.")
        if not isinstance(parameters, dict):
            raise BadInput(f"tools[{index}].parameters: expected a JSON schema object.")
        tools.append({"type": "function", "function": {"name": tool["name"], "description": tool.get("description")
                                                        or "", "parameters": parameters}})
    return tools


def _output_text(output: Any, where: str) -> str:
    if isinstance(output, list):  # a list of text parts
        texts = [part.get("text") for part in output if isinstance(part, dict)]
        output = "".join(texts) if all(isinstance(t, str) for t in texts) else None
    if not isinstance(output, str):
        raise BadInput(f"{where}.output: expected text.")
    return output


def _function_output(entry: dict, where: str, open_calls: dict[str, it.Item]) -> it.Item:
    """A caller's `function_call_output`: the result of one of the previous response's calls (T4)."""
    call_id = entry.get("call_id")
    call = open_calls.get(call_id) if isinstance(call_id, str) else None
    if call is None:
        raise BadInput(f"{where}.call_id: {entry.get('call_id')!r} is no function call of the previous response.")
    output = _output_text(entry.get("output"), where)
    if len(output) > settings.ARBOR_MAX_CONTENT_CHARS:
        raise TooLarge(f"{where}.output: longer than {settings.ARBOR_MAX_CONTENT_CHARS} characters.")
    return it.tool_result(call["id"], call["name"], output)


def input_items(value: Any, *, open_calls: dict[str, it.Item] | None = None) -> list[it.Item]:
    """The request's `input` as the new node's sent items: a text, or a list of messages and the outputs of the
    previous response's function calls (`open_calls`, by call id; that each has its output, `turn_below` checks)."""
    open_calls = open_calls or {}
    if isinstance(value, str):
        if not value.strip():
            raise BadInput("`input` is empty.")
        value = [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise BadInput("`input` must be a text or a non-empty list of input items.")
    items = []
    for index, entry in enumerate(value):
        where = f"input[{index}]"
        if isinstance(entry, dict) and entry.get("type") == "function_call_output":
            items.append(_function_output(entry, where, open_calls))
            continue
        if isinstance(entry, dict) and entry.get("type") == "function_call":
            continue  # the previous response's own call, sent back as some clients do: already stored
        if not isinstance(entry, dict) or entry.get("type", "message") != "message":
            kind = entry.get("type") if isinstance(entry, dict) else type(entry).__name__
            raise BadInput(f"{where}: this server reads messages and function call outputs (got {kind!r}).")
        make = _ROLES.get(entry.get("role"))
        if make is None:
            raise BadInput(f"{where}.role: expected user, system or developer; earlier turns are named with "
                           "`previous_response_id`, not sent again.")
        text, files = (user_content(entry.get("content"), where) if make is it.user
                       else (_message_text(entry.get("content"), where), []))
        if len(text) > settings.ARBOR_MAX_CONTENT_CHARS:
            raise TooLarge(f"{where}: longer than {settings.ARBOR_MAX_CONTENT_CHARS} characters.")
        items.append(it.user(text, files) if make is it.user else make(text))
    if not any(item["type"] in ("user", "tool_result") for item in items):
        raise BadInput("`input` holds no user message.")
    # Results go first, as the model reads them: after the calls they answer, before a new question.
    return sorted(items, key=lambda item: item["type"] != "tool_result")


def _is_earlier_turn(entry: Any) -> bool:
    return isinstance(entry, dict) and (entry.get("type") in ("function_call", "mcp_call") or (
        entry.get("type", "message") == "message" and entry.get("role") == "assistant"))


def _round_answer(messages: list[dict[str, Any]], node: str) -> dict[str, Any] | None:
    """The answer a resent call of round `node` belongs to: the last message when it is an answer, or the answer of
    that round's calls whose results follow it (a round's calls come before their results)."""
    results = 0
    while results < len(messages) and messages[-1 - results]["role"] == "tool":
        results += 1
    answer = messages[-1 - results] if results < len(messages) else None
    if answer is None or answer["role"] != "assistant":
        return None
    return answer if results == 0 or answer.get("round") == node else None


def _error_text(error: Any) -> str:
    """A resent mcp_call's error as the result's text: as `mcp_call_item` wrote it (a tool's error content), a
    protocol or HTTP error's message, or a text."""
    if isinstance(error, str):
        return error
    if not isinstance(error, dict):
        return ""
    if isinstance(error.get("message"), str):
        return error["message"]
    said = error.get("content") if isinstance(error.get("content"), list) else []
    return "".join(part["text"] for part in said if isinstance(part, dict) and isinstance(part.get("text"), str))


def _mcp_call_message(entry: dict, where: str, messages: list[dict[str, Any]]) -> None:
    """A resent `mcp_call` (issue 32): the call this server ran, onto the answer it belongs to, then its result, as
    they are stored (the call's own id is in the item's, `mcp_call_item`)."""
    if not all(isinstance(entry.get(key), str) for key in ("id", "server_label", "name", "arguments")):
        raise BadInput(f"{where}: an mcp_call has an id, a server_label, a name and its arguments as text.")
    output = entry.get("output") if entry.get("output") is not None else _error_text(entry.get("error"))
    if not isinstance(output, str):
        raise BadInput(f"{where}.output: expected text.")
    ours = re.fullmatch(r"mcp_(\d+)_(.+)", entry["id"])  # `mcp_call_item`'s id: the round's node, the call's id
    node, call_id = ours.groups() if ours else ("", entry["id"])
    name = entry["name"] if entry["server_label"] == OWN_LABEL else f"{entry['server_label']}{SEPARATOR}{entry['name']}"
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": entry["arguments"]}}
    answer = _round_answer(messages, node)
    if answer is None:
        messages.append(answer := {"role": "assistant", "content": None})
    answer.setdefault("tool_calls", []).append(call)
    answer["round"] = node
    messages.append({"role": "tool", "tool_call_id": call_id, "content": output})


def _history_message(entry: Any, where: str, messages: list[dict[str, Any]]) -> None:
    """One input item onto the chat list: a function call or an assistant text joins the answer it belongs to."""
    kind = entry.get("type", "message") if isinstance(entry, dict) else type(entry).__name__
    role = entry.get("role") if isinstance(entry, dict) else None
    answer = messages[-1] if messages and messages[-1]["role"] == "assistant" else None
    if kind in ("reasoning", "mcp_list_tools"):
        return
    if kind == "mcp_call":
        _mcp_call_message(entry, where, messages)
        return
    if kind == "function_call":
        if not all(isinstance(entry.get(key), str) for key in ("call_id", "name", "arguments")):
            raise BadInput(f"{where}: a function_call has a call_id, a name and its arguments as text.")
        if answer is None:
            messages.append(answer := {"role": "assistant", "content": None})
        answer.setdefault("tool_calls", []).append({"id": entry["call_id"], "type": "function", "function": {
            "name": entry["name"], "arguments": entry["arguments"]}})
    elif kind == "function_call_output":
        messages.append({"role": "tool", "tool_call_id": entry.get("call_id"),
                         "content": _output_text(entry.get("output"), where)})
    elif kind == "message" and role == "assistant":
        text = _message_text(entry.get("content"), where, parts=("output_text", "text", "input_text"))
        if answer is None:
            messages.append({"role": "assistant", "content": text})
        else:  # one answer: its text and calls together
            answer["content"] = "\n".join(filter(None, [answer["content"], text]))
    elif kind == "message" and role == "user":  # its parts as they are: `chat.read_messages` reads their files
        messages.append({"role": role, "content": entry.get("content")})
    elif kind == "message" and role in _ROLES:
        messages.append({"role": role, "content": _message_text(entry.get("content"), where)})
    else:
        raise BadInput(f"{where}: this server reads messages, function calls and their outputs (got {kind!r} with "
                       f"role {role!r}).")


def history_messages(value: Any) -> tuple[list[dict[str, Any]], list[int]] | None:
    """OpenAI's manual-history pattern: an `input` that resends earlier turns (assistant messages and function
    calls with their outputs) instead of naming `previous_response_id`, as openai-agents' Responses model does.
    Such a list is read as Chat Completions' `messages` (`chat.read_messages`), so it is matched against the stored
    paths the same way: the messages and where each began in `input`; None when the input holds no earlier turn.
    Reasoning items are the provider's own and are passed over."""
    if not isinstance(value, list) or not any(_is_earlier_turn(entry) for entry in value):
        return None
    messages: list[dict[str, Any]] = []
    positions: list[int] = []
    for index, entry in enumerate(value):
        _history_message(entry, f"input[{index}]", messages)
        while len(positions) < len(messages):  # an item merged into the message before begins none of its own
            positions.append(index)
    return messages, positions


# --- what a response is ----------------------------------------------------------------------------------------


def _usage(chain: list[Node]) -> dict[str, Any] | None:
    """What a response's calls used, every round's together."""
    used = [node.usage for node in chain if node.usage]
    if not used:
        return None

    def total(key: str) -> int:
        return sum(usage.get(key, 0) for usage in used)

    return {"input_tokens": total("prompt_tokens"),
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": total("completion_tokens"),
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": total("total_tokens")}


def message_item(node: Node, text: str, *, status: str = "completed") -> dict[str, Any]:
    return {"id": f"msg_{node.pk}", "type": "message", "role": "assistant", "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def function_call_item(node: Node, call: it.Item) -> dict[str, Any]:
    return {"id": f"fc_{node.pk}_{call['id']}", "type": "function_call", "call_id": call["id"], "name": call["name"],
            "arguments": call["arguments"], "status": "completed"}


def mcp_call_item(node: Node, call: it.Item, result: it.Item | None, status: str = "incomplete") -> dict[str, Any]:
    """Issue 32: a call this server ran in one of its MCP servers, with its result once the next round carried it
    (an error result is the item's `error`, C4); with none, `status` (a call whose result no round carried, as a
    turn stored before rounds were recorded, is `incomplete`)."""
    server, separator, tool = call["name"].partition(SEPARATOR)
    if not separator:  # a tool of Arbor's own, or a name no server has (its result says it was not run)
        server, tool = OWN_LABEL, call["name"]
    failed = result is not None and result.get("is_error")
    return {"id": f"mcp_{node.pk}_{call['id']}", "type": "mcp_call", "server_label": server, "name": tool,
            "arguments": call["arguments"], "approval_request_id": None,
            "output": None if result is None or failed else result["content"],
            "error": {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": result["content"]}]}
            if failed else None,
            "status": status if result is None else "failed" if failed else "completed"}


def output_of(node: Node, results: dict[str, it.Item] | None = None) -> list[dict[str, Any]]:
    """The answer's text as one message, then each call, in the order the model wrote them: the client's as a
    function call, for it to run; one this server ran (or refused) as an `mcp_call` with its result from
    `results` (by id), so no client takes it for one of its own."""
    text = it.answer_text(node.received)
    items = [message_item(node, text)] if text else []
    for call in it.tool_calls(node.received):
        items.append(function_call_item(node, call) if call.get("client")
                     else mcp_call_item(node, call, (results or {}).get(call["id"])))
    return items


# --- a response of several rounds (issue 32) ------------------------------------------------------------------


def rounds_of(node: Node) -> list[Node]:
    """The calls one response made: `node`, then the later rounds of its turn (`Node.first_round`), which carried
    the results of the calls run here (an MCP server's, or Arbor's own tools') to the model. One node, and no
    query, for a response whose calls were the client's or that made none."""
    if all(call.get("client") for call in it.tool_calls(node.received)):
        return [node]
    first = node.first_round_id or node.pk
    return [node, *Node.objects.filter(first_round_id=first, pk__gt=node.pk).order_by("pk")]


def first_round(node: Node) -> Node:
    """The response `node` is a round of (itself, with no query, when it is a turn's first call)."""
    return node if node.first_round_id is None else Node.objects.get(pk=node.first_round_id)


# What a response says of a request that sent nothing else (OpenAI's own defaults); a create says back what it
# was sent (`options.responses_options`), and a retrieve these, as a node keeps only its instructions.
RESPONSE_DEFAULTS: dict[str, Any] = {
    "temperature": None, "top_p": None, "max_output_tokens": None, "tool_choice": "auto", "tools": [],
    "parallel_tool_calls": True, "metadata": {}, "text": {"format": {"type": "text"}}, "truncation": "disabled",
    "store": True, "background": False, "reasoning": {"effort": None, "summary": None}, "service_tier": "default",
    "top_logprobs": 0, "max_tool_calls": None, "user": None, "safety_identifier": None, "prompt_cache_key": None,
    "conversation": None,
}


def cut_short(node: Node) -> bool:
    """Whether the answer stopped at its output limit (max_tokens), as the provider said (`llm.stream_call`)."""
    return (node.usage or {}).get("finish_reason") == "length"


def response_of(node: Node, *, status: str | None = None, sent: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Responses object of the call `node` made, with the rounds that followed it (`rounds_of`): its output
    is all of theirs, its status, usage and end the last one's. `sent`: the request's own fields, said back as
    sent (the create's `echo`, with the `previous_response_id` it named: a compaction may stand between, C2)."""
    chain = rounds_of(node) if status != "in_progress" else [node]
    last = chain[-1]
    failed = last.status == Node.Status.FAILED
    status = status or ("failed" if failed else "in_progress" if last.status == Node.Status.PENDING
                        else "incomplete" if cut_short(last) else "completed")
    results = {item["call_id"]: item for step in chain[1:] for item in step.sent if item.get("type") == "tool_result"}
    output = [item for step in chain for item in output_of(step, results)]
    sent = sent or {}
    previous = sent.get("previous_response_id", response_id(node.parent_id) if node.parent_id else None)
    return {
        **RESPONSE_DEFAULTS, **sent,
        "id": response_id(node.pk), "object": "response", "created_at": int(node.created_at.timestamp()),
        "completed_at": int(last.finished_at.timestamp()) if status == "completed" and last.finished_at else None,
        "model": node.model, "status": status, "output": output if status != "in_progress" else [],
        "error": {"code": "server_error", "message": last.failure_message} if failed else None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": node.instructions or None, "previous_response_id": previous,
        "usage": _usage(chain) if status in ("completed", "incomplete") else None,
    }


def settings_said(node: Node) -> dict[str, Any]:
    """What a stored call sent beside its messages (`llm.wire_settings`), as a Responses object's fields: a
    retrieve says the options the call went out with. `max_output_tokens` stays OpenAI's default: the stored
    limit is the reserve when the caller set none, so it cannot say what was asked."""
    if node.call_settings_id is None:
        return {}
    sent = node.call_settings.settings
    said: dict[str, Any] = {name: sent[name] for name in ("temperature", "top_p", "parallel_tool_calls")
                            if name in sent}
    tools = [tool["function"] for tool in sent.get("tools", []) if isinstance(tool.get("function"), dict)]
    said["tools"] = [{"type": "function", "name": f["name"], "description": f.get("description") or None,
                      "parameters": f.get("parameters"), "strict": None} for f in tools]
    choice = sent.get("tool_choice")
    if isinstance(choice, dict):
        choice = {"type": "function", "name": choice.get("function", {}).get("name")}
    if choice is not None:
        said["tool_choice"] = choice
    answer_format = sent.get("response_format")
    if isinstance(answer_format, dict):
        schema = answer_format.get("json_schema") or {}
        said["text"] = {"format": {"type": answer_format.get("type"), **schema}}
    return said


def input_items_of(node: Node) -> list[dict[str, Any]]:
    """What the call of `node` added: its sent messages and function call outputs, as Responses input items."""
    roles = {"user": "user", "system": "system"}
    items = []
    for index, item in enumerate(node.sent):
        if item.get("type") == "tool_result":
            items.append({"id": f"fco_{node.pk}_{index}", "type": "function_call_output", "call_id": item["call_id"],
                          "output": item["content"], "status": "completed"})
        elif item.get("type") in roles and not item.get("ephemeral"):
            items.append({"id": f"msg_in_{node.pk}_{index}", "type": "message", "role": roles[item["type"]],
                          "status": "completed", "content": [{"type": "input_text", "text": item["text"]}]})
    return items
