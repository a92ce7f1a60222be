"""One small view per operation. Views parse, call a service or the turn runner, and shape the answer."""

from __future__ import annotations

import logging
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.http import StreamingHttpResponse
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics, status
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from config.api import error_body, paginated, valid_input
from config.errors import ArborError, BadInput, NotFound
from config.replica import reads_may_lag
from config.schema import SSE, PaginatedList
from config.streams import StreamSlotView
from conversations import services, usage
from conversations.apis import serializers as s
from conversations.apis.paging import CursorPages, page_body, page_nodes, read_cursor
from conversations.apis.schema import TURN_EVENT, TURN_MESSAGE_EVENT
from conversations.apis.streams import FORMAT, EventStreamRenderer, log_stream
from conversations.idempotency import IdempotentView
from conversations.models import Conversation, Node, Project
from conversations.screen import BubblePage, bubbles_after, bubbles_before
from conversations.selectors import (
    conversation_for_user,
    conversation_has_node,
    conversation_list,
    node_for_user,
    node_page,
    project_for_user,
)
from conversations.tools import catalog
from conversations.tree_map import tree_map
from conversations.turns import detached, records
from conversations.turns.events import EventType, TurnOutcome
from conversations.turns.runner import Turn
from conversations.turns.seen import context_diff, next_context
from conversations.turns.start import turn_ask, turn_compact, turn_decide, turn_edit, turn_regenerate, turn_retry
from files.services import project_files_set

logger = logging.getLogger("arbor.api")


# --- conversations ---------------------------------------------------------------------------------


class ConversationListCreate(PaginatedList, APIView):
    @extend_schema(responses=s.ConversationOut(many=True))
    @reads_may_lag
    def get(self, request: Request) -> Response:
        return paginated(self, request, conversation_list(user=request.user), s.ConversationOut)

    @extend_schema(request=s.ConversationIn, responses={
        201: s.ConversationOut, 404: OpenApiResponse(description="not_found: no such project of the caller's")})
    def post(self, request: Request) -> Response:
        data = _with_project(request, valid_input(s.ConversationIn, request))
        conversation = services.conversation_create(owner=request.user, **data)
        return Response(s.ConversationOut(conversation).data, status=status.HTTP_201_CREATED)


def _with_project(request: Request, data: dict) -> dict:
    """`project` as the caller's Project (another person's is a 404, and nothing changes); null stays null."""
    if data.get("project") is not None:
        data["project"] = project_for_user(user=request.user, project_id=data["project"])
    return data


class ConversationDetail(APIView):
    @extend_schema(responses=s.ConversationOut)
    def get(self, request: Request, conversation_id: int) -> Response:
        conversation = conversation_for_user(user=request.user, conversation_id=conversation_id)
        return Response(s.ConversationOut(conversation).data)

    @extend_schema(request=s.ConversationIn, responses={
        200: s.ConversationOut, 404: OpenApiResponse(description="not_found: no such conversation or project")})
    def patch(self, request: Request, conversation_id: int) -> Response:
        conversation = conversation_for_user(user=request.user, conversation_id=conversation_id)
        data = _with_project(request, valid_input(s.ConversationIn, request))
        services.conversation_update(conversation=conversation, **data)
        return Response(s.ConversationOut(conversation).data)

    @extend_schema(responses={204: None, 409: OpenApiResponse(description="turn_in_progress: a turn holds the "
                                                                         "conversation")})
    def delete(self, request: Request, conversation_id: int) -> Response:
        conversation = conversation_for_user(user=request.user, conversation_id=conversation_id)
        services.conversation_delete(conversation=conversation)
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- turns -----------------------------------------------------------------------------------------


def _wants_stream(request: Request) -> bool:
    """`Accept: text/event-stream`, or `?format=sse` (which picks the event-stream renderer)."""
    return SSE in request.headers.get("Accept", "") or isinstance(
        getattr(request, "accepted_renderer", None), EventStreamRenderer)


def _turn_response(request: Request, turn: Turn | None) -> Response | StreamingHttpResponse:
    """Run the turn and answer: SSE when asked for, else one JSON body when the turn has ended."""
    if turn is None:  # an approval recorded, others still waiting
        return Response({"answer": None, "head": None, "nodes": [], "approval_required": []},
                        status=status.HTTP_202_ACCEPTED)
    if _wants_stream(request):
        # The turn runs in a thread of its own and the stream follows its log: a client that leaves, even
        # before the first byte, never ends the turn (issue 12), and its `id:`s resume with `…/stream/`.
        return log_stream(detached.launch(turn), owner=turn.conversation.owner_id)
    outcome = TurnOutcome.of(detached.run_here(turn))
    if outcome.ending == EventType.ERROR and outcome.error["code"] == "unavailable":
        nodes = []  # the database is away: the error's message names the nodes recorded
    else:
        nodes = s.NodeOut(records.as_written(turn, turn.nodes), many=True).data
    if outcome.ending == EventType.ERROR:
        more = {"answers": outcome.answers} if outcome.answers is not None else {}
        body = error_body(outcome.error["code"], outcome.error["message"], node=outcome.failed_node,
                          head=outcome.head, nodes=nodes, **more)
        return Response(body, status=outcome.http_status)
    body = {"answer": outcome.answer, "head": outcome.head, "nodes": nodes}
    if outcome.answers is not None:  # issue 33: several models asked at once
        body["answers"] = outcome.answers
    if outcome.ending == EventType.APPROVAL_REQUIRED:
        body["approval_required"] = outcome.approval_required
    return Response(body, status=outcome.http_status)


class TurnView(IdempotentView, StreamSlotView):
    renderer_classes = [JSONRenderer, EventStreamRenderer]

    def wants_stream(self, request: Request) -> bool:
        return _wants_stream(request)

    def stream_run(self, request: Request, run_id) -> StreamingHttpResponse:
        """A run's events from its first: what a retry with the same Idempotency-Key follows again (its own, so
        the person asking is the run's owner)."""
        return log_stream(run_id, owner=request.user.pk)




_TURN_RESPONSES = {
    (200, SSE): OpenApiResponse(TURN_EVENT, description="the turn as it runs, when asked for "
                                "(`Accept: text/event-stream` or `?format=sse`): one event per step, the last "
                                "`done`, `approval_required` or `error`"),
    (201, "application/json"): s.TurnOut,
    (202, "application/json"): OpenApiResponse(s.TurnOut, description="paused: a tool call waits for approval "
                                               "(F3); or an approval recorded while others still wait"),
    (202, SSE): OpenApiResponse(TURN_MESSAGE_EVENT, description="an approval recorded while others still wait, "
                                "as one `message` event"),
    400: OpenApiResponse(description="bad input"),
    404: OpenApiResponse(description="not found or not yours"),
    409: OpenApiResponse(description="turn_in_progress, approval_pending, before_compaction, or file_not_ready (a "
                                     "file still being read)"),
    413: OpenApiResponse(description="content too large"),
    502: OpenApiResponse(description="the model provider failed; the failed node is recorded"),
    503: OpenApiResponse(description="the provider timed out or is rate limited"),
}


class TurnCreate(TurnView):
    @extend_schema(request=s.TurnIn, parameters=[FORMAT], responses=_TURN_RESPONSES,
                   examples=[OpenApiExample("question", {"content": "What changed since yesterday?"},
                                            request_only=True),
                             OpenApiExample("tool call (echo model)", request_only=True,
                                            value={"content": '#tool send_email {"to": "a@example.com", '
                                                              '"subject": "Hi", "body": "Hello"}'},
                                            description="The offline model `arbor/echo` calls the tool named "
                                                        "after `#tool` with that JSON; send_email waits for "
                                                        "approval (202, F3).")],
                   description="Run a turn from the head. `Accept: text/event-stream` streams SSE events "
                               "`token`, `tool_call`, `tool_result`, `approval_required`, `compaction` (the "
                               "context was compacted before this call, C2), `done`, `error`.")
    def post(self, request: Request, conversation_id: int):
        data = valid_input(s.TurnIn, request)
        turn = turn_ask(user=request.user, conversation_id=conversation_id, content=data["content"],
                        files=data.get("files", ()), models=data.get("models", ()))
        return _turn_response(request, turn)


class TurnEdit(TurnView):
    @extend_schema(request=s.EditIn, parameters=[FORMAT], responses=_TURN_RESPONSES)
    def post(self, request: Request, conversation_id: int):
        data = valid_input(s.EditIn, request)
        turn = turn_edit(user=request.user, conversation_id=conversation_id, node_id=data["node"],
                         content=data["content"], files=data.get("files"), models=data.get("models", ()))
        return _turn_response(request, turn)


class TurnRegenerate(TurnView):
    @extend_schema(request=s.RegenerateIn, parameters=[FORMAT], responses=_TURN_RESPONSES)
    def post(self, request: Request, conversation_id: int):
        data = valid_input(s.RegenerateIn, request)
        turn = turn_regenerate(user=request.user, conversation_id=conversation_id, node_id=data.get("node"))
        return _turn_response(request, turn)


class TurnRetry(TurnView):
    @extend_schema(request=None, parameters=[FORMAT], responses=_TURN_RESPONSES,
                   description="F1: call the model again from the failed node at the head, adding nothing: "
                               "its question or tool results are already on the path.")
    def post(self, request: Request, conversation_id: int):
        turn = turn_retry(user=request.user, conversation_id=conversation_id)
        return _turn_response(request, turn)


class ToolApprovalCreate(TurnView):
    @extend_schema(request=s.ApprovalIn, parameters=[FORMAT], responses=_TURN_RESPONSES)
    def post(self, request: Request, conversation_id: int):
        data = valid_input(s.ApprovalIn, request)
        turn = turn_decide(user=request.user, conversation_id=conversation_id,
                           call_id=data["tool_call_id"], approve=data["approve"])
        return _turn_response(request, turn)


# --- the head and the tree -----------------------------------------------------------------------


class HeadSwitch(APIView):
    @extend_schema(request=s.SwitchIn, responses={
        200: s.ConversationOut,
        400: OpenApiResponse(description="bad_input: `node` is no node id, or its branch has no answer yet"),
        404: OpenApiResponse(description="not_found: no such node in this conversation"),
        409: OpenApiResponse(description="turn_in_progress: a turn holds the conversation")})
    def post(self, request: Request, conversation_id: int) -> Response:
        data = valid_input(s.SwitchIn, request)
        conversation = conversation_for_user(user=request.user, conversation_id=conversation_id)
        services.head_switch(conversation=conversation, node_id=data["node"])
        return Response(s.ConversationOut(conversation).data)


class ConversationFork(APIView):
    @extend_schema(request=s.SwitchIn, responses={
        201: s.ConversationOut,
        400: OpenApiResponse(description="bad_input: `node` is no node id, or no node a head may rest on"),
        404: OpenApiResponse(description="not_found: no such node in this conversation")},
        description="Issue 33 (P3): a new conversation whose head is `node`; nothing is copied.")
    def post(self, request: Request, conversation_id: int) -> Response:
        data = valid_input(s.SwitchIn, request)
        conversation = conversation_for_user(user=request.user, conversation_id=conversation_id)
        fork = services.conversation_fork(conversation=conversation, node_id=data["node"])
        return Response(s.ConversationOut(fork).data, status=status.HTTP_201_CREATED)


class ContextDiff(APIView):
    @extend_schema(parameters=[OpenApiParameter(name, {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
                                                required=True) for name in ("a", "b")],
                   responses={200: s.DiffOut, 400: OpenApiResponse(description="bad_input"),
                              404: OpenApiResponse(description="not_found: a node not in this conversation")},
                   description="Issue 33: where the contexts of two calls part. `common`: how many messages "
                               "both calls were sent alike from the start; `a`, `b`: the messages after that "
                               "of each; `answers`: what each call answered.")
    def get(self, request: Request, conversation_id: int) -> Response:
        conversation = conversation_for_user(user=request.user, conversation_id=conversation_id)
        nodes = [_node_of(conversation, request.query_params.get(name), name) for name in ("a", "b")]
        return Response(context_diff(*nodes))


def _node_of(conversation: Conversation, value: Any, name: str) -> Node:
    if value is None or not str(value).isdigit() or not 0 < int(value) < 2**63:
        raise BadInput(f"`{name}` must be a node id.", param=name)
    if not conversation_has_node(conversation=conversation, node_id=int(value)):
        raise NotFound(f"No node {value} in this conversation.")
    return Node.objects.get(pk=int(value))


class ConversationClear(APIView):
    @extend_schema(request=None, responses={
        200: s.ConversationOut, 409: OpenApiResponse(description="turn_in_progress: a turn holds the conversation")})
    def post(self, request: Request, conversation_id: int) -> Response:
        conversation = conversation_for_user(user=request.user, conversation_id=conversation_id)
        services.conversation_clear(conversation=conversation)
        return Response(s.ConversationOut(conversation).data)


class ConversationCompact(APIView):
    @extend_schema(
        request=None,
        responses={201: s.NodeOut, 400: OpenApiResponse(description="nothing_to_compact"),
                   409: OpenApiResponse(description="turn_in_progress or approval_pending"),
                   502: OpenApiResponse(description="the summarising call failed; its node is recorded, "
                                                    "the head did not move"),
                   503: OpenApiResponse(description="the provider timed out or is rate limited")},
        description="Compact now (C2): summarise the path, start a new one at a parentless compaction node "
                    "that points at the old head (C3), and move the head there.",
    )
    def post(self, request: Request, conversation_id: int) -> Response:
        root = turn_compact(user=request.user, conversation_id=conversation_id)
        return Response(s.NodeOut(root).data, status=status.HTTP_201_CREATED)


class ContextDetail(APIView):
    @extend_schema(responses=s.ContextOut)
    def get(self, request: Request, conversation_id: int) -> Response:
        conversation = conversation_for_user(user=request.user, conversation_id=conversation_id)
        return Response({"messages": next_context(conversation)})


def _bubble_page(conversation: Conversation, cursor: dict | None) -> BubblePage:
    """The page a cursor names. Pages after a node follow the path the last walk from the head saw (its cursor
    names the ends of the next pages, so most pages walk only themselves); every MARKS pages, and for the last one,
    the walk starts at the head again: while the head's path still passes through the node, turns added meanwhile
    come at the end, else the pages finish the path they began. A page before a node is that node's own history.
    A cleared conversation (T11) shows nothing, whatever the cursor."""
    head, size = conversation.head_id, page_nodes()
    if head is None:
        return bubbles_after(conversation=conversation, tip=None, size=size)
    if cursor is None:
        return bubbles_after(conversation=conversation, tip=head, size=size)
    if "b" in cursor:
        return bubbles_before(conversation=conversation, tip=cursor["t"], before=cursor["b"], size=size,
                              sealed=cursor["s"])
    if cursor.get("k"):  # the ends of the next pages, as the last walk from a tip saw them
        page = bubbles_after(conversation=conversation, tip=cursor["t"], after=cursor["a"], size=size,
                             ahead=tuple(cursor["k"]), root=cursor.get("r"))
        if page is not None:
            return page
    page = bubbles_after(conversation=conversation, tip=head, after=cursor["a"], size=size)
    if page is None:  # the head moved to another branch since: finish the path that was being read
        page = bubbles_after(conversation=conversation, tip=cursor["t"], after=cursor["a"], size=size)
    if page is None:
        raise NotFound("No such page: the path this `cursor` was reading is gone; start from the first page.")
    return page


class BubbleList(APIView):
    pagination_class = CursorPages

    @extend_schema(responses=s.BubbleOut(many=True), description=(
        "The bubbles of the head's path (and behind its compaction roots, C3), from the root, a page at a time "
        "(issue 13): a page holds the bubbles of up to `ARBOR_PAGE_NODES` (200) nodes of the path, so a short "
        "conversation is one page. Follow `next` to the end; turns added meanwhile come at the end, and if the "
        "head moves to another branch meanwhile the pages finish the path they began. `previous` reads back."))
    def get(self, request: Request, conversation_id: int) -> Response:
        conversation = conversation_for_user(user=request.user, conversation_id=conversation_id)
        scope = f"bubbles.{conversation.pk}"
        page = _bubble_page(conversation, read_cursor(request, scope=scope))
        after = ({"t": page.tip, "a": page.last, "k": list(page.ahead), "r": page.root}
                 if page.has_after and page.last is not None else None)
        before = ({"t": page.tip, "b": page.first, "s": page.sealed}
                  if page.has_before and page.first is not None else None)
        results = s.BubbleOut(page.views, many=True).data
        return Response(page_body(request, results, scope=scope, after=after, before=before))


class NodeList(APIView):
    pagination_class = CursorPages

    @extend_schema(responses=s.NodeSummaryOut(many=True), description=(
        "Every node of the conversation's tree (its own, and shared history on its path, P3) in id order, "
        "`ARBOR_PAGE_NODES` (200) a page (issue 13). Nodes added meanwhile have larger ids: they come at the end "
        "and never shift a page."))
    def get(self, request: Request, conversation_id: int) -> Response:
        conversation = conversation_for_user(user=request.user, conversation_id=conversation_id)
        scope = f"nodes.{conversation.pk}"
        cursor = read_cursor(request, scope=scope) or {}
        nodes, more = node_page(conversation=conversation, after=cursor.get("a"), before=cursor.get("b"),
                                size=page_nodes())
        # Read back from a cursor, the page's end came from somewhere; read on from one, so did its start.
        has_after, has_before = (True, more) if "b" in cursor else (more, "a" in cursor)
        after = {"a": nodes[-1].pk} if nodes and has_after else None
        before = {"b": nodes[0].pk} if nodes and has_before else None
        return Response(page_body(request, s.NodeSummaryOut(nodes, many=True).data, scope=scope, after=after,
                                  before=before))


class NodeDetail(generics.GenericAPIView):
    serializer_class = s.NodeOut

    def get(self, request: Request, node_id: int) -> Response:
        return Response(s.NodeOut(node_for_user(user=request.user, node_id=node_id)).data)

    @extend_schema(request=s.NodeMarkIn, responses={
        200: s.NodeOut, 409: OpenApiResponse(description="not_a_branch: a side call or a detached node takes no "
                                                         "mark; a star only where the conversation can open")},
        description=(
        "Name (`label`, up to 40 characters; empty removes it) or star (`starred`) the branch that ends at this "
        "node. One star a conversation: starring takes it off any other branch. The conversation then opens on "
        "its starred branch. What the node sent and received never changes."))
    def patch(self, request: Request, node_id: int) -> Response:
        node = node_for_user(user=request.user, node_id=node_id)
        data = valid_input(s.NodeMarkIn, request)
        return Response(s.NodeOut(services.branch_mark(node=node, **data)).data)


class ConversationTree(APIView):
    @extend_schema(responses=s.TreeOut, description=(
        "The whole tree as a map (issue 16): one entry a turn (a question with the tool rounds that followed it), "
        "in id order, a parent before its children; compaction roots under the node they compacted; playbook "
        "drafts and failed turns included; side calls (titles, summarising calls) left out. `head` is the entry "
        "holding the head; `on_path` marks the head's path."))
    def get(self, request: Request, conversation_id: int) -> Response:
        conversation = conversation_for_user(user=request.user, conversation_id=conversation_id)
        return Response(s.TreeOut(tree_map(conversation)).data)


# --- usage and budgets (issue 31) ------------------------------------------------------------------


def _person(request: Request, username: str | None):
    """The caller, or (staff only) the person named; anyone else's name is a 404, as a missing one."""
    if username in (None, "", request.user.get_username()):
        return request.user
    found = get_user_model().objects.filter(username=username).first() if request.user.is_staff else None
    if found is None:
        raise NotFound(f"No user {username!r}.")
    return found


class UsageSummary(APIView):
    @extend_schema(parameters=[OpenApiParameter("from", {"type": "string", "format": "date"}),
                               OpenApiParameter("to", {"type": "string", "format": "date"}),
                               OpenApiParameter("group", str, enum=["day", "model", "conversation", "project"]),
                               OpenApiParameter("user", str, description="staff only: another person's")],
                   responses={200: s.UsageOut, 400: OpenApiResponse(description="bad_input"),
                              404: OpenApiResponse(description="not_found: no such user (staff), or not staff")},
                   description="Issue 31: calls, tokens and cost from the usage ledger, in groups.")
    def get(self, request: Request) -> Response:
        person = _person(request, request.query_params.get("user"))
        return Response(usage.summary(person.pk, request.query_params))


class UserBudget(APIView):
    @extend_schema(responses={200: s.BudgetOut, 404: OpenApiResponse(description="not_found")})
    def get(self, request: Request, username: str) -> Response:
        return Response(usage.budget_of(_person(request, username)))

    @extend_schema(request=s.BudgetIn, responses={200: s.BudgetOut, 400: OpenApiResponse(description="bad_input"),
                                                  403: OpenApiResponse(description="staff only")},
                   description="Issue 31: staff set a person's monthly budget; null is no limit.")
    def put(self, request: Request, username: str) -> Response:
        if not request.user.is_staff:
            raise ArborError("Only staff set budgets.", code="permission_denied", status=403)
        return Response(usage.set_budget(_person(request, username), request.data))


# --- tools (issue 32) ---------------------------------------------------------------------------------------------


class ToolList(APIView):
    @extend_schema(responses=s.ToolsOut, description="Every tool a conversation may use: Arbor's own and each MCP "
                                                     "server's (`SERVER__TOOL`), and each server's state.")
    def get(self, request: Request) -> Response:
        tools, servers = catalog.listing()
        return Response({
            "tools": [{"name": tool.name, "description": tool.description, "server": tool.server or None,
                       "needs_approval": tool.needs_approval, "parameters": tool.parameters} for tool in tools],
            "servers": [vars(server) for server in servers],
        })


# --- projects (issue 30) ---------------------------------------------------------------------------


class ProjectListCreate(PaginatedList, APIView):
    @extend_schema(responses=s.ProjectOut(many=True))
    def get(self, request: Request) -> Response:
        projects = Project.objects.filter(owner_id=request.user.pk).prefetch_related("files").order_by("name", "id")
        return paginated(self, request, projects, s.ProjectOut)

    @extend_schema(request=s.ProjectIn, responses={
        201: s.ProjectOut, 404: OpenApiResponse(description="not_found: a file named in `files` is none of yours")})
    def post(self, request: Request) -> Response:
        data = valid_input(s.ProjectIn, request)
        files = data.pop("files", None)
        with transaction.atomic():
            project = services.project_create(owner=request.user, **data)
            if files is not None:
                project_files_set(user=request.user, project=project, file_ids=files)
        return Response(s.ProjectOut(project).data, status=status.HTTP_201_CREATED)


class ProjectDetail(APIView):
    @extend_schema(responses=s.ProjectOut)
    def get(self, request: Request, project_id: int) -> Response:
        return Response(s.ProjectOut(project_for_user(user=request.user, project_id=project_id)).data)

    @extend_schema(request=s.ProjectIn(partial=True), responses={
        200: s.ProjectOut, 404: OpenApiResponse(description="not_found: no such project, or a file named in `files` "
                                                            "is none of yours")})
    def patch(self, request: Request, project_id: int) -> Response:
        project = project_for_user(user=request.user, project_id=project_id)
        data = valid_input(s.ProjectIn, request, partial=True)
        files = data.pop("files", None)
        with transaction.atomic():
            project = services.project_update(project=project, **data)
            if files is not None:
                project_files_set(user=request.user, project=project, file_ids=files)
        return Response(s.ProjectOut(project).data)

    @extend_schema(parameters=[OpenApiParameter("confirm", {"type": "integer", "minimum": 0, "maximum": 999_999_999},
                                                description="how many conversations it holds")],
                   responses={204: None, 409: OpenApiResponse(description="project_not_empty: send confirm=N")},
                   description="Delete the project and its conversations, once `confirm` names how many.")
    def delete(self, request: Request, project_id: int) -> Response:
        project = project_for_user(user=request.user, project_id=project_id)
        confirm = request.query_params.get("confirm")
        if confirm is not None and not (confirm.isascii() and confirm.isdigit() and len(confirm) <= 9):
            raise BadInput("`confirm` must be the number of conversations the project holds.", param="confirm")
        services.project_delete(project=project, confirm=confirm)
        return Response(status=status.HTTP_204_NO_CONTENT)
