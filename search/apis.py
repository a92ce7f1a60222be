from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from config.errors import ArborError, BadInput
from config.replica import reads_may_lag
from conversations.llm import LLMError
from conversations.models import Conversation
from conversations.selectors import project_for_user
from search.query import MAX_QUERY_CHARS, search_bubbles
from search.similar import QUERY_TIMEOUT_SECONDS, similar_bubbles

# What search_bubbles reads: no control character, and something besides white space (str.isspace()).
QUERY_PATTERN = ("^[^\\x00-\\x1f]*[^\\x00-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]"
                 "[^\\x00-\\x1f]*$")


MODES = ("words", "similar")


class HitOut(serializers.Serializer):
    bubble = serializers.IntegerField()
    node = serializers.IntegerField()
    role = serializers.CharField()
    conversation = serializers.IntegerField()
    conversation_title = serializers.CharField()
    rank = serializers.FloatField(help_text="words: the database's text rank; similar: cosine similarity")
    snippet = serializers.CharField(help_text="escaped text; matched words inside <mark> (words)")
    on_current_path = serializers.BooleanField(help_text="false: on another branch; POST switch with `node` opens it")


class SearchOut(serializers.Serializer):
    results = HitOut(many=True)


class Search(APIView):
    @extend_schema(parameters=[OpenApiParameter(
                       "q", {"type": "string", "maxLength": MAX_QUERY_CHARS, "pattern": QUERY_PATTERN}, required=True,
                       description="words to find"),
                               OpenApiParameter("mode", {"type": "string", "enum": list(MODES), "default": "words"},
                                                description="words: full-text matches; similar: messages nearest "
                                                            "in meaning (the embedding model's vectors)"),
                               OpenApiParameter("project", {"type": "integer", "minimum": 1,
                                                            "maximum": 2**63 - 1},
                                                description="only the caller's conversations in this project (issue "
                                                            "30)")],
                   responses={200: SearchOut,
                              400: OpenApiResponse(description="bad_input: an empty, too long or unknown `q` or "
                                                               "`mode`, or a `project` that is no project id"),
                              404: OpenApiResponse(description="not_found: no such project of the caller's"),
                              503: OpenApiResponse(description="embedding_unavailable (mode=similar): the embedding "
                                                               "model failed, or none is set")},
                   description="Search over the caller's own conversations, every branch: word matches, or "
                               "similar messages.")
    def get(self, request: Request) -> Response:
        mode = request.query_params.get("mode", "words")
        if mode not in MODES:
            raise BadInput(f"`mode` must be one of {', '.join(MODES)}.")
        query = request.query_params.get("q", "")
        project = request.query_params.get("project")
        if project is not None and not (project.isascii() and project.isdigit()):  # the schema's integer
            raise BadInput("`project` must be the id of one of your projects; leave it out to search them all.",
                           param="project")
        if project is not None:  # issue 30: the caller's own project (anyone else's is a 404)
            project = project_for_user(user=request.user, project_id=project).pk
        if mode == "words":
            # Issue 34: the word index may lag (a replica's); the project's ownership above was the primary's.
            hits = reads_may_lag(search_bubbles)(user=request.user, query=query, project=project or None)
        else:
            if not settings.ARBOR_EMBEDDING_MODEL:
                raise ArborError("no embedding model is set (ARBOR_EMBEDDING_MODEL): only word matches are found",
                                 code="embedding_unavailable", status=503)
            try:
                hits = similar_bubbles(user=request.user, query=query, timeout=QUERY_TIMEOUT_SECONDS)
            except LLMError as error:
                raise ArborError(f"the embedding model failed: {error.message}", code="embedding_unavailable",
                                 status=503) from error
            if project:  # the nearest of the caller's messages, kept to the project's conversations
                inside = set(Conversation.objects.filter(pk__in={h.conversation for h in hits}, project_id=project)
                             .values_list("pk", flat=True))
                hits = [hit for hit in hits if hit.conversation in inside]
        return Response({"results": HitOut(hits, many=True).data})
