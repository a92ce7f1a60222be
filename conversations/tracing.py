"""OpenTelemetry traces that walk the tree (issue 31), after the GenAI semantic conventions: a `chat` span per
model call (its node), an `execute_tool` span per tool run. Off unless OTEL_EXPORTER_OTLP_ENDPOINT is set; then
spans go over OTLP/HTTP to `<endpoint>/v1/traces`, in batches, from a thread of their own.

The ids come from the tree, not from chance: a conversation's calls share one trace (its id made from the
conversation's), and a node's span id is made from the node's id. So a node's span is the child of its parent
node's span, with a link to it as well (`arbor.parent_node.id`), whichever process made either call, and a trace
viewer shows the conversation as the tree it is: an edit or a regenerated answer is a sibling span. A node's span
is written once the call has ended, from what the node records, so no turn waits on tracing.

Message content goes on a span only when OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT is true, as the
conventions say; it is off by default (people's words stay out of a tracing backend).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from datetime import datetime

from django.conf import settings
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from conversations.models import Node

logger = logging.getLogger("arbor.tracing")
_next_ids: ContextVar[tuple[int, int] | None] = ContextVar("arbor_span_ids", default=None)


class _TreeIds(RandomIdGenerator):
    """The ids `_ids` asks for (a node's, its conversation's); random ones otherwise."""

    def generate_span_id(self) -> int:
        asked = _next_ids.get()
        return asked[1] if asked else super().generate_span_id()

    def generate_trace_id(self) -> int:
        asked = _next_ids.get()
        return asked[0] if asked else super().generate_trace_id()


@contextlib.contextmanager
def _ids(trace_id: int, span_id: int) -> Iterator[None]:
    token = _next_ids.set((trace_id, span_id))
    try:
        yield
    finally:
        _next_ids.reset(token)


def trace_id_of(conversation_id: int | None) -> int:
    return _digest(f"arbor:conversation:{conversation_id}", 16)


def span_id_of(node_id: int) -> int:
    return _digest(f"arbor:node:{node_id}", 8)


def _digest(text: str, size: int) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:size], "big") or 1


_provider: tuple[str, TracerProvider | None] | None = None
_provider_lock = threading.Lock()


def tracer() -> trace.Tracer | None:
    """The tracer for the configured endpoint; None when tracing is off."""
    global _provider
    endpoint = settings.ARBOR_OTEL_ENDPOINT
    if not endpoint:
        return None
    with _provider_lock:
        if _provider is None or _provider[0] != endpoint:
            if _provider is not None and _provider[1] is not None:
                _provider[1].shutdown()
            _provider = (endpoint, _new_provider(endpoint))
        return _provider[1].get_tracer("arbor") if _provider[1] is not None else None


def _new_provider(endpoint: str) -> TracerProvider | None:
    """The provider exporting to `endpoint`; None (tracing off, said once in the log) when OpenTelemetry's own
    settings are wrong: a trace never costs a turn."""
    try:
        provider = TracerProvider(resource=Resource.create({"service.name": settings.ARBOR_OTEL_SERVICE_NAME}),
                                  id_generator=_TreeIds())
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(
            endpoint=os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or f"{endpoint.rstrip('/')}/v1/traces")))
    except Exception:
        logger.exception("OpenTelemetry could not be set up for %s: no traces are sent", endpoint)
        return None
    return provider


def flush() -> None:
    """Send what is batched now (tests, and a process about to end)."""
    if _provider is not None and _provider[1] is not None:
        _provider[1].force_flush()


def _nanos(moment: datetime | None) -> int | None:
    return int(moment.timestamp() * 1_000_000_000) if moment else None


def _capture_content() -> bool:
    return os.environ.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "").lower() == "true"


def node_ended(node: Node) -> None:
    """The span of `node`'s call, once it has ended (succeeded or failed): the child of its parent node's span.
    Whatever goes wrong in tracing is logged; the turn never hears of it."""
    try:
        _node_span(node)
    except Exception:
        logger.exception("the span of node %s was not sent", node.pk)


def _node_span(node: Node) -> None:
    tracing = tracer()
    if tracing is None or node.pk is None:
        return
    usage = node.usage or {}
    attributes = {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": node.provider or "unknown",
        "gen_ai.request.model": node.model, "gen_ai.response.model": node.model,
        "gen_ai.usage.input_tokens": usage.get("prompt_tokens") or 0,
        "gen_ai.usage.output_tokens": usage.get("completion_tokens") or 0,
        "gen_ai.conversation.id": str(node.conversation_id or ""), "arbor.node.id": node.pk,
        "arbor.node.kind": node.kind, "arbor.node.status": node.status,
    }
    if _capture_content():
        attributes["gen_ai.input.messages"] = json.dumps(node.sent, ensure_ascii=False, default=str)
        attributes["gen_ai.output.messages"] = json.dumps(node.received, ensure_ascii=False, default=str)
    context, links = Context(), []
    if node.parent_id is not None:
        attributes["arbor.parent_node.id"] = node.parent_id
        # The parent's trace is its own conversation's (a fork's first node hangs off another conversation's).
        parent_conversation = Node.objects.filter(pk=node.parent_id).values_list("conversation_id", flat=True).first()
        parent = SpanContext(trace_id=trace_id_of(parent_conversation), span_id=span_id_of(node.parent_id),
                             is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
        links.append(Link(parent, {"arbor.relation": "parent_node"}))
        if parent_conversation == node.conversation_id:
            context = trace.set_span_in_context(NonRecordingSpan(parent))
    with _ids(trace_id_of(node.conversation_id), span_id_of(node.pk)):
        span = tracing.start_span(f"chat {node.model}", context=context, kind=SpanKind.CLIENT, attributes=attributes,
                                  links=links, start_time=_nanos(node.created_at))
    if node.status == Node.Status.FAILED:
        span.set_attribute("error.type", node.failure_reason or "error")
        span.set_status(Status(StatusCode.ERROR, node.failure_message[:200]))
    span.end(end_time=_nanos(node.finished_at))


@contextlib.contextmanager
def tool_span(call: dict, *, node_id: int, conversation_id: int | None) -> Iterator[trace.Span | None]:
    """An `execute_tool` span around one tool run, the child of the span of the node whose call asked for it."""
    try:
        span = _tool_span_started(call, node_id=node_id, conversation_id=conversation_id)
    except Exception:  # tracing never stops a tool
        logger.exception("the span of tool call %s was not started", call.get("id"))
        span = None
    try:
        yield span
    finally:
        if span is not None:
            with contextlib.suppress(Exception):
                span.end()


def _tool_span_started(call: dict, *, node_id: int, conversation_id: int | None) -> trace.Span | None:
    tracing = tracer()
    if tracing is None:
        return None
    parent = SpanContext(trace_id=trace_id_of(conversation_id), span_id=span_id_of(node_id), is_remote=True,
                         trace_flags=TraceFlags(TraceFlags.SAMPLED))
    attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": call["name"],
                  "gen_ai.tool.call.id": call["id"], "gen_ai.conversation.id": str(conversation_id or ""),
                  "arbor.node.id": node_id}
    return tracing.start_span(f"execute_tool {call['name']}", kind=SpanKind.INTERNAL, attributes=attributes,
                              context=trace.set_span_in_context(NonRecordingSpan(parent)))
