"""Export and import over the API (issue 7): each format lives in conversations.transfer."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import closing
from functools import partial

from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.db import connections
from django.http import HttpRequest, StreamingHttpResponse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from config.errors import BadInput
from conversations.apis import serializers as s
from conversations.apis.schema import IMPORT_REQUEST, FileBodySchema
from conversations.selectors import conversation_for_user, project_for_user
from conversations.transfer import arbor_tree, chatgpt, importing, markdown, project_file

EXPORT_FORMATS = ("md", "json", "chatgpt")


_FORMATS = {  # format: (the text in parts, content type, file name; {stem} is the conversation's)
    "md": (markdown.markdown_chunks, "text/markdown; charset=utf-8", "{stem}.md"),
    "json": (arbor_tree.tree_chunks, "application/json", "{stem}.json"),
    "chatgpt": (chatgpt.chatgpt_chunks, "application/json", "conversations.json"),
}


def export_response(conversation, export_format: str, request: HttpRequest | None = None) -> StreamingHttpResponse:
    """The export as a download: Markdown of the current path, or the whole tree as JSON. Its body is made while
    it is sent, a chunk of nodes at a time (issue 13), so no export holds a conversation in memory."""
    if export_format not in _FORMATS:
        raise BadInput(f"`format` must be one of {', '.join(EXPORT_FORMATS)}.")
    chunks, content_type, name = _FORMATS[export_format]
    return _download(partial(chunks, conversation), content_type, name.format(stem=f"arbor-conversation-"
                                                                                  f"{conversation.pk}"), request)


def _download(produce: Callable[[], Iterator[str]], content_type: str, name: str,
              request: HttpRequest | None) -> StreamingHttpResponse:
    """`produce()`'s parts as a download, made as they are sent (`produce` starts where the body is read)."""
    body = _from_a_thread(produce) if isinstance(request, ASGIRequest) else produce()
    response = StreamingHttpResponse(body, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


_END = object()
_HANDOVER_SECONDS = 0.5


async def _from_a_thread(produce: Callable[[], Iterator[str]]) -> AsyncIterator[bytes]:
    """The parts `produce()` makes, made in a thread of its own and handed over a small queue.

    Under ASGI, Django reads a synchronous body whole into memory before sending it (it cannot block the event
    loop on it): this one goes out as it is made, with a few parts in memory. A client that leaves stops the
    thread at its next part; the thread closes its database connections when it ends.
    """
    parts: queue.Queue = queue.Queue(maxsize=4)
    left = threading.Event()

    def hand_over(item) -> bool:
        while not left.is_set():
            try:
                parts.put(item, timeout=_HANDOVER_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            with closing(produce()) as made:
                for part in made:
                    if not hand_over(part.encode()):
                        return
            hand_over(_END)
        except Exception as error:  # the reader raises it where the response is being sent
            hand_over(error)
        finally:
            connections.close_all()

    threading.Thread(target=run, name="arbor-export", daemon=True).start()
    try:
        while True:
            try:
                part = await asyncio.to_thread(parts.get, True, _HANDOVER_SECONDS)
            except queue.Empty:
                continue
            if part is _END:
                return
            if isinstance(part, Exception):
                raise part
            yield part
    finally:
        left.set()


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
    def get(self, request: Request, conversation_id: int) -> StreamingHttpResponse:
        conversation = conversation_for_user(user=request.user, conversation_id=conversation_id)
        return export_response(conversation, request.query_params.get("format", "json"), request._request)


class ProjectExport(APIView):
    def perform_content_negotiation(self, request, force=False):
        return JSONRenderer(), JSONRenderer.media_type

    @extend_schema(responses={(200, "application/json"): OpenApiResponse(
        {"type": "object"}, description="the project with its knowledge files and every conversation's whole tree "
                                        "(imports back as a new project)")})
    def get(self, request: Request, project_id: int) -> StreamingHttpResponse:
        """Issue 30: the project as one file."""
        project = project_for_user(user=request.user, project_id=project_id)
        return _download(partial(project_file.project_chunks, project), "application/json",
                         f"arbor-project-{project.pk}.json", request._request)


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
                               "An entry that cannot be read is skipped and named in `skipped` (its index in "
                               "the file and why); the others import.")
    def post(self, request: Request) -> Response:
        document = importing.parse(read_upload(request._request))
        imported = importing.import_any(owner=request.user, document=document)
        made = {"conversations": s.ConversationOut(imported.conversations, many=True).data,
                "skipped": imported.skipped}
        if imported.project is not None:
            made["project"] = imported.project.pk
        return Response(made, status=status.HTTP_201_CREATED)
