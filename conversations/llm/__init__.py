"""The one seam to model providers: the only package that imports litellm.

`stream_call` streams one model call and returns its received items and usage; errors come out as
`LLMError` with a failure reason from T1. `max_input_tokens` and `count_tokens` are the model facts the
budget (C1) needs. A provider of Arbor's own (the offline `arbor/echo`, in `echo/`) is registered through
`register_provider` (an `OwnProvider`, with the facts litellm cannot know about it); this module knows nothing
else about it.

A provider registered with `native_compaction` answers a summarising call (`stream_call(..., compaction=True)`)
with an opaque item of its own as well as its text: it receives `compaction=True` (litellm's `arbor_compaction`)
and streams the item in its chunk's `provider_specific_fields["arbor_compaction"]`, like the encrypted compaction
items of hosted providers. Only that provider can read it back; any other gets the original path expanded
instead (C3).

litellm is imported on first use (`litellm_module`), never at start-up (issue 34): its import took 3-5 s of every
process's start (migrate, bootstrap, worker and server each paid it). A provider of Arbor's own is called here
directly and its chunks are read by the same `_absorb` as litellm's stream, so the offline model, the management
commands and a server that serves only arbor/echo never import litellm. Once litellm is loaded, `custom.py`
registers each own provider with it as a custom provider too (`litellm.completion(model="arbor/echo")` works).
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import threading
import uuid
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace
from typing import Any, Protocol

from django.conf import settings

from conversations import items as it

_LOADED: dict[str, ModuleType] = {}
_LOADING = threading.Lock()


def litellm_module() -> ModuleType:
    """litellm, imported and set up the first time a call needs it (issue 34: ~3-5 s and ~150 MB that a process
    serving only Arbor's own providers never needs). Thread-safe; later calls cost a dictionary look-up."""
    if (module := _LOADED.get("litellm")) is None:
        with _LOADING:
            if (module := _LOADED.get("litellm")) is None:
                module = _LOADED["litellm"] = _import_litellm()
    return module


def _import_litellm() -> ModuleType:
    import litellm  # here, not at the top: the one place litellm is imported (see the module's docstring)

    litellm.telemetry = False
    # litellm logs every streamed chunk at a cost that grows with the prompt (measured: 2.4 ms a token
    # at path 400; a path-2,000 echo turn took 432 s). Arbor records usage itself.
    litellm.disable_streaming_logging = True
    litellm.suppress_debug_info = True
    litellm.disable_hf_tokenizer_download = True  # count with the bundled tiktoken files, never the network
    # Arbor retries itself (the worker's backoff; a person's Retry). litellm's OpenAI embedding path reads
    # `max_retries or DEFAULT_MAX_RETRIES`, so an explicit 0 there still retried twice.
    litellm.DEFAULT_MAX_RETRIES = 0
    from conversations.llm import custom  # imports litellm: loaded with it, never before

    for name, handler in _OWN_HANDLERS.items():
        custom.register(litellm, name, handler)
    return litellm


class OwnProvider(Protocol):
    """A provider of Arbor's own (`name/<model>`; `model` below is the part after the slash).

    `stream` answers one call with chunks shaped like litellm's `GenericStreamingChunk` (plain dicts: `text`,
    `tool_use`, `usage`, `provider_specific_fields`, ...); it raises at once for a call it refuses, with litellm's
    own exception (`litellm_module()`), as a hosted provider's failure comes out. `embed` returns a vector a text.
    """

    def stream(self, model: str, messages: list[dict], *, tools: list[dict] | None,
               compaction: bool) -> Iterator[dict]: ...

    def embed(self, model: str, texts: list[str]) -> list[list[float]]: ...


@dataclass(frozen=True)
class ProviderFacts:
    """What litellm cannot know about a provider of Arbor's own: its counter, its input limit, whether it
    compacts natively, whether it takes JSON mode (litellm says a custom provider takes OpenAI's parameters).
    Read when asked (the limit may be a setting a test changes)."""

    count_tokens: Callable[[list[dict]], int]
    max_input_tokens: Callable[[], int]
    native_compaction: bool = False
    json_mode: bool = True
    vision: bool = True  # takes image parts (arbor/echo digests them)


_OWN_PROVIDERS: dict[str, ProviderFacts] = {}
_OWN_HANDLERS: dict[str, OwnProvider] = {}


def register_provider(name: str, handler: OwnProvider, facts: ProviderFacts) -> None:
    """Register a provider of Arbor's own (`name/<model>`) with its facts; registering again replaces it.

    The seam calls it directly; litellm (once loaded) has it as a custom provider as well.
    """
    _OWN_HANDLERS[name] = handler
    _OWN_PROVIDERS[name] = facts
    if (litellm := _LOADED.get("litellm")) is not None:
        from conversations.llm import custom  # loaded with litellm (see `_import_litellm`)

        custom.register(litellm, name, handler)


def native_compaction(provider: str | None) -> bool:
    """Does `provider` answer a summarising call with an opaque item only it can read (C3)?"""
    facts = _OWN_PROVIDERS.get(provider or "")
    return bool(facts and facts.native_compaction)


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
    finish_reason: str = ""
    size: int = 0  # bytes (UTF-8) received so far, of every kind

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
    own, slash, _ = model.partition("/")
    if slash and own in _OWN_PROVIDERS:  # what litellm answers for a custom provider, without loading it
        return own
    try:
        return litellm_module().get_llm_provider(model)[1]
    except Exception:  # an unknown provider is reported when the call is made
        return model.split("/", 1)[0] if "/" in model else ""


def max_input_tokens(model: str) -> int:
    """The model's input limit (C1): a settings override, an own provider's limit, else litellm's model info.

    Never the context window (`max_tokens` in litellm's list may be the output limit); a model litellm
    does not know gets `ARBOR_DEFAULT_MAX_INPUT_TOKENS`.
    """
    overrides = settings.ARBOR_MAX_INPUT_TOKENS
    if model in overrides:
        return overrides[model]
    own = _OWN_PROVIDERS.get(provider_of(model))
    if own is not None:
        return own.max_input_tokens()
    if "*" in overrides:
        return overrides["*"]
    try:
        known = litellm_module().get_model_info(model).get("max_input_tokens")
    except Exception:  # not in litellm's list: local servers, new models
        known = None
    return int(known) if known else settings.ARBOR_DEFAULT_MAX_INPUT_TOKENS


def max_output_tokens(model: str) -> int | None:
    """The model's own limit on an answer, from litellm's model info; None when litellm does not know it."""
    if provider_of(model) in _OWN_PROVIDERS:
        return None
    try:
        known = litellm_module().get_model_info(model).get("max_output_tokens")
    except Exception:  # not in litellm's list: local servers, new models
        return None
    return int(known) if known else None


def answer_reserve(model: str) -> int:
    """What a call keeps free for its answer (C1), and sends as `max_tokens`: the model's output limit,
    capped by ARBOR_ANSWER_RESERVE_TOKENS and by a quarter of its input limit (the default 4096 would leave
    a small model, arbor/echo's 4000 or a local 8192, little or nothing for its input)."""
    reserve = min(settings.ARBOR_ANSWER_RESERVE_TOKENS, max_input_tokens(model) // 4)
    known = max_output_tokens(model)
    return min(reserve, known) if known else reserve


# litellm providers that speak OpenAI's API: ARBOR_API_BASE is theirs alone.
_OPENAI_COMPATIBLE = ("openai", "hosted_vllm")


def provider_options(model: str) -> dict[str, Any]:
    """The litellm options ARBOR_PROVIDERS sets for the model's provider, then for the model itself (a model's
    win). Only the model's own provider's entry is read, so a key never goes to another provider's base."""
    provider = provider_of(model)
    if provider in _OWN_PROVIDERS:
        return {}
    options: dict[str, Any] = {}
    if settings.ARBOR_API_BASE and provider in _OPENAI_COMPATIBLE:
        options["api_base"] = settings.ARBOR_API_BASE
    configured = settings.ARBOR_PROVIDERS
    return {**options, **configured.get(provider, {}), **configured.get(model, {})}


def count_tokens(model: str, messages: list[dict], tools: list[dict] | None = None) -> int:
    """Input tokens of `messages` (and tool specs) for `model`, with litellm's counter.

    An own provider counts like it reports usage, so its budget and its limit agree.
    """
    if not messages and not tools:
        return 0
    own = _OWN_PROVIDERS.get(provider_of(model))
    if own is not None:
        return own.count_tokens([*messages, *(tools or [])])
    try:
        return litellm_module().token_counter(model=model, messages=messages, tools=tools or None)
    except Exception:  # a message shape the counter cannot read: estimate from its JSON size
        return estimate_tokens([*messages, *(tools or [])])


def estimate_tokens(parts: list[dict]) -> int:
    """About a token per four characters of JSON: what arbor/echo reports, and the fallback estimate."""
    return max(1, sum(len(json.dumps(p, ensure_ascii=False)) for p in parts) // 4)


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
    error, so every check looks through the whole chain. Neither litellm nor httpx is imported for it: an error
    of a library that is not loaded cannot be one of its classes.
    """
    chain = _causes(error)
    litellm, httpx = sys.modules.get("litellm"), sys.modules.get("httpx")
    timeouts = tuple(t for t in (getattr(litellm, "Timeout", None), getattr(httpx, "TimeoutException", None),
                                 TimeoutError) if t is not None)
    if litellm is not None and any(isinstance(e, litellm.ContextWindowExceededError) for e in chain):
        return "context_overflow"
    if any(isinstance(e, timeouts) for e in chain):
        return "timeout"
    if litellm is not None and any(isinstance(e, litellm.RateLimitError) for e in chain):
        return "rate_limit"
    return "provider_error"


def stream_call(
    *, model: str, messages: list[dict], tools: list[dict] | None = None, api_base: str | None = None,
    compaction: bool = False,
    response_format: dict[str, Any] | None = None, options: dict[str, Any] | None = None,
) -> Generator[str, None, CallResult]:
    """Stream one call: yield text tokens as they arrive, return the received items and usage.

    Closing the generator (the user pressed stop) raises `LLMError('cancelled')` with the partial items.
    `compaction` marks a summarising call; a provider with native compaction answers it with an opaque
    `summary` item as well as its text. `options`: the caller's own request options (`_request`); a provider of
    Arbor's own ignores them.
    """
    provider = provider_of(model)
    state = _StreamState()
    own = _OWN_HANDLERS.get(provider)
    if own is None:
        kwargs = _request(model, provider, messages, tools=tools, api_base=api_base, compaction=compaction,
                          response_format=response_format, options=options)
    stream = None
    try:
        if own is None:
            stream = chunks = litellm_module().completion(**kwargs)
        else:  # called directly, read as litellm reads a custom provider's chunks (no litellm import)
            stream = own.stream(model.partition("/")[2], messages, tools=tools,
                                compaction=compaction and native_compaction(provider))
            chunks = map(_own_chunk, stream)
        max_bytes = settings.ARBOR_NODE_MAX_BYTES // 2  # an answer may take half of what a node stores
        for chunk in chunks:
            token = _absorb(state, chunk)
            if state.size > max_bytes:
                _close(stream)
                raise LLMError("provider_error", f"the answer passed {max_bytes} bytes, the most a node keeps "
                               "of one; the rest was not read", partial=state.items(provider))
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
    if state.finish_reason == "length":  # cut at the output limit: the gateways say so (max_tokens, incomplete)
        usage["finish_reason"] = "length"
    cost = cost_of(model, usage)
    if cost is not None:
        usage["cost_usd"] = cost
    return CallResult(received=state.items(provider), usage=usage, provider=provider, model=model)


# Providers whose requests must declare the tools their history called (litellm adds a dummy tool otherwise).
_DECLARE_HISTORY_TOOLS = frozenset({"anthropic", "bedrock", "vertex_ai"})


def _tools_in_history(messages: list[dict]) -> list[dict]:
    names = dict.fromkeys(call["function"]["name"] for m in messages for call in m.get("tool_calls") or [])
    return [{"type": "function", "function": {"name": name, "description": "Called earlier in this conversation.",
                                              "parameters": {"type": "object", "properties": {}}}}
            for name in names]


def wire_settings(model: str, messages: list[dict], *, tools: list[dict] | None,
                  response_format: dict[str, Any] | None = None, options: dict[str, Any] | None = None
                  ) -> dict[str, Any]:
    """Everything a call sends beside its messages and the transport: `max_tokens`, the tools and the caller's
    own options (`temperature`, `top_p`, `tool_choice`, `parallel_tool_calls`, `response_format`, and
    `max_tokens`, which never exceeds the reserve); its tool options go only with tools it offers. A node keeps
    this ("what the model saw", issue 27), so it is made once, here, for the call and for the record."""
    sent: dict[str, Any] = {
        # The reserve the budget kept free (C1): without it litellm sends the model's whole output limit
        # (64,000 for a Claude model), and the provider refuses a long context the budget let through.
        "max_tokens": answer_reserve(model),
    }
    if tools:
        sent["tools"] = tools
    elif provider_of(model) in _DECLARE_HISTORY_TOOLS and (used := _tools_in_history(messages)):
        # A call that must answer, below tool calls: Anthropic refuses tool calls in the history of a request
        # that declares no tools, and litellm would add a "dummy_tool" the person never sees. Declared here
        # instead: the tools the history used, which this call may not call.
        sent["tools"], sent["tool_choice"] = used, "none"
    if response_format:
        sent["response_format"] = response_format
    options = dict(options or {})
    sent["max_tokens"] = min(sent["max_tokens"], options.pop("max_tokens", sent["max_tokens"]))
    if not tools:  # a round that offers none (a provider refuses a tool choice without tools)
        options = {k: v for k, v in options.items() if k not in ("tool_choice", "parallel_tool_calls")}
    return {**sent, **options}


def _request(model: str, provider: str, messages: list[dict], *, tools: list[dict] | None, api_base: str | None,
             compaction: bool, response_format: dict[str, Any] | None,
             options: dict[str, Any] | None = None) -> dict[str, Any]:
    """litellm's arguments for one streamed call: the transport, the messages and `wire_settings`."""
    kwargs: dict[str, Any] = {
        **provider_options(model),
        "model": model,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
        "timeout": settings.ARBOR_LLM_TIMEOUT_SECONDS,
        "num_retries": 0,
        "max_retries": 0,
        **wire_settings(model, messages, tools=tools, response_format=response_format, options=options),
    }
    if compaction and native_compaction(provider):
        kwargs["arbor_compaction"] = True
    if api_base:
        kwargs["api_base"] = api_base
    return kwargs


def cost_of(model: str, usage: dict[str, Any]) -> float | None:
    """Issue 31: a call's price in dollars from its usage (`prompt_tokens`, `completion_tokens`, cached prompt
    tokens in `prompt_tokens_details`): ARBOR_MODEL_PRICES' price for the model, else litellm's bundled price
    list; None for a model neither prices (arbor/echo, a local server)."""
    if not usage:
        return None
    price = settings.ARBOR_MODEL_PRICES.get(model)
    if price is not None:
        details = usage.get("prompt_tokens_details")
        cached = (details.get("cached_tokens") if isinstance(details, dict) else 0) or 0
        prompt, completion = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
        dollars = ((prompt - cached) * price["input"] + cached * price.get("cached_input", price["input"])
                   + completion * price["output"]) / 1_000_000
        return round(dollars, 10)
    return _cost(model, usage)


def _cost(model: str, usage: dict[str, Any]) -> float | None:
    """The call's price from litellm's bundled price list; None for a model it does not price (arbor/echo)."""
    if provider_of(model) in _OWN_PROVIDERS:
        return None
    try:
        prompt, completion = litellm_module().cost_per_token(
            model=model, prompt_tokens=usage.get("prompt_tokens", 0),
            completion_tokens=usage.get("completion_tokens", 0),
        )
    except Exception:  # unpriced models are normal: local servers, the offline echo
        return None
    return round(prompt + completion, 10)


def _own_chunk(chunk: dict) -> SimpleNamespace:
    """An own provider's chunk (a `GenericStreamingChunk` dict) in the shape litellm streams it: one reader
    (`_absorb`) for every provider."""
    call = chunk.get("tool_use")
    tool_calls = [SimpleNamespace(index=call.get("index") or 0, id=call.get("id"),
                                  function=SimpleNamespace(**call["function"]))] if call else None
    delta = SimpleNamespace(content=chunk.get("text") or None, tool_calls=tool_calls,
                            provider_specific_fields=chunk.get("provider_specific_fields"))
    usage = SimpleNamespace(**chunk["usage"]) if chunk.get("usage") else None
    return SimpleNamespace(choices=[SimpleNamespace(delta=delta, finish_reason=chunk.get("finish_reason") or None)],
                           usage=usage)


def _absorb(state: _StreamState, chunk: Any) -> str:
    """Add one streamed chunk to `state`; return its answer text (empty when it brought none)."""
    usage = getattr(chunk, "usage", None)
    if usage:
        state.usage = {
            "prompt_tokens": getattr(usage, "prompt_tokens", 0) or 0,
            "completion_tokens": getattr(usage, "completion_tokens", 0) or 0,
            "total_tokens": getattr(usage, "total_tokens", 0) or 0,
        }
        details = getattr(usage, "prompt_tokens_details", None)
        cached = getattr(details, "cached_tokens", None) if details is not None else None
        if isinstance(cached, int) and cached > 0:  # issue 31: priced apart (ARBOR_MODEL_PRICES' cached_input)
            state.usage["prompt_tokens_details"] = {"cached_tokens": cached}
    if not chunk.choices:
        return ""
    state.finish_reason = getattr(chunk.choices[0], "finish_reason", None) or state.finish_reason
    delta = chunk.choices[0].delta
    for call in getattr(delta, "tool_calls", None) or []:
        _absorb_call(state, call)
    _absorb_extras(state, delta)
    token = delta.content or ""
    if token:
        state.text.append(token)
        state.size += len(token.encode())
    return token


def _absorb_call(state: _StreamState, call: Any) -> None:
    """A tool call's piece: its id and name arrive once, its arguments in pieces (by `index`)."""
    slot = state.calls.setdefault(call.index or 0, {"id": "", "name": "", "arguments": ""})
    if call.id:
        slot["id"] = call.id
    if call.function and call.function.name:
        slot["name"] = call.function.name
    if call.function and call.function.arguments:
        slot["arguments"] += call.function.arguments
        state.size += len(call.function.arguments.encode())


def _absorb_extras(state: _StreamState, delta: Any) -> None:
    """What a delta carries beside text and calls: a provider's opaque compaction result, reasoning, thinking."""
    opaque = (getattr(delta, "provider_specific_fields", None) or {}).get("arbor_compaction")
    if opaque:
        state.opaque_summary.append(opaque)
        state.size += len(str(opaque).encode())
    reasoning = getattr(delta, "reasoning_content", None)
    if reasoning:
        state.reasoning.append(reasoning)
        state.size += len(reasoning.encode())
    for block in getattr(delta, "thinking_blocks", None) or []:
        state.thinking_blocks.append(dict(block))
        state.size += len(json.dumps(dict(block), default=str).encode())


def _close(stream: Any) -> None:
    """Close the provider's stream: the one litellm's wrapper holds, or an own provider's generator."""
    close = getattr(getattr(stream, "completion_stream", stream), "close", None)
    if callable(close):
        with contextlib.suppress(Exception):  # closing a dead stream is best effort
            close()


def _message(error: BaseException) -> str:
    message = getattr(error, "message", None) or str(error) or error.__class__.__name__
    return re.sub(r"\s+", " ", message)[:2000]


def supports_vision(model: str) -> bool:
    """Does `model` take image parts (X1)? litellm's model list says; a model it does not know is taken to see
    (a local vision server), so the provider's own refusal is the word there."""
    if (own := _OWN_PROVIDERS.get(provider_of(model))) is not None:
        return own.vision
    try:
        info = litellm_module().get_model_info(model)
    except Exception:  # not in litellm's list
        return True
    return bool(info.get("supports_vision"))


def supports_json_mode(model: str) -> bool:
    """Does litellm know `model` to take `response_format={"type": "json_object"}`?"""
    if (own := _OWN_PROVIDERS.get(provider_of(model))) is not None:
        return own.json_mode
    try:
        params = litellm_module().get_supported_openai_params(model=model, custom_llm_provider=provider_of(model))
    except Exception:  # an unknown model: ask for JSON in words only
        return False
    return "response_format" in (params or [])


def embed(model: str, texts: list[str], *, timeout: float | None = None) -> list[list[float]]:
    """One embedding call through litellm: a vector a text, in order. Failures come out as `LLMError`.

    Provider options (keys, bases) come from ARBOR_PROVIDERS like a chat call's; no retries here: the worker
    retries a failed job, and retrieval falls back to words at once.
    """
    if not texts:
        return []
    own = _OWN_HANDLERS.get(provider_of(model))
    try:
        if own is not None:
            vectors = [list(vector) for vector in own.embed(model.partition("/")[2], list(texts))]
        else:
            response = litellm_module().embedding(
                model=model, input=texts, **provider_options(model),
                timeout=timeout or settings.ARBOR_EMBEDDING_TIMEOUT_SECONDS, num_retries=0, max_retries=0)
            rows = sorted(response.data, key=lambda row: row["index"] if isinstance(row, dict) else row.index)
            vectors = [list(row["embedding"] if isinstance(row, dict) else row.embedding) for row in rows]
    except Exception as error:  # every provider failure is the caller's to handle: retry, or fall back
        raise LLMError(classify(error), _message(error)) from error
    if len(vectors) != len(texts) or len({len(v) for v in vectors}) != 1:
        raise LLMError("provider_error", f"{model} returned {len(vectors)} vectors of sizes "
                       f"{sorted({len(v) for v in vectors})} for {len(texts)} texts")
    return vectors
