"""Deleting a response (issue 27, `DELETE /v1/responses/{id}`): one call's node (or each round's, when its calls ran
here: issue 32), when nothing continues it.

T11 and P3 say what may go: a conversation's delete keeps every node another path still needs, and this is the
same rule for one node. A response is continued by a call below it (of any conversation, P3), by another
conversation whose head it is (a fork, X5, or a playbook's edit conversation), by a compaction made from it (C3)
or by a record that protects it (a playbook's source). Any of these refuses the delete (409, saying which) and
changes nothing. A title call hung below it (R4) continues nothing: it is hung on the response's parent and
kept, with what it cost.

Otherwise the node goes with its bubbles (and what hangs on them: search entries, approvals); its own
conversation's head, if it rested there, moves to its parent, and a /v1 conversation left with no node goes too.
Everything happens in one transaction under the conversation's row lock, and never while a turn holds the
conversation (T9): a turn that would hang a call below it waits, then finds it gone.
"""

from __future__ import annotations

from django.db import IntegrityError, models, transaction
from django.db.models import ProtectedError

from config.errors import ArborError
from conversations import services
from conversations.models import Conversation, Node
from conversations.openai.shapes import response_id, rounds_of


class ResponseContinued(ArborError):
    code = "response_continued"
    status = 409


def continued_by(node: Node) -> str | None:
    """What continues `node`, said for a person; None when nothing does. A record of another app that protects it
    (a playbook's source) is found by the delete itself (`ProtectedError`), so this module imports no other app."""
    below = (Node.objects.filter(models.Q(parent=node) | models.Q(compacted_from=node) | models.Q(summary_call=node))
             .exclude(parent=node, kind=Node.Kind.TITLE).order_by("pk").first())
    if below is not None:
        if below.kind == Node.Kind.TURN:
            return f"{response_id(below.pk)} continues it"
        return f"a {below.kind} node ({below.pk}) was made from it"
    other = Conversation.objects.filter(head=node).exclude(pk=node.conversation_id).values_list("pk", flat=True)
    if (other := other.first()) is not None:
        return f"conversation {other} goes on from it (its head)"
    return None


def response_delete(*, node: Node) -> None:
    """Delete the response `node` (a turn node of a conversation) if nothing continues it; ResponseContinued (409)
    or TurnInProgress (409) otherwise, with nothing changed."""
    try:
        with transaction.atomic():
            for step in reversed(rounds_of(node)):  # a response of several rounds (issue 32) goes whole
                _delete(step, named=node)
    except ProtectedError as error:
        kept_by = sorted({str(type(record)._meta.verbose_name) for record in error.protected_objects})
        raise ResponseContinued(f"{response_id(node.pk)} cannot be deleted: a {' and a '.join(kept_by)} keeps it."
                                ) from error
    except IntegrityError as error:  # something began to continue it meanwhile (a fork): the database refused
        raise ResponseContinued(f"{response_id(node.pk)} cannot be deleted: another call now goes on from it."
                                ) from error


def _delete(node: Node, *, named: Node) -> None:
    conversation = Conversation.objects.select_for_update().get(pk=node.conversation_id)
    # Refused while a turn holds the conversation (T9); the UPDATE also holds its row until this commits.
    head = node.parent_id if conversation.head_id == node.pk else conversation.head_id
    services.head_move(conversation=conversation, to=head)
    if (reason := continued_by(node)) is not None:
        raise ResponseContinued(f"{response_id(named.pk)} cannot be deleted: {reason}.")
    Node.objects.filter(owner_id=node.owner_id, parent=node, kind=Node.Kind.TITLE).update(parent=node.parent_id)
    Node.objects.filter(owner_id=node.owner_id, pk=node.pk).delete()
    if conversation.origin == Conversation.Origin.API and not Node.objects.of(conversation).exists():
        conversation.delete()
