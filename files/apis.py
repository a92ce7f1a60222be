"""The files API (issue 29, X1): one small view per operation; views parse, call a service and shape the answer."""

from __future__ import annotations

from django.conf import settings
from django.core.files.storage import default_storage
from django.http import FileResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from config.api import paginated
from config.schema import PaginatedList
from files import services
from files.models import StoredFile
from files.serializers import FileIn, FileOut

_NOT_YOURS = OpenApiResponse(description="not_found: no such file of yours")


class FileListCreate(PaginatedList, APIView):
    parser_classes = [MultiPartParser]

    @extend_schema(request={"multipart/form-data": FileIn}, responses={
        201: FileOut,
        400: OpenApiResponse(description="bad_input: no `file` part"),
        404: OpenApiResponse(description="not_found: no such project of yours"),
        413: OpenApiResponse(description="too_large: past ARBOR_FILE_MAX_BYTES; nothing is stored"),
        415: OpenApiResponse(description="unsupported_file: bytes that are no image, PDF, Office document or text")},
        description="Keep a file. Its type is read from its bytes, never from its name. An image is `ready` at "
                    "once; a document is `processing` until the worker has read its text, then `ready` or "
                    "`failed` (with `error`).")
    def post(self, request: Request) -> Response:
        if int(request.META.get("CONTENT_LENGTH") or 0) > settings.ARBOR_FILE_MAX_BYTES + 64 * 1024:
            raise services.too_large()  # refused before the body is read
        data = FileIn(data=request.data)
        if not data.is_valid():
            raise ValidationError(data.errors)
        upload = data.validated_data["file"]
        if upload.size > settings.ARBOR_FILE_MAX_BYTES:
            raise services.too_large()
        stored = services.file_upload(user=request.user, name=upload.name, data=upload.read(),
                                      project_id=data.validated_data.get("project"))
        return Response(FileOut(stored).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses=FileOut(many=True), description="The caller's files, newest first.")
    def get(self, request: Request) -> Response:
        files = StoredFile.objects.filter(owner=request.user).order_by("-created_at", "-id")
        return paginated(self, request, files, FileOut)


class FileDetail(APIView):
    @extend_schema(responses={200: FileOut, 404: _NOT_YOURS})
    def get(self, request: Request, file_id: int) -> Response:
        return Response(FileOut(services.file_for_user(user=request.user, file_id=file_id)).data)

    @extend_schema(responses={204: None, 404: _NOT_YOURS,
                              409: OpenApiResponse(description="file_in_use: a conversation sent it (X1)")})
    def delete(self, request: Request, file_id: int) -> Response:
        services.file_delete(user=request.user, file_id=file_id)
        return Response(status=status.HTTP_204_NO_CONTENT)


class FileContent(APIView):
    @extend_schema(responses={(200, "*/*"): OpenApiResponse(description="the file's bytes, as their sniffed type"),
                              404: _NOT_YOURS},
                   description="The bytes, to their owner only, always as an attachment: never shown inline as a "
                               "page (an HTML or SVG file cannot run as this site).")
    def get(self, request: Request, file_id: int) -> FileResponse:
        stored = services.file_for_user(user=request.user, file_id=file_id)
        response = FileResponse(default_storage.open(stored.blob.name, "rb"), as_attachment=True,
                                filename=stored.name, content_type=stored.content_type)
        response["X-Content-Type-Options"] = "nosniff"
        response["Content-Security-Policy"] = "default-src 'none'; sandbox"
        return response
