"""The one turn runner (R1).

Every way of asking the model something (a new question, an edit, a regenerate, a turn resumed after
an approval) first decides *where the new node's parent is*, then hands over to `Turn.events`, which
runs the rounds:

    check ownership -> load state -> compact if needed -> gather instructions -> assemble -> call the
    model, streaming -> keep what came back -> commit node, head, bubbles and jobs in one transaction.

Loading the state expands a compaction root the conversation's model cannot read (C3,
`selectors.context_path`); before each round's call, `conversations.compaction` runs when the call
would pass the budget's threshold (C1, C2). `Turn.events` is a generator of `TurnEvent`s; closing it
(stop, or a client that went away) ends the turn as failed/cancelled.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from config.errors import BadInput, NotFound, TooLarge
from conversations import budget, compaction, jobs, llm, services
from conversations import items as it
from conversations.context import PathNode, assemble, is_compaction_root
from conversations.errors import ApprovalPending, BeforeCompaction, ProviderFailed, TurnInProgress
from conversations.models import Bubble, Conversation, Node, ToolApproval
from conversations.retrieval import retrieved_items
from conversations.selectors import (
    context_path,
    conversation_for_user,
    history_ids,
    instructions_for,
    node_path,
    opens_turn,
    path_node,
    turn_start,
)
from conversations.side_calls import release_connection
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


def _open_calls(tip: PathNode | None) -> list[it.Item]:
    """Tool calls on the path's last node that have no result yet: their results must go out first."""
    if tip is None or tip.status != Node.Status.SUCCEEDED:
        return []
    return it.tool_calls(tip.received)


def _needs_approval(call: it.Item) -> bool:
    tool = get_tool(call["name"])
    return bool(tool and tool.needs_approval)


def _undecided(tip: PathNode | None) -> list[it.Item]:
    """The open calls that wait for a person's decision (F3)."""
    calls = [c for c in _open_calls(tip) if _needs_approval(c)]
    if not calls:
        return []
    decided = set(ToolApproval.objects.filter(node_id=tip.id).values_list("call_id", flat=True))
    return [c for c in calls if c["id"] not in decided]


def _begin(*, user, conversation: Conversation, token: uuid.UUID, path: list[PathNode],
           new_items: list[it.Item]) -> Turn:
    """Start a turn whose first node hangs below the last node of `path` (the head, or where T7 puts it)."""
    if _undecided(path[-1] if path else None):
        raise ApprovalPending("A tool call is waiting for approval: approve or refuse it first.")
    return Turn(conversation=conversation, user=user, token=token, path=path, new_items=new_items)


def _locked(function):
    """Take the turn lock, run `function(conversation, token)`; give the lock back if it refuses."""

    def run(*, user, conversation_id: Any, **kwargs) -> Turn | None:
        conversation = conversation_for_user(user=user, conversation_id=conversation_id)
        token = services.turn_lock_acquire(conversation=conversation)
        try:
            # Read the state again under the lock: a turn that ended in between may have moved the head.
            conversation.refresh_from_db(fields=["head", "version", "model", "instructions", "retrieval",
                                                 "keep_retrieved"])
            return function(user=user, conversation=conversation, token=token, **kwargs)
        except BaseException:
            services.turn_lock_release(conversation=conversation, token=token)
            raise

    return run


def turn_ask(*, user, conversation_id: Any, content: Any) -> Turn:
    """A new question from the head."""
    content = _check_content(content)
    return _locked(_ask)(user=user, conversation_id=conversation_id, content=content)


def _ask(*, user, conversation: Conversation, token: uuid.UUID, content: str) -> Turn:
    path = node_path(conversation.head_id)
    return _begin(user=user, conversation=conversation, token=token, path=path, new_items=[it.user(content)])


def _question_index(conversation: Conversation, path: list[PathNode], node_id: Any) -> int:
    """Return the index on the path of the node that sent the question `node_id` (T7, T10)."""
    try:
        node_id = int(node_id)
    except (TypeError, ValueError):
        raise BadInput("`node` must be a node id.") from None
    for index, node in enumerate(path):
        if node.id == node_id:
            if is_compaction_root(node):
                break
            if not opens_turn(node):
                raise BadInput(f"Node {node_id} did not send a question; pass the node that did.")
            return index
    if path and is_compaction_root(path[0]) and _before_compaction(path[0], node_id):
        raise BeforeCompaction(f"Node {node_id} lies before the compaction node {path[0].id}; it cannot be edited.")
    if Node.objects.filter(pk=node_id, conversation=conversation).exists():
        raise BadInput(f"Node {node_id} is not on this conversation's current path; switch to its branch first.")
    raise NotFound(f"No node {node_id} in this conversation.")


def _before_compaction(root: PathNode, node_id: int) -> bool:
    """T10: is `node_id` the root itself, or anywhere on the history behind it (through every earlier root)?

    Ids only: the history behind a long conversation's roots is thousands of nodes, and their items are
    not needed to compare ids.
    """
    return node_id == root.id or node_id in history_ids(root.compacted_from_id)


def _reposition(*, user, conversation: Conversation, token: uuid.UUID, node_id: Any, content: str | None) -> Turn:
    """T7: a normal turn whose parent is the end of the turn before the question.

    The head itself moves when that turn ends, like any turn's: a turn that never runs moves nothing.
    """
    path = node_path(conversation.head_id)
    if node_id is None:
        index = turn_start(path)
        if index is None and path and is_compaction_root(path[0]):
            raise BeforeCompaction(f"The last question lies before the compaction node {path[0].id}; ask a new one.")
        if index is None:
            raise BadInput("There is no question to regenerate yet.")
    else:
        index = _question_index(conversation, path, node_id)
    question = content if content is not None else it.question_of(path[index].sent)
    return _begin(user=user, conversation=conversation, token=token, path=path[:index],
                  new_items=[it.user(question)])


def turn_edit(*, user, conversation_id: Any, node_id: Any, content: Any) -> Turn:
    content = _check_content(content)
    return _locked(_reposition)(user=user, conversation_id=conversation_id, node_id=node_id, content=content)


def turn_regenerate(*, user, conversation_id: Any, node_id: Any = None) -> Turn:
    return _locked(_reposition)(user=user, conversation_id=conversation_id, node_id=node_id, content=None)


def _retry(*, user, conversation: Conversation, token: uuid.UUID) -> Turn:
    path = node_path(conversation.head_id)
    tip = path[-1] if path else None
    if tip is None or tip.status != Node.Status.FAILED:
        raise BadInput("Nothing to retry: the last call did not fail.")
    return _begin(user=user, conversation=conversation, token=token, path=path, new_items=[])


def turn_retry(*, user, conversation_id: Any) -> Turn:
    """F1: call the model again from the failed node at the head, adding nothing.

    The failed node's sent items (the question, or the previous round's tool results) are on the
    path, so nothing is asked twice and no tool runs again.
    """
    return _locked(_retry)(user=user, conversation_id=conversation_id)


def _decide(*, user, conversation: Conversation, token: uuid.UUID, call_id: str, approve: bool) -> Turn | None:
    path = node_path(conversation.head_id)
    tip = path[-1] if path else None
    call = next((c for c in _open_calls(tip) if c["id"] == call_id and _needs_approval(c)), None)
    if call is None:
        raise NotFound(f"No tool call {call_id!r} is waiting for approval.")
    earlier = ToolApproval.objects.filter(node_id=tip.id, call_id=call_id).values_list("approved", flat=True).first()
    if earlier is not None and earlier != approve:
        raise BadInput(f"Tool call {call_id!r} was already {'approved' if earlier else 'refused'}.")
    if earlier is None:
        with transaction.atomic():
            services.approval_record(node_id=tip.id, call_id=call_id, approved=approve, user=user)
            Bubble.objects.filter(node_id=tip.id, role=Bubble.Role.TOOL, data__call_id=call_id).update(
                data={**_tool_bubble_data(call), "status": "approved" if approve else "refused"}
            )
    if _undecided(tip):
        services.turn_lock_release(conversation=conversation, token=token)
        return None
    return Turn(conversation=conversation, user=user, token=token, path=path, new_items=[])


def turn_decide(*, user, conversation_id: Any, call_id: Any, approve: Any) -> Turn | None:
    """Record a person's decision on a pending tool call (F3); once all are decided, the turn goes on.

    Deciding the same way twice resumes again (a client that lost the answer can retry); the action
    itself never runs twice, because its result is stored with the decision.
    """
    if not isinstance(call_id, str) or not call_id:
        raise BadInput("`tool_call_id` must be a string.")
    if not isinstance(approve, bool):
        raise BadInput("`approve` must be true or false.")
    return _locked(_decide)(user=user, conversation_id=conversation_id, call_id=call_id, approve=approve)


def _tool_bubble_data(call: it.Item) -> dict[str, Any]:
    return {"call_id": call["id"], "name": call["name"], "arguments": call["arguments"]}


def _resolve_calls(node: PathNode, *, run: bool, note: str = "") -> list[it.Item]:
    """Results for `node`'s open calls (C4: every call gets one). Without `run`, nothing new executes:
    a call with no stored result gets an error result that says `note`."""
    calls = _open_calls(node)
    decisions = ({a.call_id: a for a in ToolApproval.objects.filter(node_id=node.id)}
                 if any(_needs_approval(c) for c in calls) else {})
    results = []
    for call in calls:
        decision = decisions.get(call["id"])
        if decision is not None and decision.result:
            results.append(decision.result)
        elif not run:
            results.append(it.tool_result(call["id"], call["name"], note, is_error=True))
        elif decision is not None:
            result = run_tool_call(call, approved=decision.approved)
            services.approval_store_result(node_id=node.id, call_id=call["id"], result=result)
            results.append(result)
        else:
            results.append(run_tool_call(call))
    return results


def next_context(conversation: Conversation) -> list[dict[str, Any]]:
    """What the next call from the head would send: the path, then results for calls still open."""
    provider = llm.provider_of(conversation.model or settings.ARBOR_MODEL)
    path = context_path(node_path(conversation.head_id), provider)
    tip = path[-1] if path else None
    waiting = _resolve_calls(tip, run=False, note="pending: waiting for a person's decision") if tip else []
    return assemble(path, waiting, instructions=instructions_for(conversation), provider=provider,
                    keep_ephemeral=conversation.keep_retrieved)


def call_context(node: Node) -> list[dict[str, Any]]:
    """What the call of `node` was sent: its parent's path, its own items, its instructions ("what the model saw").

    A compaction root sent nothing itself: its context is what the next call below it starts with.
    """
    provider = node.provider or None
    if is_compaction_root(node):
        return assemble([path_node(node)], (), instructions=node.instructions, provider=provider,
                        keep_ephemeral=node.keep_ephemeral)
    return assemble(context_path(node_path(node.parent_id), provider), node.sent, instructions=node.instructions,
                    provider=provider, keep_ephemeral=node.keep_ephemeral)


def turn_compact(*, user, conversation_id: Any) -> Node:
    """Compact now (C2): the head moves to a new compaction root. Holds the turn lock like a turn (T9)."""
    return _locked(_compact_now)(user=user, conversation_id=conversation_id)


def _compact_now(*, user, conversation: Conversation, token: uuid.UUID) -> Node:
    try:
        model = conversation.model or settings.ARBOR_MODEL
        path = context_path(node_path(conversation.head_id), llm.provider_of(model))
        if not path:
            raise compaction.NothingToCompact("Nothing to compact: the conversation has no messages yet.")
        if _open_calls(path[-1]):
            raise ApprovalPending("A tool call is still open: approve or refuse it (or let its turn end) first.")
        lock = _LockKeeper(conversation, token)
        try:
            done = compaction.compact(conversation=conversation, path=path, model=model,
                                      instructions=instructions_for(conversation), keep_alive=lock.renew_if_due,
                                      keep_ephemeral=conversation.keep_retrieved)
        except compaction.SummaryFailed as failed:
            raise ProviderFailed(failed.error.reason, f"The summarising call failed: {failed.error.message}",
                                 node=failed.node_id, head=conversation.head_id) from failed
        if not _head_move(conversation, done.root.id, token):
            raise TurnInProgress("The compaction outlived its lock and another turn took over; its nodes are kept.")
        return Node.objects.get(pk=done.root.id)
    finally:
        services.turn_lock_release(conversation=conversation, token=token)


def _head_move(conversation: Conversation, to: int, token: uuid.UUID) -> bool:
    """Move the head with the turn's lock (`services.head_move`, the one head mover); False if the lock was
    lost (R3). A savepoint: a refused move never undoes what the caller wrote before it."""
    try:
        with transaction.atomic():
            services.head_move(conversation=conversation, to=to, turn_token=token)
    except TurnInProgress:
        return False
    return True


class _LockKeeper:
    """Keep a turn lock alive through long streams and tool runs (T9): renew at a third of its life."""

    def __init__(self, conversation: Conversation, token: uuid.UUID):
        self.conversation, self.token = conversation, token
        self.renewed_at = time.monotonic()

    def renew_if_due(self) -> None:
        if time.monotonic() - self.renewed_at > settings.ARBOR_TURN_LOCK_SECONDS / 3:
            self.renew()
            release_connection()

    def renew(self) -> None:
        services.turn_lock_renew(conversation=self.conversation, token=self.token)
        self.renewed_at = time.monotonic()


# --- the rounds ---------------------------------------------------------------------------------------


class Turn:
    """A turn whose lock is held and whose starting point is decided. Run it with `events()`, once."""

    def __init__(self, *, conversation: Conversation, user, token: uuid.UUID, path: list[PathNode],
                 new_items: list[it.Item]):
        self.conversation = conversation
        self.user = user
        self.token = token
        self.new_items = new_items
        self.nodes: list[int] = []
        self.model = conversation.model or settings.ARBOR_MODEL
        self.provider = llm.provider_of(self.model)
        self.instructions = instructions_for(conversation)
        question = it.question_of(new_items)
        if conversation.retrieval and question:  # R2: for this call; later ones drop them unless kept
            self.new_items = [*retrieved_items(conversation, question), *new_items]
        self._path = path  # up to the first node's parent; each round's node is appended
        tip = path[-1] if path else None
        self._open: PathNode | None = tip if _open_calls(tip) else None  # calls still needing results
        self._pending: Node | None = None  # the node whose call is under way
        self._started = False
        self._start_lock = threading.Lock()  # `events` (a worker thread) and `abandon` may race
        self._lock = _LockKeeper(conversation, token)
        self._summary_failed = False  # a failed summary is not tried again in the same turn

    def _claim(self) -> bool:
        with self._start_lock:
            claimed, self._started = not self._started, True
        return claimed

    def events(self) -> Iterator[TurnEvent]:
        if not self._claim():
            return  # abandoned before it began: the lock is already given back
        try:
            yield from self._rounds()
        except GeneratorExit:
            self._fail(llm.LLMError("cancelled", "stopped by the user"))
            raise
        except BaseException as error:
            self._fail(llm.LLMError("interrupted", f"the turn stopped: {error!r}"))
            raise
        finally:
            services.turn_lock_release(conversation=self.conversation, token=self.token)

    def run(self) -> list[TurnEvent]:
        """Run to the end without streaming (the plain JSON API, tests)."""
        return list(self.events())

    def abandon(self) -> None:
        """Give the lock back if the turn was never started (its client left before the stream began)."""
        if self._claim():
            services.turn_lock_release(conversation=self.conversation, token=self.token)

    def _rounds(self) -> Iterator[TurnEvent]:
        max_rounds = max(1, settings.ARBOR_MAX_ROUNDS_PER_TURN)
        # Read once, when the turn began (T5): later rounds append their own node. C3: expanded when
        # this model cannot read the compaction result the path starts with.
        path = context_path(self._path, self.provider)
        for round_number in range(1, max_rounds + 1):
            sent = [*(_resolve_calls(self._open, run=True) if self._open else []), *self.new_items]
            self.new_items = []
            # The last round offers no tools, so a turn ends with an answer.
            last_round = round_number == max_rounds
            tools = None if last_round else [t.spec() for t in all_tools()]
            path, compacted = self._compact_if_needed(path, sent, tools)
            parent = path[-1] if path else None
            messages = assemble(path, sent, instructions=self.instructions, provider=self.provider,
                                keep_ephemeral=self.conversation.keep_retrieved)
            node = self._start_node(parent=parent, sent=sent)
            if compacted:
                yield TurnEvent("compaction", {"node": compacted.root.id, "summary_call": compacted.summary_call,
                                               "compacted_from": compacted.root.compacted_from_id})
            yield from self._announce_results(sent)
            result = yield from self._call_model(node, messages, tools)
            if result is None:
                return
            calls = it.tool_calls(result.received)
            waiting = [c for c in calls if _needs_approval(c)] if not last_round else []
            if not self._succeed(node, result, head_moves=not calls or bool(waiting), waiting=bool(waiting)):
                yield self._superseded(node)
                return
            if calls and not waiting:
                # From here, a stop gives these calls 'not run' results. Shifted like its parent (C3).
                self._open = path_node(node, shift=parent.shift if parent else 0)
                path = [*path, self._open]
            for c in calls:
                yield TurnEvent("tool_call", {**_tool_bubble_data(c), "node": node.pk})
            if not calls:
                yield TurnEvent("done", {"answer": it.answer_text(result.received), "head": node.pk,
                                         "nodes": list(self.nodes)})
                return
            if waiting:
                yield TurnEvent("approval_required", {"node": node.pk,
                                                      "calls": [_tool_bubble_data(c) for c in waiting]})
                return
            if last_round:  # the model asked for tools although none were offered
                yield self._fail(llm.LLMError("round_limit", f"the model still asked for tools after {max_rounds} "
                                              "rounds; those calls were not run"))
                return

    def _compact_if_needed(self, path: list[PathNode], sent: list[it.Item], tools: list[dict] | None
                           ) -> tuple[list[PathNode], compaction.Compaction | None]:
        """C1, C2: compact before a call that would pass the threshold; the call then hangs below the root.

        When the path's tip is the head (a new question), the head moves to the root at once, so a call
        that then fails leaves it on the compacted path; otherwise it moves at the turn's end, as always.
        A failed summarising call is recorded and the turn goes on uncompacted, without trying again in
        a later round: the call itself may still fit the limit, and if it does not, its overflow is
        recorded like any other (F2).
        """
        if self._summary_failed or not compaction.needed(path, sent, model=self.model, provider=self.provider,
                                                         instructions=self.instructions, tools=tools):
            return path, None
        results = [item for item in sent if item.get("type") == "tool_result"]
        try:
            done = compaction.compact(conversation=self.conversation, path=path, model=self.model,
                                      instructions=self.instructions, pending_results=results,
                                      keep_alive=self._renew_lock_if_due,
                                      keep_ephemeral=self.conversation.keep_retrieved)
        except compaction.NothingToCompact:
            return path, None
        except compaction.CannotCompact:
            self._summary_failed = True
            return path, None
        except compaction.SummaryFailed as failed:
            self.nodes.append(failed.node_id)
            self._summary_failed = True
            return path, None
        self.nodes.extend(done.written)
        if done.root.compacted_from_id == self.conversation.head_id:
            self._move_head(done.root.id)
        return [done.root], done

    def _call_model(self, node: Node, messages: list[dict], tools: list[dict] | None
                    ) -> Generator[TurnEvent, None, llm.CallResult | None]:
        """Stream one call as token events; return its result, or None once its failure is recorded."""
        release_connection()  # no database connection is held while the model thinks
        call = llm.stream_call(model=self.model, messages=messages, tools=tools)
        try:
            while True:
                try:
                    token = next(call)
                except StopIteration as stop:
                    return stop.value
                self._renew_lock_if_due()
                yield TurnEvent("token", {"text": token, "node": node.pk})
        except GeneratorExit:
            try:
                call.close()
            except llm.LLMError as error:
                self._fail(error)
            raise
        except llm.LLMError as error:
            yield self._fail(error)
            return None

    def _start_node(self, *, parent: PathNode | None, sent: list[it.Item]) -> Node:
        """T3: the node exists, pending, before its call; the question's bubble commits with it."""
        parent_id = parent.id if parent else None
        tokens = budget.items_tokens(sent, model=self.model, provider=self.provider)
        with transaction.atomic():
            node = Node.objects.create(
                parent_id=parent_id, conversation=self.conversation, kind=Node.Kind.TURN,
                status=Node.Status.PENDING, sent=sent, provider=self.provider, model=self.model,
                instructions=self.instructions, keep_ephemeral=self.conversation.keep_retrieved, tokens=tokens,
                path_tokens=(parent.stored_path_tokens if parent else 0) + tokens,
            )
            question = it.question_of(sent)
            if question is not None:
                Bubble.objects.create(conversation=self.conversation, node=node, role=Bubble.Role.USER,
                                      content=question)
            results = {i["call_id"]: i for i in sent if i.get("type") == "tool_result"}
            if results and self._open is not None:
                # The node that made the calls; after a compaction between rounds it is not the parent.
                self._attach_results(self._open.id, results)
            self._lock.renew()
        self._pending = node
        self._open = None
        self.nodes.append(node.pk)
        return node

    def _attach_results(self, caller_id: int, results: dict[str, it.Item]) -> None:
        bubbles = list(Bubble.objects.filter(node_id=caller_id, role=Bubble.Role.TOOL))
        for bubble in bubbles:
            result = results.get(bubble.data.get("call_id"))
            if result:
                refused = bubble.data.get("status") == "refused"  # a refusal's error result says it was refused
                bubble.data = {**bubble.data, "result": result["content"], "is_error": result["is_error"],
                               "status": "refused" if refused else "error" if result["is_error"] else "done"}
        Bubble.objects.bulk_update(bubbles, ["data"])

    def _announce_results(self, sent: list[it.Item]) -> Iterator[TurnEvent]:
        for item in sent:
            if item.get("type") == "tool_result":
                yield TurnEvent("tool_result", {"call_id": item["call_id"], "name": item["name"],
                                                "content": item["content"], "is_error": item["is_error"]})

    def _renew_lock_if_due(self) -> None:
        self._lock.renew_if_due()

    def _succeed(self, node: Node, result: llm.CallResult, *, head_moves: bool, waiting: bool) -> bool:
        """One transaction: the answered node, its bubbles, the head move at the turn's end, the jobs.

        Return False if this turn lost its lock (it outlived its expiry and another turn took over):
        its node is kept all the same, but it may not move the head (R3).
        """
        received_tokens = budget.items_tokens(result.received, model=self.model, provider=result.provider)
        with transaction.atomic():
            node.status = Node.Status.SUCCEEDED
            node.received = result.received
            node.usage = result.usage
            node.provider, node.model = result.provider, result.model
            node.finished_at = timezone.now()
            node.tokens += received_tokens
            node.path_tokens += received_tokens
            node.save(update_fields=["status", "received", "usage", "provider", "model", "finished_at", "tokens",
                                     "path_tokens"])
            answer = it.answer_text(result.received)
            if answer:
                Bubble.objects.create(conversation=self.conversation, node=node, role=Bubble.Role.ASSISTANT,
                                      content=answer)
            for call in it.tool_calls(result.received):
                status = "awaiting_approval" if _needs_approval(call) else "running"
                Bubble.objects.create(conversation=self.conversation, node=node, role=Bubble.Role.TOOL,
                                      content=call["name"], data={**_tool_bubble_data(call), "status": status})
            moved = True
            if head_moves:
                moved = self._move_head(node.pk)
                if moved and not waiting:
                    jobs.enqueue_after_turn(conversation_id=self.conversation.pk, head=node.pk)
        self._pending = None
        return moved

    def _move_head(self, node_id: int) -> bool:
        return _head_move(self.conversation, node_id, self.token)

    def _superseded(self, node: Node) -> TurnEvent:
        return TurnEvent("error", {"code": "turn_superseded", "node": node.pk, "head": None,
                                   "message": "This turn ran past its lock and another took over; its answer "
                                              "is kept as a branch.", "nodes": list(self.nodes)})

    def _fail(self, error: llm.LLMError) -> TurnEvent:
        """F1/F2: record the failure; the head moves to the failed node unless the context overflowed.

        Stopped between rounds, the open calls get 'not run' results in a failed node of their own,
        so the question and the calls stay on the path (C4, F1).
        """
        if self._pending is None and self._open is not None:
            note = f"not run: {error.message}"
            self._start_node(parent=self._open, sent=_resolve_calls(self._open, run=False, note=note))
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
            Bubble.objects.create(conversation=self.conversation, node=node, role=Bubble.Role.ERROR,
                                  content=error.message,
                                  data={"reason": error.reason, "partial": it.answer_text(error.partial)})
            if error.reason != Node.FailureReason.CONTEXT_OVERFLOW:
                self._move_head(node.pk)
            # R4: a failed turn's question is searchable too (the job indexes whatever is not yet).
            jobs.enqueue_after_turn(conversation_id=self.conversation.pk, head=self.conversation.head_id)
        self._pending = None
        return TurnEvent("error", {"code": error.reason, "message": error.message, "node": node.pk,
                                   "head": self.conversation.head_id, "nodes": list(self.nodes)})

