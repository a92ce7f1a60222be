"""Issue 30's pages: a person's projects, each with its instructions, model, memory, knowledge files and
conversations; a new chat in a project; moving a conversation in or out. Every change goes through the same
services and input rules as the API (`ProjectIn`), so a page and a client are held to the same limits (X2)."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.views.decorators.http import require_GET, require_POST

from config.errors import BadInput
from config.web import page
from conversations import services
from conversations.apis.serializers import ProjectIn
from conversations.models import Project
from conversations.selectors import conversation_for_user, project_for_user
from conversations.web.forms import form_input
from files.models import StoredFile
from files.services import file_upload


@page
def project_list(request: HttpRequest) -> HttpResponse:
    """The person's projects; a POST makes a new one (its name) and opens it."""
    if request.method == "POST":
        data = form_input(request, ProjectIn, ("name",))
        if data is not None:
            return redirect("project-page", services.project_create(owner=request.user, **data).pk)
    projects = Project.objects.filter(owner_id=request.user.pk).order_by("name", "id")
    return render(request, "chat/projects.html", {"conversation": None, "projects": projects},
                  status=400 if request.method == "POST" else 200)


@require_GET
@page
def project_page(request: HttpRequest, project_id: int) -> HttpResponse:
    project = project_for_user(user=request.user, project_id=project_id)
    return render(request, "chat/project.html", {
        "conversation": None, "project": project,
        "conversations": project.conversations.order_by("-updated_at", "-id").only("id", "title", "updated_at"),
        "files": project.files.filter(owner_id=request.user.pk).order_by("name", "id"),
    })


@require_POST
@page
def project_update(request: HttpRequest, project_id: int) -> HttpResponse:
    """Its name, instructions, model and memory, as a form sends them."""
    project = project_for_user(user=request.user, project_id=project_id)
    data = form_input(request, ProjectIn, ("name", "instructions", "model", "memory"), partial=True)
    if data is not None:
        services.project_update(project=project, **data)
        messages.success(request, "Saved.")
    return redirect("project-page", project.pk)


@require_POST
@page
def project_new_chat(request: HttpRequest, project_id: int) -> HttpResponse:
    project = project_for_user(user=request.user, project_id=project_id)
    conversation = services.conversation_create(owner=request.user, project=project)
    return redirect("chat-conversation", conversation.pk)


@require_POST
@page
def project_file_add(request: HttpRequest, project_id: int) -> HttpResponse:
    """A knowledge file: uploaded here, it is the project's (the worker reads its text)."""
    project = project_for_user(user=request.user, project_id=project_id)
    upload = request.FILES.get("file")
    if upload is None:
        raise BadInput("Choose a file to add.")
    stored = file_upload(user=request.user, name=upload.name, data=upload.read(), project_id=project.pk)
    messages.success(request, f"Added {stored.name}; its text is read in a moment.")
    return redirect("project-page", project.pk)


@require_POST
@page
def project_file_remove(request: HttpRequest, project_id: int, file_id: int) -> HttpResponse:
    """The file leaves the project (it stays the person's, and any question that sent it keeps it)."""
    project = project_for_user(user=request.user, project_id=project_id)
    StoredFile.objects.filter(pk=file_id, owner_id=request.user.pk, project=project).update(project=None)
    return redirect("project-page", project.pk)


@require_POST
@page
def project_delete(request: HttpRequest, project_id: int) -> HttpResponse:
    """Deleted with its conversations only when the form names how many (the page asks for the number)."""
    project = project_for_user(user=request.user, project_id=project_id)
    count = services.project_delete(project=project, confirm=request.POST.get("confirm"))
    messages.success(request, f"Project deleted, with its {count} conversation{'s' if count != 1 else ''}.")
    return redirect("project-list")


@require_POST
@page
def conversation_move(request: HttpRequest, conversation_id: int) -> HttpResponse:
    """Into one of the person's projects, or out of any ("")."""
    conversation = conversation_for_user(user=request.user, conversation_id=conversation_id)
    chosen = request.POST.get("project", "")
    project = project_for_user(user=request.user, project_id=chosen) if chosen else None
    services.conversation_update(conversation=conversation, project=project)
    messages.success(request, f"Moved into {project.name}." if project else "Moved out of its project.")
    return redirect("chat-conversation", conversation.pk)


urlpatterns = [
    path("projects/", project_list, name="project-list"),
    path("projects/<int:project_id>/", project_page, name="project-page"),
    path("projects/<int:project_id>/update/", project_update, name="project-update"),
    path("projects/<int:project_id>/new-chat/", project_new_chat, name="project-new-chat"),
    path("projects/<int:project_id>/files/", project_file_add, name="project-file-add"),
    path("projects/<int:project_id>/files/<int:file_id>/remove/", project_file_remove, name="project-file-remove"),
    path("projects/<int:project_id>/delete/", project_delete, name="project-delete"),
    path("chat/<int:conversation_id>/move/", conversation_move, name="chat-move"),
]
