"""Server-rendered playbook pages: list, detail, run form and run result, and the chat page's convert button.

They read through selectors and change things through `playbooks.services`, like the API. A run is
one turn of the one turn runner, run to its end within the request (the run page has no socket);
its conversation opens in the chat, where a tool waiting for approval (F3) is decided.
"""

from __future__ import annotations

import re
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path, reverse
from django.views.decorators.http import require_GET, require_POST

from config.api import INT64_MAX, INT64_MIN
from config.errors import BadInput
from config.web import page, progress_response, wants_progress
from conversations.screen import path_bubbles
from playbooks import services
from playbooks.models import PlaybookRun
from playbooks.selectors import conversion_chains, playbook_for_user, playbook_list, playbook_versions, run_view

_INTEGER = re.compile(r"^[+-]?\d+$")


def _typed(kind: str, raw: str) -> Any:
    """A form's text as the parameter's type; text that does not fit stays text, for the check to name."""
    if kind == "integer" and _INTEGER.match(raw) and _int64(raw) is not None:
        return int(raw)
    if kind == "number":
        try:
            return float(raw)
        except ValueError:
            return raw
    return raw


def _int64(raw: str) -> int | None:
    """The integer a form's digits spell if a database integer can hold it (int() refuses 4300+ digits)."""
    return number if len(raw) <= 20 and INT64_MIN <= (number := int(raw)) <= INT64_MAX else None


def form_problems(parameters: list[dict[str, Any]], data) -> list[str]:
    """What no run can store, named as the value checks name theirs: a NUL character (PostgreSQL text holds
    none) or an integer past 64 bits. The API's JSON parser refuses the same in a body, in the same words."""
    problems = []
    for parameter in parameters:
        name, raw = parameter["name"], data.get(parameter["name"], "").strip()
        if parameter["type"] == "boolean":  # only whether it is "on" is read
            continue
        if "\x00" in raw:
            problems.append(f"{name}: a NUL character (\\u0000) cannot be stored")
        elif parameter["type"] == "integer" and _INTEGER.match(raw) and _int64(raw) is None:
            problems.append(f"{name}: expected a whole number from {INT64_MIN} to {INT64_MAX}")
    return problems


def form_values(parameters: list[dict[str, Any]], data) -> dict[str, Any]:
    """The values a run form sent: an empty field takes the default; a checkbox is absent when off."""
    values: dict[str, Any] = {}
    for parameter in parameters:
        name = parameter["name"]
        if parameter["type"] == "boolean":
            values[name] = data.get(name) == "on"
        elif data.get(name, "").strip():
            values[name] = _typed(parameter["type"], data[name].strip())
    return values


@require_GET
@page
def playbook_list_page(request: HttpRequest) -> HttpResponse:
    context = {"conversation": None, "playbooks": playbook_list(user=request.user)}
    return render(request, "playbooks/list.html", context)


@require_GET
@page
def playbook_detail_page(request: HttpRequest, playbook_id: int) -> HttpResponse:
    playbook = playbook_for_user(user=request.user, playbook_id=playbook_id)
    listed = playbook_versions(playbook)
    chains = conversion_chains(v.conversion_node_id for v in listed)
    versions = [{"version": v, "tries": chains[v.conversion_node_id]} for v in listed]
    context = {"conversation": None, "playbook": playbook, "definition": playbook.definition,
               "versions": versions, "runs": playbook.runs.select_related("conversation")[:10]}
    return render(request, "playbooks/detail.html", context)


@require_POST
@page
def playbook_convert_page(request: HttpRequest, conversation_id: int) -> HttpResponse:
    """The chat page's "Convert to playbook" (P1, P2): the chat stays where it was.

    Still invalid after the last try (PlaybookInvalid), `page` shows the last errors back on the chat. The page's
    script watches it as it goes (each try, the draft as it is written): `progress_response`.
    """
    if wants_progress(request):
        def convert(report) -> dict:
            made = services.playbook_convert(user=request.user, conversation_id=conversation_id, progress=report)
            return {"url": reverse("playbook-page-detail", args=[made.pk]), "name": made.name}
        return progress_response(convert)
    playbook = services.playbook_convert(user=request.user, conversation_id=conversation_id)
    messages.success(request, f"Playbook “{playbook.name}” made from this conversation.")
    return redirect("playbook-page-detail", playbook.pk)


@require_POST
@page
def playbook_edit_page(request: HttpRequest, playbook_id: int) -> HttpResponse:
    """P3: open a new edit conversation on the playbook's history and go there to chat."""
    conversation = services.playbook_edit_conversation(user=request.user, playbook_id=playbook_id)
    messages.success(request, "This conversation continues from the playbook's conversation. Chat to change the "
                              "playbook, then save it from the playbook's page.")
    return redirect("chat-conversation", conversation.pk)


@require_POST
@page
def playbook_save_page(request: HttpRequest, playbook_id: int) -> HttpResponse:
    """P3: convert the edit conversation into the next version (errors come back as a message, by `page`)."""
    if wants_progress(request):
        def save(report) -> dict:
            saved = services.playbook_save(user=request.user, playbook_id=playbook_id, progress=report)
            return {"url": reverse("playbook-page-detail", args=[saved.pk]), "name": saved.name}
        return progress_response(save)
    playbook = services.playbook_save(user=request.user, playbook_id=playbook_id)
    messages.success(request, f"Saved as version {playbook.versions.count()}.")
    return redirect("playbook-page-detail", playbook.pk)


@page
def playbook_run_page(request: HttpRequest, playbook_id: int) -> HttpResponse:
    """One input per parameter; a good run goes to its result, bad values come back named."""
    playbook = playbook_for_user(user=request.user, playbook_id=playbook_id)
    parameters = playbook.definition["parameters"]
    errors: list[str] = []
    submitted: dict[str, Any] = {}
    if request.method == "POST":
        submitted = form_values(parameters, request.POST)
        errors = form_problems(parameters, request.POST)
        if not errors and wants_progress(request):
            def run(report) -> dict:
                result = services.playbook_run(user=request.user, playbook_id=playbook.pk, values=submitted,
                                               progress=report)
                return {"url": reverse("playbook-page-run-detail", args=[playbook.pk, result.run.pk]),
                        "status": result.status}
            return progress_response(run)
        if not errors:
            try:
                result = services.playbook_run(user=request.user, playbook_id=playbook.pk, values=submitted)
            except BadInput as error:
                errors = error.extra.get("errors") or [error.message]
            else:
                return redirect("playbook-page-run-detail", playbook.pk, result.run.pk)
    fields = [{**p, "value": submitted.get(p["name"], p.get("default", ""))} for p in parameters]
    context = {"conversation": None, "playbook": playbook, "fields": fields, "errors": errors}
    return render(request, "playbooks/run.html", context, status=400 if errors else 200)


@require_GET
@page
def playbook_run_detail_page(request: HttpRequest, playbook_id: int, run_id: int) -> HttpResponse:
    playbook = playbook_for_user(user=request.user, playbook_id=playbook_id)
    run = get_object_or_404(PlaybookRun.objects.select_related("conversation"), pk=run_id, playbook=playbook)
    bubbles = [view.bubble for view in path_bubbles(conversation=run.conversation)] if run.conversation else []
    waiting = any(b.role == "tool" and b.data.get("status") == "awaiting_approval" for b in bubbles)
    context = {"conversation": None, "playbook": playbook, "run": run, "bubbles": bubbles,
               "waiting": waiting, "view": run_view(run)}
    return render(request, "playbooks/run_detail.html", context)


urlpatterns = [
    path("", playbook_list_page, name="playbook-page-list"),
    path("<int:playbook_id>/", playbook_detail_page, name="playbook-page-detail"),
    path("from-conversation/<int:conversation_id>/", playbook_convert_page,
         name="playbook-page-convert"),
    path("<int:playbook_id>/edit/", playbook_edit_page, name="playbook-page-edit"),
    path("<int:playbook_id>/save/", playbook_save_page, name="playbook-page-save"),
    path("<int:playbook_id>/run/", playbook_run_page, name="playbook-page-run"),
    path("<int:playbook_id>/runs/<int:run_id>/", playbook_run_detail_page, name="playbook-page-run-detail"),
]
