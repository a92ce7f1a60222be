"""Issue 7's figures: search latency over many bubbles, worker throughput, and import time for a large export.

Run it on PostgreSQL with its own database (it writes a user `arbor-bench7` and its conversations):

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/arbor_bench7 python manage.py migrate
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/arbor_bench7 python manage.py bench_search_import_worker

It prints figures; it asserts nothing about time.
"""

from __future__ import annotations

import json
import random
import statistics
import time

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction

from conversations import items as it
from conversations import outbox as job_kinds
from conversations import services
from conversations.jobs import worker
from conversations.models import Bubble, Conversation, Node, OutboxJob
from conversations.transfer import arbor_tree, importing
from search.index import index_bubbles, unindexed_bubbles
from search.query import search_bubbles

USERNAME = "arbor-bench7"
_TOPICS = """revenue region quarter customer growth margin churn pricing seat enterprise invoice discount
forecast pipeline renewal segment north south east west korea japan germany brazil monthly weekly report dashboard
query table column index latency budget target plan product launch campaign retention cohort funnel signup trial
upgrade downgrade refund support ticket escalation contract legal"""
# A Zipf-shaped vocabulary, as in real text: a few frequent words, a long tail of rare ones.
WORDS = [*_TOPICS.split(), *(f"w{n}" for n in range(5000))]
_WEIGHTS = [1 / rank for rank in range(1, len(WORDS) + 1)]


def _words(rng: random.Random, count: int) -> list[str]:
    return rng.choices(WORDS, weights=_WEIGHTS, k=count)


def _sentence(rng: random.Random, length: int) -> str:
    return " ".join(_words(rng, length)).capitalize() + "?"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


class Command(BaseCommand):
    help = "Print search latency (median, p95), worker throughput and import time for issue 7."

    def add_arguments(self, parser):
        parser.add_argument("--bubbles", type=int, default=100_000, help="bubbles to search over (default 100000)")
        parser.add_argument("--queries", type=int, default=200, help="timed searches (default 200)")
        parser.add_argument("--jobs", type=int, default=500, help="worker jobs to time (default 500)")
        parser.add_argument("--import-nodes", type=int, default=10_000, help="nodes in the exported tree (10000)")
        parser.add_argument("--keep", action="store_true", help="reuse the search dataset if it is there")
        parser.add_argument("--allow-sqlite", action="store_true", help="run on SQLite too (FTS5; figures differ)")

    def handle(self, *args, bubbles: int, queries: int, jobs: int, import_nodes: int, keep: bool,
               allow_sqlite: bool, **options):
        if connection.vendor != "postgresql" and not allow_sqlite:
            raise CommandError("The figures are for PostgreSQL; pass --allow-sqlite to run on SQLite anyway.")
        rng = random.Random(7)
        user, _ = get_user_model().objects.get_or_create(username=USERNAME)
        self.stdout.write(f"database: {connection.vendor}")
        self._search(user, rng, bubbles=bubbles, queries=queries, keep=keep)
        self._worker(user, rng, jobs=jobs)
        self._import(user, rng, nodes=import_nodes)

    # --- search -------------------------------------------------------------------------------------------

    def _search(self, user, rng: random.Random, *, bubbles: int, queries: int, keep: bool) -> None:
        have = Bubble.objects.filter(conversation__owner=user, conversation__title__startswith="bench7:").count()
        if not (keep and have >= bubbles):
            Conversation.objects.filter(owner=user).update(head=None)
            Node.objects.filter(conversation__owner=user).delete()
            Conversation.objects.filter(owner=user).delete()
            started = time.perf_counter()
            self._build(user, rng, bubbles=bubbles)
            self.stdout.write(f"built {bubbles} bubbles in {time.perf_counter() - started:.1f} s")
            started = time.perf_counter()
            indexed = 0
            while ids := unindexed_bubbles(limit=5000):
                indexed += index_bubbles(ids)
            self.stdout.write(f"indexed {indexed} bubbles in {time.perf_counter() - started:.1f} s")
        else:
            self.stdout.write(f"reusing {have} bubbles")
        if connection.vendor == "postgresql":  # the steady state autovacuum keeps: statistics, GIN pending list flushed
            with connection.cursor() as cursor:
                cursor.execute("VACUUM ANALYZE")
        samples, hits = [], []
        terms = [" ".join(_words(rng, 1 + n % 2)) for n in range(queries)]  # one or two words, as people type
        search_bubbles(user=user, query=terms[0])  # warm the cache once
        for term in terms:
            started = time.perf_counter()
            found = search_bubbles(user=user, query=term)
            samples.append(time.perf_counter() - started)
            hits.append(len(found))
        samples.sort()
        p95 = samples[min(len(samples) - 1, int(len(samples) * 0.95))]
        self.stdout.write(f"== Search over {bubbles} bubbles, {len(samples)} queries of 1 or 2 words drawn like the "
                          f"text (Zipf), top 20 with snippets and branch")
        self.stdout.write(f"search median {_ms(statistics.median(samples))}  p95 {_ms(p95)}  "
                          f"max {_ms(samples[-1])}  (mean hits returned {statistics.mean(hits):.1f})")

    @transaction.atomic
    def _build(self, user, rng: random.Random, *, bubbles: int) -> None:
        """Conversations of 25 turns (50 bubbles), one node per turn, written in bulk."""
        turns_total = max(1, bubbles // 2)
        per_conversation = 25
        conversations = Conversation.objects.bulk_create([
            Conversation(owner=user, title=f"bench7:{n}", model="arbor/echo")
            for n in range((turns_total + per_conversation - 1) // per_conversation)
        ])
        nodes: list[Node] = []
        texts: list[tuple[str, str]] = []
        remaining = turns_total
        for conversation in conversations:
            for _ in range(min(per_conversation, remaining)):
                question, answer = _sentence(rng, 8), _sentence(rng, 20)
                nodes.append(Node(conversation=conversation, kind="turn", status="succeeded",
                                  sent=[it.user(question)], received=[it.text(answer)], provider="arbor",
                                  model="arbor/echo"))
                texts.append((question, answer))
            remaining -= per_conversation
        Node.objects.bulk_create(nodes, batch_size=2000)  # parents are set below: ids exist now
        previous: dict[int, Node] = {}
        for node in nodes:
            node.parent_id = previous[node.conversation_id].pk if node.conversation_id in previous else None
            previous[node.conversation_id] = node
        Node.objects.bulk_update(nodes, ["parent"], batch_size=2000)
        for conversation in conversations:
            services.head_move(conversation=conversation, to=previous[conversation.pk].pk)
        Bubble.objects.bulk_create(
            [Bubble(conversation_id=n.conversation_id, node=n, role=role, content=text)
             for n, (question, answer) in zip(nodes, texts, strict=True)
             for role, text in (("user", question), ("assistant", answer))],
            batch_size=5000)

    # --- worker -------------------------------------------------------------------------------------------

    def _worker(self, user, rng: random.Random, *, jobs: int) -> None:
        """Queue the after-turn jobs (index, title) for fresh conversations of 4 bubbles each, then run them."""
        others = OutboxJob.objects.filter(status=OutboxJob.Status.PENDING).count()
        if others:
            raise CommandError(f"{others} pending jobs are someone else's: run the benchmark on its own database.")
        fresh = Conversation.objects.bulk_create(
            [Conversation(owner=user, title="", model="arbor/echo") for _ in range(jobs)])
        nodes = Node.objects.bulk_create([
            Node(conversation=c, kind="turn", status="succeeded", sent=[it.user(_sentence(rng, 8))],
                 received=[it.text(_sentence(rng, 20))], provider="arbor", model="arbor/echo") for c in fresh])
        for conversation, node in zip(fresh, nodes, strict=True):
            services.head_move(conversation=conversation, to=node.pk)
        Bubble.objects.bulk_create([Bubble(conversation_id=n.conversation_id, node=n, role=role,
                                           content=(n.sent[0]["text"] if role == "user" else n.received[0]["text"]))
                                    for n in nodes for role in ("user", "assistant", "user", "assistant")])
        for conversation in fresh:
            job_kinds.enqueue_after_turn(conversation_id=conversation.pk, head=conversation.head_id)
        started = time.perf_counter()
        stats = worker.run_due()
        elapsed = time.perf_counter() - started
        titled = Conversation.objects.filter(pk__in=[c.pk for c in fresh]).exclude(title="").count()
        self.stdout.write(f"== Worker: {jobs} committed turns: {stats.total} jobs "
                          "(index and embed 4 bubbles; one arbor/echo title call)")
        self.stdout.write(f"worker {stats.done / elapsed:.1f} jobs/s  ({stats.done} done, {stats.retried} retried, "
                          f"{stats.failed} failed, {titled} titled, {elapsed:.2f} s, one worker process)")

    # --- import -------------------------------------------------------------------------------------------

    def _import(self, user, rng: random.Random, *, nodes: int) -> None:
        """A conversation of `nodes` nodes (a main line with a branch every 10 turns), exported then imported."""
        with transaction.atomic():
            source = Conversation.objects.create(owner=user, title="bench7:import-source", model="arbor/echo")
            made = Node.objects.bulk_create([
                Node(conversation=source, kind="turn", status="succeeded", sent=[it.user(_sentence(rng, 8))],
                     received=[it.text(_sentence(rng, 20))], provider="arbor", model="arbor/echo")
                for _ in range(nodes)], batch_size=2000)
            for n, node in enumerate(made[1:], start=1):  # every 10th turn branches off one turn earlier
                node.parent_id = made[n - 2].pk if n % 10 == 9 and n >= 2 else made[n - 1].pk
            Node.objects.bulk_update(made[1:], ["parent"], batch_size=2000)
            Bubble.objects.bulk_create([Bubble(conversation=source, node=n, role="user", content=n.sent[0]["text"])
                                        for n in made], batch_size=5000)
            services.head_move(conversation=source, to=made[-1].pk)
        started = time.perf_counter()
        document = json.dumps(arbor_tree.export_tree(source)).encode()
        exported = time.perf_counter() - started
        started = time.perf_counter()
        (copy,) = importing.import_any(owner=user, document=importing.parse(document)).conversations
        elapsed = time.perf_counter() - started
        count = Node.objects.filter(conversation=copy).count()
        self.stdout.write(f"== Import of a {nodes}-node export ({len(document) / 1e6:.1f} MB JSON)")
        self.stdout.write(f"import {elapsed:.2f} s  ({count / elapsed:.0f} nodes/s; export took {exported:.2f} s)")
