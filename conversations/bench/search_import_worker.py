"""Issue 7's figures: search latency over many bubbles, worker throughput, and import time for a large export.

Run it on PostgreSQL with its own database (it writes a user `arbor-bench7` and its conversations):

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/arbor_bench7 python manage.py migrate
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/arbor_bench7 python manage.py bench_search_import_worker

It prints figures; it asserts nothing about time.
"""

from __future__ import annotations

import itertools
import json
import random
import statistics
import time

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import connection, models, transaction
from django.utils import timezone

from conversations import items as it
from conversations import outbox as job_kinds
from conversations import services
from conversations.bench.assembly import p95
from conversations.jobs import worker
from conversations.models import Bubble, Conversation, Node, OutboxJob
from conversations.transfer import arbor_tree, importing
from search import embedding
from search import jobs as search_jobs
from search import query as search_query
from search.index import index_bubbles, unindexed_bubbles
from search.models import BubbleDocument, ChunkVector
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
        parser.add_argument("--parts", default="search,worker,turn-jobs,import,owners",
                            help="what to run, of search,worker,turn-jobs,import,owners (default all)")
        parser.add_argument("--turn-jobs-sizes", default="10,200,2000",
                            help="turn-jobs: answered turns in each conversation (default 10,200,2000)")
        parser.add_argument("--turn-jobs-repeat", type=int, default=15, help="turn-jobs: runs of each way (15)")
        parser.add_argument("--owners-total", type=int, default=500_000,
                            help="issue 34: nodes in the big table, everyone's (500000)")
        parser.add_argument("--owners-mine", type=int, default=10_000, help="issue 34: the person's nodes (10000)")
        parser.add_argument("--owners-long", type=int, default=10_000,
                            help="issue 34: nodes of another person's one conversation (10000)")
        parser.add_argument("--owners-queries", type=int, default=100, help="issue 34: queries a round (100)")
        parser.add_argument("--owners-rounds", type=int, default=3, help="issue 34: rounds (3)")
        parser.add_argument("--before", action="store_true",
                            help="issue 34: time the search as it was (0005's index, made for the run) beside it")

    def handle(self, *args, bubbles: int, queries: int, jobs: int, import_nodes: int, keep: bool,
               allow_sqlite: bool, parts: str, turn_jobs_sizes: str, turn_jobs_repeat: int, **options):
        if connection.vendor != "postgresql" and not allow_sqlite:
            raise CommandError("The figures are for PostgreSQL; pass --allow-sqlite to run on SQLite anyway.")
        rng = random.Random(7)
        user, _ = get_user_model().objects.get_or_create(username=USERNAME)
        self.stdout.write(f"database: {connection.vendor}")
        chosen = set(parts.split(","))
        if "search" in chosen:
            self._search(user, rng, bubbles=bubbles, queries=queries, keep=keep)
        if "worker" in chosen:
            self._worker(user, rng, jobs=jobs)
        if "turn-jobs" in chosen:
            sizes = [int(size) for size in turn_jobs_sizes.split(",")]
            turn_jobs(self.stdout, user, rng, sizes=sizes, repeat=turn_jobs_repeat)
        if "import" in chosen:
            self._import(user, rng, nodes=import_nodes)
        if "owners" in chosen and connection.vendor == "postgresql":
            self._owners(rng, keep=keep, **options)

    # --- issue 34 -----------------------------------------------------------------------------------------

    def _owners(self, rng: random.Random, *, keep: bool, owners_total: int, owners_mine: int, owners_long: int,
                owners_queries: int, owners_rounds: int, before: bool, **options) -> None:
        owners = Owners(mine=owners_mine, total=owners_total, long=owners_long)
        if keep and owners.present():
            self.stdout.write(f"reusing issue 34's {owners_total} nodes")
        else:
            started = time.perf_counter()
            owners.clear()
            owners.build(random.Random(34))
            self.stdout.write(f"built issue 34's {owners_total} nodes ({2 * owners_total} indexed bubbles; the "
                              f"person's {owners_mine} also alone in {SMALL}) in {time.perf_counter() - started:.1f} s")
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE")
        owners_figures(self.stdout, rng, owners, queries=owners_queries, rounds=owners_rounds, before=before)

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


# --- issue 34: one person's search beside everyone else's ----------------------------------------------------

MINE, LONG, OTHERS = "arbor-bench34", "arbor-bench34-long", "arbor-bench34-other-"
OTHER_PEOPLE = 40
PER_CONVERSATION = 25  # turns
TITLE = "bench34:"
SMALL = "bench34_small"  # a schema of copies of the search's tables with MINE's rows only: "the 10k table"
_TABLES = (Conversation, Node, Bubble, BubbleDocument)
_NODE_COPY = ("id", "parent_id", "conversation_id", "owner_id", "kind", "status", "failure_reason", "failure_message",
              "sent", "received", "provider", "model", "usage", "created_at", "instructions", "tokens", "path_tokens",
              "keep_ephemeral", "window_root")
_CUMULATIVE = list(itertools.accumulate(_WEIGHTS))
_BUBBLES_OF_NODES = f"""
INSERT INTO {Bubble._meta.db_table} (role, content, data, created_at, conversation_id, owner_id, node_id)
SELECT r.role, CASE r.role WHEN 'user' THEN n.sent -> 0 ->> 'text' ELSE n.received -> 0 ->> 'text' END, '{{}}',
       n.created_at, n.conversation_id, n.owner_id, n.id
FROM {Node._meta.db_table} n CROSS JOIN (VALUES ('user', 0), ('assistant', 1)) AS r(role, place)
WHERE n.id = ANY(%s) ORDER BY n.id, r.place"""


def turn_jobs(out, user, rng: random.Random, *, sizes: list[int], repeat: int) -> None:
    """Issue 34: the index and embed jobs after one more turn, in conversations of `sizes` answered turns, as they
    run now (the turn's nodes, the job's payload) and as they ran (the whole conversation, the payload of an
    import), interleaved in a shuffled order. Before each run the turn's entries and vectors are dropped, so each
    finds and does the same work."""
    out.write(f"== Turn jobs: index and embed after one turn, {repeat} runs each way, ms a turn (median / p95)")
    for size in sizes:
        conversation = Conversation.objects.create(owner=user, title=f"bench7:turn-jobs:{size}", model="arbor/echo")
        nodes = Node.objects.bulk_create([
            Node(conversation=conversation, owner=user, kind="turn", status="succeeded",
                 sent=[it.user(_sentence(rng, 8))], received=[it.text(_sentence(rng, 20))], provider="arbor",
                 model="arbor/echo") for _ in range(size)], batch_size=2000)
        for parent, node in itertools.pairwise(nodes):  # one line of turns: ids exist now
            node.parent_id = parent.pk
        Node.objects.bulk_update(nodes, ["parent"], batch_size=2000)
        ids = [node.pk for node in nodes]
        services.head_move(conversation=conversation, to=ids[-1])
        Bubble.objects.bulk_create([Bubble(conversation=conversation, owner=user, node=n, role=role, content=text)
                                    for n in nodes for role, text in (("user", n.sent[0]["text"]),
                                                                      ("assistant", n.received[0]["text"]))],
                                   batch_size=5000)
        search_jobs.run({"conversation": conversation.pk, "head": ids[-1]})
        embedding.run({"conversation": conversation.pk, "head": ids[-1]})
        if connection.vendor == "postgresql":  # the planner's statistics, as autovacuum keeps them
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE conversations_bubble, search_bubbledocument, search_chunkvector")
        ways = {"turn's nodes": {"conversation": conversation.pk, "head": ids[-1], "nodes": [ids[-1]]},
                "whole conversation": {"conversation": conversation.pk, "head": ids[-1]}}
        times: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(repeat):
            for way in rng.sample(list(ways), len(ways)):
                BubbleDocument.objects.filter(bubble__node_id=ids[-1]).delete()
                ChunkVector.objects.filter(bubble__node_id=ids[-1]).delete()
                started = time.perf_counter()
                search_jobs.run(ways[way])
                embedding.run(ways[way])
                times[way].append(time.perf_counter() - started)
                if BubbleDocument.objects.filter(bubble__node_id=ids[-1]).count() != 2:
                    raise CommandError(f"{way}: the turn's two bubbles were not indexed")
        figures = "; ".join(f"{way} {_ms(statistics.median(t))} / {_ms(p95(t))}" for way, t in times.items())
        out.write(f"{size} turns: {figures}")
        conversation.delete()


def _fast_sentence(rng: random.Random, length: int) -> str:
    return " ".join(rng.choices(WORDS, cum_weights=_CUMULATIVE, k=length)).capitalize() + "?"


def _parents(turns: int) -> list[int | None]:
    """Each turn's parent (its index): one line, and every tenth turn branches off one turn earlier, leaving the
    turn before it on another branch (the import's tree). The last turn is the head."""
    return [None if n == 0 else n - 2 if n % 10 == 9 else n - 1 for n in range(turns)]


def _next_ids(count: int) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT nextval(pg_get_serial_sequence('{Node._meta.db_table}', 'id')) "
                       "FROM generate_series(1, %s)", [count])
        return [row[0] for row in cursor.fetchall()]


def _people() -> dict[str, object]:
    names = [MINE, LONG, *(f"{OTHERS}{k}" for k in range(OTHER_PEOPLE))]
    return {name: get_user_model().objects.get_or_create(username=name)[0] for name in names}


class Owners:
    """Issue 34's data: MINE's conversations among OTHER_PEOPLE's (the big table), LONG's one long conversation, and
    a copy of MINE's rows alone in the schema SMALL; built with COPY and set-based INSERTs."""

    def __init__(self, *, mine: int, total: int, long: int):
        self.mine, self.total, self.long = mine, total, long
        self.people = _people()

    def present(self) -> bool:
        counts = dict(Node.objects.filter(conversation__title__startswith=TITLE)
                      .values_list("conversation__owner__username").annotate(count=models.Count("id")))
        with connection.cursor() as cursor:
            cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [f"{SMALL}.{BubbleDocument._meta.db_table}"])
            small = cursor.fetchone()[0]
        return small and counts.get(MINE) == self.mine and counts.get(LONG) == self.long and sum(
            counts.values()) == self.total

    def clear(self) -> None:
        conversations = f"SELECT id FROM {Conversation._meta.db_table} WHERE title LIKE '{TITLE}%%'"
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"DROP SCHEMA IF EXISTS {SMALL} CASCADE")
            cursor.execute(f"UPDATE {Conversation._meta.db_table} SET head_id = NULL WHERE id IN ({conversations})")
            cursor.execute(f"DELETE FROM {BubbleDocument._meta.db_table} WHERE bubble_id IN (SELECT id FROM "
                           f"{Bubble._meta.db_table} WHERE conversation_id IN ({conversations}))")
            cursor.execute(f"DELETE FROM {Bubble._meta.db_table} WHERE conversation_id IN ({conversations})")
            cursor.execute(f"DELETE FROM {Node._meta.db_table} WHERE conversation_id IN ({conversations})")
            cursor.execute(f"DELETE FROM {Conversation._meta.db_table} WHERE id IN ({conversations})")

    @transaction.atomic
    def build(self, rng: random.Random) -> None:
        """Conversations of PER_CONVERSATION turns (MINE's shuffled among the others', as people write side by
        side), LONG's one conversation last; a turn is a node with a question and an answer bubble."""
        others = [self.people[f"{OTHERS}{k}"] for k in range(OTHER_PEOPLE)]
        plan = [(self.people[MINE], PER_CONVERSATION)] * (self.mine // PER_CONVERSATION)
        plan += [(others[k % OTHER_PEOPLE], PER_CONVERSATION)
                 for k in range((self.total - self.mine - self.long) // PER_CONVERSATION)]
        rng.shuffle(plan)
        plan.append((self.people[LONG], self.long))
        conversations = Conversation.objects.bulk_create(
            [Conversation(owner=owner, title=f"{TITLE}{n}", model="arbor/echo") for n, (owner, _) in enumerate(plan)],
            batch_size=5000)
        ids = iter(_next_ids(sum(turns for _, turns in plan)))
        heads: list[tuple[int, int]] = []
        now = timezone.now()

        def rows():
            for conversation, (_, turns) in zip(conversations, plan, strict=True):
                made = [next(ids) for _ in range(turns)]
                for n, parent in enumerate(_parents(turns)):
                    question, answer = _fast_sentence(rng, 8), _fast_sentence(rng, 16)
                    yield (made[n], None if parent is None else made[parent], conversation.pk, conversation.owner_id,
                           "turn", "succeeded",
                           "", "", json.dumps([it.user(question)]), json.dumps([it.text(answer)]), "arbor",
                           "arbor/echo", "{}", now, "", 0, 0, False, False)
                heads.append((conversation.pk, made[-1]))

        connection.ensure_connection()
        with connection.connection.cursor() as raw, \
                raw.copy(f"COPY {Node._meta.db_table} ({', '.join(_NODE_COPY)}) FROM STDIN") as copy:
            for row in rows():
                copy.write_row(row)
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE {Conversation._meta.db_table} c SET head_id = v.head "
                           "FROM unnest(%s::bigint[], %s::bigint[]) AS v(id, head) WHERE c.id = v.id",
                           [[c for c, _ in heads], [h for _, h in heads]])
            cursor.execute(f"SELECT id FROM {Node._meta.db_table} WHERE conversation_id = ANY(%s)",
                           [[c.pk for c in conversations]])
            cursor.execute(_BUBBLES_OF_NODES, [[row[0] for row in cursor.fetchall()]])
            # The GIN index is built once over the whole table (as CREATE INDEX), not entry by entry: minutes less.
            cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s AND indexdef LIKE "
                           "'%%USING gin%%'", [BubbleDocument._meta.db_table])
            gin = cursor.fetchall()
            for name, _ in gin:
                cursor.execute(f"DROP INDEX {name}")
            cursor.execute(f"SELECT b.id FROM {Bubble._meta.db_table} b WHERE b.conversation_id = ANY(%s)",
                           [[c.pk for c in conversations]])
            bubble_ids = [row[0] for row in cursor.fetchall()]
            for start in range(0, len(bubble_ids), 100_000):
                index_bubbles(bubble_ids[start:start + 100_000])
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # the deferred foreign keys' checks, before the index
            cursor.execute("SET LOCAL maintenance_work_mem = '512MB'")
            for _, definition in gin:
                cursor.execute(definition)
        self._small()

    def _small(self) -> None:
        """MINE's rows alone, in tables of their own (same columns and indexes) in the schema SMALL."""
        owner = self.people[MINE].pk
        mine = {
            Conversation: "owner_id = %s",
            Node: f"conversation_id IN (SELECT id FROM {SMALL}.{Conversation._meta.db_table})",
            Bubble: f"conversation_id IN (SELECT id FROM {SMALL}.{Conversation._meta.db_table})",
            BubbleDocument: "owner_id = %s",
        }
        with connection.cursor() as cursor:
            cursor.execute(f"DROP SCHEMA IF EXISTS {SMALL} CASCADE")
            cursor.execute(f"CREATE SCHEMA {SMALL}")
            for model, where in mine.items():
                table = model._meta.db_table
                cursor.execute(f"CREATE TABLE {SMALL}.{table} (LIKE public.{table} INCLUDING ALL)")
                cursor.execute(f"INSERT INTO {SMALL}.{table} SELECT * FROM public.{table} WHERE {where}",
                               [owner] * where.count("%s"))


# What search ran before issue 34, kept to be timed beside it (`--before`): the words matched in 0005's GIN index over
# (owner, tsvector), every match joined before ranking, and each hit's conversation's whole history read for marks.
_BEFORE_RANKED = """
SELECT b.id, b.node_id, b.role, c.id, c.title, ts_rank(d.vector, q.query) AS rank
FROM search_bubbledocument d
JOIN conversations_bubble b ON b.id = d.bubble_id
JOIN conversations_conversation c ON c.id = b.conversation_id,
     to_tsquery(%s::regconfig, %s) AS q(query)
WHERE d.owner_id = %s AND d.vector @@ q.query AND c.owner_id = %s AND c.id IS DISTINCT FROM %s
ORDER BY rank DESC, b.id DESC
LIMIT %s
"""
_BEFORE_INDEX = "search_owner_vector_gin"


def _before_search(*, user, query: str, limit: int = 20) -> list[tuple]:
    config = settings.ARBOR_SEARCH_CONFIG
    tsquery = search_query._tsquery(search_query._terms(query), match_any=False)
    with connection.cursor() as cursor:
        cursor.execute(_BEFORE_RANKED, [config, tsquery, user.pk, user.pk, None, limit])
        rows = cursor.fetchall()
        snippets = {}
        if rows:
            cursor.execute(search_query._POSTGRES_SNIPPETS, [config, config, tsquery, [r[0] for r in rows], user.pk])
            snippets = dict(cursor.fetchall())
    on_path = search_query.current_paths({row[3] for row in rows}, owner=user.pk)
    return [(*row, snippets.get(row[0], ""), row[1] in on_path.get(row[3], ())) for row in rows]


def _after_statement(user, query: str) -> tuple[str, list]:
    config = settings.ARBOR_SEARCH_CONFIG
    tsquery = search_query._tsquery(search_query._terms(query), match_any=False)
    return (search_query._POSTGRES_RANKED.format(match=search_query._POSTGRES_ALL),
            [config, tsquery, user.pk, user.pk, None, None, None, 20])  # no project filter


def _before_statement(user, query: str) -> tuple[str, list]:
    config = settings.ARBOR_SEARCH_CONFIG
    return _BEFORE_RANKED, [config, search_query._tsquery(search_query._terms(query), match_any=False), user.pk,
                            user.pk, None, 20]


def _explain(sql: str, params: list) -> tuple[float, float]:
    """(planning, execution) milliseconds of EXPLAIN ANALYZE."""
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
        plan = cursor.fetchone()[0]
    plan = (json.loads(plan) if isinstance(plan, str) else plan)[0]
    return plan["Planning Time"], plan["Execution Time"]


def _search_path(schema: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"SET search_path TO {schema}")


def _with_before_index(add: bool) -> None:
    """0005's index over (owner, tsvector), in both schemas, for `--before` (made, then dropped at the end)."""
    with connection.cursor() as cursor:
        for schema in ("public", SMALL):
            if add:
                cursor.execute(f"CREATE INDEX IF NOT EXISTS {_BEFORE_INDEX} ON {schema}.search_bubbledocument "
                               "USING gin (owner_id, vector)")
                cursor.execute(f"ANALYZE {schema}.search_bubbledocument")
            else:
                cursor.execute(f"DROP INDEX IF EXISTS {schema}.{_BEFORE_INDEX}")


def owners_figures(out, rng: random.Random, owners: Owners, *, queries: int, rounds: int, before: bool) -> None:
    """Search latency of one person's data alone (SMALL) and among everyone's, and of LONG's one long conversation,
    interleaved: each round shuffles the cases, each query rotates them. Then EXPLAIN ANALYZE's planning and
    execution of the ranking statement for each case."""
    mine, long = owners.people[MINE], owners.people[LONG]
    cases = [(f"{owners.mine // 1000}k-node person, {owners.mine // 1000}k-node table", mine, f"{SMALL}, public"),
             (f"{owners.mine // 1000}k-node person, {owners.total // 1000}k-node table", mine, "public"),
             (f"one {owners.long // 1000}k-node conversation, {owners.total // 1000}k-node table", long, "public")]
    paths = {"after": (lambda user, q: search_bubbles(user=user, query=q), _after_statement)}
    if before:
        paths["before"] = (lambda user, q: _before_search(user=user, query=q), _before_statement)
        _with_before_index(True)
    runs = [(case, path) for case in cases for path in paths]
    terms = [" ".join(_words(rng, 1 + n % 2)) for n in range(queries)]  # one or two words, as people type
    samples: dict[tuple, list[float]] = {(case[0], path): [] for case, path in runs}
    try:
        for (_, user, schema), path in runs:  # warm each once
            _search_path(schema)
            paths[path][0](user, terms[0])
        for round_ in range(rounds):
            order = runs[:]
            rng.shuffle(order)
            for n, term in enumerate(terms):
                shift = (n + round_) % len(order)
                for (name, user, schema), path in order[shift:] + order[:shift]:
                    _search_path(schema)
                    started = time.perf_counter()
                    paths[path][0](user, term)
                    samples[(name, path)].append(time.perf_counter() - started)
        out.write(f"== Issue 34: one person's search among others' data; {queries} queries of 1 or 2 words (Zipf), "
                  f"{rounds} rounds, cases interleaved (shuffled each round, rotated each query), top 20 with "
                  "snippets and branch marks")
        for (name, path), taken in samples.items():
            out.write(f"{path:6} {name}: median {_ms(statistics.median(taken))}  p95 {_ms(p95(taken))}  "
                      f"max {_ms(max(taken))}")
        explained: dict[tuple, list[tuple[float, float]]] = {key: [] for key in samples}
        for term in terms:
            for (name, user, schema), path in runs:
                _search_path(schema)
                explained[(name, path)].append(_explain(*paths[path][1](user, term)))
        out.write("EXPLAIN ANALYZE of the ranking statement, the same queries (median / p95 ms):")
        for (name, path), figures in explained.items():
            planning, execution = [f[0] for f in figures], [f[1] for f in figures]
            out.write(f"{path:6} {name}: planning {statistics.median(planning):.2f} / {p95(planning):.2f}  "
                      f"execution {statistics.median(execution):.2f} / {p95(execution):.2f}")
    finally:
        _search_path("public")
        if before:
            _with_before_index(False)
