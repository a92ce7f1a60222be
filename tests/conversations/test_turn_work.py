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
from conversations.models import Conversation, Node
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
