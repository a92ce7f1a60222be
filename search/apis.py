from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from search.query import MAX_QUERY_CHARS, search_bubbles

# What search_bubbles reads: no control character, and something besides white space (str.isspace()).
QUERY_PATTERN = ("^[^\\x00-\\x1f]*[^\\x00-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]"
                 "[^\\x00-\\x1f]*$")


class HitOut(serializers.Serializer):
    bubble = serializers.IntegerField()
    node = serializers.IntegerField()
    role = serializers.CharField()
    conversation = serializers.IntegerField()
    conversation_title = serializers.CharField()
    rank = serializers.FloatField()
    snippet = serializers.CharField(help_text="escaped text; matched words inside <mark>")
    on_current_path = serializers.BooleanField(help_text="false: on another branch; POST switch with `node` opens it")


class SearchOut(serializers.Serializer):
    results = HitOut(many=True)


class Search(APIView):
    @extend_schema(parameters=[OpenApiParameter(
                       "q", {"type": "string", "maxLength": MAX_QUERY_CHARS, "pattern": QUERY_PATTERN}, required=True,
                       description="words to find")],
                   responses=SearchOut,
                   description="Full-text search over the caller's own conversations, every branch.")
    def get(self, request: Request) -> Response:
        hits = search_bubbles(user=request.user, query=request.query_params.get("q", ""))
        return Response({"results": HitOut(hits, many=True).data})
