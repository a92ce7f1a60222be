"""Run by tests/search/test_pgvector.py inside `manage.py shell` against a PostgreSQL with pgvector (pgserver):
real turns, the real worker, the real scorer. Prints one JSON line of what it saw; the test asserts on it."""

from __future__ import annotations

import json

import numpy as np
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from conversations import llm, services
from conversations.jobs import worker
from search import scoring_memory, scoring_pgvector, vectors
from search.similar import similar_bubbles
from tests.conversations.helpers import ask

User = get_user_model()
small = User.objects.create(username="small-owner")
large = User.objects.create(username="large-owner")
facts = ["Cancelling the subscription for the Seoul office needs a signed form",
         "Renewal of the enterprise contract happens every March",
         "The staging database migration runs on Sundays",
         "Password resets for the Berlin team go through the help desk"]
mine = []
for fact in facts:
    conversation = services.conversation_create(owner=small, title=fact[:20])
    ask(conversation, fact)
    mine.append(conversation)
# Another owner with many near texts: an HNSW scan's candidates are mostly theirs.
words = ["subscription", "contract", "database", "password", "renewal", "migration", "cancel", "Seoul", "Berlin",
         "office", "team", "desk"]
rng = np.random.default_rng(18)
for n in range(150):
    conversation = services.conversation_create(owner=large, title=f"noise {n}")
    ask(conversation, " ".join(rng.choice(words, 8)))
worker.run_due()

with connection.cursor() as cursor:
    cursor.execute("SELECT indexdef FROM pg_indexes WHERE tablename = 'search_chunkvector' AND indexdef LIKE '%hnsw%'")
    indexes = [row[0] for row in cursor.fetchall()]
    cursor.execute("SELECT count(*) FROM search_chunkvector WHERE embedding IS NULL AND length(vector) > 0")
    (missing,) = cursor.fetchone()

queries = ["how do I cancel my subscription", "when is the contract renewed", "database migration schedule",
           "reset a password"]
same_order, top = [], []
for query in queries:
    (vector,) = llm.embed("arbor/echo-embed", [query])
    target = np.frombuffer(vectors.to_bytes(vector), dtype="<f4")
    for owner in (small, large):
        by_index = scoring_pgvector.ranked(owner_id=owner.pk, model="arbor/echo-embed", target=target, take=5,
                                           exclude_conversation=None)
        exact = scoring_memory.ranked(owner_id=owner.pk, model="arbor/echo-embed", target=target, take=5,
                                      exclude_conversation=None)
        same_order.append({"query": query, "owner": owner.username, "pgvector": [pk for pk, _ in by_index],
                           "exact": [pk for pk, _ in exact],
                           "largest_difference": max((abs(a[1] - b[1]) for a, b in zip(by_index, exact, strict=False)),
                                                     default=0.0)})
    top.append([hit.conversation for hit in similar_bubbles(user=small, query=query)][:1])

# The plan of the scorer's own query, as it ran (owner filter and all), with sorting ruled out: only an index
# that gives the order can serve it, so the HNSW index is named only if the query's predicate matches its own.
(vector,) = llm.embed("arbor/echo-embed", ["cancel subscription"])
with CaptureQueriesContext(connection) as ran:
    scoring_pgvector.ranked(owner_id=large.pk, model="arbor/echo-embed",
                            target=np.frombuffer(vectors.to_bytes(vector), dtype="<f4"), take=5,
                            exclude_conversation=None)
(scan,) = [q["sql"] for q in ran.captured_queries if "ORDER BY" in q["sql"]][:1]
with transaction.atomic(), connection.cursor() as cursor:
    cursor.execute("SET LOCAL enable_sort = off")
    cursor.execute("EXPLAIN " + scan.replace("%", "%%"))
    plan = "\n".join(row[0] for row in cursor.fetchall())

mine_ids = [c.pk for c in mine]
deleted = mine[0].pk
services.conversation_delete(conversation=mine[0])
after_delete = [hit.conversation for hit in similar_bubbles(user=small, query=queries[0])]

print("SCENARIO " + json.dumps({
    "backend": vectors.backend(), "indexes": indexes, "missing": missing, "same_order": same_order,
    "top": top, "mine": mine_ids, "plan": plan, "deleted": deleted, "after_delete": after_delete,
}))
