"""Server-rendered chat pages (issue 3).

The pages read through selectors and change things through services; a turn (ask, edit, regenerate,
retry, approve) runs only over the chat WebSocket (`consumer.py`), which calls the one turn runner.
Nothing here assembles context, runs a turn or moves a head its own way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from config.errors import ArborError, BadInput, NotFound
from config.web import page
from conversations import services, usage
from conversations.apis.paging import cursor_token, decode_cursor, page_nodes
from conversations.apis.serializers import ConversationIn, PreferencesIn
from conversations.apis.transfer import read_upload
from conversations.models import Conversation, Node
from conversations.screen import BubblePage, Message, branch_infos, bubbles_after, bubbles_before, latest_bubbles
from conversations.selectors import (
    conversation_for_user,
    conversation_has_node,
    conversation_list,
    latest_tip,
    node_for_user,
    screen_history,
    user_instructions,
)
from conversations.tools import catalog
from conversations.transfer import importing
from conversations.turns.seen import call_context, context_diff
from conversations.turns.start import turn_compact
from conversations.web.forms import form_input
from conversations.web.markdown import render_markdown
from conversations.web.shell import SIDEBAR_SHOWS

# --- what a page shows --------------------------------------------------------------------------------


def _messages(conversation: Conversation, page: BubblePage) -> list[Message]:
    return [Message(bubble=view.bubble, branch=view.branch, is_head=view.bubble.node_id == conversation.head_id,
                    editable=view.editable) for view in page.views]


def _earlier(conversation: Conversation, page: BubblePage) -> str | None:
    """The signed cursor of the page before this one (issue 13), if there is one: it names the page's first node,
    so the earlier page is that node's own history, whatever the head does meanwhile."""
    if not page.has_before or page.first is None:
        return None
    return cursor_token({"t": page.tip, "b": page.first, "s": page.sealed}, scope=f"screen.{conversation.pk}")


def _overflow_notice(conversation: Conversation) -> dict[str, Any] | None:
    """F2 leaves an overflowed call off the path; if it is the newest thing tried, the page says so and shows
    the question it did not send, so its text can be shortened and sent again."""
    newest = (Node.objects.of(conversation).filter(parent_id=conversation.head_id, kind=Node.Kind.TURN)
              .order_by("-id").only("id", "status", "failure_reason", "sent").first())
    if newest and newest.failure_reason == Node.FailureReason.CONTEXT_OVERFLOW:
        return {"node": newest, "question": "\n\n".join(i["text"] for i in newest.sent if i.get("type") == "user")}
    return None


def _bubbles_context(conversation: Conversation) -> dict[str, Any]:
    """The end of the history (ARBOR_SCREEN_NODES nodes): a long conversation's screen costs what it shows; the
    earlier pages come one at a time (`chat_earlier`)."""
    page = latest_bubbles(conversation=conversation, tip=conversation.head_id, size=settings.ARBOR_SCREEN_NODES)
    return {"conversation": conversation, "bubbles": _messages(conversation, page),
            "earlier": _earlier(conversation, page), "overflow": _overflow_notice(conversation),
            "turn_running": conversation.turn_running or _cut_off(conversation)}


def _cut_off(conversation: Conversation) -> bool:
    """A turn call still pending with nobody holding the lock: its process went away (a restart) and recovery has
    not marked it yet. The page keeps looking until it is marked interrupted, with its text and Retry (issue
    26: an open page stayed on "the answer goes on")."""
    return Node.objects.of(conversation).filter(kind=Node.Kind.TURN, status=Node.Status.PENDING).exists()


# --- views -------------------------------------------------------------------------------------------


def home(request: HttpRequest) -> HttpResponse:
    """A person lands in the chat, or signs in first (issue 26: `/` was a page written for developers; its links
    to the API documentation and the admin are on the sign-in page now)."""
    if request.user.is_authenticated:
        return redirect("chat")
    return redirect(f"{reverse('login')}?next={reverse('chat')}")


@require_GET
@page
def chat(request: HttpRequest) -> HttpResponse:
    """The newest conversation, or an empty page that offers a new one."""
    newest = conversation_list(user=request.user).only("id").first()
    if newest:
        return redirect("chat-conversation", newest.pk)
    return render(request, "chat/empty.html", {"conversation": None})


@require_POST
@page
def chat_new(request: HttpRequest) -> HttpResponse:
    """Open a new chat; an untouched empty one is reused rather than piling up."""
    newest = conversation_list(user=request.user).first()
    if newest and newest.head_id is None and not newest.title and not newest.created_nodes.exists():
        return redirect("chat-conversation", newest.pk)
    conversation = services.conversation_create(owner=request.user)
    return redirect("chat-conversation", conversation.pk)


@require_GET
@page
def chat_conversation(request: HttpRequest, conversation_id: int) -> HttpResponse:
    conversation = conversation_for_user(user=request.user, conversation_id=conversation_id)
    # Opened afresh (from the sidebar, a link, a bookmark), a conversation opens on its starred branch; the page
    # reloading itself (after a rename, a no-script ◀ / ▶) stays where the person put it.
    own = reverse("chat-conversation", args=[conversation.pk])
    switched = request.session.pop(_SWITCHED, None) == conversation.pk  # a branch chosen a moment ago (search)
    if not switched and not urlparse(request.headers.get("Referer", "")).path.startswith(own):
        services.open_on_star(conversation=conversation)
    labelled = Node.objects.of(conversation).exclude(label="").exists()  # the arrows name them
    context = {"conversation": conversation, "labelled": labelled, "budget_note": usage.budget_left_note(
        request.user.pk), **_bubbles_context(conversation)}
    return render(request, "chat/conversation.html", context)


@require_GET
@page
def chat_messages(request: HttpRequest, conversation_id: int) -> HttpResponse:
    """The message list alone: the page redraws it from the server's record when a turn ends."""
    conversation = conversation_for_user(user=request.user, conversation_id=conversation_id)
    return render(request, "chat/_messages.html", _bubbles_context(conversation))


@require_GET
@page
def chat_earlier(request: HttpRequest, conversation_id: int) -> HttpResponse:
    """The page of messages before the earliest one shown (issue 13): the chat loads it when the person scrolls
    up to the top, one page of ARBOR_PAGE_NODES nodes at a time; without the fragment header, a page of its own."""
    conversation = conversation_for_user(user=request.user, conversation_id=conversation_id)
    cursor = decode_cursor(request.GET.get("cursor", ""), scope=f"screen.{conversation.pk}")
    if cursor is None or "b" not in cursor:
        raise NotFound("That link to earlier messages is not one this conversation gave out.")
    page = bubbles_before(conversation=conversation, tip=cursor["t"], before=cursor["b"], size=page_nodes(),
                          sealed=cursor["s"])
    context = {"conversation": conversation, "bubbles": _messages(conversation, page),
               "earlier": _earlier(conversation, page)}
    if request.headers.get("X-Fragment"):
        return render(request, "chat/_earlier.html", context)
    return render(request, "chat/earlier.html", context)


_SWITCHED = "arbor-switched-conversation"


@require_POST
@page
def chat_switch(request: HttpRequest, conversation_id: int) -> HttpResponse:
    """T8: show another branch (refused while a turn runs, T9)."""
    conversation = conversation_for_user(user=request.user, conversation_id=conversation_id)
    if not request.headers.get("X-Fragment"):
        services.head_switch(conversation=conversation, node_id=request.POST.get("node"))
        # The page this redirect opens shows the branch just chosen, not the star (issue 26: search's "Open its
        # branch" landed on the starred branch, the browser's Referer being the search page).
        request.session[_SWITCHED] = conversation.pk
        return redirect("chat-conversation", conversation.pk)
    # The page's script switches in place: the new message list, or the reason in plain text.
    try:
        services.head_switch(conversation=conversation, node_id=request.POST.get("node"))
    except ArborError as error:
        return HttpResponse(error.message, status=error.status, content_type="text/plain; charset=utf-8")
    return render(request, "chat/_messages.html", _bubbles_context(conversation))


def _update(request: HttpRequest, conversation: Conversation, fields: tuple[str, ...]) -> None:
    data = form_input(request, ConversationIn, fields)
    if data is not None:
        services.conversation_update(conversation=conversation, **data)
        messages.success(request, "Saved.")


@require_POST
@page
def chat_update(request: HttpRequest, conversation_id: int) -> HttpResponse:
    """Rename, pick the model, set the conversation's instructions and retrieval policy (R2)."""
    conversation = conversation_for_user(user=request.user, conversation_id=conversation_id)
    _update(request, conversation, ("title", "model", "instructions", "retrieval", "keep_retrieved"))
    return redirect("chat-conversation", conversation.pk)


@require_POST
@page
def chat_clear(request: HttpRequest, conversation_id: int) -> HttpResponse:
    """T11: the head and the bubbles go."""
    conversation = conversation_for_user(user=request.user, conversation_id=conversation_id)
    services.conversation_clear(conversation=conversation)
    messages.success(request, "Conversation cleared.")
    return redirect("chat-conversation", conversation.pk)


@require_POST
@page
def chat_fork(request: HttpRequest, conversation_id: int) -> HttpResponse:
    """Issue 33 (P3): "Fork from here": a new conversation that goes on from this answer; nothing is copied."""
    conversation = conversation_for_user(user=request.user, conversation_id=conversation_id)
    fork = services.conversation_fork(conversation=conversation, node_id=request.POST.get("node"))
    messages.success(request, "Forked: this conversation goes on from that answer; the original is unchanged.")
    return redirect("chat-conversation", fork.pk)


@require_POST
@page
def chat_compact(request: HttpRequest, conversation_id: int) -> HttpResponse:
    """C2: compact now; the head moves to a new compaction node, the history stays on screen."""
    turn_compact(user=request.user, conversation_id=conversation_id)
    messages.success(request, "Compacted: from here on the model reads a summary of the earlier messages.")
    return redirect("chat-conversation", conversation_id)


@require_POST
@page
def chat_delete(request: HttpRequest, conversation_id: int) -> HttpResponse:
    conversation = conversation_for_user(user=request.user, conversation_id=conversation_id)
    services.conversation_delete(conversation=conversation)
    messages.success(request, "Conversation deleted.")
    return redirect("chat")


@page
def chat_import(request: HttpRequest) -> HttpResponse:
    """Upload Arbor's tree export or ChatGPT's conversations.json; a refused file creates nothing."""
    if request.method == "POST":
        upload = request.FILES.get("file")
        if upload is None:
            raise BadInput("Choose a file to import.")
        imported = importing.import_any(owner=request.user, document=importing.parse(read_upload(upload)))
        created = imported.conversations
        messages.success(request, f"Imported {len(created)} conversation{'s' if len(created) != 1 else ''}.")
        for entry in imported.skipped[:10]:
            messages.warning(request, f"Skipped entry {entry['index'] + 1} of the file: {entry['error']}")
        return redirect("chat-conversation", created[0].pk)
    return render(request, "chat/import.html", {"conversation": None})


LIVE_RENDER_MAX_BYTES = 100_000  # past this an answer streams as plain text; it is rendered once it ends


@require_POST
@page
def chat_render(request: HttpRequest) -> HttpResponse:
    """A streaming answer's text so far, as sanitised HTML: the very rendering of a finished answer, so Markdown
    shows while the answer is written and nothing unsafe slips through on the way (issue 16). Off the shared
    thread (`urlpatterns`): a long answer's rendering must not hold up other pages."""
    if len(request.body) > LIVE_RENDER_MAX_BYTES:
        return HttpResponse("Too long to render while streaming.", status=413, content_type="text/plain")
    return HttpResponse(render_markdown(request.body.decode("utf-8", errors="replace")),
                        content_type="text/html; charset=utf-8")


@require_GET
@page
def chat_seen(request: HttpRequest, node_id: int) -> HttpResponse:
    """What the model saw: the exact context of the call that made `node`, from the one assembly."""
    node = node_for_user(user=request.user, node_id=node_id)
    retrieved = {item.get("text") for item in node.sent if item.get("ephemeral")}
    context = {"node": node, "usage": node.usage or {}, "settings": _shown_settings(node),
               "context": [_shown_message(message, retrieved) for message in call_context(node)]}
    if request.headers.get("X-Fragment"):
        return render(request, "chat/_seen.html", context)
    return render(request, "chat/seen.html", context)


def _shown_settings(node) -> dict[str, Any] | None:
    """What the call sent beside its messages (issue 27): each option as `name = value`, and each tool with its
    description and parameters as they went on the wire; None for a call that kept no record of it."""
    if node.call_settings_id is None:
        return None
    sent = dict(node.call_settings.settings)
    functions = [tool.get("function") or {} for tool in sent.pop("tools", [])]
    tools = [{"name": f.get("name", ""), "description": f.get("description", ""),
              "parameters": json.dumps(f.get("parameters", {}), indent=1)} for f in functions]
    return {"options": [(name, json.dumps(value)) for name, value in sorted(sent.items())], "tools": tools}


def _shown_message(message: dict[str, Any], retrieved: set[str]) -> dict[str, Any]:
    """A sent message as the panel shows it: its text (content may be a list of parts, e.g. with Anthropic's
    cache marker) and whether it is a retrieved, ephemeral item (R2)."""
    content = message.get("content")
    images = []
    if isinstance(content, list):  # an image part (X1) is shown as its file's link, the way the call got it
        images = [part["image_url"]["url"] for part in content if isinstance(part, dict)
                  and part.get("type") == "image_url" and str(part["image_url"].get("url", "")).startswith("/api/")]
        content = "\n".join(part.get("text", "") for part in content if isinstance(part, dict))
    return {**message, "text": content or "", "images": images, "retrieved": bool(content) and content in retrieved}


@dataclass(frozen=True)
class Branch:
    opener: int
    index: int
    messages: list[Message]
    more: bool = False  # the branch goes on past what is shown


def _branch(conversation: Conversation, opener: int, siblings: list[int]) -> Branch:
    """The bubbles of one branch, from its question down to the latest tip of that branch (T8): read by walking
    up from the tip (which may lie beyond a compaction, C3) no further than the question, at most
    ARBOR_SCREEN_NODES nodes of it."""
    tip = latest_tip(conversation=conversation, node_id=opener) or opener
    parent = Node.objects.filter(pk=opener).values_list("parent_id", flat=True).first()
    page = bubbles_after(conversation=conversation, tip=tip, after=parent, size=settings.ARBOR_SCREEN_NODES)
    views = page.views if page is not None else []
    start = next((i for i, v in enumerate(views) if v.bubble.node_id == opener), len(views))
    return Branch(opener=opener, index=siblings.index(opener) + 1, more=page is not None and page.has_after,
                  messages=[Message(bubble=v.bubble, branch=None, is_head=False) for v in views[start:]])


@require_GET
@page
def chat_compare(request: HttpRequest, conversation_id: int) -> HttpResponse:
    """Two branches of the same question side by side (answers to an edit or a regenerate)."""
    conversation = conversation_for_user(user=request.user, conversation_id=conversation_id)
    chosen = []
    for key in ("a", "b"):
        try:
            chosen.append(int(request.GET.get(key, "")))
        except ValueError:
            raise ArborError("Pick two answers to compare.") from None
    if not all(conversation_has_node(conversation=conversation, node_id=opener) for opener in chosen):
        raise NotFound("No such question in this conversation.")
    siblings = _siblings_of(conversation, chosen[0])
    if chosen[1] not in siblings or chosen[0] == chosen[1]:
        raise ArborError("Those two are not different branches of the same question.")
    nodes = Node.objects.in_bulk(chosen)
    diff = context_diff(nodes[chosen[0]], nodes[chosen[1]])  # issue 33: where the two contexts part
    parted = {"common": diff["common"], "sides": [[_shown_message(m, set()) for m in diff[side]] for side in "ab"]}
    context = {"conversation": conversation, "siblings": siblings, "parted": parted,
               "branches": [_branch(conversation, opener, siblings) for opener in chosen]}
    return render(request, "chat/compare.html", context)


def _siblings_of(conversation: Conversation, opener: int) -> list[int]:
    """The turns that share `opener`'s parent: its branch info, read from the history that ends at it."""
    # The question and its parent: the cost of one page's branch places.
    rows = screen_history(opener, owner=conversation.owner_id, last=1)
    info = branch_infos(conversation=conversation, path=rows[-1:], known=rows[:-1]).get(opener)
    if info is None:
        raise NotFound(f"No question node {opener} in this conversation.")
    return info.siblings


@page
def preferences(request: HttpRequest) -> HttpResponse:
    """A person's own instructions, sent before every conversation's; the tools conversations may use."""
    if request.method == "POST":
        form = PreferencesIn(data={"instructions": request.POST.get("instructions", "")})
        if form.is_valid():
            services.preferences_update(user=request.user, instructions=form.validated_data["instructions"])
            messages.success(request, "Saved. Your instructions go before every conversation's own.")
            return redirect("preferences")
        messages.error(request, "Nothing was changed. " + " ".join(map(str, form.errors.get("instructions", []))))
    context = {"conversation": None, "instructions": user_instructions(user_id=request.user.pk),
               "themes": [("", "The system's (light or dark, as the device is set)"), ("light", "Light"),
                          ("dark", "Dark")]}
    if request.method == "GET":
        context["tools"], context["tool_servers"] = catalog.listing()
    refused = request.method == "POST"  # saved ones went back above; a refused form is shown again, as a 400
    return render(request, "chat/preferences.html", context, status=400 if refused else 200)


_THEMES = {"", "light", "dark"}


@require_POST
@page
def theme(request: HttpRequest) -> HttpResponse:
    """The pages' theme, kept per person: light, dark, or "" for the system's. The page's script applies it in
    place (204); without a script the form comes back to the page it was posted from."""
    chosen = request.POST.get("theme", "")
    if chosen not in _THEMES:
        raise BadInput("The theme is light, dark, or empty for the system's.")
    services.preferences_update(user=request.user, theme=chosen)
    if request.headers.get("X-Fragment"):
        return HttpResponse(status=204)
    back = request.POST.get("next", "")
    return redirect(back if url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}) else "chat")


@require_POST
@page
def sidebar_shows(request: HttpRequest) -> HttpResponse:
    """Which conversations the sidebar lists: chats, playbook runs, API calls, or all (issue 26), kept for the
    session; the form comes back to the page it was posted from."""
    shows = request.POST.get("shows", "")
    if shows and shows not in Conversation.Origin.values:
        raise BadInput("Show chats, playbook runs, API calls, or all conversations.")
    request.session[SIDEBAR_SHOWS] = shows
    back = request.POST.get("next", "")
    return redirect(back if url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}) else "chat")


urlpatterns = [
    path("", home, name="home"),
    path("chat/", chat, name="chat"),
    path("chat/new/", chat_new, name="chat-new"),
    path("chat/import/", chat_import, name="chat-import"),
    path("chat/sidebar/", sidebar_shows, name="chat-sidebar"),
    path("chat/<int:conversation_id>/", chat_conversation, name="chat-conversation"),
    path("chat/<int:conversation_id>/messages/", chat_messages, name="chat-messages"),
    path("chat/<int:conversation_id>/earlier/", chat_earlier, name="chat-earlier"),
    path("chat/<int:conversation_id>/switch/", chat_switch, name="chat-switch"),
    path("chat/<int:conversation_id>/update/", chat_update, name="chat-update"),
    path("chat/<int:conversation_id>/clear/", chat_clear, name="chat-clear"),
    path("chat/<int:conversation_id>/fork/", chat_fork, name="chat-fork"),
    path("chat/<int:conversation_id>/compact/", chat_compact, name="chat-compact"),
    path("chat/<int:conversation_id>/delete/", chat_delete, name="chat-delete"),
    path("chat/<int:conversation_id>/compare/", chat_compare, name="chat-compare"),
    path("chat/nodes/<int:node_id>/seen/", chat_seen, name="chat-seen"),
    path("chat/render/", chat_render, name="chat-render"),
    path("settings/", preferences, name="preferences"),
    path("settings/theme/", theme, name="theme"),
]
