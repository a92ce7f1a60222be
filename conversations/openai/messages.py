"""Anthropic's Messages API on the tree (issue 27): `POST /v1/messages`, for the coding tools and agents that
speak only it.

A request carries the whole conversation, as a Chat Completions list does, so it is read into that list
(`chat_messages`) and goes the same way (`chat.read_messages`, then the longest stored path it extends): only
what is new is recorded, and an edited history branches where it differs. `tool_result` blocks are the results
of the calls before them, the caller's own tools stay the caller's (T4), and `thinking` blocks are kept on the
answer as its reasoning. What the call answers is read back as Anthropic's Message (`message_of`) or its event
stream (`MessageEvents`); a message id is its node, `msg_<node id>`.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from config.errors import BadInput
from conversations import items as it
from conversations.models import Node
from conversations.openai.errors import anthropic_error_body
from conversations.openai.options import CallOptions
from conversations.openai.shapes import cut_short
from conversations.turns.events import EventType

# --- what a caller sends -------------------------------------------------------------------------------------


def _blocks(content: Any, where: str) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(block, dict) for block in content):
        raise BadInput(f"{where}.content: expected text or a list of content blocks.")
    return content


def _block_text(content: Any, where: str) -> str:
    """A tool result's content: text, or text blocks."""
    if content is None:
        return ""
    texts = []
    for index, block in enumerate(_blocks(content, where)):
        if block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise BadInput(f"{where}.content[{index}]: only text is read by this server (got "
                           f"{block.get('type')!r}).")
        texts.append(block["text"])
    return "\n".join(texts)


def _user_messages(blocks: list[dict], where: str) -> list[dict]:
    """A user turn's blocks: the tool results first (each a `tool` message), then its text, images and documents
    as one user message (Chat Completions parts, whose files `parts.user_content` reads)."""
    results, parts = [], []
    for index, block in enumerate(blocks):
        kind = block.get("type")
        if kind == "tool_result":
            content = _block_text(block.get("content"), f"{where}.content[{index}]")
            results.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": content,
                            "is_error": block.get("is_error") is True})
        elif kind == "text" and isinstance(block.get("text"), str):
            parts.append({"type": "text", "text": block["text"]})
        elif kind in ("image", "document"):
            parts.append(_file_part(block, f"{where}.content[{index}]"))
        else:
            raise BadInput(f"{where}.content[{index}]: this server reads text, image, document and tool_result "
                           f"blocks from the user (got {kind!r}).")
    return results + ([{"role": "user", "content": parts}] if parts else [])


def _file_part(block: dict, where: str) -> dict:
    """An image or document block as a Chat Completions part: base64 sources as data URLs, a plain-text
    document's text as a text file, a file id as it is; a URL source is refused (the server fetches nothing)."""
    source = block.get("source") if isinstance(block.get("source"), dict) else {}
    kind = source.get("type")
    if kind == "base64" and isinstance(source.get("data"), str) and isinstance(source.get("media_type"), str):
        url = f"data:{source['media_type']};base64,{source['data']}"
    elif kind == "text" and isinstance(source.get("data"), str) and block["type"] == "document":
        url = "data:text/plain;base64," + base64.b64encode(source["data"].encode()).decode()
    elif kind == "file" and source.get("file_id") is not None:
        return {"type": "file", "file": {"file_id": source["file_id"]}}
    else:
        raise BadInput(f"{where}.source: send the {block['type']} as base64 (or a document's text); this server "
                       "fetches nothing from a URL.")
    if block["type"] == "image":
        return {"type": "image_url", "image_url": {"url": url}}
    return {"type": "file", "file": {"file_data": url, "filename": block.get("title") or None}}


def _assistant_message(blocks: list[dict], where: str) -> dict:
    texts, calls, thinking = [], [], []
    for index, block in enumerate(blocks):
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str) or not isinstance(
                    block.get("input", {}), dict):
                raise BadInput(f"{where}.content[{index}]: a tool_use block has an id, a name and an input object.")
            calls.append({"id": block["id"], "type": "function", "function": {
                "name": block["name"], "arguments": json.dumps(block.get("input", {}))}})
        elif kind in ("thinking", "redacted_thinking"):
            thinking.append(block)
        else:
            raise BadInput(f"{where}.content[{index}]: this server reads text, tool_use and thinking blocks from "
                           f"the assistant (got {kind!r}).")
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["thinking_blocks"] = thinking
    return message


def chat_messages(messages: Any) -> tuple[list[dict], list[int]]:
    """The request's `messages` as a Chat Completions list, and which message each came from (for errors)."""
    if not isinstance(messages, list) or not messages:
        raise BadInput("`messages` must be a non-empty list.", param="messages")
    listed: list[dict] = []
    positions: list[int] = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise BadInput(f"{where}.role: expected user or assistant (the system prompt is `system`).")
        blocks = _blocks(message.get("content"), where)
        made = _user_messages(blocks, where) if role == "user" else [_assistant_message(blocks, where)]
        listed += made
        positions += [index] * len(made)
    return listed, positions


def system_text(value: Any) -> str:
    """`system`: text, or text blocks (cache_control and the like are the provider's and are passed over)."""
    return _block_text(value, "system") if value is not None else ""


def tools_of(value: Any) -> list[dict] | None:
    """The caller's tools (`{name, description, input_schema}`), in the shape the model seam takes."""
    if value in (None, []):
        return None
    if not isinstance(value, list):
        raise BadInput("`tools` must be a list of tools.", param="tools")
    tools = []
    for index, tool in enumerate(value):
        if not isinstance(tool, dict) or tool.get("type", "custom") != "custom" or not isinstance(tool.get("name"),
                                                                                                   str):
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise BadInput(f"tools[{index}]: only the caller's own tools (a name and an input_schema) are served "
                           f"here, not Anthropic's server tools (got type {kind!r}).", param="tools")
        schema = tool.get("input_schema") or {"type": "object", "properties": {}}
        if not isinstance(schema, dict) or not isinstance(tool.get("description") or "", str):
            raise BadInput(f"tools[{index}]: input_schema must be a JSON schema object, description text.",
                           param="tools")
        tools.append({"type": "function", "function": {"name": tool["name"], "description": tool.get("description")
                                                        or "", "parameters": schema}})
    return tools


def _number(body: dict, name: str, low: float, high: float | None = None, *, whole: bool = False):
    value = body.get(name)
    if value is None:
        return None
    kinds = int if whole else int | float
    if isinstance(value, bool) or not isinstance(value, kinds) or value < low or (high is not None and value > high):
        span = f"from {low:g} to {high:g}" if high is not None else f"of at least {low:g}"
        raise BadInput(f"`{name}` must be a {'whole number' if whole else 'number'} {span} (got {value!r}).",
                       param=name)
    return value


def _tool_choice(body: dict, tools: list[dict] | None) -> dict[str, Any]:
    choice = body.get("tool_choice")
    if choice is None:
        return {}
    kind = choice.get("type") if isinstance(choice, dict) else None
    names = {tool["function"]["name"] for tool in tools or []}
    options: dict[str, Any] = {}
    if kind in ("auto", "any", "none"):
        if kind == "any" and not names:
            raise BadInput("`tool_choice: any` needs `tools`.", param="tool_choice")
        options["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    elif kind == "tool" and choice.get("name") in names:
        options["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        raise BadInput("`tool_choice` must be {type: auto|any|none} or {type: tool, name} naming one of `tools`.",
                       param="tool_choice")
    if choice.get("disable_parallel_tool_use") is True:
        options["parallel_tool_calls"] = False
    return options


def _thinking(body: dict) -> dict[str, Any] | None:
    value = body.get("thinking")
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "disabled":
        return None
    if kind == "enabled" and isinstance(value.get("budget_tokens"), int) and value["budget_tokens"] >= 1024:
        return {"type": "enabled", "budget_tokens": value["budget_tokens"]}
    if kind == "adaptive":
        return {"type": "adaptive"}
    raise BadInput("`thinking` must be {type: enabled, budget_tokens ≥ 1024}, {type: adaptive} or "
                   "{type: disabled}.", param="thinking")


def options_of(body: dict, tools: list[dict] | None) -> CallOptions:
    """The call's options, for the model call (litellm's names); `max_tokens` is required, as Anthropic's is."""
    if body.get("max_tokens") is None:
        raise BadInput("`max_tokens` is required.", param="max_tokens")
    stops = body.get("stop_sequences")
    if stops is not None and (not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops)
                              or len(stops) > 8):
        raise BadInput("`stop_sequences` must be a list of at most 8 texts.", param="stop_sequences")
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise BadInput("`metadata` must be an object.", param="metadata")
    model = {"max_tokens": _number(body, "max_tokens", 1, whole=True),
             "temperature": _number(body, "temperature", 0, 1), "top_p": _number(body, "top_p", 0, 1),
             "top_k": _number(body, "top_k", 0, whole=True), "stop": stops or None,
             "thinking": _thinking(body), **_tool_choice(body, tools)}
    return CallOptions(model={k: v for k, v in model.items() if v is not None})


# --- what a message is -----------------------------------------------------------------------------------------


def _arguments(call: it.Item) -> dict:
    try:
        value = json.loads(call["arguments"] or "{}")
    except ValueError:
        return {"arguments": call["arguments"]}  # a model's broken JSON, said back as it came
    return value if isinstance(value, dict) else {"value": value}


def _thinking_blocks(items: list[it.Item]) -> list[dict]:
    blocks = []
    for item in items:
        if item.get("type") != "reasoning":
            continue
        data = item.get("data")
        kept = [b for b in (data if isinstance(data, list) else []) if isinstance(b, dict)
                and b.get("type") in ("thinking", "redacted_thinking")]
        blocks += kept or ([{"type": "thinking", "thinking": item["text"], "signature": ""}] if item.get("text")
                           else [])
    return blocks


def content_of(node: Node) -> list[dict]:
    """The answer as Anthropic's content blocks: its thinking, its text, then each tool call."""
    text = it.answer_text(node.received)
    return [*_thinking_blocks(node.received), *([{"type": "text", "text": text}] if text else []),
            *({"type": "tool_use", "id": call["id"], "name": call["name"], "input": _arguments(call)}
              for call in it.tool_calls(node.received))]


def usage_of(node: Node) -> dict[str, int]:
    usage = node.usage or {}
    return {"input_tokens": usage.get("prompt_tokens", 0), "output_tokens": usage.get("completion_tokens", 0),
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def stop_reason(node: Node) -> str:
    if it.tool_calls(node.received):
        return "tool_use"
    return "max_tokens" if cut_short(node) else "end_turn"


def message_of(node: Node, *, model: str) -> dict[str, Any]:
    return {"id": f"msg_{node.pk}", "type": "message", "role": "assistant", "model": model,
            "content": content_of(node), "stop_reason": stop_reason(node), "stop_sequence": None,
            "usage": usage_of(node)}


def sse_event(kind: str, **fields) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n".encode()


class MessageEvents:
    """One turn's events as Anthropic's stream: `message_start` once the call's node is known, a text block
    streamed as `text_delta`s, each tool call a `tool_use` block whose input comes whole as one
    `input_json_delta`, then the thinking kept on the answer, `message_delta` with the stop reason and usage, and
    `message_stop` (or an `error` event)."""

    def __init__(self, model: str, read_node):
        self.model, self.read_node = model, read_node  # read_node: async, a node by id
        self.node_id: int | None = None
        self.index = -1  # the content block open now
        self.text_open = False
        self.ended = False

    def _start(self, node_id: int | None) -> bytes:
        if self.node_id is not None or node_id is None:
            return b""
        self.node_id = node_id
        message = {"id": f"msg_{node_id}", "type": "message", "role": "assistant", "model": self.model,
                   "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": 0, "output_tokens": 0}}
        return sse_event("message_start", message=message) + sse_event("ping")

    def _close_text(self) -> bytes:
        if not self.text_open:
            return b""
        self.text_open = False
        return sse_event("content_block_stop", index=self.index)

    def _block(self, block: dict, *deltas: dict) -> bytes:
        """A whole block: opened, its deltas, closed."""
        self.index += 1
        out = sse_event("content_block_start", index=self.index, content_block=block)
        for delta in deltas:
            out += sse_event("content_block_delta", index=self.index, delta=delta)
        return out + sse_event("content_block_stop", index=self.index)

    async def translate(self, event) -> bytes:
        if event.type == EventType.TOKEN:
            out = self._start(event.data["node"])
            if not self.text_open:
                self.index += 1
                self.text_open = True
                out += sse_event("content_block_start", index=self.index, content_block={"type": "text", "text": ""})
            return out + sse_event("content_block_delta", index=self.index,
                                delta={"type": "text_delta", "text": event.data["text"]})
        if event.type == EventType.TOOL_CALL:
            call = {"id": event.data["call_id"], "name": event.data["name"], "arguments": event.data["arguments"]}
            return self._start(event.data["node"]) + self._close_text() + self._block(
                {"type": "tool_use", "id": call["id"], "name": call["name"], "input": {}},
                {"type": "input_json_delta", "partial_json": json.dumps(_arguments(call))})
        if event.type == EventType.DONE:
            self.ended = True
            out = self._start(event.data["head"]) + self._close_text()
            node = await self.read_node(self.node_id)
            for block in _thinking_blocks(node.received):
                if block["type"] == "thinking":
                    signed = [{"type": "signature_delta", "signature": block["signature"]}] if block.get(
                        "signature") else []
                    out += self._block({"type": "thinking", "thinking": "", "signature": ""}, {
                        "type": "thinking_delta", "thinking": block.get("thinking", "")}, *signed)
                else:
                    out += self._block(block)
            usage = usage_of(node)
            return out + sse_event("message_delta", delta={"stop_reason": stop_reason(node), "stop_sequence": None},
                                usage=usage) + sse_event("message_stop")
        if event.type == EventType.ERROR:
            self.ended = True
            return self.error(502, event.data.get("message", ""))
        return b""  # compaction and the like: not part of Anthropic's stream

    def error(self, status: int, message: str) -> bytes:
        return sse_event("error", error=anthropic_error_body(status, message)["error"])
