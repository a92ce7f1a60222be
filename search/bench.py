"""Issue 18's figures: `python manage.py bench_retrieval` (on the database DATABASE_URL names; SQLite by default).

1. Recall@5. A generated set: `--facts` facts ("Cancelling the subscription for the Seoul office needs a signed
   form"), each a question in a conversation of its own, and for each a person's later question that says
   the same in other words: other word forms ("cancellation", "subscriptions"), a misspelt word in every
   second one, a synonym for the place in every third, other filler words. Distractors share the action, the
   object or the place with a fact but not all three; background turns (Zipf-drawn words) fill the rest.
   Recall@5 is the share of questions whose fact is among the first five hits of full-text alone, vectors
   alone and hybrid (the R2 retrieval), with arbor/echo-embed.
2. Latency. The same three, per question, interleaved in rotated order and repeated, at `--sizes` chunks of
   one user (10,000 and 100,000 by default): median and p95, with the in-memory copy warm (the steady state;
   the first read's cost is printed too).
3. Worker throughput: the embedding sweep (what the worker runs in the background) over the background turns,
   chunks a second, one process.

`--others N` first gives another person N pieces of the same words (distractors and background turns): their
messages should cost this person's searches nothing and change none of their results.

It writes users `arbor-bench-retrieval` (and `arbor-bench-retrieval-other`) and their conversations, and deletes
them at the end. It prints figures;
it asserts nothing about time.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable

import numpy as np
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import connection, transaction

from conversations import items as it
from conversations import llm, services
from conversations.bench.assembly import p95
from conversations.models import Bubble, Conversation, Node
from search import embedding, retrieval, scoring_memory, scoring_pgvector, vectors
from search.index import index_bubbles, unindexed_bubbles
from search.models import ChunkVector

USERNAME = "arbor-bench-retrieval"
OTHER = "arbor-bench-retrieval-other"

# (base form, other forms a person uses)
ACTIONS = [("cancel", ["cancelling", "cancellation", "cancelled"]), ("renew", ["renewing", "renewal", "renewed"]),
           ("upgrade", ["upgrading", "upgraded", "upgrades"]), ("export", ["exporting", "exported", "exports"]),
           ("migrate", ["migrating", "migration", "migrated"]), ("configure", ["configuring", "configuration"]),
           ("delete", ["deleting", "deletion", "deleted"]), ("schedule", ["scheduling", "scheduled"]),
           ("approve", ["approving", "approval", "approved"]), ("archive", ["archiving", "archived"]),
           ("transfer", ["transferring", "transferred", "transfers"]), ("audit", ["auditing", "audited"])]
OBJECTS = [("subscription", ["subscriptions"]), ("database", ["databases"]), ("invoice", ["invoices"]),
           ("password", ["passwords"]), ("calendar", ["calendars"]), ("report", ["reports"]),
           ("contract", ["contracts"]), ("backup", ["backups"]), ("license", ["licenses", "licensing"]),
           ("payment", ["payments"]), ("account", ["accounts"]), ("mailbox", ["mailboxes"])]
# (place, a synonym no index can match)
PLACES = [("Seoul office", "Korean branch"), ("enterprise plan", "business tier"), ("staging cluster", "test servers"),
          ("Berlin team", "German colleagues"), ("annual budget", "yearly spending"), ("mobile app", "phone client"),
          ("support desk", "help center"), ("trial users", "evaluation customers")]
OUTCOMES = ["needs a signed form", "takes two business days", "must be done by an administrator",
            "is logged for the auditors", "cannot be undone afterwards", "sends a receipt by email"]
OPENERS = ["How do I handle", "What happens with", "Can you remind me about", "Who is responsible for",
           "Tell me again about"]
BACKGROUND = """revenue region quarter customer growth margin churn pricing seat forecast pipeline segment monthly
weekly dashboard query table column index latency target product launch campaign retention cohort funnel signup trial
refund ticket escalation legal lunch weather printer meeting agenda notes""".split()  # noqa: SIM905 - reads as text


def _typo(word: str, rng: random.Random) -> str:
    """Drop one inner letter: what a hurried person types."""
    if len(word) < 6:
        return word
    at = rng.randrange(2, len(word) - 2)
    return word[:at] + word[at + 1:]


def _facts(rng: random.Random, count: int) -> list[tuple[str, str]]:
    """(stored fact, a later question that means the same in other words)."""
    combos = [(a, o, p) for a in ACTIONS for o in OBJECTS for p in PLACES]
    rng.shuffle(combos)
    found = []
    for n, ((action, action_forms), (obj, obj_forms), (place, synonym)) in enumerate(combos[:count]):
        stored = f"{action_forms[0].capitalize()} the {obj} for the {place} {rng.choice(OUTCOMES)}."
        asked_action, asked_object = rng.choice(action_forms[1:] or [action]), rng.choice(obj_forms)
        if n % 2:
            asked_object = _typo(asked_object, rng)
        asked_place = synonym if n % 3 == 0 else place
        found.append((stored, f"{rng.choice(OPENERS)} the {asked_action} of {asked_object} for the {asked_place}?"))
    return found


def _distractors(rng: random.Random, count: int) -> list[str]:
    """Sentences that share one or two of a fact's parts, never all three with a fact's outcome."""
    out = []
    for _ in range(count):
        (action, forms), (obj, obj_forms), (place, _) = rng.choice(ACTIONS), rng.choice(OBJECTS), rng.choice(PLACES)
        out.append(rng.choice([
            f"The {place} asked whether we {action} every {obj} twice.",
            f"Please {action} nothing for the {place} this week.",
            f"Our {obj} list for the {place} is on the wiki.",
            f"{forms[0].capitalize()} the {obj_forms[0]} went fine.",
        ]))
    return out


def _background(rng: random.Random) -> str:
    return " ".join(rng.choices(BACKGROUND, k=12)).capitalize() + "."


def _reciprocal_rank_fusion(rankings: list[list], k: int = 60) -> list[int]:
    """The fusion retrieval did not choose, for comparison: a bubble scores the sum of 1 / (k + its rank)."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, hit in enumerate(ranking, start=1):
            scores[hit.bubble] = scores.get(hit.bubble, 0.0) + 1.0 / (k + rank)
    return sorted(scores, key=lambda b: (-scores[b], -b))


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


class Command(BaseCommand):
    help = "Print recall@5 and latency of full-text, vector and hybrid retrieval, and embedding throughput."

    def add_arguments(self, parser):
        parser.add_argument("--facts", type=int, default=200, help="facts and paraphrased questions (200)")
        parser.add_argument("--distractors", type=int, default=2000, help="near-miss sentences (2000)")
        parser.add_argument("--sizes", default="10000,100000", help="chunks of the user to measure at")
        parser.add_argument("--queries", type=int, default=60, help="questions timed at each size (60)")
        parser.add_argument("--repeat", type=int, default=3, help="rounds of each question (3)")
        parser.add_argument("--others", type=int, default=0, help="another person's pieces in the database (0)")
        parser.add_argument("--keep", action="store_true", help="leave the data in the database")

    def handle(self, *args, facts: int, distractors: int, sizes: str, queries: int, repeat: int, others: int,
               keep: bool, **options):
        rng = random.Random(18)
        settings.ARBOR_EMBEDDING_MODEL = "arbor/echo-embed"  # the figures are this model's, whatever is set
        user, _ = get_user_model().objects.get_or_create(username=USERNAME)
        other, _ = get_user_model().objects.get_or_create(username=OTHER)
        self._clear(user)
        self._clear(other)
        self.stdout.write(f"database: {connection.vendor}; vector scoring: {vectors.backend()}; "
                          f"embedding model: arbor/echo-embed")
        if others:
            apart = random.Random(1800)  # their own draws: this person's set is the same with or without them
            theirs = _distractors(apart, others // 10) + [_background(apart) for _ in range(others - others // 10)]
            self._build(other, theirs, rng, total_chunks=0)
            self.stdout.write(f"another person has {ChunkVector.objects.filter(owner=other).count()} pieces of "
                              "the same words")
        pairs = _facts(rng, facts)
        texts = [stored for stored, _ in pairs] + _distractors(rng, distractors)
        order = list(range(len(texts)))
        rng.shuffle(order)  # facts and distractors interleaved: no ranking's tie-break (newest first) favours either
        built = self._build(user, [texts[n] for n in order], rng, total_chunks=0)
        bubble_of = {n: bubble for n, bubble in zip(order, built, strict=True)}
        targets = [bubble_of[n] for n in range(len(pairs))]
        questions = [asked for _, asked in pairs]
        try:
            for size in (int(s) for s in sizes.split(",")):
                have = ChunkVector.objects.filter(owner=user).count()
                if size > have:
                    self._build(user, [_background(rng) for _ in range(size - have)], rng, total_chunks=size)
                self._recall(user, questions, targets, size)
                self._latency(user, questions[:queries], repeat, size)
                self._after_a_write(user, questions[:queries], size)
                if scoring_pgvector.in_use():
                    self._scorers(user, questions[:queries], repeat, size)
        finally:
            if not keep:
                self._clear(user)
                self._clear(other)

    def _clear(self, user) -> None:
        Conversation.objects.filter(owner=user).update(head=None)
        Node.objects.filter(conversation__owner=user).delete()
        Conversation.objects.filter(owner=user).delete()
        vectors.forget()

    def _build(self, user, texts: list[str], rng: random.Random, *, total_chunks: int) -> list[int]:
        """One conversation a text (a one-turn question and a short answer); index and embed them. Returns the
        question bubbles' ids, in order."""
        with transaction.atomic():
            conversations = Conversation.objects.bulk_create(
                [Conversation(owner=user, title=f"bench {n}", model="arbor/echo") for n in range(len(texts))],
                batch_size=2000)
            nodes = Node.objects.bulk_create([
                Node(conversation=c, kind="turn", status="succeeded", sent=[it.user(text)],
                     received=[it.text("Noted.")], provider="arbor", model="arbor/echo")
                for c, text in zip(conversations, texts, strict=True)],
                batch_size=2000)
            for conversation, node in zip(conversations, nodes, strict=True):
                services.head_move(conversation=conversation, to=node.pk)
            questions = Bubble.objects.bulk_create(
                [Bubble(conversation=c, node=n, role="user", content=t)
                 for c, n, t in zip(conversations, nodes, texts, strict=True)], batch_size=5000)
        while ids := unindexed_bubbles(limit=5000):
            index_bubbles(ids)
        started = time.perf_counter()
        before = ChunkVector.objects.filter(owner=user).count()
        while embedding.backfill():  # the worker's sweep, as it runs in the background
            pass
        elapsed = time.perf_counter() - started
        made = ChunkVector.objects.filter(owner=user).count() - before
        if total_chunks:
            self.stdout.write(f"== {ChunkVector.objects.filter(owner=user).count()} chunks: the worker's embedding "
                              f"sweep embedded {made} chunks in {elapsed:.1f} s: {made / elapsed:.0f} chunks/s "
                              "(one process, arbor/echo-embed, batches of 64)")
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("VACUUM ANALYZE")
        return [b.pk for b in questions]

    def _rankers(self, user) -> dict[str, Callable[[str], list]]:
        return {
            "full-text": lambda q: retrieval.word_hits(user=user, question=q, limit=5, exclude_conversation=None),
            "vectors": lambda q: retrieval.vector_hits(user=user, question=q, limit=5, exclude_conversation=None),
            "hybrid": lambda q: retrieval.hybrid_hits(user=user, question=q, limit=5),
        }

    def _recall(self, user, questions: list[str], targets: list[int], size: int) -> None:
        found = {name: 0 for name in [*self._rankers(user), "hybrid by reciprocal rank fusion (k=60)"]}
        for question, target in zip(questions, targets, strict=True):
            for name, rank in self._rankers(user).items():
                found[name] += target in [h.bubble for h in rank(question)]
            candidates = [rank(question) for rank in (
                lambda q: retrieval.word_hits(user=user, question=q, limit=retrieval.CANDIDATES,
                                              exclude_conversation=None),
                lambda q: retrieval.vector_hits(user=user, question=q, limit=retrieval.CANDIDATES,
                                                exclude_conversation=None))]
            found["hybrid by reciprocal rank fusion (k=60)"] += target in _reciprocal_rank_fusion(candidates)[:5]
        figures = "  ".join(f"{name} {hits / len(questions):.3f}" for name, hits in found.items())
        self.stdout.write(f"recall@5 at {size} chunks over {len(questions)} paraphrased questions: {figures}")

    def _latency(self, user, questions: list[str], repeat: int, size: int) -> None:
        vectors.forget()
        started = time.perf_counter()
        retrieval.vector_hits(user=user, question=questions[0], limit=5, exclude_conversation=None)
        self.stdout.write(f"first vector query at {size} chunks (reads the owner's vectors into memory): "
                          f"{_ms(time.perf_counter() - started)}")
        rankers = list(self._rankers(user).items())
        samples: dict[str, list[float]] = {name: [] for name, _ in rankers}
        for round_ in range(repeat):
            for n, question in enumerate(questions):
                shift = (n + round_) % len(rankers)  # rotated: no ranker always runs first or last
                for name, rank in rankers[shift:] + rankers[:shift]:
                    began = time.perf_counter()
                    rank(question)
                    samples[name].append(time.perf_counter() - began)
        for name, taken in samples.items():
            self.stdout.write(f"latency at {size} chunks, {name}: median {_ms(statistics.median(taken))}  "
                              f"p95 {_ms(p95(taken))}  ({len(taken)} queries, {repeat} rounds, interleaved)")

    def _after_a_write(self, user, questions: list[str], size: int) -> None:
        """Hybrid retrieval right after a turn of the same person was embedded (the copy reads the new rows)."""
        samples = []
        conversation = Conversation.objects.filter(owner=user).order_by("pk").first()
        for n, question in enumerate(questions):
            node = Node.objects.create(conversation=conversation, kind="turn", status="succeeded",
                                       sent=[it.user(question)], received=[it.text("Noted.")], provider="arbor",
                                       model="arbor/echo")
            bubble = Bubble.objects.create(conversation=conversation, node=node, role="user", content=f"{n} {question}")
            embedding.embed_bubbles([(bubble.pk, bubble.content, conversation.pk, user.pk)], "arbor/echo-embed")
            began = time.perf_counter()
            retrieval.hybrid_hits(user=user, question=question, limit=5)
            samples.append(time.perf_counter() - began)
        self.stdout.write(f"latency at {size} chunks, hybrid right after a write of the same person's vectors: "
                          f"median {_ms(statistics.median(samples))}  p95 {_ms(p95(samples))}  "
                          f"({len(samples)} queries)")

    def _scorers(self, user, questions: list[str], repeat: int, size: int) -> None:
        """pgvector's HNSW against exact scoring in memory, on the same rows: time (interleaved, rotated) and how
        many of the exact top 20 the index finds."""
        model = settings.ARBOR_EMBEDDING_MODEL
        targets = [np.frombuffer(vectors.to_bytes(v), dtype="<f4") for v in llm.embed(model, questions)]
        scorers = [("pgvector HNSW", scoring_pgvector.ranked), ("exact in memory", scoring_memory.ranked)]
        samples: dict[str, list[float]] = {name: [] for name, _ in scorers}
        overlap = []
        for round_ in range(repeat):
            for n, target in enumerate(targets):
                found = {}
                for name, ranked in (scorers[(n + round_) % 2:] + scorers[:(n + round_) % 2]):
                    began = time.perf_counter()
                    found[name] = ranked(owner_id=user.pk, model=model, target=target, take=20,
                                         exclude_conversation=None)
                    samples[name].append(time.perf_counter() - began)
                exact = {pk for pk, _ in found["exact in memory"]}
                overlap.append(len(exact & {pk for pk, _ in found["pgvector HNSW"]}) / max(1, len(exact)))
        for name, taken in samples.items():
            self.stdout.write(f"scorer at {size} chunks, {name} (top 20): median {_ms(statistics.median(taken))}  "
                              f"p95 {_ms(p95(taken))}")
        self.stdout.write(f"pgvector HNSW finds {statistics.mean(overlap):.3f} of the exact top 20 "
                          f"(ef_search {scoring_pgvector.EF_SEARCH})")
