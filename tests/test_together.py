"""`config.together`: several writes in one round trip on PostgreSQL, the same results in a transaction
elsewhere (issue 13: a turn's statements); and a single-round turn's statement count, which it serves."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection
from django.test.utils import CaptureQueriesContext

from config.together import together
from conversations.models import Bubble, Conversation, Node, OutboxJob
from conversations.turns import detached
from conversations.turns.start import turn_ask
from tests.conversations.helpers import ask, head

pytestmark = pytest.mark.django_db


def _node(conversation: Conversation, **fields) -> Node:
    return Node(conversation=conversation, kind=Node.Kind.TURN, status=Node.Status.PENDING,
                sent=[{"type": "text", "text": "q"}], provider="arbor", model="arbor/echo", **fields)


def test_a_write_uses_an_earlier_ones_new_key_and_happens_only_when_asked(conversation):
    with CaptureQueriesContext(connection) as queries, together() as writes:
        node = writes.insert(_node(conversation))
        bubble = writes.insert(Bubble(conversation_id=conversation.pk, node_id=node.pk, role="user", content="q"))
        moved = writes.update(Conversation.objects.filter(pk=conversation.pk), head_id=node.pk)
        queued = writes.insert(OutboxJob(kind="title", payload={}), when=moved)
        refused = writes.update(Node.objects.filter(pk=-1), status=Node.Status.FAILED)
        skipped = writes.insert(OutboxJob(kind="index", payload={}), when=refused)
        late = writes.update(Bubble.objects.filter(node__conversation=conversation), when=refused, content="x")
    if connection.vendor == "postgresql":
        assert len(queries) == 1, [q["sql"] for q in queries]  # one round trip, no BEGIN or COMMIT
    assert node.obj.pk and Node.objects.get(pk=node.obj.pk).status == Node.Status.PENDING
    assert bubble.obj.node_id == node.obj.pk == Bubble.objects.get(pk=bubble.obj.pk).node_id
    assert head(conversation).pk == node.obj.pk and moved.count == 1
    assert queued.count == 1 and OutboxJob.objects.filter(kind="title").count() == 1
    assert (refused.count, skipped.count, late.count) == (0, 0, 0)
    assert not OutboxJob.objects.filter(kind="index").exists()
    assert Bubble.objects.get(pk=bubble.obj.pk).content == "q"


@pytest.mark.django_db(transaction=True)  # as a turn writes: autocommit, no transaction around the batch
def test_a_batch_that_fails_writes_nothing(conversation):
    """One statement (PostgreSQL) or one transaction (elsewhere): the node before the failing write is gone too."""
    def write() -> None:
        with together() as writes:
            node = writes.insert(_node(conversation))
            writes.insert(Bubble(conversation_id=conversation.pk, node_id=node.pk, role="user", content=None))

    with pytest.raises(IntegrityError):
        write()
    assert not Node.objects.exists() and not Bubble.objects.exists()


def test_after_runs_once_the_writes_are_done(conversation):
    seen = []
    with together() as writes:
        node = writes.insert(_node(conversation))
        writes.after(lambda: seen.append(Node.objects.filter(pk=node.obj.pk).exists()))
    assert seen == [True]


def test_issue_13_a_single_round_turn_makes_at_most_8_statements(conversation):
    """The lock with the conversation's state, the path, the run, the question, the answer with its head move
    and jobs, and the log with the run's end: six round trips on PostgreSQL (19 before issue 13)."""
    if connection.vendor != "postgresql":
        pytest.skip("the count is PostgreSQL's: elsewhere each batch is a transaction of its own statements")
    for k in range(3):
        ask(conversation, f"question {k}")
    with CaptureQueriesContext(connection) as queries:
        events = detached.run_here(turn_ask(user=conversation.owner, conversation_id=conversation.pk,
                                            content="one more"))
    assert events[-1].type == "done"
    assert len(queries) <= 8, "\n".join(q["sql"][:120] for q in queries)
