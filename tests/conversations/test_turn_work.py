"""Issue 34 (a turn's work) and issue 27 (the gateway): what a turn asks the database does not grow with the person's
other conversations. An API caller makes a conversation a call; after a year it has hundreds of thousands, and two
statements of every call read them all: the lock's count of the owner's running turns (issue 33's limit) and a
resent message list's match against the owner's first questions. The rows PostgreSQL reads for each statement are
counted by its own EXPLAIN ANALYZE (`tests/support/rows_read.py`), so the test says it on any machine, fast or slow.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from conversations import items as it
from conversations import outbox
from conversations.jobs import worker
from conversations.models import Bubble, Conversation, Node, OutboxJob
from search import embedding, index
from search import jobs as search_jobs
from search.models import BubbleDocument, ChunkVector
from tests.support.rows_read import rows_read

pytestmark = pytest.mark.django_db

MORE = 400  # conversations the person makes between the two looks


def _other_conversations(user, count: int, *, start: int) -> None:
    """`count` earlier conversations of `user`, each one answered first question, as the gateway leaves them."""
    made = Conversation.objects.bulk_create(
        [Conversation(owner=user, model="arbor/echo", origin=Conversation.Origin.API) for _ in range(count)])
    Node.objects.bulk_create([
        Node(conversation=c, owner=user, kind=Node.Kind.TURN, status=Node.Status.SUCCEEDED,
             sent=[it.user(f"Earlier question {start + i}?")], received=[it.text(f"Earlier answer {start + i}.")])
        for i, c in enumerate(made)])
    with connection.cursor() as cursor:  # the planner's statistics, as autovacuum keeps them in a deployment
        cursor.execute("ANALYZE conversations_conversation, conversations_node")


def _rows_of(run) -> dict[str, int]:
    """The rows each kind of statement `run()` sent reads now, by the statement's first words."""
    with CaptureQueriesContext(connection) as queries:
        run()
    found: dict[str, int] = {}
    for read in rows_read([q["sql"] for q in queries.captured_queries]):
        kind = " ".join(read.sql.split()[:3])[:60]
        found[kind] = found.get(kind, 0) + read.rows
    return found


def _calls(user, gateway: APIClient, api: APIClient, question: str) -> dict[str, dict[str, int]]:
    """A new call, the same list resent with one more question (an agent's second turn), and a turn through the API."""
    first = [{"role": "user", "content": question}]
    new = {}
    new["new call"] = _rows_of(lambda: new.setdefault("reply", gateway.post(
        "/v1/chat/completions", {"model": "arbor/echo", "messages": first}, format="json")))
    answer = new.pop("reply").json()["choices"][0]["message"]
    again = [*first, answer, {"role": "user", "content": "And another?"}]
    resent = {}
    new["resent list"] = _rows_of(lambda: resent.setdefault("reply", gateway.post(
        "/v1/chat/completions", {"model": "arbor/echo", "messages": again}, format="json")))
    assert resent["reply"].status_code == 200, resent["reply"].content
    conversation = Conversation.objects.filter(owner=user).order_by("-id").first()
    assert Node.objects.filter(conversation=conversation).count() == 2, "the resent list went on its stored path"
    new["API turn"] = _rows_of(lambda: api.post(f"/api/conversations/{conversation.pk}/turns/",
                                                {"content": "Once more?"}, format="json"))
    return new


def test_issue_34_a_calls_statements_read_as_many_rows_with_hundreds_more_conversations_of_its_owner(user, api):
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's own count of the rows a statement reads (EXPLAIN ANALYZE)")
    gateway = APIClient()
    gateway.credentials(HTTP_AUTHORIZATION="Bearer " + Token.objects.get_or_create(user=user)[0].key)
    _other_conversations(user, 5, start=0)
    before = _calls(user, gateway, api, "Name an oak.")
    _other_conversations(user, MORE, start=5)
    after = _calls(user, gateway, api, "Name a birch.")
    for call, rows in after.items():
        grown = {kind: (before[call].get(kind, 0), n) for kind, n in rows.items() if n > before[call].get(kind, 0) + 10}
        assert not grown, (f"{call}: statements read more rows (before, after) with {MORE} more conversations of the "
                           f"person: {grown}")
    for rows in (before, after):  # the two statements that grew were counted, in each look
        assert any(kind.startswith('UPDATE "conversations_conversation"') for kind in rows["new call"]), rows
        assert any(kind.startswith('SELECT "conversations_node"') for kind in rows["resent list"]), rows


# --- the worker's jobs after a turn ----------------------------------------------------------------------------


def _answered_conversation(user, *, branches: int) -> Conversation:
    """A conversation of five answered questions on its head's path and `branches` more answers beside them (the
    first question regenerated), every bubble indexed and embedded by the worker. The head's path, and so what the
    next turn sends and is answered, is the same whatever `branches` is."""
    conversation = Conversation.objects.create(owner=user, model="arbor/echo")
    path: list[Node] = []
    for n in range(5 + branches):
        parent = path[-1] if n < 5 and path else (path[0] if n >= 5 else None)
        node = Node.objects.create(conversation=conversation, owner=user, parent=parent, kind=Node.Kind.TURN,
                                   status=Node.Status.SUCCEEDED, sent=[it.user(f"Question {n}?")],
                                   received=[it.text(f"Answer {n}.")], provider="arbor", model="arbor/echo")
        path += [node] if n < 5 else []
        Bubble.objects.bulk_create([
            Bubble(conversation=conversation, owner=user, node=node, role=Bubble.Role.USER, content=f"Question {n}?"),
            Bubble(conversation=conversation, owner=user, node=node, role=Bubble.Role.ASSISTANT,
                   content=f"Answer {n}.")])
    Conversation.objects.filter(pk=conversation.pk).update(head=path[-1])
    index.index_conversation(conversation.pk)
    embedding.embed_conversation(conversation.pk)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE conversations_node, conversations_bubble, search_bubbledocument, search_chunkvector")
    return conversation


def _jobs_rows(api, conversation: Conversation) -> dict[str, int]:
    """One more turn, then the rows its index and embed jobs read, by job."""
    response = api.post(f"/api/conversations/{conversation.pk}/turns/", {"content": "One more?"}, format="json")
    assert response.status_code == 201, response.content
    rows = {}
    for job in OutboxJob.objects.filter(kind__in=("index", "embed"), payload__conversation=conversation.pk,
                                        status=OutboxJob.Status.PENDING):
        rows[job.kind] = sum(_rows_of(lambda job=job: outbox.handler_for(job.kind)(job.payload)).values())
    assert set(rows) == {"index", "embed"}, rows
    assert BubbleDocument.objects.filter(bubble__node_id=response.json()["head"]).count() == 2, "the turn indexed"
    return rows


def test_issue_34_r4_the_jobs_after_a_turn_read_its_rows_not_the_whole_conversations(user, api):
    """R4's index and embed jobs looked for work across the whole conversation after every turn, so a conversation's
    life cost O(turns²). They look at the turn's own nodes now: as many rows with hundreds more answers in the
    conversation (its branches: the turn itself, sent the same path, writes the same)."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's own count of the rows a statement reads (EXPLAIN ANALYZE)")
    small = _jobs_rows(api, _answered_conversation(user, branches=0))
    large = _jobs_rows(api, _answered_conversation(user, branches=MORE))
    grown = {kind: (small[kind], rows) for kind, rows in large.items() if rows > small[kind] + 10}
    assert not grown, f"the jobs read more rows (5 answers, {5 + MORE} answers): {grown}"


def test_r4_a_turn_waiting_for_approval_is_indexed_and_the_turn_after_the_approval_too(api, caplog):
    """The jobs look at a turn's nodes only, so a turn that waits for approval queues its own (its question is
    searchable before anyone approves), and the turn that goes on after the approval queues jobs for its nodes.
    The title waits for that turn: a title call now would read an unanswered call (T6)."""
    conversation = api.post("/api/conversations/", {}, format="json").json()["id"]
    paused = api.post(f"/api/conversations/{conversation}/turns/", {
        "content": '#tool send_email {"to": "a@example.com", "subject": "s", "body": "b"}'}, format="json")
    assert paused.status_code == 202
    worker.run_due()
    asked = Bubble.objects.get(conversation_id=conversation, role=Bubble.Role.USER)
    assert BubbleDocument.objects.filter(bubble=asked).exists(), "the waiting turn's question is indexed"
    assert Conversation.objects.get(pk=conversation).title == ""
    assert not Node.objects.filter(conversation_id=conversation, kind=Node.Kind.TITLE).exists()
    assert "no partner" not in caplog.text
    (call,) = paused.json()["approval_required"]
    done = api.post(f"/api/conversations/{conversation}/approvals/", {"tool_call_id": call["call_id"],
                                                                      "approve": True}, format="json")
    assert done.status_code == 201
    worker.run_due()
    answers = Bubble.objects.filter(conversation_id=conversation, role=Bubble.Role.ASSISTANT)
    assert answers.exists() and all(BubbleDocument.objects.filter(bubble=b).exists() for b in answers)
    assert Conversation.objects.get(pk=conversation).title, "named once the turn after the approval committed"
    assert not OutboxJob.objects.exclude(status=OutboxJob.Status.DONE).exists()


def test_r4_an_index_job_that_gave_up_is_run_again_by_the_workers_sweep(api):
    """Nothing is lost: a turn whose index job ran out of attempts is indexed by the worker's sweep (no later turn
    of the conversation looks at it any more), and the job is then done. One that fails again waits behind the
    others for the next sweep."""
    conversation = api.post("/api/conversations/", {}, format="json").json()["id"]
    head = api.post(f"/api/conversations/{conversation}/turns/", {"content": "Where is the oak?"},
                    format="json").json()["head"]
    OutboxJob.objects.filter(kind="index").update(status=OutboxJob.Status.FAILED, last_error="gave up")
    api.post(f"/api/conversations/{conversation}/turns/", {"content": "And the birch?"}, format="json")
    broken = outbox.enqueue(kind="index", payload={"conversation": "not a number"})
    OutboxJob.objects.filter(pk=broken.pk).update(status=OutboxJob.Status.FAILED)
    worker.run_due()
    assert not BubbleDocument.objects.filter(bubble__node_id=head).exists(), "the later turn's job left it"
    assert search_jobs.run_given_up() is True
    assert BubbleDocument.objects.filter(bubble__node_id=head).count() == 2
    assert not OutboxJob.objects.filter(kind="index", payload__conversation=conversation).exclude(
        status=OutboxJob.Status.DONE).exists()
    broken.refresh_from_db()
    assert broken.status == OutboxJob.Status.FAILED and "not a number" in broken.last_error
    assert search_jobs.run_given_up() is False, "nothing more runs: the broken job waits for the next sweep"


def test_r4_a_v1_lists_earlier_answers_are_indexed_by_the_calls_own_jobs(user):
    """A Chat Completions list that carries answers this server never gave (an edited list): they are recorded
    before the call's turn begins, and the call's jobs look at them too, not only at the sweeps."""
    gateway = APIClient()
    gateway.credentials(HTTP_AUTHORIZATION="Bearer " + Token.objects.get_or_create(user=user)[0].key)
    messages = [{"role": "user", "content": "Name an oak."}, {"role": "assistant", "content": "A sessile oak."},
                {"role": "user", "content": "And a birch?"}]
    reply = gateway.post("/v1/chat/completions", {"model": "arbor/echo", "messages": messages}, format="json")
    assert reply.status_code == 200, reply.content
    worker.run_due()
    bubbles = Bubble.objects.filter(owner=user, role__in=(Bubble.Role.USER, Bubble.Role.ASSISTANT))
    assert sorted(bubbles.values_list("content", flat=True))[:3] == ["A sessile oak.", "And a birch?",
                                                                   "Name an oak."]
    unindexed = [b.content for b in bubbles if not BubbleDocument.objects.filter(bubble=b).exists()]
    assert not unindexed, unindexed
    unembedded = [b.content for b in bubbles if not ChunkVector.objects.filter(bubble=b).exists()]
    assert not unembedded, unembedded
