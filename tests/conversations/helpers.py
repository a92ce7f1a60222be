"""Small helpers for tests: run a turn through the one runner and read the tree back."""

from __future__ import annotations

from io import StringIO

from django.core.management import call_command

from conversations.models import Conversation, Node
from conversations.turns.detached import run_here
from conversations.turns.start import turn_ask


def ask(conversation: Conversation, content: str):
    """Ask a question through the one turn runner; return the list of events."""
    return run_here(turn_ask(user=conversation.owner, conversation_id=conversation.pk, content=content))


def head(conversation: Conversation) -> Node | None:
    conversation.refresh_from_db()
    return conversation.head


def answer(events) -> str:
    return events[-1].data.get("answer", "")


def command_output(name: str, *args: str) -> str:
    """Run a management command; return what it printed."""
    out = StringIO()
    call_command(name, *args, stdout=out)
    return out.getvalue()


def give_back(turn) -> None:
    """Give back the lock of a turn a test made but never runs (a client that left before it began): only a
    turn's own run gives it back in the product."""
    turn.lock.release()


def owner_of(node_id: int | None) -> int | None:
    """The owner a path read names (issue 34): the node's own, read here so a test can name any node."""
    return Node.objects.filter(pk=node_id).values_list("owner_id", flat=True).first()
