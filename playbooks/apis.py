"""The playbook API: one small view per operation; views parse, call a service and shape the answer."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from config.api import valid_input
from config.schema import PaginatedList
from conversations.apis.serializers import ConversationOut
from playbooks import serializers as s
from playbooks import services
from playbooks.selectors import playbook_for_user, playbook_list, run_for_user, run_list, run_view

_CONVERSION_RESPONSES = {
    201: s.PlaybookDetailOut,
    400: OpenApiResponse(description="bad input, or a conversation with no head"),
    404: OpenApiResponse(description="not found or not yours"),
    409: OpenApiResponse(description="turn_in_progress: a turn holds the conversation"),
    413: OpenApiResponse(description="too_large: the next try cannot fit the model's input limit, so it was not "
                                     "sent; `nodes` holds the tries made so far, all recorded"),
    422: OpenApiResponse(description="playbook_invalid: still invalid after the last try; `errors` holds the "
                                     "last validation errors and `nodes` every try, all recorded (P1)"),
    502: OpenApiResponse(description="the model provider failed; `node` is the failed try and `nodes` every try, "
                                     "all recorded"),
    503: OpenApiResponse(description="the provider timed out or is rate limited"),
}


class PlaybookConvert(APIView):
    @extend_schema(request=None, responses=_CONVERSION_RESPONSES,
                   description="P1, P2: draft a playbook from the conversation's whole context, validate it, "
                               "retry with the errors; the head never moves.")
    def post(self, request: Request, conversation_id: int) -> Response:
        playbook = services.playbook_convert(user=request.user, conversation_id=conversation_id)
        return Response(s.PlaybookDetailOut(playbook).data, status=status.HTTP_201_CREATED)


class PlaybookList(PaginatedList, APIView):
    @extend_schema(responses=s.PlaybookOut(many=True))
    def get(self, request: Request) -> Response:
        paginator = api_settings.DEFAULT_PAGINATION_CLASS()
        page = paginator.paginate_queryset(playbook_list(user=request.user), request, view=self)
        return paginator.get_paginated_response(s.PlaybookOut(page, many=True).data)


class PlaybookDetail(APIView):
    @extend_schema(responses={200: s.PlaybookDetailOut, 404: OpenApiResponse(description="not found or not yours")})
    def get(self, request: Request, playbook_id: int) -> Response:
        playbook = playbook_for_user(user=request.user, playbook_id=playbook_id)
        return Response(s.PlaybookDetailOut(playbook).data)


class PlaybookEditConversation(APIView):
    @extend_schema(request=None, responses={201: ConversationOut,
                                            404: OpenApiResponse(description="not found or not yours")},
                   description="P3: a new conversation whose head is the head the current version came from "
                               "(the source head at first); nothing is copied.")
    def post(self, request: Request, playbook_id: int) -> Response:
        conversation = services.playbook_edit_conversation(user=request.user, playbook_id=playbook_id)
        return Response(ConversationOut(conversation).data, status=status.HTTP_201_CREATED)


class PlaybookSave(APIView):
    @extend_schema(request=None, responses={**_CONVERSION_RESPONSES, 201: s.PlaybookDetailOut},
                   description="P3: convert the playbook's edit conversation into its next version.")
    def post(self, request: Request, playbook_id: int) -> Response:
        playbook = services.playbook_save(user=request.user, playbook_id=playbook_id)
        return Response(s.PlaybookDetailOut(playbook).data, status=status.HTTP_201_CREATED)


class PlaybookRunCreate(PaginatedList, APIView):
    @extend_schema(request=s.RunIn, responses={
        201: s.RunOut,
        400: OpenApiResponse(description="bad parameter values; the message names each parameter"),
        404: OpenApiResponse(description="not found or not yours"),
    }, description="Run the current version with parameter values in a new conversation, through the one turn "
                   "runner. `status` is `done`, `approval_required` (a tool waits for a person, F3: decide in "
                   "the run's conversation) or `failed` (its node is recorded, F1).")
    def post(self, request: Request, playbook_id: int) -> Response:
        data = valid_input(s.RunIn, request)
        result = services.playbook_run(user=request.user, playbook_id=playbook_id, values=data["values"])
        view = run_view(result.run)
        if result.error:  # the turn's own account of its failure (e.g. round_limit) says more than the node
            view.error = result.error
        return Response(s.RunOut(view).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={200: s.RunListOut(many=True), 404: OpenApiResponse(description="not found or not "
                                                                                            "yours")},
                   description="The playbook's runs, newest first (paginated); each run's state is at its own "
                               "path.")
    def get(self, request: Request, playbook_id: int) -> Response:
        playbook = playbook_for_user(user=request.user, playbook_id=playbook_id)
        paginator = api_settings.DEFAULT_PAGINATION_CLASS()
        page = paginator.paginate_queryset(run_list(playbook=playbook), request, view=self)
        return paginator.get_paginated_response(s.RunListOut(page, many=True).data)


class PlaybookRunDetail(APIView):
    @extend_schema(responses={200: s.RunOut, 404: OpenApiResponse(description="not found or not yours")},
                   description="One run as it stands now, read from its conversation: a run paused for approval "
                               "shows its latest state once decided.")
    def get(self, request: Request, playbook_id: int, run_id: int) -> Response:
        run = run_for_user(user=request.user, playbook_id=playbook_id, run_id=run_id)
        return Response(s.RunOut(run_view(run)).data)
