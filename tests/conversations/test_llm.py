"""The litellm gateway (`conversations.llm`): litellm's real HTTP path against the loopback OpenAI stub,
the failure classification (T1 reasons, F1/F2 triggers), and the offline provider `arbor/echo`.

No database: `stream_call` never touches it.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import litellm
import pytest
from litellm.exceptions import MidStreamFallbackError

from conversations import llm
from conversations.llm import echo as echo_model
from tests.support.openai_stub import Reply

QUESTION = [{"role": "user", "content": "how many customers do we have?"}]

SQL_TOOL = {
    "type": "function",
    "function": {
        "name": "sql_query",
        "description": "Run one read-only SQL query.",
        "parameters": {"type": "object", "properties": {"sql": {"type": "string"}}, "required": ["sql"]},
    },
}
MAIL_TOOL = {
    "type": "function",
    "function": {
        "name": "send_email",
        "description": "Send an email.",
        "parameters": {"type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"]},
    },
}


def drain(gen) -> tuple[list[str], llm.CallResult]:
    """Run a stream_call generator to its end; return the yielded tokens and the CallResult."""
    tokens: list[str] = []
    while True:
        try:
            tokens.append(next(gen))
        except StopIteration as stop:
            return tokens, stop.value


def call(model: str = "openai/stub-model", messages=None, tools=None, **kwargs) -> tuple[list[str], llm.CallResult]:
    return drain(llm.stream_call(model=model, messages=messages or QUESTION, tools=tools, **kwargs))


def failure(model: str = "openai/stub-model", messages=None, tools=None) -> tuple[llm.LLMError, list[str]]:
    """Run a call that must fail; return the LLMError and the tokens that arrived before it."""
    tokens: list[str] = []
    with pytest.raises(llm.LLMError) as info:  # noqa: PT012 - the tokens before the failure matter too
        for token in llm.stream_call(model=model, messages=messages or QUESTION, tools=tools):
            tokens.append(token)
    return info.value, tokens


def without_nulls(messages: list[dict]) -> list[dict]:
    """litellm leaves out `"content": null` on an assistant tool-call message; the two mean the same."""
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


# --- litellm's real HTTP path against the stub --------------------------------------------------------------


def test_streamed_text_arrives_as_several_tokens_and_the_result_has_text_and_usage(stub):
    """T1: received items and usage come from the provider's stream, token by token."""
    stub.script(Reply.text("héllo wörld", chunks=["hé", "llo ", "wö", "rld"], prompt_tokens=11,
                           completion_tokens=7))
    tokens, result = call()
    assert tokens == ["hé", "llo ", "wö", "rld"], "each streamed delta is one token, unchanged"
    assert result.received == [{"type": "text", "text": "héllo wörld"}]
    assert result.usage == {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
    assert (result.provider, result.model) == ("openai", "openai/stub-model")
    (request,) = stub.requests
    assert request["model"] == "stub-model"
    assert request["stream"] is True
    assert request["stream_options"] == {"include_usage": True}, "usage is only streamed when asked for"
    assert "tools" not in request, "no tools offered, none sent"


def test_word_split_stream_joins_back_exactly(stub):
    stub.script(Reply.text("alpha beta  gamma\ndelta"))
    tokens, result = call()
    assert len(tokens) == 4
    assert "".join(tokens) == "alpha beta  gamma\ndelta"
    assert result.received == [{"type": "text", "text": "alpha beta  gamma\ndelta"}]
    assert result.usage["completion_tokens"] == 4
    assert result.usage["total_tokens"] > 4


def test_a_streamed_tool_call_assembles_into_one_tool_call_item_with_verbatim_arguments(stub):
    """T1, C4: the arguments are the JSON text exactly as the model produced it (streamed in pieces)."""
    arguments = '{"sql":  "select count(*) from customers where name like \'%é%\'"}'
    stub.script(Reply.tool_calls([("call_abc123", "sql_query", arguments)]))
    tokens, result = call(tools=[SQL_TOOL])
    assert tokens == [], "a tool call is not text"
    assert result.received == [{"type": "tool_call", "id": "call_abc123", "name": "sql_query",
                                "arguments": arguments}]
    assert result.usage["completion_tokens"] > 0
    assert stub.requests[0]["tools"] == [SQL_TOOL]


def test_two_parallel_tool_calls_keep_their_own_ids_names_and_arguments(stub):
    stub.script(Reply.tool_calls([
        ("call_one", "sql_query", '{"sql": "select count(*) from customers"}'),
        ("call_two", "send_email", '{"to": "cfo@example.com", "subject": "numbers for Q3"}'),
    ]))
    _, result = call(tools=[SQL_TOOL, MAIL_TOOL])
    assert result.received == [
        {"type": "tool_call", "id": "call_one", "name": "sql_query",
         "arguments": '{"sql": "select count(*) from customers"}'},
        {"type": "tool_call", "id": "call_two", "name": "send_email",
         "arguments": '{"to": "cfo@example.com", "subject": "numbers for Q3"}'},
    ]


def test_f2_a_400_context_length_exceeded_is_context_overflow(stub):
    """F2's trigger: the provider's 400 `context_length_exceeded` becomes reason `context_overflow`."""
    stub.script(Reply.context_overflow(limit=8192, requested=9000))
    error, tokens = failure()
    assert error.reason == "context_overflow"
    assert isinstance(error.__cause__, litellm.ContextWindowExceededError)
    assert "maximum context length is 8192" in error.message
    assert tokens == []
    assert error.partial == []
    assert len(stub.requests) == 1


def test_f2_a_vllm_style_overflow_body_is_context_overflow_too(stub):
    """F2: vLLM's error body (no `error` wrapper, code 400) on hosted_vllm is still an overflow."""
    stub.script(Reply.error(400, {
        "object": "error", "type": "BadRequestError", "param": None, "code": 400,
        "message": "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
                   "(4000 in the messages, 1000 in the completion). Please reduce the length of the messages.",
    }))
    error, _ = failure(model="hosted_vllm/stub-model")
    assert error.reason == "context_overflow"


def test_a_plain_400_is_a_provider_error_not_an_overflow(stub):
    """F1 vs F2: only an overflow keeps the head back; any other bad request is a provider error."""
    stub.script(Reply.error(400, {"error": {"message": "Invalid value for 'tools'", "type": "invalid_request_error",
                                            "param": "tools", "code": None}}))
    error, _ = failure()
    assert error.reason == "provider_error"
    assert "Invalid value for 'tools'" in error.message


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (Reply.server_error("the GPUs are on fire"), "provider_error"),
        (Reply.error(503, {"error": {"message": "overloaded", "type": "server_error", "code": None}}),
         "provider_error"),
        (Reply.error(429, {"error": {"message": "Rate limit reached, slow down", "type": "requests",
                                     "code": "rate_limit_exceeded"}}), "rate_limit"),
        (Reply.context_overflow(), "context_overflow"),
    ],
    ids=["500", "503", "429", "400-overflow"],
)
@pytest.mark.parametrize("model", ["openai/stub-model", "hosted_vllm/stub-model"])
def test_t1_provider_failures_map_to_a_reason_and_are_never_retried_behind_our_back(stub, reply, reason, model):
    """T1: each failure is one failed call: exactly ONE request reached the provider (no hidden retries)."""
    stub.script(reply)
    error, _ = failure(model=model)
    assert error.reason == reason
    assert len(stub.requests) == 1, f"litellm retried: {len(stub.requests)} requests"
    assert stub.pending == 0


def test_a_500_message_is_kept_for_the_failed_node(stub):
    stub.script(Reply.server_error("the GPUs are on fire"))
    error, _ = failure()
    assert error.reason == "provider_error"
    assert "the GPUs are on fire" in error.message
    assert "\n" not in error.message


def test_a_429_is_rate_limit(stub):
    stub.script(Reply.error(429, {"error": {"message": "Rate limit reached", "type": "requests",
                                            "code": "rate_limit_exceeded"}}))
    error, _ = failure()
    assert error.reason == "rate_limit"
    assert isinstance(error.__cause__, litellm.RateLimitError)


@pytest.mark.parametrize("model", ["openai/stub-model", "hosted_vllm/stub-model"])
def test_a_hanging_provider_times_out_after_arbor_llm_timeout_seconds(stub, settings, model):
    """T1 reason `timeout`: the call gives up after ARBOR_LLM_TIMEOUT_SECONDS, once, without retrying."""
    settings.ARBOR_LLM_TIMEOUT_SECONDS = 0.5
    stub.script(Reply.hang(10))
    started = time.monotonic()
    error, _ = failure(model=model)
    elapsed = time.monotonic() - started
    assert error.reason == "timeout"
    assert elapsed < 5, f"took {elapsed:.1f}s; the 0.5 s timeout was not applied (the stub hangs 10 s)"
    assert len(stub.requests) == 1


class _StallAfterFirstChunk(BaseHTTPRequestHandler):
    """An OpenAI-style stream that sends one content delta and then goes silent."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002 - silence stderr logging
        pass

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        chunk = {"id": "chatcmpl-stall", "object": "chat.completion.chunk", "created": 0, "model": "stub-model",
                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": "partial answer "},
                              "finish_reason": None}]}
        try:
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        except OSError:
            return
        self.server.release.wait(10)


@contextmanager
def stalling_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StallAfterFirstChunk)
    server.daemon_threads = True
    server.release = threading.Event()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.mark.parametrize("model", ["openai/stub-model", "hosted_vllm/stub-model"])
def test_t1_f1_a_stream_that_stalls_mid_answer_times_out_and_keeps_the_partial_text(stub, settings, model):
    """T1, F1: a stall after some text is reason `timeout`, and what already arrived is kept as partial items.

    hosted_vllm goes through litellm's httpx handler, whose mid-stream read timeout litellm wraps in a
    MidStreamFallbackError (a ServiceUnavailableError) around an APIConnectionError around httpx.ReadTimeout;
    `classify()` must look through that wrapping (see the report: this fails today as `provider_error`).
    """
    settings.ARBOR_LLM_TIMEOUT_SECONDS = 0.5
    with stalling_server() as base_url:
        tokens: list[str] = []
        started = time.monotonic()
        with pytest.raises(llm.LLMError) as info:  # noqa: PT012
            for token in llm.stream_call(model=model, messages=QUESTION, api_base=base_url):
                tokens.append(token)
        elapsed = time.monotonic() - started
    assert tokens == ["partial answer "]
    assert info.value.partial == [{"type": "text", "text": "partial answer "}]
    assert elapsed < 5
    assert info.value.reason == "timeout", f"classified {type(info.value.__cause__).__name__} as {info.value.reason}"


def test_c4_reasoning_content_becomes_a_reasoning_item_tagged_with_its_provider(stub):
    """C4: reasoning is kept as an item carrying the provider that made it; it is not streamed as text."""
    stub.script(Reply.reasoning("The answer is 60.", "count the rows of customers"))
    tokens, result = call()
    assert "".join(tokens) == "The answer is 60."
    assert result.received == [
        {"type": "reasoning", "provider": "openai", "text": "count the rows of customers", "data": None},
        {"type": "text", "text": "The answer is 60."},
    ]


def test_hosted_vllm_stub_model_also_works(stub):
    stub.script(Reply.text("vllm says hi", prompt_tokens=3, completion_tokens=3),
                Reply.tool_calls([("chatcmpl-tool-1", "sql_query", '{"sql": "select 1"}')]))
    tokens, result = call(model="hosted_vllm/stub-model")
    assert tokens == ["vllm", " says", " hi"]
    assert result.received == [{"type": "text", "text": "vllm says hi"}]
    assert result.usage == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    assert (result.provider, result.model) == ("hosted_vllm", "hosted_vllm/stub-model")
    _, result = call(model="hosted_vllm/stub-model", tools=[SQL_TOOL])
    assert result.received == [{"type": "tool_call", "id": "chatcmpl-tool-1", "name": "sql_query",
                                "arguments": '{"sql": "select 1"}'}]
    assert [r["model"] for r in stub.requests] == ["stub-model", "stub-model"]


def test_hosted_vllm_reasoning_is_tagged_hosted_vllm(stub):
    """C4: a reasoning block remembers which provider produced it, so another provider never gets it."""
    stub.script(Reply.reasoning("ok", "thinking"))
    _, result = call(model="hosted_vllm/stub-model")
    assert result.received[0] == {"type": "reasoning", "provider": "hosted_vllm", "text": "thinking", "data": None}


def test_what_the_model_saw_is_exactly_the_messages_passed(stub):
    """T5: the stub received exactly the assembled messages, so what we store is what the model saw."""
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "how many customers?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "sql_query", "arguments": '{"sql": "select count(*) from customers"}'}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "name": "sql_query", "content": '{"rows": [[60]]}'},
        {"role": "assistant", "content": "There are 60 customers."},
        {"role": "user", "content": "and with ünïcode? 🌳"},
    ]
    before = copy.deepcopy(messages)
    call(messages=messages, tools=[SQL_TOOL])
    assert stub.requests[0]["messages"] == messages
    assert messages == before, "stream_call must not rewrite the caller's messages"


def test_a_tool_call_message_with_null_content_reaches_the_model_unchanged_but_for_the_null(stub):
    """T5: litellm drops `content: null` on an assistant tool-call message; nothing else changes."""
    messages = [
        {"role": "user", "content": "how many customers?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "sql_query", "arguments": '{"sql": "x"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "sql_query", "arguments": '{"sql": "y"}'}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "name": "sql_query", "content": "one"},
        {"role": "tool", "tool_call_id": "call_2", "name": "sql_query", "content": "two"},
    ]
    before = copy.deepcopy(messages)
    call(messages=messages, tools=[SQL_TOOL])
    assert without_nulls(stub.requests[0]["messages"]) == without_nulls(messages)
    assert messages == before


def test_closing_the_stream_mid_answer_raises_cancelled_with_the_partial_text(stub):
    """T1 reason `cancelled`: stop keeps the text that already arrived."""
    stub.script(Reply.text("one two three four five six seven eight"))
    gen = llm.stream_call(model="openai/stub-model", messages=QUESTION)
    first = [next(gen), next(gen), next(gen)]
    with pytest.raises(llm.LLMError) as info:
        gen.close()
    assert first == ["one", " two", " three"]
    assert info.value.reason == "cancelled"
    assert info.value.partial == [{"type": "text", "text": "one two three"}]


# --- classify(): the order of the checks ----------------------------------------------------------------------


def test_f2_classify_checks_overflow_before_bad_request():
    """F2: ContextWindowExceededError is a BadRequestError subclass, so overflow must be tested first."""
    overflow = litellm.ContextWindowExceededError(message="too long", model="m", llm_provider="openai")
    bad = litellm.BadRequestError(message="bad", model="m", llm_provider="openai")
    assert isinstance(overflow, litellm.BadRequestError)
    assert llm.classify(overflow) == "context_overflow"
    assert llm.classify(bad) == "provider_error"


def _mid_stream_read_timeout() -> MidStreamFallbackError:
    """What litellm raises when a hosted_vllm stream stalls: MidStreamFallbackError around an
    APIConnectionError whose cause is httpx.ReadTimeout (the chain observed against a stalling server)."""
    try:
        try:
            raise httpx.ReadTimeout("timed out")
        except httpx.ReadTimeout as read_timeout:
            raise litellm.APIConnectionError(message="Hosted_vllmException - timed out", llm_provider="hosted_vllm",
                                             model="stub-model") from read_timeout
    except litellm.APIConnectionError as connection_error:
        return MidStreamFallbackError(message=str(connection_error), model="stub-model", llm_provider="hosted_vllm",
                                      original_exception=connection_error, generated_content="partial answer ")


def test_t1_classify_sees_a_timeout_through_litellms_mid_stream_wrapping():
    """T1: a read timeout mid-stream is `timeout`, even wrapped as a 503-like MidStreamFallbackError."""
    error = _mid_stream_read_timeout()
    assert isinstance(error, litellm.ServiceUnavailableError)
    assert llm.classify(error) == "timeout"


def test_t1_classify_sees_a_rate_limit_through_litellms_mid_stream_wrapping():
    """litellm wraps a mid-stream 429 too (it exempts 429 from its 4xx pass-through)."""
    limited = litellm.RateLimitError(message="429", llm_provider="hosted_vllm", model="stub-model")
    error = MidStreamFallbackError(message="429", model="stub-model", llm_provider="hosted_vllm",
                                   original_exception=limited)
    assert llm.classify(error) == "rate_limit"


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (litellm.Timeout(message="slow", model="m", llm_provider="openai"), "timeout"),
        (litellm.RateLimitError(message="429", llm_provider="openai", model="m"), "rate_limit"),
        (litellm.InternalServerError(message="500", llm_provider="openai", model="m"), "provider_error"),
        (litellm.APIConnectionError(message="refused", llm_provider="openai", model="m"), "provider_error"),
        (RuntimeError("anything else"), "provider_error"),
    ],
    ids=["timeout", "rate-limit", "internal", "connection", "other"],
)
def test_t1_classify_maps_every_exception_to_a_known_reason(error, reason):
    assert llm.classify(error) == reason


# --- arbor/echo -------------------------------------------------------------------------------------------------


def echo(messages, tools=None) -> tuple[list[str], llm.CallResult]:
    return call(model="arbor/echo", messages=messages, tools=tools)


def echo_failure(messages, tools=None) -> llm.LLMError:
    return failure(model="arbor/echo", messages=messages, tools=tools)[0]


def test_echo_answers_with_the_question_and_a_digest_of_everything_it_saw(stub):
    """arbor/echo: `echo: <text>` then `seen: <digest>`, streamed word by word, never over the network."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there world"}]
    tokens, result = echo(messages)
    text = "echo: hello there world\nseen: system:Be brief. | user:hello there world"
    assert "".join(tokens) == text
    assert len(tokens) > 3
    assert result.received == [{"type": "text", "text": text}]
    assert (result.provider, result.model) == ("arbor", "arbor/echo")
    assert stub.requests == [], "arbor/echo never calls ARBOR_API_BASE"


def test_echo_digest_truncates_to_30_characters_and_shows_tool_calls_and_results():
    messages = [
        {"role": "user", "content": "a question that is much longer than thirty characters"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "sql_query", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "send_email", "arguments": "{}"}},
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"columns": ["n"], "rows": [[60]], "truncated": false}'},
        {"role": "assistant", "content": [{"type": "text", "text": "parts "}, {"type": "text", "text": "joined"}]},
    ]
    assert echo_model.digest(messages) == (
        "user:a question that is much longer | assistant:[call sql_query] | assistant:[call send_email] | "
        'tool:{"columns": ["n"], "rows": [[6 | assistant:parts joined'
    )


def test_echo_digest_through_the_provider_sees_the_history(stub):
    messages = [
        {"role": "user", "content": "count"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "sql_query", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "sql_query", "content": "60"},
        {"role": "assistant", "content": "sixty"},
        {"role": "user", "content": "thanks"},
    ]
    _, result = echo(messages)
    assert result.received[0]["text"] == (
        "echo: thanks\nseen: user:count | assistant:[call sql_query] | tool:60 | assistant:sixty | user:thanks"
    )


TWO_TOOLS = '#tool sql_query {"sql": "select 1"} then #tool send_email {"to": "a@example.com"}'


def _after_call(messages: list[dict], item: dict, content: str) -> list[dict]:
    """The messages of the next round: the assistant's tool call and its result appended."""
    return [
        *messages,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": item["id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}
        ]},
        {"role": "tool", "tool_call_id": item["id"], "name": item["name"], "content": content},
    ]


def test_echo_tool_directives_are_one_round_each_in_order(stub):
    """arbor/echo: round i (tool results after the last user message) returns the i-th `#tool` call."""
    messages = [{"role": "user", "content": TWO_TOOLS}]
    tokens, first = echo(messages, tools=[SQL_TOOL, MAIL_TOOL])
    (call_1,) = first.received
    assert tokens == []
    assert (call_1["type"], call_1["name"], json.loads(call_1["arguments"])) == (
        "tool_call", "sql_query", {"sql": "select 1"})
    assert call_1["id"].startswith("call_")

    messages = _after_call(messages, call_1, "one")
    _, second = echo(messages, tools=[SQL_TOOL, MAIL_TOOL])
    (call_2,) = second.received
    assert (call_2["name"], json.loads(call_2["arguments"])) == ("send_email", {"to": "a@example.com"})
    assert call_2["id"] != call_1["id"]

    messages = _after_call(messages, call_2, "sent")
    tokens, third = echo(messages, tools=[SQL_TOOL, MAIL_TOOL])
    assert [i["type"] for i in third.received] == ["text"]
    assert "".join(tokens).startswith(f"echo: {TWO_TOOLS}\nseen: ")
    assert "assistant:[call sql_query] | tool:one | assistant:[call send_email] | tool:sent" in "".join(tokens)


def test_echo_tool_directives_only_act_when_tools_are_offered(stub):
    """arbor/echo: with no tools offered (the last allowed round), it answers instead of calling."""
    tokens, result = echo([{"role": "user", "content": TWO_TOOLS}], tools=None)
    assert [i["type"] for i in result.received] == ["text"]
    assert "".join(tokens) == f"echo: {TWO_TOOLS}\nseen: user:{TWO_TOOLS[:30]}"


def test_echo_rounds_count_only_tool_results_after_the_last_user_message(stub):
    """A new question starts again at round 0, whatever tool results earlier turns had."""
    earlier = _after_call([{"role": "user", "content": "#tool sql_query {}"}],
                          {"id": "c0", "name": "sql_query", "arguments": "{}"}, "old result")
    messages = [*earlier, {"role": "assistant", "content": "done"},
                {"role": "user", "content": '#tool send_email {"to": "b@example.com"}'}]
    _, result = echo(messages, tools=[SQL_TOOL, MAIL_TOOL])
    (item,) = result.received
    assert item["type"] == "tool_call"
    assert item["name"] == "send_email"


def test_echo_fail_is_a_provider_error_after_the_tool_rounds(stub):
    """arbor/echo `#fail` → provider_error, but only once the `#tool` directives are used up."""
    messages = [{"role": "user", "content": '#tool sql_query {"sql": "select 1"} #fail'}]
    _, first = echo(messages, tools=[SQL_TOOL])
    (item,) = first.received
    assert item["type"] == "tool_call"
    error = echo_failure(_after_call(messages, item, "1"), tools=[SQL_TOOL])
    assert error.reason == "provider_error"
    assert isinstance(error.__cause__, litellm.InternalServerError)
    assert "#fail" in error.message


def test_echo_overflow_is_a_context_overflow(stub):
    """F2's trigger from arbor/echo: `#overflow` raises a real ContextWindowExceededError."""
    error = echo_failure([{"role": "user", "content": "please #overflow"}])
    assert error.reason == "context_overflow"
    assert isinstance(error.__cause__, litellm.ContextWindowExceededError)


def test_echo_input_over_its_limit_is_a_context_overflow(stub, settings):
    """C1/F2: arbor/echo has a small input limit, ARBOR_ECHO_MAX_INPUT_TOKENS."""
    settings.ARBOR_ECHO_MAX_INPUT_TOKENS = 40
    _, small = echo([{"role": "user", "content": "x" * 60}])
    assert small.usage["prompt_tokens"] <= 40
    error = echo_failure([{"role": "user", "content": "x" * 400}])
    assert error.reason == "context_overflow"
    assert "exceed the limit of 40" in error.message


def test_echo_slow_streams_one_word_every_configured_pause(stub, settings, monkeypatch):
    """arbor/echo `#slow`: one pause of `ARBOR_ECHO_WORD_SECONDS` before each word (the pause is recorded,
    not waited for, so the test depends on no wall clock)."""
    settings.ARBOR_ECHO_WORD_SECONDS = 0.25
    pauses = []
    monkeypatch.setattr(echo_model, "pause", pauses.append)
    tokens, result = echo([{"role": "user", "content": "#slow one two three four"}])
    assert len(tokens) >= 6
    assert "".join(tokens) == result.received[0]["text"]
    assert pauses == [0.25] * len(tokens)


def test_echo_usage_is_about_characters_over_four(stub):
    messages = [{"role": "system", "content": "s" * 200}, {"role": "user", "content": "q" * 400}]
    _, result = echo(messages)
    answer = result.received[0]["text"]
    characters = sum(len(json.dumps(m)) for m in messages)
    assert result.usage["prompt_tokens"] == pytest.approx(characters / 4, rel=0.1)
    assert result.usage["completion_tokens"] == pytest.approx(len(answer) / 4, abs=1)
    assert result.usage["total_tokens"] == result.usage["prompt_tokens"] + result.usage["completion_tokens"]
    _, longer = echo([{"role": "system", "content": "s" * 200}, {"role": "user", "content": "q" * 800}])
    assert longer.usage["prompt_tokens"] >= result.usage["prompt_tokens"] + 90


def test_echo_plan_is_a_pure_function_of_the_messages():
    messages = [{"role": "user", "content": '#tool sql_query {"sql": "select 2"} #slow'}]
    plan = echo_model.make_plan(messages, tools_offered=True)
    assert plan.tool_call == ("sql_query", '{"sql": "select 2"}')
    assert plan.words == []
    answered = echo_model.make_plan(messages, tools_offered=False)
    assert answered.tool_call is None
    assert answered.slow is True
    assert "".join(answered.words) == f"echo: {messages[0]['content']}\nseen: user:{messages[0]['content'][:30]}"
    assert echo_model.make_plan(messages, tools_offered=False) == answered


def test_closing_an_echo_stream_mid_answer_raises_cancelled_with_the_partial_text():
    gen = llm.stream_call(model="arbor/echo", messages=[{"role": "user", "content": "one two three four five"}])
    first = [next(gen), next(gen)]
    with pytest.raises(llm.LLMError) as info:
        gen.close()
    assert info.value.reason == "cancelled"
    assert info.value.partial == [{"type": "text", "text": "".join(first)}]
    assert "".join(first) == "echo: one "


def _drain(stream):
    while True:
        try:
            next(stream)
        except StopIteration as stop:
            return stop.value


def test_c3_echo_answers_a_summarising_call_with_an_opaque_item_only_it_can_read(stub):
    """C3: asked to compact, arbor/echo streams its summary and an opaque `summary` item (provider arbor);
    sent back to echo, the item reads as the summary; nothing else in it is readable text."""
    messages = [{"role": "user", "content": "the revenue was 42"}, {"role": "assistant", "content": "noted"},
                {"role": "user", "content": "summarise please"}]
    result = _drain(llm.stream_call(model="arbor/echo", messages=messages, compaction=True))
    text, opaque = result.received[1], result.received[0]
    assert text["text"].startswith("summary of 2 messages: user:the revenue was 42")
    assert opaque["type"] == "summary" and opaque["provider"] == "arbor" and opaque["text"] == ""
    assert "revenue" not in opaque["data"]
    back = _drain(llm.stream_call(model="arbor/echo", messages=[{"role": "user", "content": opaque["data"]},
                                                                {"role": "user", "content": "and now?"}]))
    assert "seen: user:summary of 2 messages: user:th | user:and now?" in back.received[0]["text"]
    plain = _drain(llm.stream_call(model="arbor/echo", messages=messages))
    assert [i["type"] for i in plain.received] == ["text"], "an ordinary call gets no compaction item"


def test_c3_only_providers_with_native_compaction_are_asked_for_it(stub):
    """The stub (OpenAI) is never sent arbor's private flag, even for a summarising call."""
    _drain(llm.stream_call(model="openai/stub-model", messages=[{"role": "user", "content": "hi"}], compaction=True))
    assert "arbor_compaction" not in stub.requests[-1]


def test_c1_count_tokens_agrees_with_what_echo_reports_and_uses_litellm_for_others(stub):
    """C1: the budget counts echo's input exactly as echo's limit does; other models use litellm's counter."""
    messages = [{"role": "system", "content": "s" * 200}, {"role": "user", "content": "q" * 400}]
    _, result = echo(messages)
    assert llm.count_tokens("arbor/echo", messages) == result.usage["prompt_tokens"]
    assert llm.count_tokens("openai/gpt-4o", messages) == litellm.token_counter(model="openai/gpt-4o",
                                                                                messages=messages)
    assert llm.count_tokens("openai/gpt-4o", []) == 0
