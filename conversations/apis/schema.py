"""What the conversation API's OpenAPI schema says that its serializers alone cannot (issue 14): text fields
that may not be blank, the models a conversation may name, the approval's `call_id` and its older alias, the
import file's shapes, and a turn's server-sent events. The shared error body is config/schema.py's."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.extensions import OpenApiSerializerExtension, OpenApiSerializerFieldExtension
from drf_spectacular.openapi import AutoSchema

from config.schema import NOT_BLANK, sse_event_schema
from conversations.apis.serializers import (
    ApprovalIn,
    ModelsField,
    StrictCharField,
    ToolServersField,
    validate_model_name,
)
from conversations.tools.mcp.servers import configured
from conversations.transfer.arbor_tree import TREE_FORMAT, TREE_VERSION
from conversations.turns.events import EventType


class StrictCharFieldSchema(OpenApiSerializerFieldExtension):
    """A required text says it may not be blank: no empty string, nor (when trimmed) only white space; a model
    name is one of ARBOR_MODELS, read when the schema is built (or blank, where the field allows it)."""

    target_class = StrictCharField
    match_subclasses = True

    def map_serializer_field(self, auto_schema, direction):
        field = self.target
        schema = auto_schema._map_serializer_field(field, direction, bypass_extensions=True)
        if validate_model_name in field.validators:
            # a blank model, where allowed, means "none of its own" (a project's conversations take the default)
            schema["enum"] = list(settings.ARBOR_MODELS) + ([""] if field.allow_blank else [])
        elif not field.allow_blank and field.trim_whitespace:
            schema["pattern"] = NOT_BLANK
        elif not field.allow_blank:
            schema["minLength"] = max(schema.get("minLength", 0), 1)
        return schema


class ToolServersFieldSchema(OpenApiSerializerFieldExtension):
    """The MCP servers there are, read when the schema is built: each named once; none at all where there are
    none."""

    target_class = ToolServersField

    def map_serializer_field(self, auto_schema, direction):
        schema = auto_schema._map_serializer_field(self.target, direction, bypass_extensions=True)
        names = [server.name for server in configured()]
        schema["uniqueItems"] = True
        if names:
            schema["items"] = {"type": "string", "enum": names}
        else:
            schema["maxItems"] = 0
        return schema


class ModelsFieldSchema(OpenApiSerializerFieldExtension):
    """Issue 33: each model once, and no more than may run at once."""

    target_class = ModelsField

    def map_serializer_field(self, auto_schema, direction):
        schema = auto_schema._map_serializer_field(self.target, direction, bypass_extensions=True)
        # The names are `model`'s choice set; a set of its own to the enum components (`ModelsEnum`), where one
        # set under two names is a warning `check --deploy` fails on.
        # No maxLength beside the names, which bound it already: with one, the items were an `allOf` wrapper
        # around the enum's $ref that schemathesis 4.32 could not negate ("Cannot generate an array with 1
        # demanded elements", the fuzz of stop 41).
        items = {key: value for key, value in schema["items"].items() if key != "maxLength"}
        items["x-spec-enum-id"] = "arbor-models-asked-at-once"
        return {**schema, "items": items, "uniqueItems": True, "maxItems": ModelsField.most()}


class ApprovalInSchema(OpenApiSerializerExtension):
    """`call_id`, as the `approval_required` event and the 202 answer name the call; `tool_call_id`, its earlier
    name, is still read when `call_id` is absent: one of the two is required."""

    target_class = ApprovalIn

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        schema["properties"]["tool_call_id"]["deprecated"] = True
        schema["anyOf"] = [{"required": ["call_id"]}, {"required": ["tool_call_id"]}]
        return schema


class FileBodySchema(AutoSchema):
    """For a view whose body is a file read as it is (not through a serializer): the body is required."""

    def _get_request_body(self, direction="request"):
        body = super()._get_request_body(direction)
        if body is not None:
            body["required"] = True
        return body


# What the importers (conversations.transfer) check, no more: a value they read leniently (a title that is no
# text is no title, a message that is no object is no message) is described, not constrained.
_CHATGPT_CONVERSATION: dict[str, Any] = {
    "type": "object",
    "description": "One entry of ChatGPT's conversations.json: its messages in `mapping` by id, each with its "
                   "`parent` (null for the one root) and `message` ({author: {role}, content: {parts}}), "
                   "branches kept; `title` and `current_node` are read when they are text.",
    "properties": {
        "mapping": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "properties": {"parent": {"type": "string", "nullable": True}},
            },
        },
    },
    "required": ["mapping"],
}

IMPORT_REQUEST: dict[str, Any] = {
    "description": "The export file itself, as JSON: Arbor's tree export (an object); ChatGPT's conversations.json, "
                   "Open WebUI's chat export, Claude.ai's or DeepSeek's conversations.json (an array; one entry of "
                   "them, an object, too); LibreChat's conversation export, chatbot-ui's export, Grok's data "
                   "export (`conversations`) or a Google AI Studio prompt (an object). An entry that cannot be read "
                   "is skipped and named in the answer's `skipped`.",
    "anyOf": [
        {
            "type": "object",
            "description": "Arbor's tree export (GET .../export/?format=json): `nodes` with their ids, parents "
                           "and items; `bubbles` and `approvals` name their node.",
            "properties": {
                "format": {"type": "string", "enum": [TREE_FORMAT]},
                "version": {"type": "integer", "enum": [TREE_VERSION]},
                "conversation": {"type": "object"},
                "nodes": {"type": "array", "items": {"type": "object"}},
                "bubbles": {"type": "array", "items": {"type": "object"}, "nullable": True},
                "approvals": {"type": "array", "items": {"type": "object"}, "nullable": True},
            },
            "required": ["format", "version", "conversation", "nodes"],
        },
        _CHATGPT_CONVERSATION,
        {"type": "array", "minItems": 1, "description": "The entries of ChatGPT's, Open WebUI's or Claude.ai's export "
                                                        "(or chatbot-ui's first version): one format in a file; an "
                                                        "entry that is none of it (not even an object) is skipped",
         "items": {"anyOf": [_CHATGPT_CONVERSATION, {}]}},
        {"type": "object", "description": "LibreChat's conversation export (`messages`, or `messagesTree` when "
                                          "exported recursive)",
         "properties": {"conversationId": {"type": "string"}, "messages": {"type": "array"},
                        "messagesTree": {"type": "array"}}, "required": ["conversationId"]},
        {"type": "object", "description": "chatbot-ui's export", "properties": {"history": {"type": "array"}},
         "required": ["history"]},
        {"type": "object", "description": "One Claude.ai conversation", "properties": {
            "chat_messages": {"type": "array"}}, "required": ["chat_messages"]},
        {"type": "object", "description": "Claude.ai's conversations as a viewer wraps them", "properties": {
            "conversations": {"type": "array"}}, "required": ["conversations"]},
        {"type": "object", "description": "One Open WebUI chat as its export holds it", "properties": {
            "chat": {"type": "object", "properties": {"history": {"type": "object"}}, "required": ["history"]}},
         "required": ["chat"]},
        {"type": "object", "description": "One bare Open WebUI chat object (Open WebUI imports those too)",
         "properties": {"history": {"type": "object"}}, "required": ["history"]},
        {"type": "object", "description": "A Google AI Studio prompt file: `chunkedPrompt.chunks` (`role`, `text`, "
                                          "`isThought`), `systemInstruction.parts`",
         "properties": {"chunkedPrompt": {"type": "object", "properties": {"chunks": {"type": "array"}},
                                          "required": ["chunks"]},
                        "systemInstruction": {"type": "object"}}, "required": ["chunkedPrompt"]},
    ],
}

# One server-sent event of a turn; `data` is the event's JSON (EventType names each one's fields).
TURN_EVENT = sse_event_schema([e.value for e in EventType], {"type": "object"})
# An answer that is no stream, rendered as one event for a client that asked for text/event-stream.
TURN_MESSAGE_EVENT = sse_event_schema(["message"], {"$ref": "#/components/schemas/TurnOut"})


# Where a turn's answer leads next (OpenAPI links, which schemathesis's stateful phase follows): the answer's
# head is the node to edit, regenerate, switch to or read; a paused turn names the call to decide.
_FROM_TURN = {
    "201": {
        "edit": ("/edit/", {"node": "$response.body#/head"}),
        "regenerate": ("/regenerate/", {"node": "$response.body#/head"}),
        "switch": ("/switch/", {"node": "$response.body#/head"}),
        "ask": ("/turns/", None),
        "compact": ("/compact/", None),
    },
    "202": {
        "approve": ("/approvals/", {"call_id": "$response.body#/approval_required/0/call_id"}),
        "retry": ("/retry/", None),
    },
}
_TURN_PATHS = ("/turns/", "/edit/", "/regenerate/", "/retry/", "/approvals/")
_PREFIX = "/api/conversations/{conversation_id}"


def turn_links(result: dict, generator, request, public) -> dict:
    """drf-spectacular postprocessing hook: links from every turn-starting operation's answer (see _FROM_TURN),
    and from it to the node it ended on."""
    paths = result.get("paths", {})
    ids = {path: item["post"]["operationId"] for path, item in paths.items() if "post" in item}
    node_read = paths.get("/api/nodes/{node_id}/", {}).get("get", {}).get("operationId")
    for source in _TURN_PATHS:
        responses = paths.get(_PREFIX + source, {}).get("post", {}).get("responses", {})
        for status, targets in _FROM_TURN.items():
            if status not in responses:
                continue
            links = responses[status].setdefault("links", {})
            for name, (target, body) in targets.items():
                if _PREFIX + target not in ids:
                    continue
                link = {"operationId": ids[_PREFIX + target],
                        "parameters": {"conversation_id": "$request.path.conversation_id"}}
                if body:
                    link["requestBody"] = body
                    link["x-schemathesis"] = {"merge_body": True}
                links[name] = link
            if status == "201" and node_read:
                links["node"] = {"operationId": node_read, "parameters": {"node_id": "$response.body#/head"}}
    return result
