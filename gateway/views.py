"""The OpenAI-compatible surface (issue 17): `/v1/models` and the Responses API.

A response is a node; `previous_response_id` is its parent, so pointing at an older response forks a branch as
the tree does. Every call is a turn of the one turn runner (`turn_below`), under the same lock, budget,
compaction and log as any other; a stream follows the turn's log, so a client that leaves never ends it.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import StreamingHttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from config.errors import ArborError, BadInput, NotFound
from conversations import services
from conversations.models import Conversation, Node
from conversations.selectors import node_for_user
from conversations.turns import detached
from conversations.turns.events import EventType, TurnOutcome
from conversations.turns.start import turn_below
from conversations.turns.streaming import follow_log_batches
from gateway import errors, shapes
from gateway.auth import BearerTokenAuthentication
from gateway.shapes import input_items, input_items_of, message_item, node_id_of, response_of

logger = logging.getLogger("arbor.gateway")


@extend_schema(exclude=True)  # OpenAI's own schema describes this surface; Arbor's documents its API
class GatewayView(APIView):
    authentication_classes = [BearerTokenAuthentication]
    permission_classes = [IsAuthenticated]

    def get_exception_handler(self):
        return errors.exception_handler


class Models(GatewayView):
    def get(self, request: Request) -> Response:
        return Response({"object": "list", "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": name.split("/")[0] if "/" in name else "arbor"}
            for name in settings.ARBOR_MODELS]})


def _text_field(body: dict, name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise BadInput(f"`{name}` must be text.")
    return value


def _response_node(user, value: Any, *, field: str) -> Node:
    node = node_for_user(user=user, node_id=node_id_of(value, field=field))
    if node.conversation_id is None or node.kind != Node.Kind.TURN:
        raise NotFound(f"No response with id {value!r} ({field}).")
    return node


class Responses(GatewayView):
    def post(self, request: Request):
        body = request.data
        if not isinstance(body, dict):
            raise BadInput("The body must be a JSON object.")
        model = _text_field(body, "model")
        if model not in settings.ARBOR_MODELS:
            raise ArborError(f"The model {model!r} does not exist here; GET /v1/models lists the ones that do.",
                             code="model_not_found")
        items = input_items(body.get("input"))
        instructions = _text_field(body, "instructions")
        if body.get("tools"):
            raise BadInput("Function tools are not served by this server yet.", code="unsupported_parameter")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise BadInput("`stream` must be true or false.")
        previous = body.get("previous_response_id")
        if previous is None:  # a new conversation, named by the worker after its first answer (R4)
            conversation = services.conversation_create(owner=request.user, model=model)
            parent_id = None
        else:
            parent = _response_node(request.user, previous, field="previous_response_id")
            conversation, parent_id = Conversation.objects.get(pk=parent.conversation_id), parent.pk
        turn = turn_below(user=request.user, conversation_id=conversation.pk, parent_id=parent_id, items=items,
                          model=model, instructions=instructions, tools=[])
        if stream:
            return ResponseStream(detached.launch(turn))
        outcome = TurnOutcome.of(detached.run_here(turn))
        if outcome.ending == EventType.ERROR:
            raise ArborError(outcome.error["message"], code=outcome.error["code"], status=outcome.http_status)
        return Response(response_of(Node.objects.get(pk=outcome.head)))


class ResponseDetail(GatewayView):
    def get(self, request: Request, response_id: str) -> Response:  # not `response`: DRF's own argument
        return Response(response_of(_response_node(request.user, response_id, field="id")))


class ResponseInputItems(GatewayView):
    def get(self, request: Request, response_id: str) -> Response:
        items = input_items_of(_response_node(request.user, response_id, field="id"))
        if request.query_params.get("order", "desc") == "desc":
            items.reverse()
        return Response({"object": "list", "data": items, "first_id": items[0]["id"] if items else None,
                         "last_id": items[-1]["id"] if items else None, "has_more": False})


def _event(kind: str, number: int, **fields) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': number, **fields})}\n\n".encode()


class _ResponsesEvents:
    """One turn's events as OpenAI's Responses events: created, the message and its text part opened, text
    deltas, then closed and `response.completed` (or `response.failed`). The response (the call's node) is
    named once its node exists: the first token, or the turn's end."""

    def __init__(self):
        self.number = 0
        self.node: Node | None = None
        self.ended = False

    def _event(self, kind: str, **fields) -> bytes:
        self.number += 1
        return _event(kind, self.number, **fields)

    async def _open(self, node_id: int) -> bytes:
        if self.node is not None:
            return b""
        self.node = await sync_to_async(Node.objects.get)(pk=node_id)
        started = response_of(self.node, status="in_progress")
        item = {**message_item(self.node, "", status="in_progress"), "content": []}
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return b"".join([
            self._event("response.created", response=started),
            self._event("response.in_progress", response=started),
            self._event("response.output_item.added", output_index=0, item=item),
            self._event("response.content_part.added", item_id=item["id"], output_index=0, content_index=0,
                        part=part),
        ])

    async def translate(self, event) -> bytes:
        if event.type == EventType.TOKEN:
            opened = await self._open(event.data["node"])
            return opened + self._event("response.output_text.delta", item_id=f"msg_{self.node.pk}", output_index=0,
                                        content_index=0, delta=event.data["text"], logprobs=[])
        if event.type == EventType.DONE:
            self.ended = True
            opened = await self._open(event.data["head"])
            done = await sync_to_async(Node.objects.get)(pk=self.node.pk)  # written before DONE was logged
            return opened + self._closed(done)
        if event.type == EventType.ERROR:
            self.ended = True
            if event.data.get("node") is None:  # refused before a call was made
                return self._event("error", code=event.data.get("code"), message=event.data.get("message", ""),
                                   param=None)
            opened = await self._open(event.data["node"])
            failed = await sync_to_async(Node.objects.get)(pk=event.data["node"])
            return opened + self._event("response.failed", response=response_of(failed))
        return b""  # compaction and the like: not part of OpenAI's stream

    def _closed(self, done: Node) -> bytes:
        final = response_of(done)
        item = final["output"][0] if final["output"] else message_item(done, "")
        part = item["content"][0]
        return b"".join([
            self._event("response.output_text.done", item_id=item["id"], output_index=0, content_index=0,
                        text=part["text"], logprobs=[]),
            self._event("response.content_part.done", item_id=item["id"], output_index=0, content_index=0,
                        part=part),
            self._event("response.output_item.done", output_index=0, item=item),
            self._event("response.completed", response={**final, "output": [item]}),
        ])


class ResponseStream(StreamingHttpResponse):
    """A turn's log as a Responses event stream (`_ResponsesEvents`). A client that leaves only stops reading:
    the call goes on, and `GET /v1/responses/{id}` shows it."""

    def __init__(self, run_id):
        super().__init__(self._events(run_id), content_type="text/event-stream")
        self["Cache-Control"] = "no-cache"
        self["X-Accel-Buffering"] = "no"

    @staticmethod
    async def _events(run_id):
        events = _ResponsesEvents()
        try:
            async for batch in follow_log_batches(run_id):
                for _, event in batch:
                    yield await events.translate(event)
                    if events.ended:
                        return
        except Exception as error:  # the status is sent: say it as an event; the call goes on regardless
            logger.exception("response stream %s failed", run_id)
            where = shapes.response_id(events.node.pk) if events.node else "…"
            yield events._event("error", code="server_error", param=None,
                                message=f"Reading the call's events failed ({error!r}); it goes on: "
                                        f"GET /v1/responses/{where} shows it when done.")
