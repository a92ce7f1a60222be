"""Export and import over the API (issue 7): each format lives in conversations.transfer."""

from __future__ import annotations

import json

from django.conf import settings
from django.http import HttpResponse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from config.errors import BadInput
from conversations.apis import serializers as s
from conversations.apis.schema import IMPORT_REQUEST, FileBodySchema
from conversations.selectors import conversation_for_user
from conversations.transfer import arbor_tree, chatgpt, importing, markdown

EXPORT_FORMATS = ("md", "json", "chatgpt")


def export_response(conversation, export_format: str) -> HttpResponse:
    """The export as a download: Markdown of the current path, or the whole tree as JSON."""
    stem = f"arbor-conversation-{conversation.pk}"
    if export_format == "md":
        response = HttpResponse(markdown.export_markdown(conversation), content_type="text/markdown; charset=utf-8")
        name = f"{stem}.md"
    elif export_format == "json":
        response = HttpResponse(json.dumps(arbor_tree.export_tree(conversation), ensure_ascii=False),
                                content_type="application/json")
        name = f"{stem}.json"
    elif export_format == "chatgpt":
        response = HttpResponse(json.dumps([chatgpt.export_chatgpt(conversation)], ensure_ascii=False),
                                content_type="application/json")
        name = "conversations.json"
    else:
        raise BadInput(f"`format` must be one of {', '.join(EXPORT_FORMATS)}.")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


class ConversationExport(APIView):
    def perform_content_negotiation(self, request, force=False):
        # `?format=` names the export here, not one of DRF's renderers.
        return JSONRenderer(), JSONRenderer.media_type

    @extend_schema(parameters=[OpenApiParameter("format", str, enum=list(EXPORT_FORMATS), default="json")],
                   responses={
                       (200, "application/json"): OpenApiResponse(
                           {"oneOf": [{"type": "object"}, {"type": "array", "items": {"type": "object"}}]},
                           description="json: the whole tree (an object; imports back losslessly); chatgpt: "
                                       "conversations.json (an array)"),
                       (200, "text/markdown"): OpenApiResponse({"type": "string"},
                                                               description="md: the current path as Markdown"),
                       400: OpenApiResponse(description="bad_input: an unknown `format`"),
                   })
    def get(self, request: Request, conversation_id: int) -> HttpResponse:
        conversation = conversation_for_user(user=request.user, conversation_id=conversation_id)
        return export_response(conversation, request.query_params.get("format", "json"))


def read_upload(stream) -> bytes:
    """Read at most one byte past the limit, so an oversized upload is refused without holding all of it."""
    return stream.read(settings.ARBOR_IMPORT_MAX_BYTES + 1)


class ConversationImport(APIView):
    schema = FileBodySchema()

    @extend_schema(request={"application/json": IMPORT_REQUEST},
                   responses={201: s.ImportOut,
                              400: OpenApiResponse(description="import_refused: nothing in the file could be read "
                                                               "(or it is no JSON); nothing was created"),
                              413: OpenApiResponse(description="too_large: the file is over the import limit")},
                   description="Import an export file: the body is the file itself, whatever its Content-Type. "
                               "Today a file with an entry that cannot be read is refused whole, so `skipped` "
                               "is empty.")
    def post(self, request: Request) -> Response:
        document = importing.parse(read_upload(request._request))
        created = importing.import_any(owner=request.user, document=document)
        return Response({"conversations": s.ConversationOut(created, many=True).data, "skipped": []},
                        status=status.HTTP_201_CREATED)
