"""Measure what compaction does to prompt caches and to assembly time: `python manage.py bench_compaction`.

1. Prefix stability. A conversation of --turns real arbor/echo turns, three ways: never compacted, compacted
   once by hand in the middle, and compacted automatically under a small input limit. For every call (turns
   and summarising calls, in order) it checks that the call's context ("what the model saw",
   `call_context`) starts with exactly the previous call's context, and prints the share that do.
   Providers' prompt caches pay off only on such calls.
2. Assembly time. What the turn runner does before a call (the path query, the C3 expansion check, the
   budget check, `assemble`) at the head of a conversation at turn --short and at turn --long, both with
   compaction on. The long one's first turns are written in bulk with the shape compaction gives a tree
   (a root every few turns pointing at the old head, with its summarising call); its last --real turns
   and the whole short one run through the real turn runner. Target: long / short <= 1.2. The ratio covers
   only that pre-call work, whose cost follows the path since the last compaction, not the history.
3. History reads, timed at the same two heads but with no target: they follow the whole history behind
   the compactions (C3), so they grow with it. The screen's history (`selectors.path_bubbles`: the
   bubbles of every node behind every root, with branch infos) and the T10 check (is a node anywhere
   behind the path's compaction root? asked for the conversation's first question, the deepest).

Everything it writes belongs to conversations titled `arbor-bench-compaction:...` owned by the user
`arbor-bench`, deleted again at the start of the next run. Run it on a database of its own.
"""

from __future__ import annotations

import statistics
import time

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction
from django.test.utils import override_settings
from django.utils import timezone

from conversations import budget, services
from conversations import items as it
from conversations.bench.assembly import ANSWER, BENCH_USER, INSTRUCTIONS, interleaved_timings, p95, reset_node_sequence
from conversations.context import assemble, is_compaction_root
from conversations.llm import echo
from conversations.models import Bubble, Conversation, Node
from conversations.screen import path_bubbles
from conversations.selectors import context_path, node_path
from conversations.turns.detached import run_here
from conversations.turns.seen import call_context
from conversations.turns.start import _before_compaction, turn_ask, turn_compact

PREFIX = "arbor-bench-compaction:"
MODEL = "arbor/echo"
TARGET_RATIO = 1.2
UNLIMITED = 10**9
# Compaction on: a small input limit, so arbor/echo compacts every few turns.
SMALL = {"ARBOR_ECHO_MAX_INPUT_TOKENS": 3000, "ARBOR_ANSWER_RESERVE_TOKENS": 500, "ARBOR_COMPACTION_THRESHOLD": 0.8,
         "ARBOR_COMPACTION_KEEP_TURNS": 2, "ARBOR_TURN_LOCK_SECONDS": 3600}
SEGMENT = 8  # turns between two compactions in the bulk-written history (what SMALL gives, measured)


def question(k: int) -> str:
    return f"Question {k}: how did revenue change by region last quarter, and why?"


def ask(conversation: Conversation, k: int) -> None:
    events = run_here(turn_ask(user=conversation.owner, conversation_id=conversation.pk, content=question(k)))
    if events[-1].type != "done":
        raise CommandError(f"bench turn {k} of {conversation.title} ended with {events[-1]}")


def new_conversation(name: str) -> Conversation:
    owner, _ = get_user_model().objects.get_or_create(username=BENCH_USER)
    return services.conversation_create(owner=owner, title=f"{PREFIX}{name}", model=MODEL, instructions=INSTRUCTIONS)


def drop_bench_conversations() -> None:
    for conversation in Conversation.objects.filter(title__startswith=PREFIX):
        services.conversation_delete(conversation=conversation)


# --- 1. prefix stability ------------------------------------------------------------------------------


def calls_in_order(conversation: Conversation) -> list[Node]:
    """Every model call the conversation made (turns and summarising calls), oldest first."""
    return list(Node.objects.filter(conversation=conversation).exclude(kind=Node.Kind.COMPACTION, parent=None)
                .order_by("id"))


def prefix_stable(calls: list[Node]) -> tuple[int, int]:
    """(calls whose context starts with the previous call's context, calls that have a previous call)."""
    contexts = [call_context(call) for call in calls]
    stable = sum(1 for before, after in zip(contexts, contexts[1:], strict=False) if after[: len(before)] == before)
    return stable, max(0, len(contexts) - 1)


# --- 2. assembly time ---------------------------------------------------------------------------------


def before_a_call(head_id: int, owner: int) -> list[dict]:
    """What the turn runner does before a call from a head: path, C3 check, budget check, assembly."""
    path = context_path(node_path(head_id, owner=owner), echo.PROVIDER, owner=owner)
    new = [it.user("One more question?")]
    budget.call_tokens(path, new, model=MODEL, provider=echo.PROVIDER, instructions=INSTRUCTIONS)
    return assemble(path, new, instructions=INSTRUCTIONS, provider=echo.PROVIDER)


def last_heads(conversation: Conversation) -> list[int]:
    """The heads of the last SEGMENT turns: one compaction cycle, so neither conversation is measured at a
    luckier point of it (just after a compaction the path is shortest)."""
    ids = Node.objects.filter(conversation=conversation, kind=Node.Kind.TURN).order_by("-id")
    return list(ids.values_list("id", flat=True)[:SEGMENT])


def before_calls(heads: list[int], owner: int) -> None:
    for head_id in heads:
        before_a_call(head_id, owner)


def write_compacted_history(conversation: Conversation, turns_count: int) -> None:
    """`turns_count` turns in bulk, shaped as compaction leaves them: after every SEGMENT turns a summarising
    call below the tip and a parentless root pointing at it, holding a summary and the last two turns."""
    next_id = (Node.objects.order_by("-id").values_list("id", flat=True).first() or 0) + 1
    now, rows, bubbles = timezone.now(), [], []
    parent, path_tokens, recent = None, 0, []

    def add(**fields) -> Node:
        nonlocal next_id
        node = Node(id=next_id, conversation=conversation, owner_id=conversation.owner_id,
                    status=Node.Status.SUCCEEDED, provider=echo.PROVIDER,
                    model=MODEL, instructions=INSTRUCTIONS, finished_at=now, **fields)
        next_id += 1
        rows.append(node)
        return node

    for k in range(1, turns_count + 1):
        sent, received = [it.user(question(k))], [it.text(f"Answer {k}: {ANSWER}")]
        tokens = len(str(sent + received)) // 4
        path_tokens += tokens
        parent = add(parent=parent, kind=Node.Kind.TURN, sent=sent, received=received, tokens=tokens,
                     path_tokens=path_tokens)
        bubbles += [Bubble(conversation=conversation, owner_id=conversation.owner_id, node=parent,
                           role=Bubble.Role.USER, content=question(k)),
                    Bubble(conversation=conversation, owner_id=conversation.owner_id, node=parent,
                           role=Bubble.Role.ASSISTANT,
                           content=received[0]["text"])]
        recent = [*recent[-1:], sent + received]
        if k % SEGMENT == 0 and k < turns_count:
            summary = add(parent=parent, kind=Node.Kind.COMPACTION, sent=[it.user("Summarise ...")],
                          received=[it.text(f"summary up to question {k}")], tokens=20,
                          path_tokens=path_tokens + 20)
            kept = [it.summary(f"summary up to question {k}"), *(i for items in recent for i in items)]
            tokens = len(str(kept)) // 4
            parent = add(parent=None, kind=Node.Kind.COMPACTION, sent=kept, compacted_from=parent,
                         summary_call=summary, tokens=tokens, path_tokens=tokens)
            path_tokens = tokens
    with transaction.atomic():
        Node.objects.bulk_create(rows, batch_size=2000)
        reset_node_sequence()
        Bubble.objects.bulk_create(bubbles, batch_size=2000)
        services.head_move(conversation=conversation, to=parent.pk)


class Command(BaseCommand):
    help = "Prefix-stable share of calls with and without compaction, and assembly time at turn 10,000 vs 100."

    def add_arguments(self, parser):
        parser.add_argument("--turns", type=int, default=50, help="turns of the prefix-stability study (50)")
        parser.add_argument("--short", type=int, default=100, help="the short conversation's turns (100)")
        parser.add_argument("--long", type=int, default=10_000, help="the long conversation's turns (10000)")
        parser.add_argument("--real", type=int, default=100, help="of those, run for real at the end (100)")
        parser.add_argument("--repeat", type=int, default=30, help="timed runs per figure (30)")
        parser.add_argument("--allow-sqlite", action="store_true", help="run on SQLite (figures not comparable)")

    def handle(self, *args, **options):
        if connection.vendor == "sqlite" and not options["allow_sqlite"]:
            raise CommandError("bench_compaction measures PostgreSQL: point DATABASE_URL at one, or pass "
                               "--allow-sqlite.")
        if options["real"] > options["long"]:
            raise CommandError("--real cannot be more than --long.")
        if options["turns"] < 6:
            raise CommandError("--turns must be at least 6: a compaction in the middle keeps the last two turns "
                               "and needs something before them to summarise.")
        drop_bench_conversations()
        self.prefix_study(options["turns"])
        conversations = self.assembly_study(options["short"], options["long"], options["real"], options["repeat"])
        self.history_study(conversations, options["repeat"])

    def prefix_study(self, turns_count: int) -> None:
        self.stdout.write(f"== Prefix stability over {turns_count} arbor/echo turns "
                          "(a call's context starts with exactly the previous call's)")
        ways = {"never compacted": ({"ARBOR_ECHO_MAX_INPUT_TOKENS": UNLIMITED}, False),
                "compacted once, by hand, in the middle": ({"ARBOR_ECHO_MAX_INPUT_TOKENS": UNLIMITED}, True),
                "compacted automatically (echo limit 3000)": (SMALL, False)}
        for name, (limits, by_hand) in ways.items():
            conversation = new_conversation(f"prefix-{len(name)}")
            with override_settings(**{**SMALL, **limits}):
                for k in range(1, turns_count + 1):
                    ask(conversation, k)
                    if by_hand and k == turns_count // 2:
                        turn_compact(user=conversation.owner, conversation_id=conversation.pk)
                calls = calls_in_order(conversation)
                stable, pairs = prefix_stable(calls)
            compactions = sum(1 for c in calls if c.kind == Node.Kind.COMPACTION)
            share = stable / pairs if pairs else 1.0
            self.stdout.write(f"{name:<44} {len(calls):>4} calls ({compactions} summarising)   "
                              f"prefix-stable {stable}/{pairs} = {share:6.1%}")

    def assembly_study(self, short: int, long: int, real: int, repeat: int) -> dict[int, Conversation]:
        self.stdout.write(f"\n== Assembly before a call, compaction on: turn {short} vs turn {long:,}")
        with override_settings(**SMALL):
            short_conversation = new_conversation("short")
            for k in range(1, short + 1):
                ask(short_conversation, k)
            long_conversation = new_conversation("long")
            began = time.perf_counter()
            write_compacted_history(long_conversation, long - real)
            for k in range(long - real + 1, long + 1):
                ask(long_conversation, k)
            self.stdout.write(f"long conversation written in {time.perf_counter() - began:.1f} s "
                              f"({Node.objects.filter(conversation=long_conversation).count():,} nodes)")
            heads = {"short": last_heads(short_conversation), "long": last_heads(long_conversation)}
            owner = long_conversation.owner_id
            samples = interleaved_timings({name: lambda h=h: before_calls(h, owner) for name, h in heads.items()},
                                          repeat)
        medians = {}
        for name, turn in (("short", short), ("long", long)):
            per_call = [ms / len(heads[name]) for ms in samples[name]]
            medians[name] = statistics.median(per_call)
            lengths = [len(node_path(h, owner=owner)) for h in heads[name]]
            self.stdout.write(f"turn {turn:>6,}   paths of {min(lengths)}-{max(lengths)} nodes over its last "
                              f"{len(lengths)} heads   median {medians[name]:8.3f} ms   p95 {p95(per_call):8.3f} ms"
                              f"   ({len(per_call)} runs)")
        ratio = medians["long"] / medians["short"]
        verdict = "met" if ratio <= TARGET_RATIO else "MISSED"
        self.stdout.write(f"[{verdict}] turn {long:,} / turn {short}: {ratio:.2f}x (target <= {TARGET_RATIO}x)")
        self.stdout.write("  covers: the work before a call (path query up to the compaction root, C3 check, budget "
                          "check, assemble);\n  not the history reads below, which follow the whole history.")
        return {short: short_conversation, long: long_conversation}

    def history_study(self, conversations: dict[int, Conversation], repeat: int) -> None:
        self.stdout.write("\n== History reads at the head (no target: they follow the whole history, C3)")
        for turn, conversation in conversations.items():
            conversation.refresh_from_db()
            path = node_path(conversation.head_id, owner=conversation.owner_id)
            first = (Node.objects.filter(conversation=conversation, kind=Node.Kind.TURN).order_by("id")
                     .values_list("id", flat=True).first())
            root = path[0] if is_compaction_root(path[0]) else None
            reads = {"screen": lambda c=conversation: path_bubbles(conversation=c),
                     "t10": lambda r=root, f=first, o=conversation.owner_id: (r is not None
                                                                             and _before_compaction(r, f, o))}
            samples = interleaved_timings(reads, repeat)
            shown = len(path_bubbles(conversation=conversation))
            self.stdout.write(
                f"turn {turn:>6,}   screen history (path_bubbles, {shown:,} entries) median "
                f"{statistics.median(samples['screen']):8.2f} ms   T10 check of the first question median "
                f"{statistics.median(samples['t10']):8.2f} ms")
