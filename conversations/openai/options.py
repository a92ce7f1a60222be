"""A call's own options on /v1/ (issue 27): read and checked before anything is written, passed to the model call,
and said back in the response object as they were sent.

`model` holds what goes to the model call (litellm's Chat Completions names: `temperature`, `top_p`,
`max_tokens`, `tool_choice`, `parallel_tool_calls`, `response_format`); `echo` holds the Responses fields a
response object says back. Out-of-range values are refused (400, OpenAI's error shape) with the field named.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from config.errors import BadInput

_CHOICES = ("none", "auto", "required")
MAX_METADATA_KEYS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512  # OpenAI's limits


@dataclass
class CallOptions:
    model: dict[str, Any] = field(default_factory=dict)  # for the model call
    echo: dict[str, Any] = field(default_factory=dict)  # for the response object


def _number(body: dict, name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise BadInput(f"`{name}` must be a number from {low:g} to {high:g} (got {value!r}).", param=name)
    return value


def _tokens(body: dict, name: str, low: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise BadInput(f"`{name}` must be a whole number of at least {low} (got {value!r}).", param=name)
    return value


def _flag(body: dict, name: str) -> bool | None:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise BadInput(f"`{name}` must be true or false.", param=name)
    return value


def _function_named(choice: Any, names: set[str], *, chat: bool) -> str | None:
    """The function a `tool_choice` object names (Responses: `{type, name}`; chat: `{type, function: {name}}`)."""
    if not isinstance(choice, dict) or choice.get("type") != "function":
        return None
    holder = choice.get("function") if chat else choice
    name = holder.get("name") if isinstance(holder, dict) else None
    if not isinstance(name, str):
        return None
    if name not in names:
        raise BadInput(f"`tool_choice` names the function {name!r}, which is not in `tools`.", param="tool_choice")
    return name


def _tool_choice(body: dict, tools: list[dict] | None, *, chat: bool) -> tuple[Any, Any]:
    """(what the model call gets, what the response says back); both None when the caller sent none."""
    choice = body.get("tool_choice")
    if choice is None:
        return None, None
    names = {tool["function"]["name"] for tool in tools or []}
    if choice in _CHOICES:
        if choice == "required" and not names:
            raise BadInput("`tool_choice: required` needs `tools`.", param="tool_choice")
        return choice, choice
    name = _function_named(choice, names, chat=chat)
    if name is None:
        shape = '{"type": "function", "function": {"name": …}}' if chat else '{"type": "function", "name": …}'
        raise BadInput(f"`tool_choice` must be none, auto, required or {shape} (only function tools are served "
                       "here).", param="tool_choice")
    return {"type": "function", "function": {"name": name}}, {"type": "function", "name": name}


def metadata_of(body: dict) -> dict[str, str] | None:
    value = body.get("metadata")
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > MAX_METADATA_KEYS or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= MAX_METADATA_KEY and len(v) <= MAX_METADATA_VALUE
            for k, v in value.items()):
        raise BadInput(f"`metadata` must be at most {MAX_METADATA_KEYS} text values, keys of at most "
                       f"{MAX_METADATA_KEY} characters, values of at most {MAX_METADATA_VALUE}.", param="metadata")
    return value


def _schema_format(value: dict, where: str) -> dict[str, Any]:
    """A JSON schema answer format: its name and schema, checked; `strict` kept when given."""
    if not isinstance(value.get("name"), str) or not isinstance(value.get("schema"), dict):
        raise BadInput(f"`{where}`: a json_schema format needs a `name` and a `schema` object.", param=where)
    return {k: value[k] for k in ("name", "schema", "description", "strict") if value.get(k) is not None}


def _text_format(body: dict) -> tuple[dict | None, dict]:
    """Responses' `text`: (the model call's `response_format`, the `text` said back)."""
    text = body.get("text")
    if text is None:
        return None, {"format": {"type": "text"}}
    given = text.get("format", {"type": "text"}) if isinstance(text, dict) else None
    kind = given.get("type") if isinstance(given, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        raise BadInput("`text.format.type` must be text, json_object or json_schema.", param="text.format")
    if kind == "json_schema":
        schema = _schema_format(given, "text.format")
        return {"type": "json_schema", "json_schema": schema}, {**text, "format": {"type": kind, **schema}}
    return (None if kind == "text" else {"type": kind}), {**text, "format": {"type": kind}}


def _response_format(body: dict) -> dict | None:
    """Chat Completions' `response_format`, checked, for the model call."""
    value = body.get("response_format")
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        raise BadInput("`response_format.type` must be text, json_object or json_schema.", param="response_format")
    if kind == "json_schema":
        inner = value.get("json_schema")
        return {"type": kind, "json_schema": _schema_format(inner if isinstance(inner, dict) else {},
                                                            "response_format.json_schema")}
    return None if kind == "text" else {"type": kind}


def _common(body: dict, tools: list[dict] | None, *, chat: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    sampling = {"temperature": _number(body, "temperature", 0, 2), "top_p": _number(body, "top_p", 0, 1)}
    to_model, said = _tool_choice(body, tools, chat=chat)
    parallel = _flag(body, "parallel_tool_calls")
    model = {**sampling, "tool_choice": to_model, "parallel_tool_calls": parallel}
    echo = {**sampling, "tool_choice": said or "auto", "parallel_tool_calls": True if parallel is None else parallel}
    return model, echo


def responses_options(body: dict, tools: list[dict] | None) -> CallOptions:
    """A Responses create's options; `tools` as `shapes.tools_of` read them."""
    model, echo = _common(body, tools, chat=False)
    limit = _tokens(body, "max_output_tokens", 16)
    response_format, text = _text_format(body)
    truncation = body.get("truncation")
    if truncation not in (None, "auto", "disabled"):
        raise BadInput("`truncation` must be auto or disabled.", param="truncation")
    _flag(body, "store")  # a call is always stored here: the tree is the point (see README)
    for name in ("user", "safety_identifier", "prompt_cache_key"):
        if body.get(name) is not None and not isinstance(body.get(name), str):
            raise BadInput(f"`{name}` must be text.", param=name)
    model.update(max_tokens=limit, response_format=response_format)
    echo.update(max_output_tokens=limit, text=text, truncation=truncation or "disabled", metadata=metadata_of(body)
                or {}, store=True, tools=body.get("tools") or [],
                **{name: body.get(name) for name in ("user", "safety_identifier", "prompt_cache_key")})
    return CallOptions(model={k: v for k, v in model.items() if v is not None}, echo=echo)


def chat_options(body: dict, tools: list[dict] | None) -> CallOptions:
    """A Chat Completions create's options; `max_completion_tokens` (or the older `max_tokens`) caps the answer."""
    model, _ = _common(body, tools, chat=True)
    metadata_of(body)
    limits = [v for v in (_tokens(body, "max_completion_tokens", 1), _tokens(body, "max_tokens", 1)) if v]
    model.update(max_tokens=min(limits) if limits else None, response_format=_response_format(body))
    return CallOptions(model={k: v for k, v in model.items() if v is not None})
