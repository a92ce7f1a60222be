"""The OpenAI-compatible surface (issue 17): `/v1/models` and the Responses API.

A response is a node; `previous_response_id` is its parent, so pointing at an older response forks a branch as
the tree does. Every call is a turn of the one turn runner (`turn_below`), under the same lock, budget,
compaction and log as any other; a stream follows the turn's log, so a client that leaves never ends it.
"""

from __future__ import annotations

import functools
import io
import json
import logging
import time
from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from config.errors import ArborError, BadInput, NotFound, TooLarge
from config.streams import EventStream, StreamSlotView
from config.throttles import AnonRateFirst
from config.web import in_pool_thread
from conversations import items as it
from conversations import llm, services
from conversations.idempotency import IdempotentView
from conversations.models import Conversation, Node
from conversations.openai import chat, conversations, deletion, errors, mcp, messages, shapes
from conversations.openai.auth import ApiKeyAuthentication, BearerTokenAuthentication
from conversations.openai.options import chat_options, metadata_of, responses_options
from conversations.openai.parts import file_id
from conversations.openai.shapes import (
    function_call_item,
    history_messages,
    input_items,
    input_items_of,
    instructions_text,
    message_item,
    node_id_of,
    response_of,
    tools_of,
)
from conversations.selectors import node_for_user
from conversations.turns import detached, records
from conversations.turns.events import EventType, TurnOutcome
from conversations.turns.start import turn_below
from conversations.turns.streaming import follow_log_batches
from conversations.turns.tool_policy import ServerTools
from files.services import IMAGE_TOKENS, drop_unsent, files_made_here, files_to_send, resolve_pending

logger = logging.getLogger("arbor.openai")


def _node(pk: int, owner: int) -> Node:
    return Node.objects.get(owner_id=owner, pk=pk)


@extend_schema(exclude=True)  # OpenAI's own schema describes this surface; Arbor's documents its API
class GatewayView(StreamSlotView):
    authentication_classes = [BearerTokenAuthentication]
    permission_classes = [AnonRateFirst, IsAuthenticated]

    def initial(self, request: Request, *args, **kwargs):
        _read_body(request._request, settings.ARBOR_GATEWAY_MAX_BODY_BYTES)
        super().initial(request, *args, **kwargs)

    def wants_stream(self, request: Request) -> bool:
        return request.method == "POST" and isinstance(request.data, dict) and request.data.get("stream") is True

    def get_exception_handler(self):
        return errors.exception_handler

    def dispatch(self, request, *args, **kwargs):
        # A refused call changes nothing: the files its content parts made go again (issue 29), unless a call
        # that reached a model sent them (then its node keeps them).
        with files_made_here() as made:
            response = super().dispatch(request, *args, **kwargs)
        if made and response.status_code >= 400:
            drop_unsent(made)
        return response


def _read_body(request, limit: int) -> None:
    """Read the body up to `limit` bytes (a call's images and files come inside it, base64: issue 29), past
    Django's DATA_UPLOAD_MAX_MEMORY_SIZE, which stays the bound everywhere else; TooLarge past `limit`."""
    if hasattr(request, "_body") or request.method != "POST":
        return
    if int(request.META.get("CONTENT_LENGTH") or 0) > limit:
        raise TooLarge(f"The request body is larger than {limit} bytes.")
    data = request.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(f"The request body is larger than {limit} bytes.")
    request._body, request._stream = data, io.BytesIO(data)


def _model_object(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": name.split("/")[0] if "/" in name else "arbor"}


class Models(GatewayView):
    def get(self, request: Request) -> Response:
        return Response({"object": "list", "data": [_model_object(name) for name in settings.ARBOR_MODELS]})


class ModelDetail(GatewayView):
    def get(self, request: Request, model: str) -> Response:
        """One model this server offers; its id may hold slashes (`arbor/echo`), sent as they are or as %2F."""
        if model not in settings.ARBOR_MODELS:
            raise NotFound(f"The model {model!r} does not exist here; GET /v1/models lists the ones that do.",
                           code="model_not_found", param="model")
        return Response(_model_object(model))


def _response_node(user, value: Any, *, field: str) -> Node:
    node = node_for_user(user=user, node_id=node_id_of(value, field=field))
    if node.conversation_id is None or node.kind != Node.Kind.TURN:
        raise NotFound(f"No response with id {value!r} ({field}).")
    return node


def _call(request: Request) -> tuple[dict, str, bool]:
    """What every create shares: a JSON object, a model this server offers, and whether to stream."""
    body = request.data
    if not isinstance(body, dict):
        raise BadInput("The body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or model not in settings.ARBOR_MODELS:
        raise ArborError(f"The model {model!r} does not exist here; GET /v1/models lists the ones that do.",
                         code="model_not_found")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadInput("`stream` must be true or false.")
    return body, model, stream


def _stream(events, run_id) -> EventStream:
    stream = EventStream(events)
    stream.run_id = run_id  # what a retry with the same Idempotency-Key follows again (`idempotency`)
    return stream


def _responses_sent(body: dict, options) -> dict:
    """The request's own fields a Responses object says back (`response_of`)."""
    named = body.get("conversation")
    said = named.get("id") if isinstance(named, dict) else named
    return {**options.echo, "previous_response_id": body.get("previous_response_id"),
            "conversation": {"id": said} if named is not None else None}


def _response_tools(body: dict) -> tuple[list[dict] | ServerTools | None, list[dict] | None]:
    """The call's tools, and the function specs its options are read against: the caller's function tools (it
    runs them itself, T4), or the MCP servers of Arbor's it named (issue 32: run here); Arbor's own stay out."""
    servers = mcp.servers_named(body.get("tools"))
    if servers is not None:
        return servers, [tool.spec() for tool in servers.tools()]
    tools = tools_of(body.get("tools"))
    return tools, tools


class Responses(IdempotentView, GatewayView):
    def stream_run(self, request: Request, run_id) -> EventStream:
        body = request.data
        sent = _responses_sent(body, responses_options(body, _response_tools(body)[1]))
        owner = request.user.pk
        return _stream(_translated(run_id, owner, _ResponsesEvents(sent, owner), "responses"), run_id)

    def post(self, request: Request):
        body, model, stream = _call(request)
        tools, specs = _response_tools(body)
        options = responses_options(body, specs)
        turn = _response_turn(request, body, model=model, tools=tools, call_options=options.model,
                              instructions=instructions_text(body.get("instructions")))  # never the account's
        if stream:
            return self.stream_run(request, detached.launch(turn))
        outcome = TurnOutcome.of(detached.run_here(turn))
        if outcome.ending == EventType.ERROR:
            raise ArborError(outcome.error["message"], code=outcome.error["code"], status=outcome.http_status)
        first = shapes.first_round(records.as_written(turn, [outcome.head])[0])
        return Response(response_of(first, sent=_responses_sent(body, options)))


def _response_turn(request: Request, body: dict, *, model: str, instructions: str, tools, call_options):
    """Where a Responses call hangs: below a named conversation's head, below `previous_response_id`, below the
    stored path a resent history extends, or at a new conversation's root."""
    previous, named = body.get("previous_response_id"), body.get("conversation")
    if named is not None and previous is not None:
        raise BadInput("Send `conversation` or `previous_response_id`, not both.", param="conversation")
    if named is not None:  # OpenAI's Conversations API: below its head, its waiting items sent first
        conversation = conversations.conversation_named(request.user, named)
        pending = conversation.pending_input
        new = input_items(body.get("input"), open_calls=conversations.open_calls(conversation))
        items = sorted([*(entry["item"] for entry in pending), *new],
                       key=lambda item: item["type"] != "tool_result")  # results first
        turn = _turn_in(request.user, conversation, model, parent_id=conversation.head_id, items=items,
                        instructions=instructions, tools=tools or [], call_options=call_options)
        conversations.take_pending(conversation, pending)
        return turn
    history = history_messages(body.get("input")) if previous is None else None
    if history is not None:  # earlier turns resent, not named: matched as a chat completion's list is
        listed_instructions, turns = chat.read_messages(history[0], field="input", positions=history[1])
        return _turn_from_list(request, body, model, turns, tools=tools, call_options=call_options,
                               instructions="\n\n".join(filter(None, [instructions, listed_instructions])))
    parent = None if previous is None else shapes.rounds_of(
        _response_node(request.user, previous, field="previous_response_id"))[-1]  # below its last round
    open_calls = {call["id"]: call for call in it.tool_calls(parent.received)} if parent else {}
    items = input_items(body.get("input"), open_calls=open_calls)
    conversation = Conversation.objects.get(pk=parent.conversation_id) if parent else None
    return _turn_in(request.user, conversation, model, parent_id=parent and parent.pk, items=items,
                    instructions=instructions, tools=tools or [], call_options=call_options)


def _chat_tools(value: Any) -> list[dict] | None:
    """Chat Completions' function tools, as the model seam takes them."""
    if value in (None, []):
        return None
    if not isinstance(value, list) or not all(
            isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("function"), dict)
            and isinstance(t["function"].get("name"), str)
            and isinstance(t["function"].get("parameters") or {}, dict)
            and isinstance(t["function"].get("description") or "", str) for t in value):
        raise BadInput("`tools` must be a list of function tools ({type: function, function: {name, …}}).")
    return [{"type": "function", "function": {"name": t["function"]["name"],
                                              "description": t["function"].get("description") or "",
                                              "parameters": t["function"].get("parameters")
                                              or {"type": "object", "properties": {}}}} for t in value]


class ChatCompletions(IdempotentView, GatewayView):
    def stream_run(self, request: Request, run_id) -> EventStream:
        options = request.data.get("stream_options")
        usage = isinstance(options, dict) and options.get("include_usage") is True
        owner = request.user.pk
        return _stream(_translated(run_id, owner, _ChatChunks(request.data["model"], usage, owner), "chat"), run_id)

    def post(self, request: Request):
        body, model, stream = _call(request)
        instructions, turns = chat.read_messages(body.get("messages"))
        tools = _chat_tools(body.get("tools"))
        options = chat_options(body, tools)
        turn = _turn_from_list(request, body, model, turns, instructions=instructions, tools=tools,
                               call_options=options.model)
        if stream:
            return self.stream_run(request, detached.launch(turn))
        outcome = TurnOutcome.of(detached.run_here(turn))
        if outcome.ending == EventType.ERROR:
            raise ArborError(outcome.error["message"], code=outcome.error["code"], status=outcome.http_status)
        return Response(chat.completion_of(records.as_written(turn, [outcome.head])[0], model=model))


class AnthropicMessages(IdempotentView, GatewayView):
    """Issue 27: Anthropic's Messages API (`messages.py`), run as a chat list is (`_turn_from_list`)."""
    authentication_classes = [ApiKeyAuthentication, BearerTokenAuthentication]

    def stream_run(self, request: Request, run_id) -> EventStream:
        owner = request.user.pk
        events = messages.MessageEvents(request.data["model"], lambda pk: in_pool_thread(_node, pk, owner))
        return _stream(_translated(run_id, owner, events, "messages"), run_id)

    def get_exception_handler(self):
        return errors.anthropic_exception_handler

    def post(self, request: Request):
        if isinstance(request.data, dict) and request.data.get("model") not in settings.ARBOR_MODELS:
            raise NotFound(f"model: {request.data.get('model')!r} does not exist here; GET /v1/models lists the "
                           "ones that do.", code="model_not_found")  # Anthropic's answer: a 404
        body, model, stream = _call(request)
        listed, positions = messages.chat_messages(body.get("messages"))
        tools = messages.tools_of(body.get("tools"))
        options = messages.options_of(body, tools)
        _, turns = chat.read_messages(listed, positions=positions, reasoning_provider=llm.provider_of(model))
        turn = _turn_from_list(request, body, model, turns, instructions=instructions_text(
            messages.system_text(body.get("system")), "system"), tools=tools, call_options=options.model)
        if stream:
            return self.stream_run(request, detached.launch(turn))
        outcome = TurnOutcome.of(detached.run_here(turn))
        if outcome.ending == EventType.ERROR:
            raise ArborError(outcome.error["message"], code=outcome.error["code"], status=outcome.http_status)
        return Response(messages.message_of(records.as_written(turn, [outcome.head])[0], model=model))


class AnthropicCountTokens(GatewayView):
    """`POST /v1/messages/count_tokens`: the request's own messages, system and tools, estimated as the budget
    estimates them (C1); nothing is recorded."""
    authentication_classes = [ApiKeyAuthentication, BearerTokenAuthentication]

    def get_exception_handler(self):
        return errors.anthropic_exception_handler

    def post(self, request: Request) -> Response:
        body = request.data if isinstance(request.data, dict) else None
        if body is None:
            raise BadInput("The body must be a JSON object.")
        listed, positions = messages.chat_messages(body.get("messages"))
        chat.read_messages(listed, positions=positions)  # the same checks a create makes
        system = instructions_text(messages.system_text(body.get("system")), "system")
        tools = messages.tools_of(body.get("tools")) or []
        listed, parts = _bytes_counted_apart(listed, request.user)
        counted = [{"role": "system", "content": system}, {"tools": tools}, *listed]
        return Response({"input_tokens": llm.estimate_tokens(counted) + parts})


def _bytes_counted_apart(listed: list[dict], user) -> tuple[list[dict], int]:
    """The messages with their image and document parts taken out, and what those parts cost as a call costs
    them (issue 29: an image its fixed cost, a document about a token for four bytes, one of the caller's files by
    its id as its text is sent), not as base64 text."""
    kept, tokens = [], 0
    for message in listed:
        content = message.get("content")
        if isinstance(content, list):
            parts = [part for part in content if isinstance(part, dict) and part.get("type") in ("image_url", "file")]
            named = [file_id(part["file"]["file_id"], "document.source") for part in parts
                     if part["type"] == "file" and part["file"].get("file_id") is not None]
            tokens += sum(IMAGE_TOKENS if part["type"] == "image_url"
                          else len(str(part["file"].get("file_data") or "")) * 3 // 16 for part in parts)
            # Files named by id: checked and counted as the call would send them (each once, the caller's, read).
            tokens += sum(ref["tokens"] for ref in files_to_send(user=user, file_ids=named)) if named else 0
            message = {**message, "content": [part for part in content if part not in parts]}
        kept.append(message)
    return kept, tokens


class _ChatChunks:
    """One turn's events as Chat Completions chunks. Every chunk has its call's id, `chatcmpl-<node id>`, as a
    plain completion has (API.md): the role chunk waits for the first event that names the call's node."""

    def __init__(self, model: str, usage: bool, owner: int):
        self.model, self.usage, self.owner = model, usage, owner
        self.created = int(time.time())
        self.node_id: int | None = None
        self.calls = 0
        self.ended = False

    def chunk(self, delta: dict | None, finish: str | None = None, **extra) -> bytes:
        body = {"id": f"chatcmpl-{self.node_id}", "object": "chat.completion.chunk", "created": self.created,
                "model": self.model, "choices": [] if delta is None else [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}], **extra}
        return f"data: {json.dumps(body)}\n\n".encode()

    def _open(self, node_id: int | None) -> bytes:
        if self.node_id is not None or node_id is None:
            return b""
        self.node_id = node_id
        return self.chunk({"role": "assistant", "content": ""})

    async def translate(self, event) -> bytes:
        if event.type == EventType.TOKEN:
            return self._open(event.data["node"]) + self.chunk({"content": event.data["text"]})
        if event.type == EventType.TOOL_CALL:
            call = {"index": self.calls, "id": event.data["call_id"], "type": "function",
                    "function": {"name": event.data["name"], "arguments": event.data["arguments"]}}
            self.calls += 1
            return self._open(event.data["node"]) + self.chunk({"tool_calls": [call]})
        if event.type == EventType.DONE:
            self.ended = True
            node = await in_pool_thread(_node, event.data["head"], self.owner)
            done = self._open(event.data["head"]) + self.chunk({}, chat.finish_reason(node, calls=bool(self.calls)))
            if self.usage:
                used = node.usage or {}
                done += self.chunk(None, usage={k: used.get(k, 0) for k in ("prompt_tokens", "completion_tokens",
                                                                             "total_tokens")})
            return done + b"data: [DONE]\n\n"
        if event.type == EventType.ERROR:
            self.ended = True
            failed = errors.openai_error_body(502, event.data.get("message", ""), event.data.get("code"))
            return self._open(event.data.get("node")) + f"data: {json.dumps(failed)}\n\n".encode()
        return b""  # compaction and the like: not part of OpenAI's stream

    def error(self, status: int, message: str) -> bytes:
        return f"data: {json.dumps(errors.openai_error_body(status, message, 'server_error'))}\n\n".encode()


_RUN_LOST = "The call ended without an answer: the process running it stopped."


async def _translated(run_id, owner: int, translator, api: str):
    """A turn's log as `translator` says it in `api`'s stream (`_ChatChunks`, `_ResponsesEvents`,
    `messages.MessageEvents`). A client that leaves only stops reading: the call goes on. A stream whose
    reading fails, or whose run ended without a word (its process died, D3), ends with the translator's
    error, never with a claim that the call finished."""
    try:
        async for batch in follow_log_batches(run_id, owner=owner):
            for _, event in batch:
                yield await translator.translate(event)
                if translator.ended:
                    return
    except Exception as error:  # the status is sent: say it in the stream; the call goes on regardless
        logger.exception("%s stream %s failed", api, run_id)
        yield translator.error(500, f"Reading the call's events failed ({error!r}); the call goes on.")
        return
    yield translator.error(502, _RUN_LOST)


def _turn_from_list(request: Request, body: dict, model: str, turns: list[chat.ListedTurn], *, instructions: str,
                    tools: list[dict] | None, call_options: dict):
    """The call a whole list asks for (`chat.read_messages`): below the longest stored path of the caller's
    conversations (or the one named) that the list extends, after recording the list's answered turns past it."""
    named = chat.named_conversation(user=request.user, request=request, body=body)
    for listed in turns:  # files by their bytes' digest before matching (X1: a file id is matched as its bytes)
        listed.sent = resolve_pending(user=request.user, items=listed.sent)
    match = chat.longest_match(user=request.user, turns=turns, conversation=named)
    supplied = [(listed.sent, listed.received) for listed in turns[match.matched:-1]]
    return _turn_in(request.user, match.conversation, model, parent_id=match.node and match.node.pk,
                    items=turns[-1].sent, supplied=supplied, instructions=instructions, tools=tools or [],
                    call_options=call_options)


def _turn_in(user, conversation: Conversation | None, model: str, **start):
    """The call's turn (`turn_below`) in `conversation`, or in a new one (named by the worker after its first
    answer, R4) that goes again if the turn is refused: a refused request leaves nothing behind."""
    start["items"] = resolve_pending(user=user, items=start["items"])  # X1: files sent in content parts
    start["supplied"] = [(resolve_pending(user=user, items=sent), received)
                         for sent, received in start.get("supplied", ())]
    created = conversation is None
    if created:
        conversation = services.conversation_create(owner=user, model=model, origin=Conversation.Origin.API)
    try:
        return turn_below(user=user, conversation_id=conversation.pk, model=model, **start)
    except Exception:
        if created:
            services.conversation_delete(conversation=conversation)
        raise


def _previous_of(node: Node) -> str | None:
    """The response a stored call continued: its parent, or the original a compaction root stands for (C2)."""
    parent = node.parent
    if parent is not None and parent.kind == Node.Kind.COMPACTION:
        parent = parent.compacted_from
    return parent and shapes.response_id(shapes.first_round(parent).pk)  # a response of rounds: its first


class ResponseDetail(GatewayView):
    def get(self, request: Request, response_id: str) -> Response:  # not `response`: DRF's own argument
        node = _response_node(request.user, response_id, field="id")
        return Response(response_of(node, sent={**shapes.settings_said(node),
                                                "previous_response_id": _previous_of(node)}))

    def delete(self, request: Request, response_id: str) -> Response:
        """Issue 27: a response nothing continues (`deletion.response_delete`); 409 saying what continues it."""
        node = _response_node(request.user, response_id, field="id")
        deletion.response_delete(node=node)
        return Response({"id": shapes.response_id(node.pk), "object": "response.deleted", "deleted": True})


class Conversations(GatewayView):
    def post(self, request: Request) -> Response:
        """Create: a conversation of the caller's (origin api), with its metadata and the items it starts with."""
        body = request.data if isinstance(request.data, dict) else None
        if body is None:
            raise BadInput("The body must be a JSON object.")
        metadata = metadata_of(body) or {}
        items = conversations.added_items(request.user, body["items"]) if body.get("items") is not None else []
        conversation = services.conversation_create(owner=request.user, origin=Conversation.Origin.API)
        if items or metadata:
            conversation.metadata, conversation.pending_input = metadata, conversations.waiting(items)
            conversation.save(update_fields=["metadata", "pending_input"])
        return Response(conversations.conversation_object(conversation))


class ConversationDetail(GatewayView):
    def get(self, request: Request, conversation_id: str) -> Response:
        return Response(conversations.conversation_object(
            conversations.conversation_named(request.user, conversation_id, field="id")))

    def post(self, request: Request, conversation_id: str) -> Response:
        """OpenAI updates a conversation's metadata with a POST."""
        found = conversations.conversation_named(request.user, conversation_id, field="id")
        return Response(conversations.conversation_object(conversations.update_metadata(found, request.data)))

    def delete(self, request: Request, conversation_id: str) -> Response:
        return Response(conversations.delete(conversations.conversation_named(request.user, conversation_id,
                                                                              field="id")))


class ConversationItems(GatewayView):
    def get(self, request: Request, conversation_id: str) -> Response:
        found = conversations.conversation_named(request.user, conversation_id, field="id")
        return Response(conversations.page(conversations.items_of(found), request.query_params))

    def post(self, request: Request, conversation_id: str) -> Response:
        """Add items for the next call; answered as the items added, with their ids."""
        found = conversations.conversation_named(request.user, conversation_id, field="id")
        body = request.data if isinstance(request.data, dict) else {}
        data = conversations.shown_waiting(conversations.add_pending(
            found, conversations.added_items(request.user, body.get("items"), found)))
        return Response({"object": "list", "data": data, "first_id": data[0]["id"] if data else "",
                         "last_id": data[-1]["id"] if data else "", "has_more": False})


class ConversationItem(GatewayView):
    def get(self, request: Request, conversation_id: str, item_id: str) -> Response:
        found = conversations.conversation_named(request.user, conversation_id, field="id")
        return Response(conversations.item_named(found, item_id))

    def delete(self, request: Request, conversation_id: str, item_id: str) -> Response:
        """A waiting item goes (OpenAI answers with the conversation); a recorded one is a 409 (P3)."""
        found = conversations.conversation_named(request.user, conversation_id, field="id")
        conversations.delete_item(found, item_id)
        return Response(conversations.conversation_object(found))


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
    """One turn's events as OpenAI's Responses events: `response.created` once the call's node exists; each round's
    text as a message item, opened at its first token, with its deltas; each function call as an item with its
    arguments; each call run in an MCP server (issue 32) as an `mcp_call` item, done when its result comes; then
    every item closed and `response.completed` with the response as stored (or `response.failed`)."""

    def __init__(self, sent: dict, owner: int):
        self.owner = owner
        self.number = 0
        self.sent = sent  # the request's own fields, said back (`response_of`)
        self.node: Node | None = None  # the response's first round: its id
        self.items: list[dict] = []  # the output items opened, in output_index order
        self.open_message: dict | None = None  # the message item still taking text, with the text so far
        self.running: dict[str, int] = {}  # MCP calls under way: their output_index by call id
        self.servers = any(isinstance(tool, dict) and tool.get("type") == "mcp" for tool in sent.get("tools") or [])
        self.ended = False

    def _event(self, kind: str, **fields) -> bytes:
        self.number += 1
        return _event(kind, self.number, **fields)

    def error(self, status: int, message: str) -> bytes:
        where = shapes.response_id(self.node.pk) if self.node else "…"
        message = f"{message} GET /v1/responses/{where} shows it."
        return self._event("error", code="server_error", param=None, message=message,
                           error=errors.openai_error_body(status, message, "server_error")["error"])

    async def _open(self, node_id: int) -> bytes:
        if self.node is not None:
            return b""
        self.node = await in_pool_thread(_node, node_id, self.owner)
        started = response_of(self.node, status="in_progress", sent=self.sent)
        return self._event("response.created", response=started) + self._event("response.in_progress",
                                                                                response=started)

    def _message(self, node_id: int) -> bytes:
        """The round's message item, opened at its first text (closing an earlier round's)."""
        item_id = f"msg_{node_id}"
        if self.open_message is not None and self.open_message["id"] == item_id:
            return b""
        closed = self._close_message()
        item = {**message_item(Node(pk=node_id), "", status="in_progress"), "content": []}
        self.items.append(item)
        self.open_message = {"id": item_id, "index": len(self.items) - 1, "text": ""}
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return closed + (self._event("response.output_item.added", output_index=len(self.items) - 1, item=item)
                         + self._event("response.content_part.added", item_id=item_id,
                                       output_index=len(self.items) - 1, content_index=0, part=part))

    def _close_message(self, final: dict | None = None) -> bytes:
        """Close the open message with its text (`final`: as stored, when the response has ended)."""
        opened, self.open_message = self.open_message, None
        if opened is None:
            return b""
        item = final or {**message_item(Node(pk=int(opened["id"][4:])), opened["text"])}
        part, index = item["content"][0], opened["index"]
        return b"".join([
            self._event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                        text=part["text"], logprobs=[]),
            self._event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                        part=part),
            self._event("response.output_item.done", output_index=index, item=item),
        ])

    def _text(self, data: dict) -> bytes:
        opened = self._message(data["node"])
        self.open_message["text"] += data["text"]
        return opened + self._event("response.output_text.delta", item_id=self.open_message["id"],
                                    output_index=self.open_message["index"], content_index=0, delta=data["text"],
                                    logprobs=[])

    def _call(self, data: dict) -> bytes:
        call = {"id": data["call_id"], "name": data["name"], "arguments": data["arguments"]}
        node = Node(pk=data["node"])
        ran_here = self.servers  # a request names MCP servers or sends function tools, never both (`mcp`)
        item = shapes.mcp_call_item(node, call, None, "in_progress") if ran_here else function_call_item(node, call)
        opened = self._close_message()
        index = len(self.items)
        self.items.append(item)
        kind = "mcp_call" if ran_here else "function_call"
        events = [
            self._event("response.output_item.added", output_index=index, item={**item, "arguments": "",
                                                                                "status": "in_progress"}),
            self._event(f"response.{kind}_arguments.delta", item_id=item["id"], output_index=index,
                        delta=item["arguments"]),
            self._event(f"response.{kind}_arguments.done", item_id=item["id"], output_index=index,
                        **({} if ran_here else {"name": item["name"]}), arguments=item["arguments"]),
        ]
        if ran_here:  # done when its result comes (`_result`)
            self.running[call["id"]] = index
            events.append(self._event("response.mcp_call.in_progress", item_id=item["id"], output_index=index))
        else:
            events.append(self._event("response.output_item.done", output_index=index, item=item))
        return opened + b"".join(events)

    def _result(self, data: dict) -> bytes:
        index = self.running.pop(data["call_id"], None)
        if index is None:
            return b""
        item = self.items[index]
        call = {"id": data["call_id"], "name": data["name"], "arguments": item["arguments"]}
        done = shapes.mcp_call_item(Node(pk=int(item["id"].split("_")[1])), call, it.tool_result(
            data["call_id"], data["name"], data["content"], is_error=data["is_error"]))
        self.items[index] = done
        return (self._event(f"response.mcp_call.{done['status']}", item_id=done["id"], output_index=index)
                + self._event("response.output_item.done", output_index=index, item=done))

    async def translate(self, event) -> bytes:
        if event.type == EventType.TOKEN:
            return await self._open(event.data["node"]) + self._text(event.data)
        if event.type == EventType.TOOL_CALL:
            return await self._open(event.data["node"]) + self._call(event.data)
        if event.type == EventType.TOOL_RESULT:
            return self._result(event.data)
        if event.type == EventType.DONE:
            self.ended = True
            opened = await self._open(event.data["head"])
            done = await in_pool_thread(_node, self.node.pk, self.owner)  # written before DONE was logged
            return opened + await in_pool_thread(self._closed, done)
        if event.type == EventType.ERROR:
            self.ended = True
            if event.data.get("node") is None:  # refused before a call was made: the SDK raises its APIError
                return self._event("error", code=event.data.get("code"), message=event.data.get("message", ""),
                                   param=None, error=errors.openai_error_body(
                                       502, event.data.get("message", ""), event.data.get("code"))["error"])
            opened = await self._open(event.data["node"])
            failed = await in_pool_thread(_node, self.node.pk, self.owner)
            final = await in_pool_thread(functools.partial(response_of, failed, sent=self.sent))
            return opened + self._event("response.failed", response=final)
        return b""  # compaction and the like: not part of OpenAI's stream

    def _closed(self, done: Node) -> bytes:
        """The open message closed with its stored text, any message that came in no token event opened and
        closed, then `response.completed` (or `incomplete`) with the response as stored."""
        final = response_of(done, sent=self.sent)
        stored = {item["id"]: item for item in final["output"] if item["type"] == "message"}
        parts = [self._close_message(stored.get(self.open_message["id"])) if self.open_message else b""]
        seen = {item["id"] for item in self.items}
        for item in final["output"]:
            if item["type"] == "message" and item["id"] not in seen:
                parts += [self._message(int(item["id"][4:])), self._close_message(item)]
        return b"".join([*parts, self._event(f"response.{final['status']}", response=final)])
