"""A running turn from outside the request that started it (issue 12): follow its numbered events from any
process (`GET …/stream/`, resumable with `Last-Event-ID` or `?after=N`), and stop it (`POST …/stop/`)."""

from __future__ import annotations

import json
import logging
import time

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from config import news
from config.api import error_body
from config.errors import BadInput
from config.schema import SSE
from config.streams import EventStream, StreamSlotView
from conversations.apis import serializers as s
from conversations.apis.schema import TURN_EVENT
from conversations.models import Node, TurnRun
from conversations.selectors import conversation_for_user
from conversations.turns import detached, log
from conversations.turns.events import EventType, TurnEvent
from conversations.turns.log_stores import LOG_NEWS
from conversations.turns.streaming import follow_log_batches

STOP_WAIT_SECONDS = 10

logger = logging.getLogger("arbor.api")


def sse(seq: int | None, event: TurnEvent) -> bytes:
    """One server-sent event; its `id` is the event's number in the turn's log, for `Last-Event-ID`."""
    head = f"id: {seq}\n" if seq is not None else ""
    return f"{head}event: {event.type}\ndata: {json.dumps(event.data, ensure_ascii=False)}\n\n".encode()


def log_stream(run_id, *, owner: int, after: int = 0) -> EventStream:
    """A run's events after `after`, then live until its ending. A client that leaves only stops reading:
    the turn goes on (its record completes, and a later `…/stream/` replays it)."""
    stream = EventStream(_log_events(run_id, owner, after))
    stream.run_id = run_id  # which run a test or a log line reads back
    return stream


async def _log_events(run_id, owner: int, after: int):
    try:
        async for batch in follow_log_batches(run_id, owner=owner, after=after):  # a batch is one write
            yield b"".join(sse(seq, event) for seq, event in batch)
    except Exception as error:  # the stream has begun: the status is sent, so say it as an event
        logger.exception("turn stream %s failed", run_id)
        yield sse(None, TurnEvent(EventType.ERROR, {
            "code": "server_error", "message": f"Reading the turn's events failed ({error!r}); the turn goes "
                                               "on: `GET …/stream/` resumes it."}))


class EventStreamRenderer(BaseRenderer):
    """Lets clients ask for `text/event-stream`; a refusal before the stream starts is one `error` event."""

    media_type = "text/event-stream"
    format = "sse"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        if data is None:
            return b""
        kind = "error" if isinstance(data, dict) and "error" in data else "message"
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def _after(request: Request) -> int:
    # An empty `Last-Event-ID` means none (as an EventSource sends it); an empty `?after=` is not a number.
    raw = request.headers.get("Last-Event-ID") or request.query_params.get("after", "0")
    if not (raw.isascii() and raw.isdigit()) or int(raw) > MAX_EVENT_NUMBER:
        raise BadInput("`Last-Event-ID` (or `after`) must be an event number: a whole number from 0.")
    return int(raw)


MAX_EVENT_NUMBER = 999_999_999
# DRF's own `?format=` picks the renderer; empty is as if it were not given.
FORMAT = OpenApiParameter("format", str, enum=["json", "sse", ""],
                          description="`sse`: the turn as server-sent events, as `Accept: text/event-stream` asks "
                                      "for; `json` (or empty): JSON")
_AFTER = OpenApiParameter("after", {"type": "integer", "minimum": 0, "maximum": MAX_EVENT_NUMBER},
                          description="resume after this event number (as `Last-Event-ID` does)")


class TurnStreamFollow(StreamSlotView):
    renderer_classes = [JSONRenderer, EventStreamRenderer]  # an EventSource asks for text/event-stream

    def wants_stream(self, request: Request) -> bool:
        return True

    @extend_schema(parameters=[_AFTER, FORMAT], responses={
        (200, SSE): OpenApiResponse(TURN_EVENT, description="the running (or just ended) turn's events after "
                                    "`Last-Event-ID` / `after`, then live until `done`, `approval_required` "
                                    "or `error`; every event has an `id`"),
        204: OpenApiResponse(description="no turn runs or ran lately"),
        400: OpenApiResponse(description="bad event number"),
        404: OpenApiResponse(description="not found or not yours")})
    def get(self, request: Request, conversation_id: int):
        conversation = conversation_for_user(user=request.user, conversation_id=conversation_id)
        after = _after(request)
        run = log.latest_run(conversation)
        if run is None:
            return Response(status=status.HTTP_204_NO_CONTENT)
        return log_stream(run.pk, owner=conversation.owner_id, after=after)


class TurnStop(APIView):
    @extend_schema(request=None, responses={200: s.NodeOut, 404: OpenApiResponse(description="not found or not yours"),
                                            409: OpenApiResponse(description="no_turn_running")})
    def post(self, request: Request, conversation_id: int) -> Response:
        """Stop the running turn, from any process: 200 with the stopped node once it is recorded."""
        conversation = conversation_for_user(user=request.user, conversation_id=conversation_id)
        run_id = detached.running_run(conversation)
        if run_id is None or not detached.request_stop(conversation):
            return Response(error_body("no_turn_running", "No turn is running on this conversation."),
                            status=status.HTTP_409_CONFLICT)
        deadline = time.monotonic() + STOP_WAIT_SECONDS
        with news.Waiter(LOG_NEWS, str(run_id)) as waiter:  # the run's last write says it ended
            while not TurnRun.objects.filter(owner_id=conversation.owner_id, pk=run_id,
                                             ended_at__isnull=False).exists():
                if time.monotonic() > deadline:
                    break
                waiter.wait(log.POLL_SECONDS)
        entries = log.read(run_id, owner=conversation.owner_id)
        node_id = entries[-1][1].data.get("node") if entries else None
        if node_id is None:  # it ended before a node was written, or has not noticed yet: its latest node
            node_id = Node.objects.of(conversation).values_list("pk", flat=True).last()
        if node_id is None:
            return Response(error_body("no_turn_running", "The turn ended before it wrote anything."),
                            status=status.HTTP_409_CONFLICT)
        return Response(s.NodeOut(Node.objects.get(owner_id=conversation.owner_id, pk=node_id)).data)
