"""The one node recorder (T1, T3): every model call is written here, whoever makes it.

A turn's round, a title, a summarising call and a playbook try are all a node created `pending` right
before its call (`start`), then `succeed`ed with what came back or `fail`ed with why (and what arrived
before it failed). The bubbles a person sees of a turn, and the jobs queued after its commit, are written
here too, so the three callers cannot drift apart.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable, Iterable
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from config.db import release_connection
from config.together import Together, Written, together
from conversations import budget, llm, outbox, tracing
from conversations import items as it
from conversations.context import PathNode
from conversations.models import Bubble, CallSettings, Conversation, Node, ToolStatus, UsageEntry
from files.models import SentFile

CLIENT = "client"  # the provider of a call a client made elsewhere and sent as history

# --- nodes --------------------------------------------------------------------------------------------


def start(*, conversation: Conversation, parent: PathNode | None, kind: str, sent: list[it.Item],
          model: str, instructions: str = "", keep_ephemeral: bool = False, call_settings: dict | None = None,
          file_parts: dict | None = None, first_round: int | None = None, writes: Together | None = None) -> Node:
    """T3: the node exists, pending, before its call; its token count and its path's are kept (C1). With
    `writes`, it is written with that batch (its key is known once the batch ran: `writes.pk_of`).
    `call_settings`: what the call sends beside its messages (`llm.wire_settings`), kept once for all calls that
    send the same (`CallSettings`), in the same batch. `file_parts`: the large documents' parts the call is sent
    (`files.attached.parts_chosen`). `first_round`: the node of its turn's first call, for a later round."""
    provider = llm.provider_of(model)
    tokens = budget.items_tokens(sent, model=model, provider=provider)
    kept = _kept_settings(call_settings)
    node = Node(
        parent_id=parent.id if parent else None, conversation=conversation, owner_id=conversation.owner_id,
        kind=kind, status=Node.Status.PENDING, sent=sent, provider=provider, model=model, instructions=instructions,
        keep_ephemeral=keep_ephemeral, tokens=tokens, path_tokens=(parent.stored_path_tokens if parent else 0) + tokens,
        call_settings_id=kept and kept.digest, file_parts=file_parts, first_round_id=first_round,
    )
    with together(writes) as batch:
        if kept is not None:
            batch.insert_once(kept)
        batch.insert(node)
        for file_id in dict.fromkeys(it.file_ids(sent)):  # X1: the node keeps its files (they cannot go before it)
            batch.insert(SentFile(node_id=batch.pk_of(node), owner_id=node.owner_id, file_id=file_id))
    return node


def _kept_settings(settings: dict | None) -> CallSettings | None:
    if settings is None:
        return None
    canonical = json.dumps(settings, sort_keys=True, separators=(",", ":"), default=str)
    return CallSettings(digest=hashlib.sha256(canonical.encode()).hexdigest(), settings=json.loads(canonical))


def succeed(node: Node, result: llm.CallResult, *, writes: Together | None = None) -> Written:
    """The answer arrived: what was received, its usage, who answered (the provider may differ from the ask)."""
    received_tokens = budget.items_tokens(result.received, model=node.model, provider=result.provider)
    charged = result.provider != CLIENT  # a call a client made elsewhere reached no provider of Arbor's
    return _settle(node, writes, ledger=charged, status=Node.Status.SUCCEEDED, received=result.received,
                   usage=result.usage, provider=result.provider, model=result.model, finished_at=timezone.now(),
                   tokens=node.tokens + received_tokens, path_tokens=node.path_tokens + received_tokens)


def ledger_entry(node: Node) -> UsageEntry:
    """Issue 31: the call's row of the usage ledger, from what its node records (`usage_check` compares them).
    A call that failed after output had arrived (stopped, cut off, its process gone) is charged by the provider
    but reports no usage: its node records Arbor's estimate (`estimated_usage`), and its row is marked so."""
    estimated = node.status == Node.Status.FAILED
    usage = node.usage or (estimated_usage(node) if estimated else {})
    details = usage.get("prompt_tokens_details") or {}
    project_id = node.conversation.project_id if node.conversation_id else None
    return UsageEntry(node_id=node.pk, owner_id=node.owner_id, conversation_id=node.conversation_id,
                      project_id=project_id, model=node.model, provider=node.provider,
                      input_tokens=usage.get("prompt_tokens") or 0, output_tokens=usage.get("completion_tokens") or 0,
                      cached_tokens=(details.get("cached_tokens") if isinstance(details, dict) else 0) or 0,
                      cost_usd=usage.get("cost_usd") or 0.0, day=(node.finished_at or timezone.now()).date(),
                      estimated=estimated)


def charged_partly(received: list[it.Item]) -> bool:
    """Whether a failed call had output: a provider charges for what it generated before a stop or a break."""
    return bool(received)


def estimated_usage(node: Node) -> dict[str, Any]:
    """A failed call's usage as Arbor counts it (C1's counts): the path it was sent, and what it received; its
    cost at the prices of the day it ended (kept on the node, so a later price is no difference)."""
    provider = node.provider or llm.provider_of(node.model)
    usage = {"prompt_tokens": node.path_tokens,
             "completion_tokens": budget.items_tokens(node.received or [], model=node.model, provider=provider)}
    cost = llm.cost_of(node.model, usage)
    return {**usage, "estimated": True, **({"cost_usd": cost} if cost is not None else {})}


def record_supplied(*, conversation: Conversation, parent: PathNode | None, sent: list[it.Item],
                    received: list[it.Item], model: str) -> Node:
    """A call a client made elsewhere and now sends as history (the OpenAI-compatible Chat Completions: an edited
    list's earlier answers): stored as the succeeded node it was, with its bubbles, counted for `model` (C1).
    `provider` "client" says Arbor did not make it."""
    with together() as writes:
        node = start(conversation=conversation, parent=parent, kind=Node.Kind.TURN, sent=sent, model=model,
                     writes=writes)
        question_bubble(node, sent, writes=writes)
    succeed(node, llm.CallResult(received=received, usage={}, provider=CLIENT, model=model))
    answer_bubbles(node, needs_approval=lambda call: False)  # written under the turn lock: no sweep races it
    return node


def as_written(turn, pks: Iterable[int]) -> list[Node]:
    """Nodes `pks` of `turn` (a `Turn` or `SiblingTurns`) as it wrote them, in id order: no read back (issues 27, 34),
    unless it wrote one it does not hold (a compaction's) or one went elsewhere (an answer a sweep's failure pushed
    onto a sibling: its key changed)."""
    held, pks = turn.recorded, sorted(pks)
    if all(pk in held and held[pk].pk == pk for pk in pks):
        return [held[pk] for pk in pks]
    return list(Node.objects.filter(owner_id=turn.conversation.owner_id, pk__in=pks).order_by("id"))


def _pending(node: Node) -> QuerySet[Node]:
    """The node while it is still pending, asked by its owner too (issue 34)."""
    return Node.objects.filter(owner_id=node.owner_id, pk=node.pk, status=Node.Status.PENDING)


def save_partial(node: Node, text: str) -> None:
    """Keep the text streamed so far on the pending node, where a crash cannot take it (a sweep fails the
    node with it: `turns.recovery`); the connection goes back, as the model goes on talking."""
    _pending(node).update(received=[it.text(text)])
    release_connection()


def fail(node: Node, error: llm.LLMError, *, writes: Together | None = None) -> Written:
    """The call failed: why, and whatever had arrived before it did (kept, never sent again: T5); with output,
    its estimated usage and ledger row (issue 31)."""
    fields = _failed(node, error)
    return _settle(node, writes, ledger=charged_partly(error.partial), **fields)


def _failed(node: Node, error: llm.LLMError) -> dict[str, Any]:
    """The fields a failure writes; with output, the usage Arbor estimates for it."""
    fields = {"status": Node.Status.FAILED, "failure_reason": error.reason, "failure_message": error.message,
              "received": error.partial, "finished_at": timezone.now()}
    if charged_partly(error.partial):
        fields["usage"] = estimated_usage(_ended(node, fields))
    return fields


def interrupt(node: Node, error: llm.LLMError) -> bool:
    """Fail a node still pending (its process is gone), with its estimated ledger row if output had arrived;
    False if it ended meanwhile (its process was only late): then its own record stands, and nothing is
    written."""
    fields = _failed(node, error)
    ended = _ended(node, fields)
    with transaction.atomic():
        if not _pending(node).update(**fields):
            return False
        if charged_partly(error.partial):
            ledger_entry(ended).save(force_insert=True)
        transaction.on_commit(lambda: tracing.node_ended(ended))  # its span too, as a failure in its turn has
    return True


def _settle(node: Node, writes: Together | None, ledger: bool = False, **fields: Any) -> Written:
    """Write how a pending node ended, once; `.count` is 0 when a sweep had already failed it.

    A node a sweep has already failed as interrupted (its process outlived its lease, and the next turn
    took over) keeps that record: what this process brings goes on a sibling of its own (same parent, same
    sent items), written once the batch has run, so neither is lost and no later call's context changes
    under it. `node` is then that sibling. What the batch writes beside it `when` it settled is skipped, and
    the caller writes it for the sibling."""
    with together(writes) as batch:
        settled = batch.update(_pending(node), **fields)
        if ledger:  # `ledger`: the call reached a provider; its ledger row goes with its ending (issue 31)
            batch.insert(ledger_entry(_ended(node, fields)), when=settled)

        def in_memory() -> None:
            for name, value in fields.items():
                setattr(node, name, value)
            if not settled.count:  # the sibling, written as it ended in one INSERT: no moment it is pending
                swept, node.pk, node._state.adding = node.pk, None, True
                with transaction.atomic():
                    node.save(force_insert=True)
                    if ledger:
                        ledger_entry(node).save(force_insert=True)
                        # One provider call, one charge: the sweep's estimate gives way to what the call reports.
                        UsageEntry.objects.filter(owner_id=node.owner_id, node_id=swept, estimated=True).delete()

        batch.after(in_memory)
        # Issue 31: its span, from what the node now records, once committed (tracing reads; never in the turn's
        # own transaction, where a failed read would abort it).
        batch.after(lambda: transaction.on_commit(lambda: tracing.node_ended(node)))
    return settled


def _ended(node: Node, fields: dict[str, Any]) -> Node:
    """`node` as `fields` end it, for what is written beside the ending (the node itself changes after)."""
    ended = copy.copy(node)
    for name, value in fields.items():
        setattr(ended, name, value)
    return ended


def stopped(error: BaseException, *, partial: list[it.Item] | None = None) -> llm.LLMError:
    """A call that ended by no failure of its own: closed by a stop (cancelled) or cut by anything else; `partial`:
    what had arrived."""
    reason = Node.FailureReason.CANCELLED if isinstance(error, GeneratorExit) else Node.FailureReason.INTERRUPTED
    return llm.LLMError(reason, f"the call stopped: {error!r}", partial=partial)


# --- what a person sees of a turn (T8) ------------------------------------------------------------------


def tool_bubble_data(call: it.Item) -> dict[str, Any]:
    return {"call_id": call["id"], "name": call["name"], "arguments": call["arguments"]}


def question_bubble(node: Node, sent: list[it.Item], *, writes: Together | None = None) -> None:
    question = it.question_item(sent)
    if question is not None:
        shown = {"files": question["files"]} if question.get("files") else {}  # X1: the bubble names its files
        with together(writes) as batch:
            batch.insert(Bubble(conversation_id=node.conversation_id, owner_id=node.owner_id,
                                node_id=batch.pk_of(node),
                                role=Bubble.Role.USER, content=question.get("text", ""), data=shown))


def answer_bubbles(node: Node, *, needs_approval: Callable[[it.Item], bool], received: list[it.Item] | None = None,
                   writes: Together | None = None, when: Written | None = None) -> None:
    """The answer's text, and one bubble per tool call (awaiting approval, or running). `received`: what
    the call brought (default: the node's, as last written)."""
    received = node.received if received is None else received
    with together(writes) as batch:
        answer = it.answer_text(received)
        if answer:
            batch.insert(Bubble(conversation_id=node.conversation_id, owner_id=node.owner_id,
                                node_id=node.pk, role=Bubble.Role.ASSISTANT,
                                content=answer), when=when)
        for call in it.tool_calls(received):
            status = ToolStatus.AWAITING_APPROVAL if needs_approval(call) else ToolStatus.RUNNING
            batch.insert(Bubble(conversation_id=node.conversation_id, owner_id=node.owner_id,
                                node_id=node.pk, role=Bubble.Role.TOOL,
                                content=call["name"], data={**tool_bubble_data(call), "status": status}), when=when)


def error_bubble(node: Node, error: llm.LLMError, *, writes: Together | None = None,
                 when: Written | None = None) -> None:
    with together(writes) as batch:
        batch.insert(Bubble(conversation_id=node.conversation_id, owner_id=node.owner_id,
                                node_id=node.pk, role=Bubble.Role.ERROR,
                            content=error.message,
                            data={"reason": error.reason, "partial": it.answer_text(error.partial)}), when=when)


def decision_bubble(node_id: int, call: it.Item, *, owner: int, approved: bool) -> None:
    """F3: the call's bubble (of `owner`'s node) says what the person decided."""
    Bubble.objects.filter(owner_id=owner, node_id=node_id, role=Bubble.Role.TOOL, data__call_id=call["id"]).update(
        data={**tool_bubble_data(call), "status": ToolStatus.APPROVED if approved else ToolStatus.REFUSED})


def result_bubbles(caller_id: int, results: Iterable[it.Item], *, owner: int, writes: Together | None = None
                   ) -> None:
    """T4: the calls' bubbles (on `owner`'s node that made them) show their results."""
    by_call = {r["call_id"]: r for r in results}
    with together(writes) as batch:
        for bubble in Bubble.objects.filter(owner_id=owner, node_id=caller_id, role=Bubble.Role.TOOL):
            result = by_call.get(bubble.data.get("call_id"))
            if result:
                status = ToolStatus.ERROR if result["is_error"] else ToolStatus.DONE
                if bubble.data.get("status") == ToolStatus.REFUSED:  # a refusal's error result says it was refused
                    status = ToolStatus.REFUSED
                batch.update(Bubble.objects.filter(owner_id=owner, pk=bubble.pk), data={
                    **bubble.data, "result": result["content"], "is_error": result["is_error"], "status": status})


def committed(conversation: Conversation, *, head: int | None = None, nodes: list[int] | None = None,
              writes: Together | None = None, when: Written | None = None) -> None:
    """R4: queue the work after the commit (indexing, a title), with the caller's writes; `head`: the head
    the writes leave (default: the conversation's as it is in memory); `nodes`: the nodes whose bubbles the
    writes made (default: look at the whole conversation)."""
    outbox.enqueue_after_turn(conversation_id=conversation.pk, head=conversation.head_id if head is None else head,
                              nodes=nodes, writes=writes, when=when)
