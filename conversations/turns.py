"""The one turn runner (R1).

Every way of asking the model something (a new question, an edit, a regenerate, a resumed turn after
an approval) first decides *where the new node's parent is*, then hands over to `Turn.events`, which
runs the rounds:

    check ownership -> load state -> (compact if needed) -> gather instructions -> assemble ->
    call the model, streaming -> keep what came back -> commit node, head, bubbles and jobs at once.

`Turn.events` is a generator of `TurnEvent`s. Closing it (stop, or a client that went away) ends the
turn as `failed/cancelled`; a node once written is never lost.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from conversations import items as it
from conversations import llm, services
from conversations.context import PathNode, assemble
from conversations.errors import ApprovalPending, BadInput, BeforeCompaction, NotFound, TooLarge, TurnInProgress
from conversations.models import Bubble, Conversation, Node, ToolApproval
from conversations.selectors import conversation_for_user, node_path, turn_start
from conversations.tools import all_tools, get_tool
from conversations.tools.runner import run_tool_call


@dataclass(frozen=True)
class TurnEvent:
    type: str  # token | tool_call | tool_result | approval_required | done | error
    data: dict[str, Any] = field(default_factory=dict)


# --- where the turn starts --------------------------------------------------------------------------


def _check_content(content: Any) -> str:
    if not isinstance(content, str) or not content.strip():
        raise BadInput("`content` must be a non-empty string.")
    if len(content) > settings.ARBOR_MAX_CONTENT_CHARS:
        raise TooLarge(f"`content` is longer than {settings.ARBOR_MAX_CONTENT_CHARS} characters.")
    return content


def _pending_approvals(conversation: Conversation, head: PathNode | None) -> list[it.Item]:
    """Tool calls on the head that wait for a person's decision (F3)."""
    if head is None or head.status != Node.Status.SUCCEEDED:
        return []
    calls = [c for c in it.tool_calls(head.received) if (tool := get_tool(c["name"])) and tool.needs_approval]
    return calls


def _lock(conversation: Conversation) -> uuid.UUID:
    return services.turn_lock_acquire(conversation=conversation)


def turn_ask(*, user, conversation_id: Any, content: Any) -> Turn:
    """A new question from the head."""
    content = _check_content(content)
    conversation = conversation_for_user(user=user, conversation_id=conversation_id)
    token = _lock(conversation)
    try:
        path = node_path(conversation.head_id)
        if _pending_approvals(conversation, path[-1] if path else None):
            raise ApprovalPending("A tool call is waiting for approval: approve or refuse it first.")
    except Exception:
        services.turn_lock_release(conversation=conversation, token=token)
        raise
    return Turn(conversation=conversation, user=user, token=token, first_items=[it.user(content)])


def _question_node(conversation: Conversation, path: list[PathNode], node_id: Any) -> int:
    """Return the index on the path of the node that sent the question `node_id` (T7, T10)."""
    try:
        node_id = int(node_id)
    except (TypeError, ValueError):
        raise BadInput("`node` must be a node id.") from None
    for index, node in enumerate(path):
        if node.id == node_id:
            if it.question_of(node.sent) is None:
                raise BadInput(f"Node {node_id} did not send a question; pass the node that did.")
            return index
    if path and path[0].kind == Node.Kind.COMPACTION and _before_compaction(path[0].id, node_id):
        raise BeforeCompaction(f"Node {node_id} lies before the compaction node {path[0].id}; it cannot be edited.")
    if not Node.objects.filter(pk=node_id).exists():
        raise NotFound("No such node.")
    raise BadInput(f"Node {node_id} is not on this conversation's current path.")


def _before_compaction(compaction_id: int, node_id: int) -> bool:
    original = Node.objects.filter(pk=compaction_id).values_list("compacted_from", flat=True).first()
    return any(p.id == node_id for p in node_path(original))


def _reposition(*, user, conversation_id: Any, node_id: Any, content: str | None) -> Turn:
    """T7: move the head to the end of the turn before the question, then run a normal turn."""
    conversation = conversation_for_user(user=user, conversation_id=conversation_id)
    token = _lock(conversation)
    try:
        path = node_path(conversation.head_id)
        if node_id is None:
            index = turn_start(path)
            if index is None:
                raise BadInput("There is no question to regenerate yet.")
        else:
            index = _question_node(conversation, path, node_id)
        question = content if content is not None else it.question_of(path[index].sent)
        with transaction.atomic():
            services.head_move(conversation=conversation, to=path[index].parent_id, turn_token=token)
    except Exception:
        services.turn_lock_release(conversation=conversation, token=token)
        raise
    return Turn(conversation=conversation, user=user, token=token, first_items=[it.user(question)])


def turn_edit(*, user, conversation_id: Any, node_id: Any, content: Any) -> Turn:
    return _reposition(user=user, conversation_id=conversation_id, node_id=node_id, content=_check_content(content))


def turn_regenerate(*, user, conversation_id: Any, node_id: Any = None) -> Turn:
    return _reposition(user=user, conversation_id=conversation_id, node_id=node_id, content=None)


def turn_decide(*, user, conversation_id: Any, call_id: Any, approve: Any) -> Turn | None:
    """Record a person's decision on a pending tool call (F3); once all are decided, the turn goes on."""
    if not isinstance(call_id, str) or not call_id:
        raise BadInput("`tool_call_id` must be a string.")
    if not isinstance(approve, bool):
        raise BadInput("`approve` must be true or false.")
    conversation = conversation_for_user(user=user, conversation_id=conversation_id)
    token = _lock(conversation)
    try:
        path = node_path(conversation.head_id)
        waiting = _pending_approvals(conversation, path[-1] if path else None)
        if call_id not in {c["id"] for c in waiting}:
            raise NotFound(f"No tool call {call_id!r} is waiting for approval.")
        head = path[-1]
        decided = dict(ToolApproval.objects.filter(node_id=head.id).values_list("call_id", "approved"))
        if call_id in decided:
            raise BadInput(f"Tool call {call_id!r} was already {'approved' if decided[call_id] else 'refused'}.")
        with transaction.atomic():
            services.approval_record(node=Node(pk=head.id), call_id=call_id, approved=approve, user=user)
            Bubble.objects.filter(node_id=head.id, role=Bubble.Role.TOOL, data__call_id=call_id).update(
                data={**_tool_bubble_data(_call(head, call_id)), "status": "approved" if approve else "refused"}
            )
        decided[call_id] = approve
        if any(c["id"] not in decided for c in waiting):
            services.turn_lock_release(conversation=conversation, token=token)
            return None
    except Exception:
        services.turn_lock_release(conversation=conversation, token=token)
        raise
    results = [run_tool_call(c, approved=decided.get(c["id"])) for c in it.tool_calls(head.received)]
    return Turn(conversation=conversation, user=user, token=token, first_items=results)


def _call(node: PathNode, call_id: str) -> it.Item:
    return next(c for c in it.tool_calls(node.received) if c["id"] == call_id)


def _tool_bubble_data(call: it.Item) -> dict[str, Any]:
    return {"call_id": call["id"], "name": call["name"], "arguments": call["arguments"]}


# --- the rounds ---------------------------------------------------------------------------------------


class Turn:
    """A turn whose lock is held and whose starting point is decided. Run it with `events()`, once."""

    def __init__(self, *, conversation: Conversation, user, token: uuid.UUID, first_items: list[it.Item]):
        self.conversation = conversation
        self.user = user
        self.token = token
        self.first_items = first_items
        self.nodes: list[int] = []
        self._pending: Node | None = None

    def events(self) -> Iterator[TurnEvent]:
        try:
            yield from self._rounds()
        except GeneratorExit:
            self._fail_pending(llm.LLMError("cancelled", "stopped by the user"))
            raise
        except BaseException as error:
            self._fail_pending(llm.LLMError("interrupted", f"the turn stopped: {error!r}"))
            raise
        finally:
            services.turn_lock_release(conversation=self.conversation, token=self.token)

    def run(self) -> list[TurnEvent]:
        """Run to the end without streaming (the plain JSON API, tests)."""
        return list(self.events())

    def _rounds(self) -> Iterator[TurnEvent]:
        conversation = self.conversation
        model = conversation.model or settings.ARBOR_MODEL
        provider = llm.provider_of(model)
        parent_id = conversation.head_id
        sent = self.first_items
        max_rounds = max(1, settings.ARBOR_MAX_ROUNDS_PER_TURN)
        for round_number in range(1, max_rounds + 1):
            path = node_path(parent_id)  # one query (T5); nothing off the path can reach the model
            messages = assemble(path, sent, instructions=conversation.instructions, provider=provider)
            # The last round offers no tools, so a turn always ends with an answer.
            tools = [t.spec() for t in all_tools()] if round_number < max_rounds else None
            node = self._start_node(parent_id=parent_id, sent=sent, provider=provider, model=model)
            yield from self._announce_results(sent)
            call = llm.stream_call(model=model, messages=messages, tools=tools)
            try:
                while True:
                    try:
                        token = next(call)
                    except StopIteration as stop:
                        result: llm.CallResult = stop.value
                        break
                    yield TurnEvent("token", {"text": token, "node": node.pk})
            except GeneratorExit:
                try:
                    call.close()
                except llm.LLMError as error:
                    self._fail_pending(error)
                raise
            except llm.LLMError as error:
                yield self._fail_pending(error)
                return
            calls = it.tool_calls(result.received)
            final = not calls
            waiting = [c for c in calls if (t := get_tool(c["name"])) and t.needs_approval]
            if not self._succeed(node, result, head_moves=final or bool(waiting), waiting=bool(waiting)):
                yield self._superseded(node)
                return
            for c in calls:
                yield TurnEvent("tool_call", {**_tool_bubble_data(c), "node": node.pk})
            if final:
                yield TurnEvent("done", {"answer": it.answer_text(result.received), "head": node.pk,
                                         "nodes": list(self.nodes)})
                return
            if waiting:
                yield TurnEvent("approval_required", {"node": node.pk, "calls": [_tool_bubble_data(c)
                                                                                  for c in waiting]})
                return
            sent = [run_tool_call(c) for c in calls]  # C4: every call gets a result
            parent_id = node.pk

    def _start_node(self, *, parent_id: int | None, sent: list[it.Item], provider: str, model: str) -> Node:
        """T3: the node exists, pending, before its call; the question's bubble commits with it."""
        with transaction.atomic():
            node = Node.objects.create(
                parent_id=parent_id, conversation=self.conversation, kind=Node.Kind.TURN,
                status=Node.Status.PENDING, sent=sent, provider=provider, model=model,
            )
            question = it.question_of(sent)
            if question is not None:
                Bubble.objects.create(conversation=self.conversation, node=node, role=Bubble.Role.USER,
                                      content=question)
            results = {i["call_id"]: i for i in sent if i.get("type") == "tool_result"}
            if results and parent_id:
                self._attach_results(parent_id, results)
            services.turn_lock_renew(conversation=self.conversation, token=self.token)
        self._pending = node
        self.nodes.append(node.pk)
        return node

    def _attach_results(self, parent_id: int, results: dict[str, it.Item]) -> None:
        for bubble in Bubble.objects.filter(node_id=parent_id, role=Bubble.Role.TOOL):
            result = results.get(bubble.data.get("call_id"))
            if result:
                bubble.data = {**bubble.data, "result": result["content"], "is_error": result["is_error"],
                               "status": "error" if result["is_error"] else "done"}
                bubble.save(update_fields=["data"])

    def _announce_results(self, sent: list[it.Item]) -> Iterator[TurnEvent]:
        for item in sent:
            if item.get("type") == "tool_result":
                yield TurnEvent("tool_result", {"call_id": item["call_id"], "name": item["name"],
                                                "content": item["content"], "is_error": item["is_error"]})

    def _succeed(self, node: Node, result: llm.CallResult, *, head_moves: bool, waiting: bool) -> bool:
        """One transaction: the answered node, its bubbles, the head move at the turn's end, the jobs.

        Return False if this turn lost its lock (it outlived its expiry and another turn took over):
        its node is kept all the same, but it may not move the head (R3).
        """
        with transaction.atomic():
            node.status = Node.Status.SUCCEEDED
            node.received = result.received
            node.usage = result.usage
            node.provider, node.model = result.provider, result.model
            node.finished_at = timezone.now()
            node.save(update_fields=["status", "received", "usage", "provider", "model", "finished_at"])
            answer = it.answer_text(result.received)
            if answer:
                Bubble.objects.create(conversation=self.conversation, node=node, role=Bubble.Role.ASSISTANT,
                                      content=answer)
            for call in it.tool_calls(result.received):
                tool = get_tool(call["name"])
                status = "awaiting_approval" if tool and tool.needs_approval else "running"
                Bubble.objects.create(conversation=self.conversation, node=node, role=Bubble.Role.TOOL,
                                      content=call["name"], data={**_tool_bubble_data(call), "status": status})
            moved = True
            if head_moves:
                moved = self._move_head(node.pk)
                if moved and not waiting:
                    services.outbox_add(kind="turn_committed",
                                        payload={"conversation": self.conversation.pk, "head": node.pk})
        self._pending = None
        return moved

    def _move_head(self, node_id: int) -> bool:
        try:
            with transaction.atomic():  # a savepoint: a refused move must not undo the node
                services.head_move(conversation=self.conversation, to=node_id, turn_token=self.token)
        except TurnInProgress:
            return False
        return True

    def _superseded(self, node: Node) -> TurnEvent:
        return TurnEvent("error", {"code": "turn_superseded", "node": node.pk, "head": None,
                                   "message": "This turn ran past its lock and another took over; its answer "
                                              "is kept as a branch.", "nodes": list(self.nodes)})

    def _fail_pending(self, error: llm.LLMError) -> TurnEvent:
        """F1/F2: record the failure; the head moves to the failed node unless the context overflowed."""
        node = self._pending
        if node is None:
            return TurnEvent("error", {"code": error.reason, "message": error.message})
        with transaction.atomic():
            node.status = Node.Status.FAILED
            node.failure_reason = error.reason
            node.failure_message = error.message
            node.received = error.partial
            node.finished_at = timezone.now()
            node.save(update_fields=["status", "failure_reason", "failure_message", "received", "finished_at"])
            partial = it.answer_text(error.partial)
            Bubble.objects.create(conversation=self.conversation, node=node, role=Bubble.Role.ERROR,
                                  content=error.message, data={"reason": error.reason, "partial": partial})
            if error.reason != Node.FailureReason.CONTEXT_OVERFLOW:
                self._move_head(node.pk)
        self._pending = None
        return TurnEvent("error", {"code": error.reason, "message": error.message, "node": node.pk,
                                   "head": self.conversation.head_id, "nodes": list(self.nodes)})


def head_switch(*, user, conversation_id: Any, node_id: Any) -> Conversation:
    """T8: move the head to the latest tip of the branch that holds `node_id`."""
    from conversations.selectors import latest_tip

    conversation = conversation_for_user(user=user, conversation_id=conversation_id)
    try:
        node_id = int(node_id)
    except (TypeError, ValueError):
        raise BadInput("`node` must be a node id.") from None
    path_ids = {p.id for p in node_path(conversation.head_id)}
    node = Node.objects.filter(pk=node_id).values_list("conversation_id", flat=True)
    if not node.exists():
        raise NotFound("No such node.")
    if node.first() != conversation.pk and node_id not in path_ids:
        raise BadInput(f"Node {node_id} is not in this conversation's tree.")
    with transaction.atomic():
        services.head_move(conversation=conversation, to=latest_tip(conversation=conversation, node_id=node_id))
    return conversation
