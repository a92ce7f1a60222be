"""Manual self-check: drive litellm's real HTTP path against OpenAIStub.

Run:  . .venv/bin/activate && python tests/support/check_openai_stub.py
Not collected by pytest (file name does not start with ``test_``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import litellm  # noqa: E402

from tests.support.openai_stub import OpenAIStub, Reply  # noqa: E402

MESSAGES = [{"role": "user", "content": "Say hello to the stub please"}]
NO_RETRY = {"num_retries": 0, "max_retries": 0}


def base(stub: OpenAIStub, model: str = "openai/stub-model") -> dict:
    return {"model": model, "api_base": stub.base_url, "api_key": "sk-test", "messages": MESSAGES}


def collect_stream(resp) -> tuple[list[str], object, list, str | None, str]:
    texts, usage, tool_deltas, finish, reasoning = [], None, [], None, ""
    for chunk in resp:
        if getattr(chunk, "usage", None):
            usage = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content:
                texts.append(delta.content)
            if getattr(delta, "reasoning_content", None):
                reasoning += delta.reasoning_content
            if delta.tool_calls:
                tool_deltas.extend(delta.tool_calls)
            if choice.finish_reason:
                finish = choice.finish_reason
    return texts, usage, tool_deltas, finish, reasoning


def check(name: str, fn) -> bool:
    t0 = time.monotonic()
    try:
        fn()
    except AssertionError as exc:
        print(f"FAIL {name}: {exc}")
        return False
    print(f"ok   {name} ({time.monotonic() - t0:.2f}s)")
    return True


def expect_raises(stub: OpenAIStub, reply: Reply, expected: type[Exception], **kwargs) -> Exception:
    stub.reset()
    stub.script(reply)
    t0 = time.monotonic()
    try:
        litellm.completion(**{**base(stub), **NO_RETRY, **kwargs})
    except Exception as exc:  # noqa: BLE001
        elapsed = time.monotonic() - t0
        print(
            f"     -> {type(exc).__module__}.{type(exc).__qualname__} after {elapsed:.2f}s, "
            f"{len(stub.requests)} request(s); status_code={getattr(exc, 'status_code', None)}"
        )
        print(f"        mro: {[c.__name__ for c in type(exc).__mro__[:6]]}")
        print(f"        message: {str(exc)[:300]}")
        caught = exc
    else:
        raise AssertionError(f"no exception raised, expected {expected.__name__}")
    assert isinstance(caught, expected), f"expected {expected.__name__}, got {type(caught).__name__}"
    assert len(stub.requests) == 1, f"expected exactly 1 request (no retries), saw {len(stub.requests)}"
    return caught


def main() -> int:
    results = []
    with OpenAIStub() as stub:
        print("stub at", stub.base_url)

        def text_stream_include_usage():
            stub.reset()
            stub.script(Reply.text("hello there from the stub"))
            resp = litellm.completion(
                **base(stub), stream=True, stream_options={"include_usage": True}, **NO_RETRY
            )
            texts, usage, _, finish, _ = collect_stream(resp)
            print(f"     chunks={texts} usage={usage} finish={finish}")
            assert len(texts) >= 3, texts
            assert "".join(texts) == "hello there from the stub"
            assert usage is not None
            assert usage.completion_tokens == 5, usage
            assert usage.total_tokens > 5, usage
            assert finish == "stop"
            assert stub.requests[0]["stream"] is True
            assert stub.requests[0]["messages"] == MESSAGES

        def text_stream_no_usage_option():
            stub.reset()
            stub.script(Reply.text("alpha beta gamma", chunks=["alpha", " beta", " gamma"]))
            resp = litellm.completion(**base(stub), stream=True, **NO_RETRY)
            texts, usage, _, finish, _ = collect_stream(resp)
            print(
                f"     chunks={texts} usage={usage} stream_options={stub.requests[0].get('stream_options')}"
            )
            assert texts == ["alpha", " beta", " gamma"], texts
            assert finish == "stop"
            # Like real OpenAI, the stub sends no usage here, and litellm then reports zeros (no estimate).
            assert usage is None, usage

        def text_stream_usage_on_last_chunk():
            stub.reset()
            stub.usage_on_last_chunk = True
            try:
                stub.script(Reply.text("a b c", prompt_tokens=111, completion_tokens=222))
                chunks = list(litellm.completion(**base(stub), stream=True, **NO_RETRY))
            finally:
                stub.usage_on_last_chunk = False
            hidden = chunks[-1]._hidden_params.get("usage")
            built = litellm.stream_chunk_builder(chunks).usage
            print(
                f"     hidden usage={hidden.prompt_tokens}/{hidden.completion_tokens} "
                f"builder={built.prompt_tokens}/{built.completion_tokens}"
            )
            assert not any(getattr(c, "usage", None) for c in chunks)  # litellm hides it from chunks
            assert (hidden.prompt_tokens, hidden.completion_tokens) == (111, 222)
            assert (built.prompt_tokens, built.completion_tokens) == (111, 222)

        def text_non_stream():
            stub.reset()
            stub.script(Reply.text("plain answer"))
            resp = litellm.completion(**base(stub), **NO_RETRY)
            assert resp.choices[0].message.content == "plain answer"
            assert resp.usage.completion_tokens == 2, resp.usage
            assert resp.usage.prompt_tokens == 6, resp.usage

        def default_reply():
            stub.reset()
            resp = litellm.completion(**base(stub), **NO_RETRY)
            assert resp.choices[0].message.content == "stub: ok"

        def tool_calls_stream():
            stub.reset()
            calls = [
                ("call_abc", "get_weather", json.dumps({"city": "Paris", "unit": "celsius"})),
                ("call_def", "search_notes", json.dumps({"query": "arbor roadmap"})),
            ]
            stub.script(Reply.tool_calls(calls))
            tools = [
                {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
                for n in ("get_weather", "search_notes")
            ]
            resp = litellm.completion(
                **base(stub), tools=tools, stream=True, stream_options={"include_usage": True}, **NO_RETRY
            )
            _, usage, deltas, finish, _ = collect_stream(resp)
            assembled: dict[int, dict] = {}
            for d in deltas:
                slot = assembled.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
                if d.id:
                    slot["id"] = d.id
                if d.function and d.function.name:
                    slot["name"] = d.function.name
                if d.function and d.function.arguments:
                    slot["arguments"] += d.function.arguments
            got = [(v["id"], v["name"], v["arguments"]) for _, v in sorted(assembled.items())]
            print(f"     {len(deltas)} tool deltas, finish={finish}, usage={usage}")
            assert got == calls, got
            assert finish == "tool_calls", finish
            assert len(deltas) > 2
            assert "tools" in stub.requests[0]

        def tool_calls_non_stream():
            stub.reset()
            stub.script(Reply.tool_calls([("call_1", "f", '{"x": 1}')]))
            resp = litellm.completion(**base(stub), **NO_RETRY)
            tc = resp.choices[0].message.tool_calls
            assert [(t.id, t.function.name, t.function.arguments) for t in tc] == [
                ("call_1", "f", '{"x": 1}')
            ]
            assert resp.choices[0].finish_reason == "tool_calls"

        def context_overflow():
            expect_raises(stub, Reply.context_overflow(), litellm.ContextWindowExceededError)

        def context_overflow_stream():
            expect_raises(stub, Reply.context_overflow(), litellm.ContextWindowExceededError, stream=True)

        def server_error():
            expect_raises(stub, Reply.server_error(), litellm.InternalServerError)

        def server_error_stream():
            expect_raises(stub, Reply.server_error(), litellm.InternalServerError, stream=True)

        def server_error_default_retries():
            # What happens when the caller passes nothing about retries?
            stub.reset()
            stub.script(Reply.server_error(), Reply.server_error(), Reply.server_error())
            try:
                litellm.completion(**base(stub))
            except Exception as exc:  # noqa: BLE001
                print(f"     no retry kwargs: {type(exc).__name__}, {len(stub.requests)} request(s)")
            stub.reset()
            stub.script(Reply.server_error(), Reply.server_error(), Reply.server_error())
            try:
                litellm.completion(**base(stub), num_retries=0)
            except Exception as exc:  # noqa: BLE001
                print(f"     num_retries=0 only: {type(exc).__name__}, {len(stub.requests)} request(s)")
            stub.reset()
            stub.script(Reply.server_error(), Reply.server_error(), Reply.server_error())
            try:
                litellm.completion(**base(stub), max_retries=0)
            except Exception as exc:  # noqa: BLE001
                print(f"     max_retries=0 only: {type(exc).__name__}, {len(stub.requests)} request(s)")

        def hang_timeout():
            t0 = time.monotonic()
            expect_raises(stub, Reply.hang(10), litellm.Timeout, timeout=1)
            assert time.monotonic() - t0 < 3, "timeout took too long"

        def hang_timeout_stream():
            t0 = time.monotonic()
            expect_raises(stub, Reply.hang(10), litellm.Timeout, timeout=1, stream=True)
            assert time.monotonic() - t0 < 3, "timeout took too long"

        def hosted_vllm():
            stub.reset()
            stub.script(Reply.text("vllm says hi"), Reply.text("vllm stream"))
            resp = litellm.completion(**base(stub, "hosted_vllm/stub-model"), **NO_RETRY)
            assert resp.choices[0].message.content == "vllm says hi"
            resp = litellm.completion(
                **base(stub, "hosted_vllm/stub-model"),
                stream=True,
                stream_options={"include_usage": True},
                **NO_RETRY,
            )
            texts, usage, _, _, _ = collect_stream(resp)
            assert "".join(texts) == "vllm stream", texts
            assert usage is not None
            assert stub.requests[0]["model"] == "stub-model", stub.requests[0]["model"]

        def hosted_vllm_context_overflow():
            expect_raises(
                stub,
                Reply.context_overflow(),
                litellm.ContextWindowExceededError,
                model="hosted_vllm/stub-model",
            )

        def reasoning_stream():
            stub.reset()
            stub.script(Reply.reasoning("final answer", "let me think about it"))
            resp = litellm.completion(
                **base(stub, "hosted_vllm/stub-model"),
                stream=True,
                stream_options={"include_usage": True},
                **NO_RETRY,
            )
            texts, usage, _, _, reasoning = collect_stream(resp)
            print(f"     reasoning={reasoning!r} text={''.join(texts)!r}")
            assert reasoning == "let me think about it", reasoning
            assert "".join(texts) == "final answer"

        def models_endpoint():
            import urllib.request

            with urllib.request.urlopen(stub.base_url + "/models", timeout=5) as r:
                data = json.load(r)
            ids = [m["id"] for m in data["data"]]
            print(f"     models={ids}")
            assert "stub-model" in ids

        def stop_releases_hang():
            import threading

            s2 = OpenAIStub().start()
            s2.script(Reply.hang(30))
            t = threading.Thread(
                target=lambda: _swallow(lambda: litellm.completion(**base(s2), timeout=60, **NO_RETRY)),
                daemon=True,
            )
            t.start()
            while not s2.requests:
                time.sleep(0.02)
            t0 = time.monotonic()
            s2.stop()
            print(f"     stop() with a hanging request took {time.monotonic() - t0:.2f}s")
            assert time.monotonic() - t0 < 2
            t.join(5)

        def async_stream():
            import asyncio

            async def run():
                stub.reset()
                stub.script(Reply.text("async hello world"))
                resp = await litellm.acompletion(
                    **base(stub), stream=True, stream_options={"include_usage": True}, **NO_RETRY
                )
                texts, usage = [], None
                async for chunk in resp:
                    if getattr(chunk, "usage", None):
                        usage = chunk.usage
                    for c in chunk.choices:
                        if c.delta.content:
                            texts.append(c.delta.content)
                return texts, usage

            texts, usage = asyncio.run(run())
            assert texts == ["async", " hello", " world"], texts
            assert usage is not None
            assert usage.completion_tokens == 3, usage

        for fn in [
            text_stream_include_usage,
            text_stream_no_usage_option,
            text_stream_usage_on_last_chunk,
            text_non_stream,
            default_reply,
            tool_calls_stream,
            tool_calls_non_stream,
            context_overflow,
            context_overflow_stream,
            server_error,
            server_error_stream,
            server_error_default_retries,
            hang_timeout,
            hang_timeout_stream,
            hosted_vllm,
            hosted_vllm_context_overflow,
            reasoning_stream,
            async_stream,
            models_endpoint,
            stop_releases_hang,
        ]:
            results.append(check(fn.__name__, fn))
    print(f"{sum(results)}/{len(results)} checks passed")
    return 0 if all(results) else 1


def _swallow(fn) -> None:
    with contextlib.suppress(Exception):
        fn()


if __name__ == "__main__":
    sys.exit(main())
