"""The share API (issue 33, X5): one small view per operation; views parse, call a service and shape the answer."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from config.api import valid_input
from config.schema import PaginatedList
from shares import serializers as s
from shares import services
from shares.selectors import share_list


class ShareCreate(APIView):
    @extend_schema(request=s.ShareIn, responses={
        201: s.ShareCreatedOut,
        400: OpenApiResponse(description="bad_input: `node` is no node id, no answer (a node a head may rest on), "
                                         "or the conversation has no head to share"),
        404: OpenApiResponse(description="not_found: no such conversation of yours, or no such node in it")},
        description="Issue 33 (X5): a read-only snapshot page of the path that ends at `node` (default: the head), "
                    "for anyone holding its URL. Later turns never show on it; nothing is copied.")
    def post(self, request: Request, conversation_id: int) -> Response:
        data = valid_input(s.ShareIn, request)
        share, token = services.share_create(user=request.user, conversation_id=conversation_id,
                                             node=data.get("node"))
        body = {"token": token, "url": s.share_url(request, token)}
        return Response(s.ShareCreatedOut(body).data, status=status.HTTP_201_CREATED)


class ShareList(PaginatedList, APIView):
    @extend_schema(responses=s.ShareOut(many=True), description="The caller's shares, newest first.")
    def get(self, request: Request) -> Response:
        paginator = api_settings.DEFAULT_PAGINATION_CLASS()
        page = paginator.paginate_queryset(share_list(user=request.user), request, view=self)
        return paginator.get_paginated_response(s.ShareOut(page, many=True, context={"request": request}).data)


class ShareDetail(APIView):
    @extend_schema(responses={204: None, 404: OpenApiResponse(description="not_found: no such share of yours")},
                   description="Revoke a share: its page is a 404 from now on.")
    def delete(self, request: Request, token: str) -> Response:
        services.share_revoke(user=request.user, token=token)
        return Response(status=status.HTTP_204_NO_CONTENT)
