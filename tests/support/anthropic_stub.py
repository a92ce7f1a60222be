"""Loopback Anthropic Messages API stub for tests (stdlib only): what litellm's `anthropic/…` models talk to.

    with AnthropicStub(api_key="sk-ant-test", context_window=3000) as stub:
        litellm.completion(model="anthropic/claude-sonnet-4-5", api_base=stub.base_url, api_key="sk-ant-test",
                           messages=[...], max_tokens=100, stream=True)
        stub.requests[0]["body"]["max_tokens"] == 100

Serves `POST /v1/messages` as the real API does, streaming only (Arbor always streams). The wire format is
that of Anthropic's recorded streams (anthropics/anthropic-sdk-python, tests/lib/streaming/fixtures/
basic_response.txt): message_start with the input usage, a text content block streamed as text_delta events
with a ping, content_block_stop, message_delta with the stop reason and output usage, message_stop.

Like the real API it refuses, with its real error bodies (quoted in public issues: coder/aibridge#56 for
"prompt is too long", the context-limit wording from the API's 400 for input plus max_tokens, and
eyaltoledano/claude-task-master#222 for the 401; `fail_next` scripts the others, e.g. anthropic-sdk-typescript#616's
529 overloaded_error and brainlid/langchain#302's 429 rate_limit_error with retry-after):
- a wrong `x-api-key`: 401 authentication_error "invalid x-api-key";
- input alone over `context_window`: 400 invalid_request_error "prompt is too long: N tokens > W maximum";
- input plus `max_tokens` over `context_window`: 400 "input length and `max_tokens` exceed context limit: N + M > W,
  decrease input length or `max_tokens` and try again".
It counts a request's input as the words of its system prompt and messages (a stand-in tokenizer: any real
tokenizer counts at least that many).
"""

from __future__ import annotations

import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_TEXT = "anthropic stub: ok"


def _texts(value: Any) -> list[str]:
    """Every text a system prompt or message content holds (a string, or a list of blocks)."""
    if isinstance(value, str):
        return [value]
    out: list[str] = []
    for block in value or []:
        if isinstance(block, dict):
            for key in ("text", "content", "thinking"):
                out += _texts(block.get(key)) if key in block else []
            if block.get("type") == "tool_use":
                out.append(json.dumps(block.get("input", {})))
    return out


def input_words(body: dict) -> int:
    texts = _texts(body.get("system")) + [t for m in body.get("messages", []) for t in _texts(m.get("content"))]
    return sum(len(t.split()) for t in texts)


class AnthropicStub:
    def __init__(self, *, api_key: str = "sk-ant-test", context_window: int = 200_000, answer: str = DEFAULT_TEXT):
        self.api_key = api_key
        self.context_window = context_window
        self.answer = answer
        self.requests: list[dict[str, Any]] = []  # {"path", "headers", "body"}; refused ones too
        self.refusals: list[tuple[int, dict]] = []
        self.failures: list[tuple[int, dict, dict]] = []  # scripted: (status, error, headers), next request first
        self._server: ThreadingHTTPServer | None = None

    def fail_next(self, status: int, error_type: str, message: str, headers: dict | None = None) -> None:
        """Answer the next request with this error, as the API does (e.g. 529 overloaded_error, 429
        rate_limit_error with retry-after)."""
        self.failures.append((status, {"type": error_type, "message": message}, headers or {}))

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> AnthropicStub:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw or b"{}")
                stub.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                refusal, headers = stub.refusal(self.path, self.headers, body), {}
                if refusal is None and stub.failures:
                    status, error, headers = stub.failures.pop(0)
                    refusal = status, error
                if refusal:
                    status, error = refusal
                    stub.refusals.append(refusal)
                    payload = json.dumps({"type": "error", "error": error,
                                          "request_id": f"req_{uuid.uuid4().hex[:24]}"}).encode()
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                for event, data in stub.stream(body):
                    self.wfile.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
                    self.wfile.flush()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._server.shutdown()
        self._server.server_close()

    def refusal(self, path: str, headers, body: dict) -> tuple[int, dict] | None:
        if path.rstrip("/") != "/v1/messages":
            return 404, {"type": "not_found_error", "message": f"Not found: {path}"}
        if headers.get("x-api-key") != self.api_key:
            return 401, {"type": "authentication_error", "message": "invalid x-api-key"}
        if not isinstance(body.get("max_tokens"), int):
            return 400, {"type": "invalid_request_error", "message": "max_tokens: Field required"}
        words, window = input_words(body), self.context_window
        if words > window:
            return 400, {"type": "invalid_request_error", "message": f"prompt is too long: {words} tokens > {window} "
                                                                     "maximum"}
        if words + body["max_tokens"] > window:
            return 400, {"type": "invalid_request_error",
                         "message": f"input length and `max_tokens` exceed context limit: {words} + "
                                    f"{body['max_tokens']} > {window}, decrease input length or `max_tokens` and try "
                                    "again"}
        return None

    def stream(self, body: dict):
        words = self.answer.split(" ")
        message_id = f"msg_{uuid.uuid4().hex[:24]}"
        yield "message_start", {"type": "message_start", "message": {
            "id": message_id, "type": "message", "role": "assistant", "content": [], "model": body.get("model"),
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": input_words(body), "output_tokens": 1}}}
        yield "content_block_start", {"type": "content_block_start", "index": 0,
                                      "content_block": {"type": "text", "text": ""}}
        yield "ping", {"type": "ping"}
        for i, word in enumerate(words):
            yield "content_block_delta", {"type": "content_block_delta", "index": 0,
                                          "delta": {"type": "text_delta", "text": word if i == 0 else f" {word}"}}
        yield "content_block_stop", {"type": "content_block_stop", "index": 0}
        yield "message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                "usage": {"output_tokens": len(words)}}
        yield "message_stop", {"type": "message_stop"}
