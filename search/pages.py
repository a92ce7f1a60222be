from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import path
from django.views.decorators.http import require_GET

from config.web import page
from search.query import search_bubbles


@require_GET
@page
def search(request: HttpRequest) -> HttpResponse:
    query = request.GET.get("q", "")
    hits = search_bubbles(user=request.user, query=query) if query.strip() else []
    return render(request, "search/results.html", {"conversation": None, "query": query, "hits": hits})


urlpatterns = [path("search/", search, name="search")]
