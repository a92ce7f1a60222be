"""Writes for playbooks: conversion with retries (P1, P2), edit conversations (P3), runs.

Where the nodes go (DESIGN.md's two questions):
- A conversion's first try hangs below the conversation's head; each later try below the previous
  try, and sends the previous draft's validation errors (P1). Tries are kind `playbook` and belong
  to the conversation they were converted in (see playbooks.models). Before each try the budget
  is checked (C1): a retry re-sends every earlier draft and error, so it may no longer fit.
- The head never moves (P2): no try is ever on a path, so the next question never sees a draft or
  an error. The conversion holds the turn lock, so no turn moves the head under it either (T9).
- An edit conversation is a new conversation whose head is set, through `head_move`, to the head the
  current version was converted from; nothing is copied (P3).
- A run asks one question in a new conversation through the one turn runner (R1), from one
  PlaybookVersion row (its definition and number together).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Max

from config.errors import ArborError, BadInput, TooLarge
from conversations import budget, llm, services
from conversations import items as it
from conversations.context import PathNode, assemble
from conversations.errors import FAILURE_STATUS, ApprovalPending
from conversations.locks import TurnLock
from conversations.models import Conversation, Node, offered_model
from conversations.selectors import context_path, conversation_for_user, instructions_for, node_path
from conversations.turns import detached
from conversations.turns.events import EventType, TurnEvent, TurnOutcome
from conversations.turns.side_calls import run_side_call
from conversations.turns.start import turn_ask
from playbooks import prompts, schema
from playbooks.errors import PlaybookInvalid
from playbooks.models import Playbook, PlaybookRun, PlaybookVersion
from playbooks.selectors import playbook_for_user


@dataclass(frozen=True)
class Conversion:
    definition: dict[str, Any]
    node: Node  # the try whose draft is valid
    head_id: int  # the head it was converted from
    nodes: list[int]  # every try, first to last


# --- conversion (P1, P2) ----------------------------------------------------------------------------


# What a long write reports as it goes (`progress`): {"type": "try", "number", "of"}, {"type": "token", "text"},
# {"type": "invalid", "errors"} for a conversion; a run's turn events ({"type": "token" | "tool_call" | …}).
Progress = Callable[[dict[str, Any]], None]


def _convert(conversation: Conversation, progress: Progress | None = None) -> Conversion:
    """Draft, validate and retry under the conversation's turn lock; the head stays where it is (P2)."""
    with TurnLock.acquire(conversation) as lock:
        conversation.refresh_from_db(fields=["head", "model", "instructions"])
        if conversation.head_id is None:
            raise BadInput("This conversation has no messages yet: there is nothing to turn into a playbook.")
        # The whole context, read once (T5); a compaction this model cannot read is expanded (C3).
        provider = llm.provider_of(conversation.effective_model)
        path = context_path(node_path(conversation.head_id, owner=conversation.owner_id), provider,
                                owner=conversation.owner_id)
        if path[-1].status == Node.Status.SUCCEEDED and it.tool_calls(path[-1].received):
            # Like a turn (F3): a call waiting for a person has no result yet, so the context is unfinished.
            raise ApprovalPending("A tool call is waiting for approval: approve or refuse it before converting.")
        return _draft_until_valid(conversation, path, lock, progress or (lambda event: None))


def _draft_until_valid(conversation: Conversation, path: list[PathNode], lock: TurnLock,
                       progress: Progress) -> Conversion:
    model = conversation.effective_model
    provider = llm.provider_of(model)
    instructions = instructions_for(conversation)
    json_mode = {"type": "json_object"} if llm.supports_json_mode(model) else None
    sent = [prompts.conversion_request()]
    tries: list[int] = []
    errors: list[str] = []
    attempts = max(1, settings.ARBOR_PLAYBOOK_TRIES)
    for number in range(1, attempts + 1):
        _check_budget(path, sent, model=model, provider=provider, instructions=instructions, tries=tries)
        messages = assemble(path, sent, instructions=instructions, provider=provider)
        progress({"type": "try", "number": number, "of": attempts})
        call = run_side_call(conversation=conversation, parent=path[-1], kind=Node.Kind.PLAYBOOK, sent=sent,
                             messages=messages, model=model, instructions=instructions, response_format=json_mode,
                             on_token=lambda text: progress({"type": "token", "text": text}))
        node = call.node
        tries.append(node.pk)
        if call.result is None:
            raise ArborError(f"The model failed while drafting the playbook: {node.failure_message}",
                             code=node.failure_reason, status=FAILURE_STATUS.get(node.failure_reason, 502),
                             node=node.pk, nodes=tries)
        definition, errors = schema.parse(it.answer_text(call.result.received))
        if definition is not None:
            errors = schema.validate(definition)
        if not errors:
            return Conversion(definition=definition, node=node, head_id=conversation.head_id, nodes=tries)
        progress({"type": "invalid", "errors": errors})
        path = [*path, call.path_node()]
        sent = [prompts.conversion_retry(errors)]
    raise PlaybookInvalid(f"The playbook is still invalid after {len(tries)} tries: {'; '.join(errors)}",
                          errors=errors, nodes=tries)


def _check_budget(path: list[PathNode], sent: list[it.Item], *, model: str, provider: str | None, instructions: str,
                  tries: list[int]) -> None:
    """Refuse a try whose input cannot fit the model (C1) before paying for it (S3).

    Each retry sends the whole context again with every earlier draft and its errors, so a later try
    can pass the input limit where the first did not. The tries made so far stay recorded.
    """
    needed = budget.call_tokens(path, sent, model=model, provider=provider, instructions=instructions)
    allowed = budget.budget_for(model).allowed
    if needed > allowed:
        done = f" after {len(tries)} tr{'y' if len(tries) == 1 else 'ies'}" if tries else ""
        raise TooLarge(f"Converting stopped{done}: the next try needs about {needed} input tokens and {model} "
                       f"takes {allowed}. Compact the conversation or use a model with a larger input limit.",
                       nodes=tries)


def _current_version(playbook: Playbook) -> int:
    return playbook.versions.aggregate(last=Max("number"))["last"] or 0


def _add_version(playbook: Playbook, conversion: Conversion, conversation: Conversation) -> PlaybookVersion:
    number = _current_version(playbook) + 1
    return PlaybookVersion.objects.create(playbook=playbook, number=number, definition=conversion.definition,
                                          conversion_node=conversion.node, conversation=conversation,
                                          head_id=conversion.head_id)


def playbook_convert(*, user, conversation_id: Any, progress: Progress | None = None) -> Playbook:
    """P1, P2: a new playbook from the conversation's whole context; its head does not move."""
    conversation = conversation_for_user(user=user, conversation_id=conversation_id)
    conversion = _convert(conversation, progress)
    with transaction.atomic():
        playbook = Playbook.objects.create(
            owner=user, name=conversion.definition["name"], description=conversion.definition["description"],
            source_conversation=conversation, source_head_id=conversion.head_id, conversion_node=conversion.node,
            definition=conversion.definition,
        )
        _add_version(playbook, conversion, conversation)
    return playbook


def playbook_save(*, user, playbook_id: Any, progress: Progress | None = None) -> Playbook:
    """P3: convert the edit conversation again, into the playbook's next version."""
    playbook = playbook_for_user(user=user, playbook_id=playbook_id)
    conversation = playbook.edit_conversation
    if conversation is None:
        raise BadInput("This playbook has no edit conversation: open one, change the playbook by chatting, "
                       "then save.")
    conversion = _convert(conversation, progress)
    with transaction.atomic():
        playbook = Playbook.objects.select_for_update().get(pk=playbook.pk)
        playbook.name = conversion.definition["name"]
        playbook.description = conversion.definition["description"]
        playbook.definition = conversion.definition
        playbook.conversion_node = conversion.node
        playbook.save(update_fields=["name", "description", "definition", "conversion_node", "updated_at"])
        _add_version(playbook, conversion, conversation)
    return playbook


# --- the edit conversation (P3) ------------------------------------------------------------------------


@transaction.atomic
def playbook_edit_conversation(*, user, playbook_id: Any) -> Conversation:
    """P3: a new conversation whose head is the head the current version came from; nothing is copied.

    The first edit conversation starts at the source head, as P3 says. After a save it starts at the
    head that version came from, so a second round of edits does not lose the first.
    """
    playbook = playbook_for_user(user=user, playbook_id=playbook_id)
    current = playbook.versions.order_by("-number").first()
    source = playbook.source_conversation
    conversation = services.conversation_create(
        owner=user, title=f"Edit playbook: {playbook.name}"[:200], model=source.model if source else "",
        instructions=source.instructions if source else "", origin=Conversation.Origin.PLAYBOOK,
    )
    services.head_move(conversation=conversation, to=current.head_id if current else playbook.source_head_id)
    playbook.edit_conversation = conversation
    playbook.save(update_fields=["edit_conversation", "updated_at"])
    return conversation


# --- runs ------------------------------------------------------------------------------------------------


@dataclass
class RunResult:
    run: PlaybookRun
    status: str  # done | approval_required | failed
    answer: str | None = None
    head: int | None = None
    nodes: list[int] = field(default_factory=list)
    approval_required: list[dict[str, Any]] = field(default_factory=list)
    error: dict[str, Any] | None = None


def playbook_run(*, user, playbook_id: Any, values: Any, progress: Progress | None = None) -> RunResult:
    """Run the current version with `values` in a new conversation, through the one turn runner (R1).

    Bad values are refused before anything is created. A tool that needs approval (F3) pauses the run
    as it pauses any turn; the person decides in the run's conversation.
    """
    playbook = playbook_for_user(user=user, playbook_id=playbook_id)
    if not isinstance(values, dict):
        raise BadInput("`values` must be an object of parameter values.")
    # One row gives both the definition and its number (N1): a save between two reads cannot mix them.
    version = playbook.versions.order_by("-number").first()
    definition = version.definition
    bound, errors = schema.bind_values(definition["parameters"], values)
    if errors:
        raise BadInput("Bad parameter values: " + "; ".join(errors), errors=errors)
    try:
        question = prompts.run_question(definition, bound)
    except schema.UnsafeReference as error:
        raise BadInput("This version's SQL uses a parameter where it could change the statement: "
                       f"{error}. Save a new version.", errors=error.problems) from None
    if len(question) > settings.ARBOR_MAX_CONTENT_CHARS:
        raise TooLarge(f"With these values the run's question is longer than {settings.ARBOR_MAX_CONTENT_CHARS} "
                       "characters.")
    source = playbook.source_conversation
    model = offered_model(source.model if source else None)
    shown = ", ".join(f"{name}={value}" for name, value in bound.items())
    with transaction.atomic():
        conversation = services.conversation_create(
            owner=user, title=f"Run: {playbook.name}{f' ({shown})' if shown else ''}"[:200], model=model,
            origin=Conversation.Origin.PLAYBOOK)
        run = PlaybookRun.objects.create(playbook=playbook, playbook_version=version, version=version.number,
                                         values=bound, conversation=conversation)
    turn = turn_ask(user=user, conversation_id=conversation.pk, content=question)
    report = (lambda event: progress({"type": str(event.type), **event.data})) if progress else None
    return _run_result(run, detached.run_here(turn, report))


def _run_result(run: PlaybookRun, events: list[TurnEvent]) -> RunResult:
    outcome = TurnOutcome.of(events)
    status = {EventType.DONE: "done", EventType.APPROVAL_REQUIRED: "approval_required"}.get(outcome.ending, "failed")
    return RunResult(run=run, status=status, answer=outcome.answer, head=outcome.head, nodes=outcome.nodes,
                     approval_required=outcome.approval_required, error=outcome.error)