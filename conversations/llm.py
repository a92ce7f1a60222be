"""The one seam to model providers: the only module that imports litellm.

`stream_call` streams one model call and returns its received items and usage; errors come out as
`LLMError` with a failure reason from T1. `max_input_tokens` and `count_tokens` are the model facts the
budget (C1) needs. The offline provider `arbor/echo` is registered here.

arbor/echo (DESIGN.md, "Offline model") reads directives from the last user message: `#tool NAME {json}`
(one tool call per round), `#fail` (provider error), `#overflow` (context-window error), `#slow` (one word
every 100 ms), `#title` at the start (a title call: it answers the conversation's first question's first six
words). Asked to summarise (`stream_call(..., compaction=True)`, what compaction does), it answers
`summary of N messages: <digest>` and also streams a provider-native *opaque* compaction item, like the
encrypted compaction items of hosted providers: `{"type": "summary", "provider": "arbor", "text": "",
"data": "<arbor-compaction:...>"}`. Only arbor/echo can read it back (its digest shows it as
`user:summary of N messages...`); any other provider must get the original expanded instead (C3).
A last user message carrying `PLAYBOOK_DRAFT_MARKER` (a playbook conversion, P1) is answered with a JSON
playbook drafted from the path's last tool-using turn (`echo_playbook_draft`); `#draft-invalid N` in any
earlier user message makes the first N drafts invalid, `#draft-invalid always` every draft.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import time
import uuid
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # never fetch the price list at run time

import httpx  # noqa: E402
import litellm  # noqa: E402
from django.conf import settings  # noqa: E402
from litellm import CustomLLM  # noqa: E402
from litellm.types.utils import GenericStreamingChunk, ModelResponse  # noqa: E402

from conversations import items as it  # noqa: E402

litellm.telemetry = False
# litellm logs every streamed chunk at a cost that grows with the prompt (measured: 2.4 ms a token
# at path 400; a path-2,000 echo turn took 432 s). Arbor records usage itself.
litellm.disable_streaming_logging = True
litellm.suppress_debug_info = True

ECHO_PROVIDER = "arbor"
# Providers that answer a summarising call with an opaque item of their own (see the module docstring).
NATIVE_COMPACTION = frozenset({ECHO_PROVIDER})
_ECHO_OPAQUE = "<arbor-compaction:"


class LLMError(Exception):
    """A failed call, with the T1 failure reason and whatever items had arrived before it failed."""

    def __init__(self, reason: str, message: str, *, partial: list[dict] | None = None):
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.partial = partial or []


@dataclass
class CallResult:
    received: list[dict]
    usage: dict[str, Any]
    provider: str
    model: str


@dataclass
class _StreamState:
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    thinking_blocks: list[dict] = field(default_factory=list)
    calls: dict[int, dict[str, str]] = field(default_factory=dict)
    usage: dict[str, Any] = field(default_factory=dict)
    opaque_summary: list[str] = field(default_factory=list)

    def items(self, provider: str) -> list[dict]:
        received: list[dict] = []
        if self.opaque_summary:
            received.append(it.summary("", provider=provider, data="".join(self.opaque_summary)))
        if self.reasoning or self.thinking_blocks:
            received.append(
                {"type": "reasoning", "provider": provider, "text": "".join(self.reasoning),
                 "data": self.thinking_blocks or None}
            )
        if self.text:
            received.append(it.text("".join(self.text)))
        for _, call in sorted(self.calls.items()):
            received.append(it.tool_call(call["id"] or f"call_{uuid.uuid4().hex[:16]}", call["name"],
                                         call["arguments"] or "{}"))
        return received


def provider_of(model: str) -> str:
    """Return litellm's provider name for a model string such as `openai/gpt-4o` or `arbor/echo`."""
    _register_echo()
    try:
        return litellm.get_llm_provider(model)[1]
    except Exception:  # an unknown provider is reported when the call is made
        return model.split("/", 1)[0] if "/" in model else ""


def max_input_tokens(model: str) -> int:
    """The model's input limit (C1): a settings override, arbor/echo's own, else litellm's model info.

    Never the context window (`max_tokens` in litellm's list may be the output limit); a model litellm
    does not know gets `ARBOR_DEFAULT_MAX_INPUT_TOKENS`.
    """
    overrides = settings.ARBOR_MAX_INPUT_TOKENS
    if model in overrides:
        return overrides[model]
    if provider_of(model) == ECHO_PROVIDER:
        return settings.ARBOR_ECHO_MAX_INPUT_TOKENS
    if "*" in overrides:
        return overrides["*"]
    try:
        known = litellm.get_model_info(model).get("max_input_tokens")
    except Exception:  # not in litellm's list: local servers, new models
        known = None
    return int(known) if known else settings.ARBOR_DEFAULT_MAX_INPUT_TOKENS


def count_tokens(model: str, messages: list[dict], tools: list[dict] | None = None) -> int:
    """Input tokens of `messages` (and tool specs) for `model`, with litellm's counter.

    arbor/echo counts like it reports usage (JSON characters / 4), so its budget and its limit agree.
    """
    if not messages and not tools:
        return 0
    if provider_of(model) == ECHO_PROVIDER:
        return _echo_tokens([*messages, *(tools or [])])
    try:
        return litellm.token_counter(model=model, messages=messages, tools=tools or None)
    except Exception:  # a message shape the counter cannot read: fall back to the echo estimate
        return _echo_tokens([*messages, *(tools or [])])


def _causes(error: BaseException) -> list[BaseException]:
    """The error and what it wraps: litellm's `original_exception`, else `__cause__` / `__context__`."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and not any(current is seen for seen in chain):
        chain.append(current)
        current = getattr(current, "original_exception", None) or current.__cause__ or current.__context__
    return chain


def classify(error: BaseException) -> str:
    """Map a provider exception to a failure reason. Order matters: overflow is also a BadRequestError.

    litellm wraps failures that happen mid-stream (MidStreamFallbackError, a 503) around the real
    error, so every check looks through the whole chain.
    """
    chain = _causes(error)
    if any(isinstance(e, litellm.ContextWindowExceededError) for e in chain):
        return "context_overflow"
    if any(isinstance(e, litellm.Timeout | httpx.TimeoutException | TimeoutError) for e in chain):
        return "timeout"
    if any(isinstance(e, litellm.RateLimitError) for e in chain):
        return "rate_limit"
    return "provider_error"


def stream_call(
    *, model: str, messages: list[dict], tools: list[dict] | None = None, api_base: str | None = None,
    compaction: bool = False,
    response_format: dict[str, Any] | None = None,
) -> Generator[str, None, CallResult]:
    """Stream one call: yield text tokens as they arrive, return the received items and usage.

    Closing the generator (the user pressed stop) raises `LLMError('cancelled')` with the partial items.
    `compaction` marks a summarising call; a provider with native compaction answers it with an opaque
    `summary` item as well as its text.
    """
    _register_echo()
    provider = provider_of(model)
    state = _StreamState()
    kwargs: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
        "timeout": settings.ARBOR_LLM_TIMEOUT_SECONDS,
        "num_retries": 0,
        "max_retries": 0,
    }
    if tools:
        kwargs["tools"] = tools
    if compaction and provider in NATIVE_COMPACTION:
        kwargs["arbor_compaction"] = True
    if response_format:
        kwargs["response_format"] = response_format
    if api_base or (settings.ARBOR_API_BASE and provider != ECHO_PROVIDER):
        kwargs["api_base"] = api_base or settings.ARBOR_API_BASE
    stream = None
    try:
        stream = litellm.completion(**kwargs)
        for chunk in stream:
            token = _absorb(state, chunk)
            if token:
                yield token
    except GeneratorExit:
        _close(stream)
        raise LLMError("cancelled", "stopped by the user", partial=state.items(provider)) from None
    except LLMError:
        raise
    except Exception as error:  # every provider failure becomes a recorded failed node
        raise LLMError(classify(error), _message(error), partial=state.items(provider)) from error
    usage = dict(state.usage)
    cost = _cost(model, usage)
    if cost is not None:
        usage["cost_usd"] = cost
    return CallResult(received=state.items(provider), usage=usage, provider=provider, model=model)


def _cost(model: str, usage: dict[str, Any]) -> float | None:
    """The call's price from litellm's bundled price list; None for a model it does not price (arbor/echo)."""
    if not usage:
        return None
    try:
        prompt, completion = litellm.cost_per_token(
            model=model, prompt_tokens=usage.get("prompt_tokens", 0),
            completion_tokens=usage.get("completion_tokens", 0),
        )
    except Exception:  # unpriced models are normal: local servers, the offline echo
        return None
    return round(prompt + completion, 10)


def _absorb(state: _StreamState, chunk: Any) -> str:
    usage = getattr(chunk, "usage", None)
    if usage:
        state.usage = {
            "prompt_tokens": getattr(usage, "prompt_tokens", 0) or 0,
            "completion_tokens": getattr(usage, "completion_tokens", 0) or 0,
            "total_tokens": getattr(usage, "total_tokens", 0) or 0,
        }
    if not chunk.choices:
        return ""
    delta = chunk.choices[0].delta
    for call in getattr(delta, "tool_calls", None) or []:
        slot = state.calls.setdefault(call.index or 0, {"id": "", "name": "", "arguments": ""})
        if call.id:
            slot["id"] = call.id
        if call.function and call.function.name:
            slot["name"] = call.function.name
        if call.function and call.function.arguments:
            slot["arguments"] += call.function.arguments
    opaque = (getattr(delta, "provider_specific_fields", None) or {}).get("arbor_compaction")
    if opaque:
        state.opaque_summary.append(opaque)
    reasoning = getattr(delta, "reasoning_content", None)
    if reasoning:
        state.reasoning.append(reasoning)
    for block in getattr(delta, "thinking_blocks", None) or []:
        state.thinking_blocks.append(dict(block))
    token = delta.content or ""
    if token:
        state.text.append(token)
    return token


def _close(stream: Any) -> None:
    close = getattr(getattr(stream, "completion_stream", None), "close", None)
    if callable(close):
        with contextlib.suppress(Exception):  # closing a dead stream is best effort
            close()


def _message(error: BaseException) -> str:
    message = getattr(error, "message", None) or str(error) or error.__class__.__name__
    return re.sub(r"\s+", " ", message)[:2000]


# --- arbor/echo: the offline provider (DESIGN.md, "Offline model") --------------------------------

_TOOL_DIRECTIVE = re.compile(r"#tool\s+([A-Za-z0-9_\-]+)\s*")


def _text_of(content: Any) -> str:
    if isinstance(content, list):  # OpenAI content parts
        text = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    else:
        text = content or ""
    return _echo_read_opaque(text) if text.startswith(_ECHO_OPAQUE) else text


def _echo_tokens(messages: list[dict]) -> int:
    return max(1, sum(len(json.dumps(m, ensure_ascii=False)) for m in messages) // 4)


def _echo_opaque(summary: str) -> str:
    return f"{_ECHO_OPAQUE}{base64.b64encode(summary.encode()).decode()}>"


def _echo_read_opaque(text: str) -> str:
    try:
        return base64.b64decode(text[len(_ECHO_OPAQUE):].rstrip(">")).decode()
    except ValueError:
        return text


def echo_digest(messages: list[dict]) -> str:
    """`role:<first 30 characters>` for every message; tool calls and results as DESIGN.md shows."""
    parts: list[str] = []
    for message in messages:
        role = message.get("role", "")
        text = _text_of(message.get("content"))
        if role == "assistant" and message.get("tool_calls"):
            if text:
                parts.append(f"assistant:{text[:30]}")
            parts.extend(f"assistant:[call {c['function']['name']}]" for c in message["tool_calls"])
        else:
            parts.append(f"{role}:{text[:30]}")
    return " | ".join(parts)


def _tool_directives(text: str) -> list[tuple[str, str]]:
    decoder = json.JSONDecoder()
    found: list[tuple[str, str]] = []
    for match in _TOOL_DIRECTIVE.finditer(text):
        try:
            arguments, _ = decoder.raw_decode(text, match.end())
        except json.JSONDecodeError:
            arguments = {}
        found.append((match.group(1), json.dumps(arguments, ensure_ascii=False)))
    return found


@dataclass
class EchoPlan:
    """What arbor/echo will do for one call; a pure function of the messages, so tests can rely on it."""

    words: list[str]
    tool_call: tuple[str, str] | None
    slow: bool
    prompt_tokens: int
    opaque_summary: str | None = None

    @property
    def completion_tokens(self) -> int:
        return max(1, len("".join(self.words)) // 4)


ECHO_SUMMARY_CHARS = 240


def echo_plan(messages: list[dict], *, tools_offered: bool, compaction: bool = False) -> EchoPlan:
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    question = _text_of(messages[last_user].get("content")) if last_user >= 0 else ""
    prompt_tokens = _echo_tokens(messages)
    if prompt_tokens > settings.ARBOR_ECHO_MAX_INPUT_TOKENS:
        raise litellm.ContextWindowExceededError(
            message=f"arbor/echo: {prompt_tokens} input tokens exceed the limit of "
            f"{settings.ARBOR_ECHO_MAX_INPUT_TOKENS}",
            model="echo",
            llm_provider=ECHO_PROVIDER,
        )
    if compaction:  # the summary: every message but the prompt, newest kept when it runs long
        earlier = messages[:last_user] if last_user >= 0 else messages
        summary = f"summary of {len(earlier)} messages: {echo_digest(earlier)[-ECHO_SUMMARY_CHARS:]}"
        return EchoPlan(words=re.findall(r"\S+\s*|\s+", summary), tool_call=None, slow=False,
                        prompt_tokens=prompt_tokens, opaque_summary=_echo_opaque(summary))
    round_index = sum(1 for m in messages[last_user + 1 :] if m.get("role") == "tool")
    directives = _tool_directives(question) if tools_offered else []
    if round_index < len(directives):
        return EchoPlan(words=[], tool_call=directives[round_index], slow=False, prompt_tokens=prompt_tokens)
    if question.startswith("#title"):  # a title call: the conversation's first question, cut short
        first = next((_text_of(m.get("content")) for m in messages if m.get("role") == "user"), "")
        title = " ".join(first.split()[:6]) or "Untitled"
        return EchoPlan(words=re.findall(r"\S+\s*|\s+", title), tool_call=None, slow=False,
                        prompt_tokens=prompt_tokens)
    if "#fail" in question:
        raise litellm.InternalServerError(
            message="arbor/echo: #fail asked for a provider error", model="echo", llm_provider=ECHO_PROVIDER
        )
    if "#overflow" in question:
        raise litellm.ContextWindowExceededError(
            message="arbor/echo: #overflow asked for a context-window error", model="echo",
            llm_provider=ECHO_PROVIDER,
        )
    if PLAYBOOK_DRAFT_MARKER in question:
        answer = echo_playbook_draft(messages)
    else:
        answer = f"echo: {question}\nseen: {echo_digest(messages)}"
    words = re.findall(r"\S+\s*|\s+", answer)
    return EchoPlan(words=words, tool_call=None, slow="#slow" in question, prompt_tokens=prompt_tokens)


class EchoLLM(CustomLLM):
    """A litellm custom provider that answers from what it received, with no network."""

    def completion(self, model, messages, api_base, custom_prompt_dict, model_response, *args, **kwargs):
        plan = _plan_for(messages, kwargs)
        response = ModelResponse(model="arbor/echo")
        message: dict[str, Any] = {"role": "assistant", "content": "".join(plan.words) or None}
        if plan.tool_call:
            name, arguments = plan.tool_call
            message["tool_calls"] = [
                {"id": _call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}
            ]
        response.choices[0].message = litellm.Message(**message)
        response.choices[0].finish_reason = "tool_calls" if plan.tool_call else "stop"
        response.usage = litellm.Usage(  # type: ignore[attr-defined]
            prompt_tokens=plan.prompt_tokens,
            completion_tokens=plan.completion_tokens,
            total_tokens=plan.prompt_tokens + plan.completion_tokens,
        )
        return response

    def streaming(self, model, messages, api_base, custom_prompt_dict, model_response, *args, **kwargs):
        return _echo_chunks(_plan_for(messages, kwargs))

    async def acompletion(self, *args, **kwargs):
        return self.completion(*args, **kwargs)

    async def astreaming(self, *args, **kwargs):
        for chunk in self.streaming(*args, **kwargs):
            yield chunk


def _plan_for(messages: list[dict], kwargs: dict[str, Any]) -> EchoPlan:
    options = kwargs.get("optional_params") or {}
    return echo_plan(messages, tools_offered=bool(options.get("tools")),
                     compaction=bool(options.get("arbor_compaction")))


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:20]}"


def _echo_chunks(plan: EchoPlan) -> Iterator[GenericStreamingChunk]:
    usage = {
        "prompt_tokens": plan.prompt_tokens,
        "completion_tokens": plan.completion_tokens,
        "total_tokens": plan.prompt_tokens + plan.completion_tokens,
    }
    if plan.tool_call:
        name, arguments = plan.tool_call
        yield GenericStreamingChunk(
            text="",
            tool_use={"id": _call_id(), "type": "function", "function": {"name": name, "arguments": arguments},
                      "index": 0},
            is_finished=True,
            finish_reason="tool_calls",
            usage=usage,
            index=0,
        )
        return
    for position, word in enumerate(plan.words):
        if plan.slow:
            time.sleep(0.1)
        last = position == len(plan.words) - 1
        yield GenericStreamingChunk(
            text=word,
            tool_use=None,
            is_finished=last,
            finish_reason="stop" if last else "",
            usage=usage if last else None,
            index=0,
            provider_specific_fields={"arbor_compaction": plan.opaque_summary}
            if plan.opaque_summary and position == 0 else None,
        )


_echo_handler: EchoLLM | None = None


def _register_echo() -> None:
    global _echo_handler
    if _echo_handler is None:
        _echo_handler = EchoLLM()
        litellm.custom_provider_map = [
            *[p for p in litellm.custom_provider_map if p.get("provider") != ECHO_PROVIDER],
            {"provider": ECHO_PROVIDER, "custom_handler": _echo_handler},
        ]
        litellm.utils.custom_llm_setup()


# --- arbor/echo drafts playbooks (P1) ------------------------------------------------------------------

# Put in the request item of a playbook conversion: arbor/echo answers it with a JSON draft.
PLAYBOOK_DRAFT_MARKER = "[arbor:playbook-draft]"
_DRAFT_INVALID = re.compile(r"#draft-invalid\s+(always|\d+)")
_MONTH_LITERAL = re.compile(r"'(\d{4}-\d{2})'")
_LIMIT = re.compile(r"\b(limit)\s+(\d+)\b", re.IGNORECASE)
_DOMESTIC_ONLY = re.compile(r"\b((?:\w+\.)?is_overseas)\s*=\s*0\b")


def supports_json_mode(model: str) -> bool:
    """Does litellm know `model` to take `response_format={"type": "json_object"}`?"""
    try:
        params = litellm.get_supported_openai_params(model=model, custom_llm_provider=provider_of(model))
    except Exception:  # an unknown model: ask for JSON in words only
        return False
    return "response_format" in (params or [])


def _plain_question(text: str) -> str:
    """A question without its echo directives."""
    decoder, kept, position = json.JSONDecoder(), [], 0
    for match in _TOOL_DIRECTIVE.finditer(text):
        if match.start() < position:
            continue
        kept.append(text[position:match.start()])
        try:
            position = decoder.raw_decode(text, match.end())[1]
        except json.JSONDecodeError:
            position = match.end()
    kept.append(text[position:])
    return " ".join(re.sub(r"#(fail|overflow|slow|draft-invalid\s+(always|\d+))\b", "", "".join(kept)).split())


def _parameterise_sql(sql: str, parameters: dict[str, dict[str, Any]]) -> str:
    """Turn the month, the row limit and a domestic-only filter into parameters (the seeds' sales question)."""
    month = _MONTH_LITERAL.search(sql)
    if month:
        parameters.setdefault("month", {"name": "month", "type": "string", "description": "The month, YYYY-MM.",
                                        "default": month.group(1), "pattern": r"^\d{4}-(0[1-9]|1[0-2])$"})
        sql = _MONTH_LITERAL.sub("'{{month}}'", sql)
    limit = _LIMIT.search(sql)
    if limit:
        parameters.setdefault("limit", {"name": "limit", "type": "integer", "description": "How many rows.",
                                        "default": int(limit.group(2))})
        sql = _LIMIT.sub(lambda m: f"{m.group(1)} {{{{limit}}}}", sql)
    if _DOMESTIC_ONLY.search(sql):
        parameters.setdefault("include_overseas", {"name": "include_overseas", "type": "boolean",
                                                   "description": "Count overseas customers too.",
                                                   "default": False})
        sql = _DOMESTIC_ONLY.sub(lambda m: f"({m.group(1)} = 0 OR {{{{include_overseas}}}})", sql)
    return sql


def echo_playbook_draft(messages: list[dict]) -> str:
    """A deterministic playbook draft: one tool step per tool call of the path's last tool-using turn.

    The first N drafts of a conversion are invalid when a user message says `#draft-invalid N`
    (`always`: every draft): they gain a step that queries a column the sales database lacks.
    """
    users = [i for i, m in enumerate(messages)
             if m.get("role") == "user" and PLAYBOOK_DRAFT_MARKER not in _text_of(m.get("content"))]
    calling = [i for i, m in enumerate(messages) if m.get("role") == "assistant" and m.get("tool_calls")]
    opener = max((i for i in users if not calling or i < calling[-1]), default=None)
    question = _plain_question(_text_of(messages[opener].get("content"))) if opener is not None else ""
    parameters: dict[str, dict[str, Any]] = {}
    steps: list[dict[str, Any]] = []
    turn = messages[opener + 1 if opener is not None else 0:]
    calls = [call for m in turn if m.get("role") == "assistant" for call in m.get("tool_calls") or []]
    for call in calls:
        try:
            arguments = json.loads(call["function"]["arguments"] or "{}")
        except json.JSONDecodeError:
            arguments = {}  # the validator then says what is missing, as it would to a model
        if not isinstance(arguments, dict):
            arguments = {}
        if call["function"]["name"] == "sql_query" and isinstance(arguments.get("sql"), str):
            arguments["sql"] = _parameterise_sql(arguments["sql"], parameters)
        steps.append({"tool": call["function"]["name"], "arguments": arguments})
    steps.append({"instruction": "Answer the question from the results above." if steps else
                  f"Answer: {question or 'the question'}"})
    tries = sum(1 for m in messages if m.get("role") == "user" and PLAYBOOK_DRAFT_MARKER in _text_of(m.get("content")))
    invalid = [match.group(1) for i in users for match in _DRAFT_INVALID.finditer(_text_of(messages[i]["content"]))]
    if invalid and (invalid[-1] == "always" or tries <= int(invalid[-1])):
        steps.insert(0, {"tool": "sql_query", "arguments": {"sql": "SELECT no_such_column FROM orders"}})
    draft = {"name": (question or "Playbook")[:80], "description": f"From the question: {question}",
             "parameters": list(parameters.values()), "steps": steps,
             "expected_output": f"The answer to: {question}" if question else "The answer."}
    return json.dumps(draft, ensure_ascii=False)
