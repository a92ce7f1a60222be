"""Give a new conversation a title (R4: a worker job after the first committed turn).

The title call reads the conversation through the one assembly, is recorded as a `title` node below
the head it read (a side call, `turns.side_calls.run_side_call`), and never moves the head. A title the person has
set in the meantime is never overwritten.
"""

from __future__ import annotations

from typing import Any

from conversations import items as it
from conversations import llm
from conversations.context import assemble
from conversations.models import Conversation, Node
from conversations.selectors import context_path, node_path
from conversations.turns import calls
from conversations.turns.side_calls import run_side_call

# `#title` is also arbor/echo's directive for a title call (see `conversations.llm.echo`).
TITLE_PROMPT = "#title Give this conversation a short title: at most six words, no quotes, nothing else."
MAX_TITLE_CHARS = 80
TITLE_CONTEXT_NODES = 6


def clean_title(text: str) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line.strip("\"'“”‘’# ").removeprefix("Title:").strip()[:MAX_TITLE_CHARS]


def run(payload: dict[str, Any]) -> None:
    """The `title` job: name a conversation after its first committed turn."""
    title_conversation(int(payload["conversation"]))


def title_conversation(conversation_id: int) -> str | None:
    """Name the conversation from its current path; return the title set, or None if nothing was done."""
    conversation = Conversation.objects.filter(pk=conversation_id).first()
    if conversation is None or conversation.title or conversation.head_id is None:
        return None
    earlier = Node.objects.of(conversation).filter(kind=Node.Kind.TITLE, status=Node.Status.SUCCEEDED)
    title = next((clean_title(it.answer_text(n.received)) for n in earlier.order_by("-id")[:1]), "")
    if not title:  # a job that ran before and crashed after its call needs no second call
        model = conversation.effective_model
        provider = llm.provider_of(model)
        whole = node_path(conversation.head_id, owner=conversation.owner_id)
        if whole and calls.undecided(whole[-1], owner=conversation.owner_id):
            return None  # the turn waits for a person's approval: the turn after it is named once it commits
        # The opening turns name a conversation; reading only those keeps a long (imported) one cheap.
        path = context_path(whole, provider, owner=conversation.owner_id)[:TITLE_CONTEXT_NODES]
        sent = [it.user(TITLE_PROMPT)]
        call = run_side_call(conversation=conversation, parent=path[-1] if path else None, kind=Node.Kind.TITLE,
                             sent=sent, messages=assemble(path, sent, provider=provider), model=model)
        if call.result is None:
            raise RuntimeError(f"the title call failed: {call.node.failure_message}")  # the worker retries
        title = clean_title(it.answer_text(call.result.received))
    if not title:
        return None
    updated = Conversation.objects.filter(pk=conversation.pk, title="").update(title=title)
    return title if updated else None
