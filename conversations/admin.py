"""The staff tree explorer: read-only pages over conversations and nodes, plus one head move.

Nothing here assembles context or reads paths its own way: it calls `node_path`, `tree_scope`,
`turns.call_context` (the one assembly) and `services.head_move`, the one implementation of each.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from html import escape
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import BigIntegerField, Count, Exists, FloatField, IntegerField, OuterRef, Subquery, Sum, Value
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Coalesce
from django.http import Http404, HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.safestring import mark_safe
from rest_framework.authtoken.models import TokenProxy

from config.replica import ListsMayLag
from conversations import services, usage
from conversations.errors import TurnInProgress
from conversations.items import answer_text, question_of
from conversations.models import (
    SIDE_CALL,
    Bubble,
    Conversation,
    Node,
    OutboxJob,
    Preferences,
    Project,
    ToolServer,
    UsageBudget,
    UsageEntry,
)
from conversations.selectors import node_path, tree_scope
from conversations.tools.mcp.connection import CallStopped, ServerDown
from conversations.tools.mcp.servers import BadServer, announce_change, parse_servers, row_config
from conversations.tools.mcp.tools import server_tools
from conversations.turns.seen import call_context

SNIPPET_CHARS = 60
MAX_INDENT = 40  # fork depths static/arbor/admin.css indents (.indent.depth-N)
TREE_ROW_FIELDS = ("id", "parent_id", "conversation_id", "kind", "status", "failure_reason", "compacted_from_id",
                   "window_root", "usage", "sent", "received")


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)


def _cost(usage: Any) -> float:
    cost = usage.get("cost_usd") if isinstance(usage, dict) else None
    return float(cost) if isinstance(cost, int | float) else 0.0


def _usd(value: float | None) -> str:
    return f"${value:.4f}" if value else "—"


def _tokens(usage: Any) -> int:
    if isinstance(usage, dict):
        try:
            return int(usage.get("total_tokens") or 0)
        except (TypeError, ValueError):
            return 0
    return 0


def _snippet(node: Node) -> str:
    text = question_of(node.sent or [])
    if text is None:
        text = answer_text(node.received or []) or next(
            (i.get("text", "") for i in node.sent or [] if isinstance(i, dict) and i.get("text")), ""
        )
    text = " ".join(str(text).split())
    return text if len(text) <= SNIPPET_CHARS else text[:SNIPPET_CHARS] + "…"


def _node_url(node_id: int) -> str:
    return reverse("admin:conversations_node_change", args=[node_id])


_URL_MARK = 987654321987


def _node_url_maker() -> Callable[[int], str]:
    """`_node_url` without a `reverse()` per node: the URL is reversed once and the id put in by hand."""
    head, tail = _node_url(_URL_MARK).rsplit(str(_URL_MARK), 1)
    return lambda node_id: f"{head}{node_id}{tail}"


class ReadOnlyAdmin(ListsMayLag, admin.ModelAdmin):
    """No adding, deleting or editing through the admin; viewing needs only the view permission."""

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]

    def viewable_object(self, request, object_id):
        """The object for a read-only page: 404 if missing, 403 without the view (or change) permission."""
        obj = self.get_object(request, object_id)
        if obj is None:
            raise Http404(f"No such {self.model._meta.verbose_name}.")
        if not self.has_view_permission(request, obj):
            raise PermissionDenied
        return obj


# --- conversations --------------------------------------------------------------------------------


def _per_conversation(queryset, aggregate, output_field):
    """A correlated subquery aggregating the conversation's own nodes: one SQL query for the whole page."""
    return Coalesce(
        Subquery(
            queryset.filter(owner_id=OuterRef("owner_id"), conversation=OuterRef("pk")).order_by()
            .values("conversation")
            .annotate(value=aggregate).values("value")[:1],
            output_field=output_field,
        ),
        Value(0),
        output_field=output_field,
    )


@dataclass
class TreeRow:
    node: Node
    depth: int
    on_path: bool
    is_head: bool
    can_be_head: bool
    tokens: int
    snippet: str
    url: str
    children: list[int] = field(default_factory=list)
    starts_branch: bool = False  # the first node of a branch: its parent has more than one child
    compacted_into: list[int] = field(default_factory=list)


def tree_rows(conversation: Conversation) -> tuple[list[TreeRow], list[dict[str, Any]], list[int]]:
    """Every node of the conversation as flat (node, depth) rows, the per-branch totals, and the head path.

    Three queries whatever the tree's size: the path, the nodes, and the ids a head may rest on.
    Depth grows only where the tree forks, so a long chain stays flat; the walk is iterative.
    """
    path = node_path(conversation.head_id, owner=conversation.owner_id)
    path_ids = [p.id for p in path]
    on_path = set(path_ids)
    scope = tree_scope(conversation, path_ids)
    # Only what a row shows: skipping timestamps, provider, model and failure message saves ~10% on 5,000 rows.
    nodes = list(Node.objects.filter(scope).order_by("id").only(*TREE_ROW_FIELDS))
    headable = set(Node.objects.can_be_head().filter(scope).values_list("id", flat=True))
    by_id = {n.id: n for n in nodes}
    children: dict[int | None, list[int]] = {}
    compacted_into: dict[int, list[int]] = {}
    for n in nodes:
        parent = n.parent_id if n.parent_id in by_id else None
        children.setdefault(parent, []).append(n.id)
        if n.compacted_from_id:
            compacted_into.setdefault(n.compacted_from_id, []).append(n.id)

    node_url = _node_url_maker()
    rows: list[TreeRow] = []
    branches: list[dict[str, Any]] = []
    total: dict[int, int] = {}
    spent: dict[int, float] = {}
    length: dict[int, int] = {}
    stack: list[tuple[int, int]] = [(node_id, 0) for node_id in reversed(children.get(None, []))]
    while stack:
        node_id, depth = stack.pop()
        n = by_id[node_id]
        tokens = _tokens(n.usage)
        parent = n.parent_id if n.parent_id in by_id else None
        total[node_id] = total.get(parent, 0) + tokens if parent else tokens
        spent[node_id] = (spent.get(parent, 0.0) if parent else 0.0) + _cost(n.usage)
        length[node_id] = length.get(parent, 0) + 1 if parent else 1
        kids = children.get(node_id, [])
        rows.append(TreeRow(
            node=n, depth=depth, on_path=node_id in on_path, is_head=node_id == conversation.head_id,
            can_be_head=node_id in headable, tokens=tokens, snippet=_snippet(n), url=node_url(node_id),
            children=kids, compacted_into=compacted_into.get(node_id, []),
            starts_branch=parent is not None and len(children[parent]) > 1,
        ))
        if not n.is_side_call and all(by_id[kid].is_side_call for kid in kids):  # side calls are never tips
            branches.append({"tip": n, "url": node_url(node_id), "tokens": total[node_id],
                             "cost": _usd(spent[node_id]),
                             "nodes": length[node_id], "on_path": node_id in on_path})
        child_depth = depth + (1 if len(kids) > 1 else 0)
        stack.extend((kid, child_depth) for kid in reversed(kids))
    return rows, branches, path_ids


def render_tree_rows(rows: list[TreeRow], *, can_move_head: bool) -> str:
    """The tree table's rows as one HTML string, built in Python: a template loop over 5,000 rows takes ~1 s.

    Every value from the database goes through `html.escape`; "Move head here" buttons submit the one
    form `arbor-move-head` (one CSRF token for the page, not one per row).
    """
    node_url = _node_url_maker()
    out: list[str] = []
    add = out.append
    for row in rows:
        n = row.node
        css = ("on-path" if row.on_path else "") + (" is-head" if row.is_head else "")
        # A class, not a style attribute: the CSP refuses inline styles. Deeper forks than the stylesheet
        # knows line up at its deepest step.
        add(f'<tr id="node-{n.pk}" class="{css}"><td><span class="indent depth-{min(row.depth, MAX_INDENT)}">')
        if row.depth:  # the arrow marks where a branch starts; the nodes after it line up under it
            add('<span class="fork">↳ </span>' if row.starts_branch else '<span class="fork cont">↳ </span>')
        add(f'<a href="{escape(row.url)}">#{n.pk}</a></span>')
        if row.is_head:
            add(' <span class="arbor-badge head">HEAD</span>')
        kind, status = escape(n.kind), escape(n.status)
        add(f'</td><td><span class="arbor-badge kind-{kind}">{kind}</span></td>'
            f'<td><span class="arbor-badge status-{status}">{status}</span>')
        if n.failure_reason:
            add(f' <span class="failure-reason">{escape(n.failure_reason)}</span>')
        add(f"</td><td>{row.tokens}</td><td>{escape(row.snippet)}</td><td>")
        if n.compacted_from_id:
            add(f'<a class="compacted-from" href="{escape(node_url(n.compacted_from_id))}">'
                f"original #{n.compacted_from_id}</a> ")
        for c in row.compacted_into:
            add(f'<a class="compacted-into" href="{escape(node_url(c))}">compacted into #{c}</a> ')
        add("</td><td>")
        if can_move_head and row.can_be_head and not row.is_head:
            add(f'<button type="submit" form="arbor-move-head" name="node" value="{n.pk}">Move head here</button>')
        add("</td></tr>\n")
    return mark_safe("".join(out))  # every interpolated value above is escaped or an int


@admin.register(Conversation)
class ConversationAdmin(ReadOnlyAdmin):
    list_display = ["id", "title", "owner", "model", "node_count", "branch_count", "total_tokens", "total_cost",
                    "turn_running"]
    list_display_links = ["id", "title"]
    list_filter = ["model", "owner"]
    list_select_related = ["owner"]
    search_fields = ["title", "owner__username"]
    change_form_template = "admin/conversations/conversation/tree.html"

    def get_queryset(self, request):
        nodes = Node.objects.all()
        # A branch ends at a node with no child but side calls (a title call is no branch, and no tip).
        leaves = nodes.exclude(SIDE_CALL).exclude(Exists(Node.objects.filter(owner_id=OuterRef("owner_id"),
                                                                             parent=OuterRef("pk")).exclude(SIDE_CALL)))
        tokens = Cast(KT("usage__total_tokens"), BigIntegerField())
        cost = Cast(KT("usage__cost_usd"), FloatField())
        return super().get_queryset(request).select_related("owner").annotate(
            node_total=_per_conversation(nodes, Count("id"), IntegerField()),
            leaf_total=_per_conversation(leaves, Count("id"), IntegerField()),
            token_total=_per_conversation(nodes, Sum(tokens), BigIntegerField()),
            cost_total=_per_conversation(nodes, Sum(cost), FloatField()),
        )

    @admin.display(description="nodes", ordering="node_total")
    def node_count(self, obj):
        return obj.node_total

    @admin.display(description="branches", ordering="leaf_total")
    def branch_count(self, obj):
        return obj.leaf_total

    @admin.display(description="tokens", ordering="token_total")
    def total_tokens(self, obj):
        return obj.token_total

    @admin.display(description="cost", ordering="cost_total")
    def total_cost(self, obj):
        return _usd(obj.cost_total)

    @admin.display(description="turn running", boolean=True)
    def turn_running(self, obj):
        return obj.turn_running

    def get_urls(self):
        view = self.admin_site.admin_view(self.move_head_view)
        return [
            path("<path:object_id>/move-head/", view, name="conversations_conversation_move_head"),
            *super().get_urls(),
        ]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        if request.method != "GET":
            return HttpResponseNotAllowed(["GET"])
        conversation = self.viewable_object(request, object_id)
        rows, branches, path_ids = tree_rows(conversation)
        can_move_head = self.has_change_permission(request, conversation)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Tree of {conversation}",
            "subtitle": None,
            "opts": self.opts,
            "original": conversation,
            "conversation": conversation,
            "rows": rows,
            "rows_html": render_tree_rows(rows, can_move_head=can_move_head),
            "branches": branches,
            "path_ids": path_ids,
            "can_move_head": can_move_head,
            "has_view_permission": True,
            **(extra_context or {}),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, self.change_form_template, context)

    def move_head_view(self, request, object_id):
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        conversation = get_object_or_404(Conversation, pk=object_id)
        if not self.has_change_permission(request, conversation):
            raise PermissionDenied
        back = reverse("admin:conversations_conversation_change", args=[conversation.pk])
        try:
            node_id = int(request.POST.get("node", ""))
        except ValueError:
            self.message_user(request, "No node was given.", messages.ERROR)
            return HttpResponseRedirect(back)
        path_ids = [p.id for p in node_path(conversation.head_id, owner=conversation.owner_id)]
        if not Node.objects.can_be_head().filter(tree_scope(conversation, path_ids), pk=node_id).exists():
            self.message_user(request, f"Node #{node_id} is not a node of this conversation the head may rest on "
                              "(a finished turn node).", messages.ERROR)
            return HttpResponseRedirect(back)
        try:
            services.head_move(conversation=conversation, to=node_id)
        except TurnInProgress:
            self.message_user(request, "Refused: a turn is running on this conversation, so its head cannot move "
                              "until the turn ends (T9).", messages.ERROR)
            return HttpResponseRedirect(back)
        self.message_user(request, f"The head moved to node #{node_id}.", messages.SUCCESS)
        return HttpResponseRedirect(back)


# --- nodes ----------------------------------------------------------------------------------------


@admin.register(Node)
class NodeAdmin(ReadOnlyAdmin):
    list_display = ["id", "conversation", "parent", "kind", "status", "failure_reason", "provider", "model",
                    "created_at"]
    list_filter = ["kind", "status", "failure_reason", "provider", "model"]
    list_select_related = ["conversation"]
    search_fields = ["=id"]
    change_form_template = "admin/conversations/node/detail.html"

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("conversation")

    def has_change_permission(self, request, obj=None):
        return False

    def change_view(self, request, object_id, form_url="", extra_context=None):
        if request.method != "GET":
            return HttpResponseNotAllowed(["GET"])
        node = self.viewable_object(request, object_id)
        path = node_path(node.id, owner=node.owner_id)
        conversation = node.conversation
        sent_context = call_context(node)
        mine = Node.objects.filter(owner_id=node.owner_id)
        children = list(mine.filter(parent=node).order_by("id").values_list("id", "kind", "status"))
        compactions = list(mine.filter(compacted_from=node).order_by("id").values_list("id", flat=True))
        summarised_into = list(mine.filter(summary_call=node).values_list("id", flat=True))
        context = {
            **self.admin_site.each_context(request),
            "title": str(node),
            "subtitle": None,
            "opts": self.opts,
            "original": node,
            "node": node,
            "tokens": _tokens(node.usage),
            "sent_json": _pretty(node.sent),
            "received_json": _pretty(node.received),
            "usage_json": _pretty(node.usage),
            "context_json": _pretty(sent_context),
            "breadcrumb": [{"id": p.id, "kind": p.kind, "status": p.status, "url": _node_url(p.id)} for p in path],
            "parent_url": _node_url(node.parent_id) if node.parent_id else None,
            "children": [{"id": c[0], "kind": c[1], "status": c[2], "url": _node_url(c[0])} for c in children],
            "compactions": [{"id": c, "url": _node_url(c)} for c in compactions],
            "original_url": _node_url(node.compacted_from_id) if node.compacted_from_id else None,
            "summary_call_url": _node_url(node.summary_call_id) if node.summary_call_id else None,
            "summarised_into": [{"id": c, "url": _node_url(c)} for c in summarised_into],
            "conversation_url": reverse("admin:conversations_conversation_change", args=[conversation.pk])
            if conversation else None,
            "has_view_permission": True,
            **(extra_context or {}),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, self.change_form_template, context)


@admin.register(Bubble)
class BubbleAdmin(ReadOnlyAdmin):
    list_display = ["id", "conversation", "node", "role"]

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Preferences)
class PreferencesAdmin(admin.ModelAdmin):
    list_display = ["user", "updated_at"]
    search_fields = ["user__username"]


class ProjectConversations(admin.TabularInline):
    model = Conversation
    fields = ["title", "model", "updated_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    """Issue 30: a person's projects, with their conversations."""
    list_display = ["name", "owner", "model", "memory", "updated_at"]
    search_fields = ["name", "owner__username"]
    inlines = [ProjectConversations]


@admin.register(UsageBudget)
class UsageBudgetAdmin(admin.ModelAdmin):
    """Issue 31: staff set what a person may spend a month; empty is no limit."""
    list_display = ["owner", "monthly_tokens", "monthly_cost_usd"]
    search_fields = ["owner__username"]
    autocomplete_fields = ["owner"]


@admin.register(UsageEntry)
class UsageEntryAdmin(ListsMayLag, admin.ModelAdmin):
    """Issue 31: the ledger, read-only: a row is written with its call's ending, never by hand."""
    list_display = ["node_id", "owner", "day", "model", "input_tokens", "output_tokens", "cost_usd", "estimated"]
    list_filter = ["day", "model", "estimated"]
    search_fields = ["owner__username", "=node_id"]
    change_list_template = "admin/conversations/usageentry/change_list.html"

    def changelist_view(self, request, extra_context=None):
        """The ledger, above it its tokens per day and per model as bar charts (of the rows the filters keep)."""
        response = super().changelist_view(request, extra_context)
        changelist = getattr(response, "context_data", {}).get("cl")
        if changelist is not None:
            rows = changelist.queryset.order_by()
            response.context_data.update(by_day=usage.chart(rows, by="day"), by_model=usage.chart(rows, by="model"),
                                         chart_height=usage.CHART_HEIGHT, bar_step=usage.BAR_STEP)
        return response

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(OutboxJob)
class OutboxJobAdmin(ReadOnlyAdmin):
    """Post-commit jobs (R4): failed ones stay here with their last error, never dropped."""

    list_display = ("id", "kind", "status", "attempts", "run_after", "created_at", "short_error")
    list_filter = ("status", "kind")
    search_fields = ("kind", "last_error")
    ordering = ("-id",)

    @admin.display(description="last error")
    def short_error(self, job: OutboxJob) -> str:
        return job.last_error[:120]


# An API token is a password: only superusers see them in the admin, and only their first characters.
admin.site.unregister(TokenProxy)


@admin.register(TokenProxy)
class TokenAdmin(ReadOnlyAdmin):
    list_display = ("key_prefix", "user", "created")
    list_display_links = None  # a token's page address is the key itself
    fields = ("key_prefix", "user", "created")
    ordering = ("-created",)

    def get_readonly_fields(self, request, obj=None):
        return self.fields

    @admin.display(description="key")
    def key_prefix(self, token: TokenProxy) -> str:
        return f"{token.key[:6]}…"

    def has_module_permission(self, request) -> bool:
        return request.user.is_active and request.user.is_superuser

    def has_view_permission(self, request, obj=None) -> bool:
        return request.user.is_active and request.user.is_superuser

    def has_change_permission(self, request, obj=None) -> bool:
        return False


_SERVER_FIELDS = ["name", "command", "env", "url", "headers", "timeout", "approval", "enabled"]


class ToolServerForm(forms.ModelForm):
    url = forms.URLField(required=False, assume_scheme="https", help_text=ToolServer._meta.get_field("url").help_text)

    class Meta:
        model = ToolServer
        fields = _SERVER_FIELDS

    def clean(self):
        data = super().clean()
        if not self.errors:  # the same rules as ARBOR_MCP_SERVERS: what saves here also starts
            try:
                row_config(ToolServer(**{key: data.get(key) for key in _SERVER_FIELDS}))
            except BadServer as exc:
                raise forms.ValidationError(str(exc)) from None
            if any(server.name == data["name"] for server in parse_servers(settings.ARBOR_MCP_SERVERS)):
                raise forms.ValidationError(f"ARBOR_MCP_SERVERS already names a server {data['name']!r}.")
        return data


@admin.register(ToolServer)
class ToolServerAdmin(admin.ModelAdmin):
    """Issue 32: MCP servers staff connect; their tools reach conversations within seconds of a save."""
    form = ToolServerForm
    list_display = ["name", "url", "enabled"]
    readonly_fields = ["tools_now"]

    # A server row is a program Arbor runs with the environment it names, and its headers hold tokens: like API
    # tokens, superusers only, whatever model permissions a staff member was given.
    def has_module_permission(self, request):
        return request.user.is_superuser

    def has_view_permission(self, request, obj=None):
        return request.user.is_superuser

    def has_add_permission(self, request):
        return request.user.is_superuser

    def has_change_permission(self, request, obj=None):
        return request.user.is_superuser

    def has_delete_permission(self, request, obj=None):
        return request.user.is_superuser

    @admin.display(description="Tools now")
    def tools_now(self, obj: ToolServer) -> str:
        if obj.pk is None or not obj.enabled:
            return "-"
        try:
            tools = server_tools(row_config(obj))
        except (BadServer, ServerDown, CallStopped) as exc:
            return f"not reachable: {exc}"
        return "; ".join(f"{tool.name} ({'asks a person' if tool.needs_approval else 'runs at once'})"
                         for tool in tools) or "none"

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        announce_change()

    def delete_model(self, request, obj):
        super().delete_model(request, obj)
        announce_change()

    def delete_queryset(self, request, queryset):
        super().delete_queryset(request, queryset)
        announce_change()
