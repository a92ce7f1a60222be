"""Where a turn starts: every way of asking the model something decides *where the new node's parent is*,
takes the turn lock, and hands a `Turn` to the one runner (`runner.py`).

- ask: below the head.
- edit and regenerate (T7): below the last node of the turn before the question; the old branch is kept.
- retry (F1): again from the failed node at the head, adding nothing.
- decide (F3): a person's approval or refusal; once every open call is decided, the turn goes on.
- compact (C2): not a turn, but it holds the lock like one (T9) while the summary is made.

The entry points take values already parsed at the edge (the API's and the socket's serializers); the rules
of the tree (T9, T10, F3) are checked here, under the lock, before anything is written.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from typing import TypeVar

from django.conf import settings
from django.db import transaction

from config.errors import BadInput, NotFound, TooLarge
from conversations import items as it
from conversations import llm, services, usage
from conversations.context import PathNode, is_compaction_root
from conversations.errors import ApprovalPending, BeforeCompaction, ProviderFailed, TurnInProgress
from conversations.locks import TurnLock
from conversations.models import Conversation, Node, ToolApproval
from conversations.selectors import (
    context_path,
    history_ids,
    instructions_for,
    node_path,
    opens_turn,
    path_node,
    turn_start,
)
from conversations.turns import calls, compaction, records, recovery
from conversations.turns.runner import Turn
from conversations.turns.siblings import SiblingTurns
from conversations.turns.tool_policy import client_calls
from files.services import files_to_send

T = TypeVar("T")


def check_content(content: str) -> str:
    if not content.strip():
        raise BadInput("`content` must be a non-empty string.")
    if len(content) > settings.ARBOR_MAX_CONTENT_CHARS:
        raise TooLarge(f"`content` is longer than {settings.ARBOR_MAX_CONTENT_CHARS} characters.")
    return content


def _under_lock(user, conversation_id: int, begin: Callable[[Conversation, TurnLock], T], *,
                budgeted: bool = True, weight: int = 1) -> T:
    """Take the turn lock, then `begin`; the lock goes to the `Turn` it returns, or back if it returns none or
    refuses.

    The conversation (and its owner's budget) is read by the UPDATE that takes the lock, so no turn that ended
    before can have moved its head since. `budgeted`: a start past the month's budget is refused (issue 31) before
    anything is written; a decision on a waiting call is not (its turn began within the budget). `weight`: how
    many turns it runs at once (issue 33: one per model asked), each counted by the person's limit."""
    lock = TurnLock.take(owner=user, conversation_id=conversation_id, weight=weight)
    with lock.until_handed_over():
        if budgeted:
            usage.check_budget(user.pk, *lock.budget)
        if lock.took_over:  # its last holder died: what it left pending is failed first (and may be the head)
            recovery.recover(lock.conversation, lock)
        return begin(lock.conversation, lock)


def _turn(conversation: Conversation, lock: TurnLock, path: list[PathNode], new_items: list[it.Item], *,
          models: list[str] = (), **options) -> Turn | SiblingTurns:
    """A turn whose first node hangs below the last node of `path`; refused while a call waits for a person.
    `models`: several are asked at once, one sibling branch each (issue 33), the first moving the head.
    `options`: the call's own model, instructions and tools (`Turn`)."""
    if calls.undecided(path[-1] if path else None, owner=conversation.owner_id):
        raise ApprovalPending("A tool call is waiting for approval: approve or refuse it first.")
    asked = list(models) or [options.pop("model", None) or conversation.effective_model]
    # X1: checked for every model before any branch takes the lock over
    if (blind := [model for model in asked if not llm.supports_vision(model)]) and _sends_images(path, new_items):
        raise BadInput(f"The model {blind[0]} cannot see images, and this call would send some: choose one that "
                       "can, or go on from before the images.")
    turns = []
    try:
        for model in asked:
            turns.append(Turn(conversation=conversation, lock=lock, path=path, new_items=copy.deepcopy(new_items),
                              model=model, **options))
    except BaseException:
        if turns:  # the first took the lock over, and none of them will run: it goes back here
            lock.release()
        raise
    return turns[0] if len(turns) == 1 else SiblingTurns(turns)


def _sends_images(path: list[PathNode], new_items: list[it.Item]) -> bool:
    sent = itertools.chain((item for node in path for item in node.sent), new_items)
    return any(ref["kind"] == "image" for item in sent if item.get("type") == "user" for ref in item.get("files", ()))


def turn_ask(*, user, conversation_id: int, content: str, files: list[int] = (), models: list[str] = ()
             ) -> Turn | SiblingTurns:
    """A new question from the head, with the person's `files` (X1) if any, asked of `models` (issue 33; default:
    the conversation's)."""
    content = check_content(content)
    attached = files_to_send(user=user, file_ids=list(files)) if files else None

    def begin(conversation: Conversation, lock: TurnLock) -> Turn | SiblingTurns:
        path = node_path(conversation.head_id, owner=conversation.owner_id)
        return _turn(conversation, lock, path, [it.user(content, attached)], models=models)

    return _under_lock(user, conversation_id, begin, weight=len(models))


MAX_SUPPLIED_TURNS = 100  # calls a client made elsewhere, recorded in one request (under the turn lock)


def turn_below(*, user, conversation_id: int, parent_id: int | None, items: list[it.Item],
               supplied: list[tuple[list[it.Item], list[it.Item]]] = (), **options) -> Turn:
    """A call of the OpenAI-compatible surface, hung below `parent_id` (None: a new root, the conversation's first
    call or a sibling of it), whatever the head: its `previous_response_id`, or the end of the stored path a Chat
    Completions list extends. An older parent forks a branch (T7, T8); the head moves to the new node when the
    turn ends, as for any turn. `supplied`: (sent, received) calls the client made elsewhere, recorded under the
    lock between the parent and the new call; their tool calls are the client's. `options`: the call's own model,
    instructions and tools (`Turn`).

    Everything is checked before anything is written: the parent, a person's pending approval on it (F3), and a
    result in `items` for every open call the new call follows (C4, T4) and for no other.
    """
    if len(supplied) > MAX_SUPPLIED_TURNS:
        raise BadInput(f"The list holds {len(supplied)} answered turns this server has not seen; send at most "
                       f"{MAX_SUPPLIED_TURNS} at a time.")
    supplied = [(sent, client_calls(received)) for sent, received in supplied]

    def begin(conversation: Conversation, lock: TurnLock) -> Turn:
        if parent_id is not None and not Node.objects.of(conversation).can_be_head().filter(pk=parent_id).exists():
            raise NotFound(f"No response {parent_id} to continue from in this conversation.")
        path = node_path(parent_id, owner=conversation.owner_id) if parent_id is not None else []
        if calls.undecided(path[-1] if path else None, owner=conversation.owner_id):
            raise ApprovalPending("A tool call is waiting for a person's approval on that response: decide it first.")
        follows = supplied[-1][1] if supplied else (path[-1].received if path else [])
        # Calls run here (issue 32: MCP servers a caller named) get their results from the turn, not the caller.
        runs_here = getattr(options.get("tools"), "runs_calls", False)
        _check_results([c for c in it.tool_calls(follows) if calls.is_clients(c) or not runs_here], items)
        written = []
        for sent, received in supplied:
            node = records.record_supplied(conversation=conversation, parent=path[-1] if path else None, sent=sent,
                                           received=received, model=options.get("model") or conversation.model)
            path = [*path, path_node(node)]
            written.append(node.pk)
        return _turn(conversation, lock, path, items, written_before=written, **options)

    return _under_lock(user, conversation_id, begin)


def _check_results(open_calls: list[it.Item], items: list[it.Item]) -> None:
    """C4: every open call gets its result, and a result answers an open call."""
    answered = {item["call_id"] for item in items if item.get("type") == "tool_result"}
    expected = {call["id"] for call in open_calls}
    if missing := sorted(expected - answered):
        raise BadInput(f"No output for the function call(s) {missing}: every call gets its output.")
    if extra := sorted(answered - expected):
        raise BadInput(f"The output(s) for {extra} answer no function call of the previous response.")


def turn_edit(*, user, conversation_id: int, node_id: int, content: str, files: list[int] | None = None,
              models: list[str] = ()) -> Turn | SiblingTurns:
    """T7: the edited question as a new branch below the end of the turn before it, with the person's `files`
    (X1): the question's own when none are named (a typo fixed keeps its screenshot), none for an empty list;
    asked of `models` (issue 33; default: the conversation's)."""
    content = check_content(content)
    edited = it.user(content, files_to_send(user=user, file_ids=list(files)) if files else None)
    return _under_lock(user, conversation_id, lambda c, lock: _reposition(c, lock, node_id, edited,
                                                                         keep_files=files is None, models=models),
                       weight=len(models))


def turn_regenerate(*, user, conversation_id: int, node_id: int | None = None) -> Turn:
    """T7: the same question again (default: the last one), as a new branch."""
    return _under_lock(user, conversation_id, lambda c, lock: _reposition(c, lock, node_id, None))


def _reposition(conversation: Conversation, lock: TurnLock, node_id: int | None, edited: it.Item | None, *,
                keep_files: bool = True, models: list[str] = ()) -> Turn | SiblingTurns:
    """T7: a normal turn whose parent is the end of the turn before the question.

    The head itself moves when that turn ends, like any turn's: a turn that never runs moves nothing.
    """
    path = node_path(conversation.head_id, owner=conversation.owner_id)
    if node_id is None:
        index = turn_start(path)
        if index is None and path and is_compaction_root(path[0]):
            raise BeforeCompaction(f"The last question lies before the compaction node {path[0].id}; ask a new one.")
        if index is None:
            raise BadInput("There is no question to regenerate yet.")
    else:
        index = _question_index(conversation, path, node_id)
    asked = it.question_item(path[index].sent)  # regenerated, or edited keeping its files: the question's files too
    question = edited or asked
    files = asked.get("files") if keep_files and edited is not None else question.get("files")
    return _turn(conversation, lock, path[:index], [it.user(question["text"], files)], models=models)


def _question_index(conversation: Conversation, path: list[PathNode], node_id: int) -> int:
    """Return the index on the path of the node that sent the question `node_id` (T7, T10)."""
    for index, node in enumerate(path):
        if node.id == node_id:
            if is_compaction_root(node):
                break
            if not opens_turn(node):
                raise BadInput(f"Node {node_id} did not send a question; pass the node that did.")
            return index
    if path and is_compaction_root(path[0]) and _before_compaction(path[0], node_id, conversation.owner_id):
        raise BeforeCompaction(f"Node {node_id} lies before the compaction node {path[0].id}; it cannot be edited.")
    if Node.objects.of(conversation).filter(pk=node_id).exists():
        raise BadInput(f"Node {node_id} is not on this conversation's current path; switch to its branch first.")
    raise NotFound(f"No node {node_id} in this conversation.")


def _before_compaction(root: PathNode, node_id: int, owner: int) -> bool:
    """T10: is `node_id` the root itself, or anywhere on the history behind it (through every earlier root)?

    Ids only: the history behind a long conversation's roots is thousands of nodes, and their items are
    not needed to compare ids.
    """
    return node_id == root.id or node_id in history_ids(root.compacted_from_id, owner=owner)


def turn_retry(*, user, conversation_id: int) -> Turn:
    """F1: call the model again from the failed node at the head, adding nothing.

    The failed node's sent items (the question, or the previous round's tool results) are on the
    path, so nothing is asked twice and no tool runs again.
    """

    def begin(conversation: Conversation, lock: TurnLock) -> Turn:
        path = node_path(conversation.head_id, owner=conversation.owner_id)
        if not path or path[-1].status != Node.Status.FAILED:
            raise BadInput("Nothing to retry: the last call did not fail.")
        return _turn(conversation, lock, path, [])

    return _under_lock(user, conversation_id, begin)


def turn_decide(*, user, conversation_id: int, call_id: str, approve: bool) -> Turn | None:
    """Record a person's decision on a pending tool call (F3, D4); once all are decided, the turn goes on.

    Return None while other calls still wait. Deciding the same way twice resumes again (a client that
    lost the answer can retry); the action itself never runs twice, because its result is stored with
    the decision.
    """

    def begin(conversation: Conversation, lock: TurnLock) -> Turn | None:
        path = node_path(conversation.head_id, owner=conversation.owner_id)
        tip = path[-1] if path else None
        call = next((c for c in calls.open_calls(tip) if c["id"] == call_id and calls.needs_approval(c)), None)
        if call is None:
            raise NotFound(f"No tool call {call_id!r} is waiting for approval.")
        earlier = (ToolApproval.objects.filter(owner_id=conversation.owner_id, node_id=tip.id, call_id=call_id)
                   .values_list("approved", flat=True).first())
        if earlier is not None and earlier != approve:
            raise BadInput(f"Tool call {call_id!r} was already {'approved' if earlier else 'refused'}.")
        if earlier is None:
            with transaction.atomic():
                services.approval_record(node_id=tip.id, owner=conversation.owner_id, call_id=call_id,
                                         approved=approve, user=user)
                records.decision_bubble(tip.id, call, owner=conversation.owner_id, approved=approve)
        if calls.undecided(tip, owner=conversation.owner_id):
            return None  # more calls to decide: the lock goes back
        # The model that asked goes on (issue 33: a branch of several models' may not be the conversation's).
        model = tip.model if tip.model in settings.ARBOR_MODELS else None
        return Turn(conversation=conversation, lock=lock, path=path, new_items=[], model=model)

    return _under_lock(user, conversation_id, begin, budgeted=False)


def turn_compact(*, user, conversation_id: int) -> Node:
    """Compact now (C2): the head moves to a new compaction root. Holds the turn lock like a turn (T9)."""

    def begin(conversation: Conversation, lock: TurnLock) -> Node:
        with lock:
            return _compact_now(conversation, lock)

    return _under_lock(user, conversation_id, begin)


def _compact_now(conversation: Conversation, lock: TurnLock) -> Node:
    model = conversation.effective_model
    owner = conversation.owner_id
    path = context_path(node_path(conversation.head_id, owner=owner), llm.provider_of(model), owner=owner)
    if not path:
        raise compaction.NothingToCompact("Nothing to compact: the conversation has no messages yet.")
    if calls.open_calls(path[-1]):
        raise ApprovalPending("A tool call is still open: approve or refuse it (or let its turn end) first.")
    try:
        done = compaction.compact(conversation=conversation, path=path, model=model,
                                  instructions=instructions_for(conversation),
                                  keep_ephemeral=conversation.keep_retrieved)
    except compaction.SummaryFailed as failed:
        raise ProviderFailed(failed.error.reason, f"The summarising call failed: {failed.error.message}",
                             node=failed.node_id, head=conversation.head_id) from failed
    if not services.head_move_held(conversation=conversation, to=done.root.id, lock=lock).count:
        raise TurnInProgress("The compaction outlived its lock and another turn took over; its nodes are kept.")
    return Node.objects.get(pk=done.root.id)
