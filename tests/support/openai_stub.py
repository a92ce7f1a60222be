"""Loopback OpenAI-compatible HTTP stub for tests (stdlib only).

Usage::

    with OpenAIStub() as stub:
        stub.script(Reply.text("hello world"), Reply.context_overflow())
        litellm.completion(model="openai/stub-model", api_base=stub.base_url, api_key="sk-test", ...)
        assert stub.requests[0]["messages"] == [...]

Serves ``POST /v1/chat/completions`` (streaming and non-streaming), ``POST /v1/embeddings`` and ``GET /v1/models``.
An embeddings request takes the next scripted reply too: an error reply is sent as it is, anything else gets
``stub_embedding`` vectors (a word-hashing embedder of its own, not arbor/echo-embed's), as a list of floats or,
with ``encoding_format: "base64"`` (what the openai SDK asks for), as base64 of little-endian float32s, the
way OpenAI's API answers (https://platform.openai.com/docs/api-reference/embeddings/create).
Every response is sent with ``Connection: close`` so no keep-alive state leaks between requests.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import math
import struct
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_TEXT = "stub: ok"


def _count_tokens(text: str) -> int:
    return max(1, len(text.split())) if text else 0


@dataclass
class Reply:
    """One scripted reply. Build with the classmethod constructors (``Reply.text(...)`` etc.)."""

    kind: str  # "text" | "tool_calls" | "error" | "hang"
    content: str = ""
    chunks: list[str] | None = None  # explicit stream pieces for ``content`` (default: split into words)
    reasoning_content: str | None = None
    calls: list[tuple[str, str, str]] = field(default_factory=list)  # (call_id, name, arguments_json)
    status: int = 200
    body: dict[str, Any] | None = None
    seconds: float = 0.0
    then: Reply | None = None  # for "hang": what to send if the wait completes
    prompt_tokens: int | None = None  # usage overrides; computed from word counts when None
    completion_tokens: int | None = None
    cached_tokens: int | None = None  # reported as `prompt_tokens_details.cached_tokens` when set
    finish: str = "stop"  # a text reply's finish_reason ("length": cut at max_tokens)

    @classmethod
    def text(
        cls,
        text: str,
        chunks: list[str] | None = None,
        *,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        cached_tokens: int | None = None,
        finish: str = "stop",
    ) -> Reply:
        return cls(
            kind="text",
            content=text,
            chunks=chunks,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=cached_tokens,
            finish=finish,
        )

    @classmethod
    def tool_calls(
        cls,
        calls: list[tuple[str, str, str]],
        *,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
    ) -> Reply:
        return cls(
            kind="tool_calls",
            calls=list(calls),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
        )

    @classmethod
    def reasoning(cls, text: str, reasoning: str, chunks: list[str] | None = None) -> Reply:
        return cls(kind="text", content=text, chunks=chunks, reasoning_content=reasoning)

    @classmethod
    def error(cls, status: int, body: dict[str, Any]) -> Reply:
        return cls(kind="error", status=status, body=body)

    @classmethod
    def context_overflow(cls, limit: int = 8192, requested: int = 9000) -> Reply:
        return cls.error(
            400,
            {
                "error": {
                    "message": (
                        f"This model's maximum context length is {limit} tokens. However, your messages "
                        f"resulted in {requested} tokens. Please reduce the length of the messages."
                    ),
                    "type": "invalid_request_error",
                    "param": "messages",
                    "code": "context_length_exceeded",
                }
            },
        )

    @classmethod
    def server_error(cls, message: str = "The server had an error while processing your request.") -> Reply:
        return cls.error(
            500, {"error": {"message": message, "type": "server_error", "param": None, "code": None}}
        )

    @classmethod
    def hang(cls, seconds: float, then: Reply | None = None) -> Reply:
        """Wait ``seconds`` (released early by ``stop()``), then send ``then`` (default text reply)."""
        return cls(kind="hang", seconds=seconds, then=then)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    stub: OpenAIStub


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence stderr logging
        pass

    # ---- low-level helpers -------------------------------------------------------------------
    def _send_json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()
        self.close_connection = True

    def _start_sse(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True  # body is delimited by connection close

    def _sse(self, payload: dict[str, Any] | str) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        self.wfile.write(f"data: {data}\n\n".encode())
        self.wfile.flush()

    # ---- routes ------------------------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802
        if self.path.rstrip("/") in ("/v1/models", "/models"):
            stub = self.server.stub
            with stub._lock:
                names = list(dict.fromkeys(r.get("model") for r in stub.requests if r.get("model")))
            if not names:
                names = ["stub-model"]
            self._send_json(
                200,
                {
                    "object": "list",
                    "data": [{"id": n, "object": "model", "created": 0, "owned_by": "stub"} for n in names],
                },
            )
            return
        self._send_json(404, {"error": {"message": f"not found: {self.path}", "type": "not_found"}})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if self.path.rstrip("/") in ("/v1/embeddings", "/embeddings"):
            self._embeddings(raw)
            return
        if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
            self._send_json(404, {"error": {"message": f"not found: {self.path}", "type": "not_found"}})
            return
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._send_json(400, {"error": {"message": "invalid JSON body", "type": "invalid_request_error"}})
            return
        stub = self.server.stub
        reply = stub._record_and_pop(body, self.headers.get("Authorization"))
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # client gave up (e.g. timeout)
            self._answer(body, reply)

    def _embeddings(self, raw: bytes) -> None:
        body = json.loads(raw or b"{}")
        reply = self.server.stub._record_and_pop(body, self.headers.get("Authorization"))
        if reply.kind == "error":
            self._send_json(reply.status, reply.body or {})
            return
        texts = body.get("input")
        texts = [texts] if isinstance(texts, str) else list(texts or [])
        data = []
        for index, text in enumerate(texts):
            vector = stub_embedding(str(text))
            if body.get("encoding_format") == "base64":
                vector = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
            data.append({"object": "embedding", "index": index, "embedding": vector})
        tokens = sum(_count_tokens(str(t)) for t in texts)
        self._send_json(200, {"object": "list", "data": data, "model": body.get("model", ""),
                              "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    # ---- replies -----------------------------------------------------------------------------
    def _answer(self, body: dict[str, Any], reply: Reply) -> None:
        stub = self.server.stub
        if reply.kind == "hang":
            if stub._stopping.wait(reply.seconds):
                self.close_connection = True  # stub is shutting down: drop the connection unanswered
                return
            reply = reply.then or Reply.text(DEFAULT_TEXT)
        if reply.kind == "error":
            self._send_json(reply.status, reply.body or {})
            return
        model = body.get("model") or "stub-model"
        stream = bool(body.get("stream"))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        usage = _usage(body, reply)
        cid = "chatcmpl-" + uuid.uuid4().hex[:24]
        created = int(time.time())
        if not stream:
            self._send_json(200, _completion(cid, created, model, reply, usage))
            return

        self._start_sse()

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            out: dict[str, Any] = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "system_fingerprint": "fp_stub",
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            }
            if include_usage:
                out["usage"] = None  # as OpenAI does: null on every chunk but the final usage chunk
            return out

        self._sse(chunk({"role": "assistant", "content": ""}))
        if reply.kind == "tool_calls":
            for index, (call_id, name, arguments) in enumerate(reply.calls):
                self._sse(
                    chunk(
                        {
                            "tool_calls": [
                                {
                                    "index": index,
                                    "id": call_id,
                                    "type": "function",
                                    "function": {"name": name, "arguments": ""},
                                }
                            ]
                        }
                    )
                )
                for piece in _split_args(arguments):
                    self._sse(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
            finish = "tool_calls"
        else:
            if reply.reasoning_content:
                for piece in _split_words(reply.reasoning_content):
                    self._sse(chunk({"reasoning_content": piece}))
            for piece in reply.chunks if reply.chunks is not None else _split_words(reply.content):
                self._sse(chunk({"content": piece}))
            finish = reply.finish
        last = chunk({}, finish)
        if include_usage:
            self._sse(last)
            final = chunk({})
            final["choices"] = []
            final["usage"] = usage
            self._sse(final)
        else:
            # Real OpenAI (and vLLM) send no usage at all unless stream_options.include_usage is set.
            # ``usage_on_last_chunk=True`` mimics servers that attach it to the finish chunk anyway.
            if stub.usage_on_last_chunk:
                last["usage"] = usage
            self._sse(last)
        self._sse("[DONE]")


STUB_DIMENSIONS = 64


def stub_embedding(text: str) -> list[float]:
    """The stub's vectors: each lower-cased word hashed (md5) into STUB_DIMENSIONS, scaled to length 1."""
    vector = [0.0] * STUB_DIMENSIONS
    for word in text.lower().split():
        vector[int(hashlib.md5(word.encode()).hexdigest(), 16) % STUB_DIMENSIONS] += 1.0
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [v / norm for v in vector]


def _split_words(text: str) -> list[str]:
    """Split into word-sized pieces that concatenate back to ``text`` exactly."""
    pieces: list[str] = []
    current = ""
    for ch in text:
        if ch.isspace() and current and not current[-1].isspace():
            pieces.append(current)
            current = ""
        current += ch
    if current:
        pieces.append(current)
    return pieces


def _split_args(arguments: str, size: int = 8) -> list[str]:
    if not arguments:
        return [""]
    return [arguments[i : i + size] for i in range(0, len(arguments), size)]


def _usage(body: dict[str, Any], reply: Reply) -> dict[str, int]:
    prompt = reply.prompt_tokens
    if prompt is None:
        prompt = (
            sum(
                _count_tokens(m["content"]) if isinstance(m.get("content"), str) else 1
                for m in body.get("messages") or []
                if isinstance(m, dict)
            )
            or 1
        )
    completion = reply.completion_tokens
    if completion is None:
        if reply.kind == "tool_calls":
            completion = sum(_count_tokens(a) + 1 for _, _, a in reply.calls) or 1
        else:
            completion = _count_tokens(reply.content) + _count_tokens(reply.reasoning_content or "")
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if reply.cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": reply.cached_tokens}
    return usage


def _completion(cid: str, created: int, model: str, reply: Reply, usage: dict[str, int]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None}
    if reply.kind == "tool_calls":
        message["tool_calls"] = [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            for call_id, name, arguments in reply.calls
        ]
        finish = "tool_calls"
    else:
        message["content"] = reply.content
        if reply.reasoning_content:
            message["reasoning_content"] = reply.reasoning_content
        finish = reply.finish
    return {
        "id": cid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": "fp_stub",
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": usage,
    }


class OpenAIStub:
    """OpenAI-compatible server on 127.0.0.1:<random port>, run in a daemon thread."""

    def __init__(self, *, usage_on_last_chunk: bool = False) -> None:
        self.usage_on_last_chunk = usage_on_last_chunk
        self.requests: list[dict[str, Any]] = []
        self.authorizations: list[str | None] = []  # each request's Authorization header, in order
        self._queue: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.base_url = ""

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> OpenAIStub:
        if self._server is not None:
            return self
        self._stopping.clear()
        server = _Server(("127.0.0.1", 0), _Handler)
        server.stub = self
        self._server = server
        host, port = server.server_address[:2]
        self.base_url = f"http://{host}:{port}/v1"
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="openai-stub", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._stopping.set()  # release any hanging handlers
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> OpenAIStub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- scripting ---------------------------------------------------------------------------
    def script(self, *responses: Reply) -> None:
        with self._lock:
            self._queue.extend(responses)

    def reset(self) -> None:
        with self._lock:
            self._queue.clear()
            self.requests.clear()
            self.authorizations.clear()

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    def _record_and_pop(self, body: dict[str, Any], authorization: str | None = None) -> Reply:
        with self._lock:
            self.requests.append(body)
            self.authorizations.append(authorization)
            if self._queue:
                return self._queue.popleft()
        return Reply.text(DEFAULT_TEXT)
