from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import path
from django.views.decorators.http import require_GET

from config.replica import reads_may_lag
from config.web import page
from conversations.llm import LLMError
from search.query import search_bubbles
from search.similar import QUERY_TIMEOUT_SECONDS, similar_bubbles

SIMILAR_SHOWN = 10

logger = logging.getLogger("arbor.search")


@require_GET
@page
def search(request: HttpRequest) -> HttpResponse:
    """Word matches, and beside them similar messages (nearest in meaning) the word matches did not show."""
    query = request.GET.get("q", "")
    hits, similar, similar_failed = [], [], False
    if query.strip():
        hits = reads_may_lag(search_bubbles)(user=request.user, query=query)  # issue 34: a replica's may lag
        try:
            shown = {hit.bubble for hit in hits}
            similar = [h for h in similar_bubbles(user=request.user, query=query, limit=SIMILAR_SHOWN + len(shown),
                                                  timeout=QUERY_TIMEOUT_SECONDS) if h.bubble not in shown]
            similar = similar[:SIMILAR_SHOWN]
        except LLMError as error:  # the word matches still show
            logger.warning("similar messages failed: %r", error)
            similar_failed = True
    return render(request, "search/results.html", {"conversation": None, "query": query, "hits": hits,
                                                   "similar": similar, "similar_failed": similar_failed})


urlpatterns = [path("search/", search, name="search")]
