"""OpenAI's Conversations API on the tree (issue 27): an Arbor conversation is an OpenAI conversation, `conv_<id>`.

Its items are what its head's path holds, each call's input items then its output items, root first; the items
a caller adds that no call has sent yet are kept on the conversation (`pending_input`) and listed after them.
`responses.create(conversation=…)` hangs the call below the head and sends those items first, then takes them
off (`take_pending`). Answers are never added as items: a model's answer is a call, recorded when it is made
(a chat list or a resent history records answers made elsewhere).
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import transaction

from config.errors import ArborError, BadInput, NotFound, TooLarge
from conversations import items as it
from conversations import services
from conversations.models import Conversation, Node
from conversations.openai.options import metadata_of
from conversations.openai.shapes import input_items, input_items_of, output_of
from conversations.selectors import history_path
from files.services import resolve_pending

PREFIX = "conv_"
MAX_ADDED = 20  # items a create or an add may carry, as OpenAI's
MAX_PENDING = 100


def conversation_id(conversation: Conversation) -> str:
    return f"{PREFIX}{conversation.pk}"


def conversation_named(user, value: Any, *, field: str = "conversation") -> Conversation:
    """The caller's conversation a `conv_…` id (or `{id: …}`) names; a 404 for anything else."""
    value = value.get("id") if isinstance(value, dict) else value
    number = value[len(PREFIX):] if isinstance(value, str) and value.startswith(PREFIX) else ""
    found = Conversation.objects.filter(pk=int(number), owner=user).first() if number.isdigit() and len(
        number) < 19 else None
    if found is None:
        raise NotFound(f"No conversation with id {value!r} ({field}).")
    return found


def conversation_object(conversation: Conversation) -> dict[str, Any]:
    return {"id": conversation_id(conversation), "object": "conversation",
            "created_at": int(conversation.created_at.timestamp()), "metadata": conversation.metadata or {}}


def added_items(user, value: Any, conversation: Conversation | None = None) -> list[it.Item]:
    """Items `user` adds: messages (their files made the caller's, X1) and the outputs of the head's open calls
    are read as a call's input is; an answer (an assistant message or a function call) is refused, since only a
    call makes one here."""
    if not isinstance(value, list) or not value or len(value) > MAX_ADDED:
        raise BadInput(f"`items` must be a list of 1 to {MAX_ADDED} items.", param="items")
    for index, entry in enumerate(value):
        if isinstance(entry, dict) and (entry.get("type") == "function_call" or entry.get("role") == "assistant"):
            raise BadInput(f"items[{index}]: an answer is recorded by the call that makes it (responses.create "
                           "with this conversation); only input items are added here.", param="items")
    return resolve_pending(user=user, items=input_items(value, open_calls=open_calls(conversation)))


def open_calls(conversation: Conversation | None) -> dict[str, it.Item]:
    """The head's calls, by id: what a function_call_output sent to this conversation may answer (T4)."""
    head = Node.objects.filter(pk=conversation.head_id).first() if conversation and conversation.head_id else None
    return {call["id"]: call for call in it.tool_calls(head.received)} if head else {}


def waiting(items: list[it.Item]) -> list[dict[str, Any]]:
    """Items as the conversation keeps them until a call sends them: each with an id of its own (`pending_…`),
    so a delete or a take names the very item, whatever was added or taken around it."""
    return [{"id": f"pending_{uuid.uuid4().hex[:24]}", "item": item} for item in items]


def add_pending(conversation: Conversation, items: list[it.Item]) -> list[dict[str, Any]]:
    """Keep `items` for the conversation's next call, after any kept before; the row lock orders concurrent
    adds, deletes and the call that takes them."""
    kept = waiting(items)
    with transaction.atomic():
        locked = Conversation.objects.select_for_update().get(pk=conversation.pk)
        if len(locked.pending_input) + len(kept) > MAX_PENDING:
            raise TooLarge(f"At most {MAX_PENDING} items wait for the next call; send a response first.")
        locked.pending_input = [*locked.pending_input, *kept]
        locked.save(update_fields=["pending_input", "updated_at"])
    return kept


def take_pending(conversation: Conversation, taken: list[dict[str, Any]]) -> None:
    """The call that sent the `taken` waiting items began (its node holds them): take those off by id, and keep
    any added meanwhile. Taken after the call is written, so a crash between sends them twice, never loses them."""
    if not taken:
        return
    gone = {entry["id"] for entry in taken}
    with transaction.atomic():
        locked = Conversation.objects.select_for_update().get(pk=conversation.pk)
        locked.pending_input = [entry for entry in locked.pending_input if entry["id"] not in gone]
        locked.save(update_fields=["pending_input"])


def update_metadata(conversation: Conversation, body: Any) -> Conversation:
    if not isinstance(body, dict) or "metadata" not in body:
        raise BadInput("Send `metadata` to update a conversation.", param="metadata")
    conversation.metadata = metadata_of(body) or {}
    conversation.save(update_fields=["metadata", "updated_at"])
    return conversation


def delete(conversation: Conversation) -> dict[str, Any]:
    """T11: as the API's delete (refused while a turn runs)."""
    said = conversation_id(conversation)
    services.conversation_delete(conversation=conversation)
    return {"id": said, "object": "conversation.deleted", "deleted": True}


def shown_waiting(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Waiting items as OpenAI's conversation items, with their own ids."""
    return [{**input_items_of(Node(pk=0, sent=[entry["item"]]))[0], "id": entry["id"]} for entry in entries]


def items_of(conversation: Conversation) -> list[dict[str, Any]]:
    """Every item of the head's path (through its compactions, C3: what happened, not what the model is sent
    now), root first, then the items waiting for the next call."""
    listed: list[dict[str, Any]] = []
    steps = [step for step in history_path(conversation.head_id, owner=conversation.owner_id)
             if step.kind == Node.Kind.TURN and step.status != Node.Status.PENDING]
    results = {item["call_id"]: item for step in steps for item in step.sent if item.get("type") == "tool_result"}
    ran_here = {call["id"] for step in steps for call in it.tool_calls(step.received) if not call.get("client")}
    for step in steps:
        node = Node(pk=step.id, sent=step.sent, received=step.received)
        # A call run here is one mcp_call item with its result (issue 32): its result is not listed again.
        listed += [item for item in input_items_of(node)
                   if item["type"] != "function_call_output" or item["call_id"] not in ran_here]
        listed += output_of(node, results)
    return listed + shown_waiting(conversation.pending_input)


def page(items: list[dict[str, Any]], query) -> dict[str, Any]:
    """OpenAI's cursor page: `order` (desc by default), `after` an item id, `limit` 1 to 100 (20)."""
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise BadInput("`order` must be asc or desc.", param="order")
    try:
        limit = int(query.get("limit", 20))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise BadInput("`limit` must be a whole number from 1 to 100.", param="limit")
    ordered = items if order == "asc" else items[::-1]
    after = query.get("after")
    if after is not None:
        ids = [item["id"] for item in ordered]
        if after not in ids:
            raise NotFound(f"No item {after!r} in this conversation.", param="after")
        ordered = ordered[ids.index(after) + 1:]
    data = ordered[:limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else "",
            "last_id": data[-1]["id"] if data else "", "has_more": len(ordered) > limit}


def item_named(conversation: Conversation, item_id: str) -> dict[str, Any]:
    found = next((item for item in items_of(conversation) if item["id"] == item_id), None)
    if found is None:
        raise NotFound(f"No item {item_id!r} in this conversation.")
    return found


def delete_item(conversation: Conversation, item_id: str) -> None:
    """An item still waiting for the next call goes; one a call sent or answered is part of the tree (P3): 409."""
    item_named(conversation, item_id)
    if not item_id.startswith("pending_"):
        raise ArborError("This item is part of a recorded call, which the tree keeps (P3); delete the response "
                         "(DELETE /v1/responses/{id}) or the conversation instead.", code="item_recorded",
                         status=409)
    with transaction.atomic():
        locked = Conversation.objects.select_for_update().get(pk=conversation.pk)
        kept = [entry for entry in locked.pending_input if entry["id"] != item_id]
        if len(kept) == len(locked.pending_input):  # taken by a call meanwhile: it is recorded now
            raise NotFound(f"No item {item_id!r} waits in this conversation.")
        locked.pending_input = kept
        locked.save(update_fields=["pending_input"])
