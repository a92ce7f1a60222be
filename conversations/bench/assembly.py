"""Benchmark context assembly (T5) on a large tree: `python manage.py bench_assembly`.

Builds (or, with --keep, reuses) a dataset of many conversations whose trees have paths of a
shallow, a middle and a deep depth (default 50, 400 and 2,000 nodes) with off-path siblings hanging
off every path node, plus, for each depth, a tree with 4x as many off-path nodes. It then prints
medians and p95 of Arbor's assembly, its two halves, the raw-SQL floor, django-tree-queries, and
the SQL queries of one whole arbor/echo turn, and whether the targets are met.

Everything the command writes belongs to conversations titled `arbor-bench:...` owned by the user
`arbor-bench`; a rebuild deletes only those. Run it on a database of its own.
"""

from __future__ import annotations

import gc
import itertools
import json
import math
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.core.management.color import no_style
from django.db import OperationalError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.test.utils import CaptureQueriesContext, override_settings
from django.utils import timezone

from config import news
from conversations import items as it
from conversations import llm
from conversations.context import PathNode, assemble
from conversations.models import Bubble, Conversation, Node, ToolApproval
from conversations.selectors import node_path
from conversations.services import head_move
from conversations.tools.mcp.servers import configured
from conversations.turns import detached
from conversations.turns.start import turn_ask

PREFIX = "arbor-bench:"
BENCH_USER = "arbor-bench"
MODEL = "arbor/echo"
PROVIDER = "arbor"
INSTRUCTIONS = "You are a careful sales analyst. Answer briefly and show the SQL you ran."
SIDE = 2  # off-path siblings hanging off every path node in a normal tree
BUSHIER = 4  # the bushier trees hang this many times more nodes off the same path
WARMUP = 3
TREE_QUERIES_BUDGET_S = 20.0  # per tree: fewer runs than --repeat if django-tree-queries is that slow
UNFILTERED_CAP_S = 60
BATCH = 2000  # bulk_create batch size when COPY is not available
NODE_COLUMNS = ("id", "parent_id", "conversation_id", "owner_id", "kind", "status", "failure_reason", "failure_message",
                "sent", "received", "provider", "model", "usage", "created_at", "finished_at", "instructions",
                "tokens", "path_tokens", "keep_ephemeral", "window_root")
# What node_path reads.
PATH_COLUMNS = "id, parent_id, kind, status, sent, received, provider, model, tokens, path_tokens, compacted_from_id"
ANSWER = ("Revenue in the north rose 12% quarter on quarter, driven by the enterprise segment; the south was "
          "flat, and the west fell 3% after two large renewals slipped into the next quarter. Margins held. ")


# --- the dataset ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TreeSpec:
    name: str
    depth: int  # path length from the root to the head
    side: int  # off-path children of every path node

    @property
    def size(self) -> int:
        return self.depth * (1 + self.side)

    @property
    def title(self) -> str:
        return f"{PREFIX}{self.name}"


def measured_specs(depths: tuple[int, ...]) -> list[TreeSpec]:
    normal = [TreeSpec(f"path-{d}", d, SIDE) for d in depths]
    return normal + [TreeSpec(f"path-{d}-bushier", d, SIDE * BUSHIER) for d in depths]


def dataset_specs(depths: tuple[int, ...], total: int) -> list[TreeSpec]:
    """The measured trees, then normal filler trees of every depth until the table holds `total` nodes."""
    specs = measured_specs(depths)
    count = sum(s.size for s in specs)
    for index in itertools.count():
        if count >= total:
            break
        spec = TreeSpec(f"filler-{index}", depths[index % len(depths)], SIDE)
        specs.append(spec)
        count += spec.size
    return specs


def node_items(local: int, parent_call: str | None, asks_tool: bool) -> tuple[list[it.Item], list[it.Item]]:
    """Realistic sent/received items: a question or the parent's tool result in, an answer or a tool call out."""
    if parent_call:
        sent = [it.tool_result(parent_call, "sql_query", json.dumps([["north", 1200 + local], ["south", 980.5]]))]
    else:
        sent = [it.user(f"Question {local}: how did revenue change by region last quarter, and why?")]
    if asks_tool:
        sql = f"SELECT region, SUM(amount) FROM sales WHERE quarter = {local % 4 + 1} GROUP BY region"
        received = [it.tool_call(f"call_{local}", "sql_query", json.dumps({"sql": sql}))]
    else:
        received = [it.text(f"Answer {local}: {ANSWER}"[:200])]
    return sent, received


def tree_rows(spec: TreeSpec) -> Iterator[tuple[int, int | None, list[it.Item], list[it.Item]]]:
    """(local id, local parent id, sent, received): each path node, then the off-path siblings under it.

    Every third path node calls a tool that the next node answers (T4); the head ends with text.
    """
    local, parent, parent_call = 0, None, None
    for position in range(spec.depth):
        asks_tool = position % 3 == 0 and position < spec.depth - 1
        node = local
        yield (node, parent, *node_items(node, parent_call, asks_tool))
        local += 1
        call = f"call_{node}" if asks_tool else None
        for _ in range(spec.side):
            yield (local, node, *node_items(local, call, False))
            local += 1
        parent, parent_call = node, call


def interleaved_rows(trees: list[tuple[TreeSpec, int]], first_id: int) -> Iterator[tuple]:
    """All trees' rows round-robin, as conversations grow side by side, with global ids from `first_id`.

    Yields (id, parent id, conversation id, sent, received); a tree's heap rows end up scattered.
    """
    ids = itertools.count(first_id)
    streams = [(conversation_id, {}, tree_rows(spec)) for spec, conversation_id in trees]
    while streams:
        alive = []
        for conversation_id, global_ids, rows in streams:
            row = next(rows, None)
            if row is None:
                continue
            local, parent, sent, received = row
            global_ids[local] = next(ids)
            yield global_ids[local], global_ids.get(parent), conversation_id, sent, received
            alive.append((conversation_id, global_ids, rows))
        streams = alive


def full_rows(rows: Iterable[tuple], *, owner: int, as_json: bool) -> Iterator[tuple]:
    now = timezone.now()
    for node_id, parent_id, conversation_id, sent, received in rows:
        if as_json:
            sent, received = json.dumps(sent), json.dumps(received)
        yield (node_id, parent_id, conversation_id, owner, "turn", "succeeded", "", "", sent, received, PROVIDER, MODEL,
               "{}" if as_json else {}, now, now, INSTRUCTIONS, 0, 0, False, False)


def copy_nodes(rows: Iterable[tuple], owner: int) -> None:
    """PostgreSQL: stream the rows with COPY on the raw psycopg connection."""
    connection.ensure_connection()
    sql = f"COPY {Node._meta.db_table} ({', '.join(NODE_COLUMNS)}) FROM STDIN"
    with connection.connection.cursor() as cursor, cursor.copy(sql) as copy:
        for row in full_rows(rows, owner=owner, as_json=True):
            copy.write_row(row)


def bulk_create_nodes(rows: Iterable[tuple], owner: int) -> None:
    objects = (Node(**dict(zip(NODE_COLUMNS, row, strict=True)))
               for row in full_rows(rows, owner=owner, as_json=False))
    while batch := list(itertools.islice(objects, BATCH)):
        Node.objects.bulk_create(batch)


def reset_node_sequence() -> None:
    with connection.cursor() as cursor:
        for sql in connection.ops.sequence_reset_sql(no_style(), [Node]):
            cursor.execute(sql)


def drop_dataset() -> None:
    """Delete every bench conversation with its nodes and bubbles (raw DELETE: the ORM collector is slow)."""
    conversations = Conversation.objects.filter(title__startswith=PREFIX)
    with transaction.atomic():
        for conversation in conversations:
            head_move(conversation=conversation, to=None)
        Bubble.objects.filter(conversation__in=conversations).delete()
        ToolApproval.objects.filter(node__conversation__in=conversations).delete()
        with connection.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {Node._meta.db_table} WHERE conversation_id IN "
                f"(SELECT id FROM {Conversation._meta.db_table} WHERE title LIKE %s)",
                [f"{PREFIX}%"],
            )
        conversations.delete()


def build_dataset(specs: list[TreeSpec]) -> None:
    owner, _ = get_user_model().objects.get_or_create(username=BENCH_USER)
    with transaction.atomic():
        conversations = Conversation.objects.bulk_create(
            Conversation(owner=owner, title=s.title, model=MODEL, instructions=INSTRUCTIONS) for s in specs
        )
        trees = [(s, c.pk) for s, c in zip(specs, conversations, strict=True)]
        first_id = (Node.objects.order_by("-id").values_list("id", flat=True).first() or 0) + 1
        rows = interleaved_rows(trees, first_id)
        copy_nodes(rows, owner.pk) if connection.vendor == "postgresql" else bulk_create_nodes(rows, owner.pk)
        reset_node_sequence()
        set_heads(trees)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {Node._meta.db_table}")


def set_heads(trees: list[tuple[TreeSpec, int]]) -> None:
    """Each head is the deepest path node; a tree's rows keep their order, so it is row (depth-1)*(1+side)."""
    for spec, conversation_id in trees:
        nodes = Node.objects.filter(conversation_id=conversation_id).order_by("id").values_list("id", flat=True)
        head = nodes[(spec.depth - 1) * (1 + spec.side)]
        head_move(conversation=Conversation.objects.get(pk=conversation_id), to=head)


def dataset_present(specs: list[TreeSpec], total: int) -> bool:
    titles = set(Conversation.objects.filter(title__startswith=PREFIX, head__isnull=False)
                 .values_list("title", flat=True))
    if not {s.title for s in measured_specs_of(specs)} <= titles:
        return False
    return Node.objects.filter(conversation__title__startswith=PREFIX).count() >= total


def measured_specs_of(specs: list[TreeSpec]) -> list[TreeSpec]:
    return [s for s in specs if not s.name.startswith("filler-")]


# --- what is measured ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tree:
    spec: TreeSpec
    conversation: Conversation
    nodes: int  # all nodes of the conversation's tree

    @property
    def head_id(self) -> int:
        return self.conversation.head_id


def assemble_only(path: list[PathNode]) -> list[dict]:
    return assemble(path, [it.user("One more question?")], instructions=INSTRUCTIONS, provider=PROVIDER)


def arbor_assembly(head_id: int, owner: int) -> list[dict]:
    """What the turn runner does before a call: the path in one query, then the pure assembly."""
    return assemble_only(node_path(head_id, owner=owner))


def floor_sql(count: int) -> str:
    table = Node._meta.db_table
    if connection.vendor == "postgresql":
        return f"SELECT {PATH_COLUMNS} FROM {table} WHERE id = ANY(%s)"
    return f"SELECT {PATH_COLUMNS} FROM {table} WHERE id IN ({', '.join(['%s'] * count)})"


def _decoded(value):
    return json.loads(value) if isinstance(value, str | bytes) else value


def raw_floor(ids: list[int]) -> list[tuple]:
    """The same rows and columns by primary key, ids known beforehand, jsonb decoded as node_path does."""
    with connection.cursor() as cursor:
        cursor.execute(floor_sql(len(ids)), [ids] if connection.vendor == "postgresql" else ids)
        rows = cursor.fetchall()
    return [(r[0], r[1], r[2], r[3], _decoded(r[4]), _decoded(r[5]), r[6], r[7], r[8], r[9], r[10]) for r in rows]


def arbor_and_floor(tree: Tree) -> dict[str, Callable[[], object]]:
    """The functions timed side by side on one tree (the path and its ids are read beforehand)."""
    owner = tree.conversation.owner_id
    path = node_path(tree.head_id, owner=owner)
    ids = [p.id for p in path]
    return {
        "assembly": lambda: arbor_assembly(tree.head_id, owner),
        "node_path": lambda: node_path(tree.head_id, owner=owner),
        "assemble": lambda: assemble_only(path),
        "floor": lambda: raw_floor(ids),
    }


def tree_queries_path(head: Node, conversation_id: int) -> list[Node]:
    # tree_filter must come first: ancestors() reloads the head with tree fields through this queryset.
    return list(Node.objects.tree_filter(conversation_id=conversation_id).ancestors(head, include_self=True))


def timings(fn: Callable[[], object], repeat: int, *, warmup: int, budget_s: float) -> list[float]:
    """Milliseconds per call after `warmup` calls; stops early once `budget_s` is spent."""
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    started = time.perf_counter()
    for _ in range(repeat):
        begin = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - begin) * 1000)
        if time.perf_counter() - started > budget_s:
            break
    return samples


def interleaved_timings(fns: dict, repeat: int) -> dict[object, list[float]]:
    """Milliseconds per call, every function once per run, in an order rotated run by run: drift over the
    minutes of a run, and whatever runs first or after which, hits all of them alike."""
    for _ in range(WARMUP):
        for fn in fns.values():
            fn()
    samples: dict[object, list[float]] = {name: [] for name in fns}
    order = list(fns.items())
    for run in range(repeat):
        shift = run % len(order)
        for name, fn in order[shift:] + order[:shift]:
            begin = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - begin) * 1000)
    return samples


def p95(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


@contextmanager
def time_cap(seconds: float):
    """Cancel whatever statement is running once `seconds` have passed (it raises OperationalError).

    Cancelling an idle connection does nothing, so a timer that fires just after the work ended is harmless.
    """
    connection.ensure_connection()
    raw = connection.connection
    timer = threading.Timer(seconds, raw.cancel_safe if connection.vendor == "postgresql" else raw.interrupt)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def unfiltered_ancestors_ms(head: Node) -> float | None:
    """One run of ancestors() without tree_filter (two whole-table CTEs). None if over the cap in all."""
    begin = time.perf_counter()
    try:
        with time_cap(UNFILTERED_CAP_S):
            list(Node.objects.ancestors(head, include_self=True))
    except OperationalError:
        return None
    return (time.perf_counter() - begin) * 1000


def turn_queries(tree: Tree) -> tuple[int, float]:
    """The SQL queries and seconds of one whole arbor/echo turn from the tree's head; the head is put back.

    echo's answer lists every message it got, so its stream grows with the path; the lock renewals, the
    partial saves and the stop checks during a stream are time-based, so their paces are slowed here to
    count what depends on the depth alone.
    """
    conversation = tree.conversation
    limits = override_settings(ARBOR_ECHO_MAX_INPUT_TOKENS=10**12, ARBOR_TURN_LOCK_SECONDS=24 * 3600,
                               ARBOR_PARTIAL_SAVE_SECONDS=24 * 3600)
    # The MCP servers staff added are read once a process (issue 32), not per turn: not counted here. Read again
    # once the process listens for news: its first LISTEN wakes every waiter, that cache's too (a change said
    # before it would be missed), which made the first depth's turn one read more.
    configured()
    news.listening(5)
    configured()
    began = time.perf_counter()
    stop_check, detached.STOP_CHECK_SECONDS = detached.STOP_CHECK_SECONDS, 24 * 3600
    with limits, CaptureQueriesContext(connection) as captured:
        events = detached.run_here(turn_ask(user=conversation.owner, conversation_id=conversation.pk,
                                            content="One more question?"))
    elapsed = time.perf_counter() - began
    detached.STOP_CHECK_SECONDS = stop_check
    head_move(conversation=conversation, to=tree.head_id)
    if events[-1].type != "done":
        raise CommandError(f"the bench turn on {conversation.title} ended with {events[-1]}")
    return len(captured.captured_queries), elapsed


def turn_overhead(owner, repeat: int) -> tuple[int, list[float], list[float]]:
    """A whole turn at path depth 10 as the API runs it (`detached.run_here`), arbor/echo answering at once:
    its statements, and per run the milliseconds of the turn beyond its model call and of the call itself
    (from `llm.stream_call`'s first step to its end). The head is put back after each run (not timed)."""
    conversation = Conversation.objects.filter(owner=owner, title=f"{PREFIX}depth-10").first()
    if conversation is None:
        conversation = Conversation.objects.create(owner=owner, title=f"{PREFIX}depth-10")
        for k in range(10):
            detached.run_here(turn_ask(user=owner, conversation_id=conversation.pk, content=f"question {k}"))
    tip = Conversation.objects.get(pk=conversation.pk).head_id
    calls: list[float] = []
    original = llm.stream_call

    def timed_call(**kwargs):
        began = time.perf_counter()
        result = yield from original(**kwargs)
        calls.append((time.perf_counter() - began) * 1000)
        return result

    overheads, call_times, count = [], [], 0
    llm.stream_call = timed_call
    try:
        for run in range(WARMUP + repeat):
            calls.clear()
            # The warm-up runs count the statements; the timed ones run as a server runs them, without the
            # capture's debug cursor (it cost a turn about a millisecond).
            counting = CaptureQueriesContext(connection) if run < WARMUP else nullcontext()
            began = time.perf_counter()
            with counting:
                events = detached.run_here(turn_ask(user=owner, conversation_id=conversation.pk, content="one more"))
            elapsed = (time.perf_counter() - began) * 1000
            head_move(conversation=Conversation.objects.get(pk=conversation.pk), to=tip)
            if events[-1].type != "done":
                raise CommandError(f"the depth-10 bench turn ended with {events[-1]}")
            if run < WARMUP:
                count = len(counting.captured_queries)
            else:
                overheads.append(elapsed - sum(calls))
                call_times.append(sum(calls))
    finally:
        llm.stream_call = original
    return count, overheads, call_times


# --- the command ----------------------------------------------------------------------------------------


class Command(BaseCommand):
    help = "Benchmark context assembly (T5) against the raw-SQL floor and django-tree-queries on a large tree."

    def add_arguments(self, parser):
        parser.add_argument("--nodes", type=int, default=500_000, help="at least this many nodes (default 500000)")
        parser.add_argument("--repeat", type=int, default=30, help="timed runs per figure (default 30)")
        parser.add_argument("--keep", action="store_true", help="reuse an existing bench dataset if present")
        parser.add_argument("--depths", default="50,400,2000", help="shallow,middle,deep path depths")
        parser.add_argument("--allow-sqlite", action="store_true", help="run on SQLite too (figures mean little)")

    def handle(self, *args, **options):
        depths = self.parse_depths(options["depths"])
        self.figures: dict[tuple[str, int, bool], float] = {}
        self.check_database(options["allow_sqlite"])
        specs = dataset_specs(depths, options["nodes"])
        self.prepare(specs, options["nodes"], options["keep"])
        trees = self.load_trees(specs)
        gc.freeze()  # as config/asgi.py does after start-up: no full-collection pauses over long-lived objects
        with override_settings(DEBUG=False):  # no query log in the timed code, as in production
            self.report_timings(trees, depths, options["repeat"])
        turns = {d: turn_queries(trees[(d, False)]) for d in (depths[0], depths[-1])}
        self.report_queries(turns)
        with override_settings(DEBUG=False):
            self.report_turn_overhead(trees[(depths[0], False)].conversation.owner, options["repeat"])
        self.report_targets(depths, {d: count for d, (count, _) in turns.items()})

    def parse_depths(self, value: str) -> tuple[int, ...]:
        try:
            depths = tuple(sorted(int(d) for d in value.split(",")))
        except ValueError:
            raise CommandError("--depths takes three comma-separated integers, e.g. 50,400,2000") from None
        if len(depths) != 3 or depths[0] < 2:
            raise CommandError("--depths takes three comma-separated integers of at least 2, e.g. 50,400,2000")
        return depths

    def check_database(self, allow_sqlite: bool) -> None:
        if connection.vendor == "sqlite" and not allow_sqlite:
            raise CommandError("bench_assembly measures PostgreSQL: point DATABASE_URL at one "
                               "(e.g. postgres://postgres@127.0.0.1:5432/arbor_bench), or pass --allow-sqlite.")
        if connection.vendor not in {"postgresql", "sqlite"}:
            raise CommandError(f"bench_assembly supports PostgreSQL (and SQLite), not {connection.vendor}.")
        executor = MigrationExecutor(connection)
        if executor.migration_plan(executor.loader.graph.leaf_nodes()):
            raise CommandError("the database is not migrated: run `python manage.py migrate` first.")

    def prepare(self, specs: list[TreeSpec], total: int, keep: bool) -> None:
        if keep and dataset_present(specs, total):
            self.stdout.write("dataset: reusing the existing bench dataset (--keep)")
            return
        self.stdout.write(f"dataset: building {sum(s.size for s in specs):,} nodes in {len(specs)} conversations ...")
        began = time.perf_counter()
        drop_dataset()
        build_dataset(specs)
        self.stdout.write(f"dataset: built in {time.perf_counter() - began:.1f} s")

    def load_trees(self, specs: list[TreeSpec]) -> dict[tuple[int, bool], Tree]:
        trees = {}
        for spec in measured_specs_of(specs):
            conversation = Conversation.objects.select_related("owner").get(title=spec.title)
            nodes = Node.objects.filter(conversation=conversation).count()
            trees[(spec.depth, spec.side > SIDE)] = Tree(spec, conversation, nodes)
        total = Node.objects.count()
        self.stdout.write(f"database: {connection.vendor}, {total:,} nodes in the table, "
                          f"{Conversation.objects.filter(title__startswith=PREFIX).count()} bench conversations")
        return trees

    def report_timings(self, trees: dict[tuple[int, bool], Tree], depths: tuple[int, ...], repeat: int) -> None:
        self.stdout.write(f"times in ms, median / p95 of {repeat} runs after {WARMUP} warm-up runs, DEBUG off; "
                          "every figure of every tree timed once per run, in an order rotated run by run")
        # Every tree's four figures in one rotation: normal and bushier trees are timed run by run, side by
        # side (timing all normal trees before all bushier ones once swung their ratio past the target).
        measured = interleaved_timings({(key, name): fn for key, tree in trees.items()
                                        for name, fn in arbor_and_floor(tree).items()}, repeat)
        samples = {key: {name: measured[(key, name)] for name in ("assembly", "node_path", "assemble", "floor")}
                   for key in trees}
        for name, title in (
            ("assembly", "Arbor full assembly: node_path(head) -> assemble(path, [user item], instructions=...)"),
            ("node_path", "  of which node_path(head) alone (one recursive CTE, rows -> PathNode)"),
            ("assemble", "  of which assemble(...) alone, on a path read beforehand (pure Python)"),
            ("floor", f"Raw-SQL floor: SELECT {PATH_COLUMNS} ... WHERE id = ANY(%s), ids known beforehand, same "
                      "Django cursor, fetchall + json.loads of sent/received (Django's psycopg 3 backend returns "
                      "jsonb as text); no ordering, no PathNode, no assemble"),
        ):
            self.section(title)
            for key, tree in trees.items():
                self.figure(name, tree, samples[key][name])
        self.report_bushier_ratios(depths)
        self.report_tree_queries(trees, depths, repeat)

    def report_bushier_ratios(self, depths: tuple[int, ...]) -> None:
        self.section(f"Tree grown {BUSHIER}x off the path, same path depth: assembly bushier / normal")
        for depth in depths:
            ratio = self.figures[("assembly", depth, True)] / self.figures[("assembly", depth, False)]
            self.stdout.write(f"path {depth:>5}  ratio {ratio:.2f}x")

    def report_tree_queries(self, trees: dict[tuple[int, bool], Tree], depths: tuple[int, ...], repeat: int) -> None:
        self.section("django-tree-queries: Node.objects.tree_filter(conversation_id=...).ancestors(head, "
                     f"include_self=True), 2 queries, model instances; at most ~{TREE_QUERIES_BUDGET_S:.0f} s a tree")
        for tree in trees.values():
            head = Node.objects.get(pk=tree.head_id)
            samples = timings(lambda h=head, t=tree: tree_queries_path(h, t.conversation.pk), repeat,
                              warmup=1, budget_s=TREE_QUERIES_BUDGET_S)
            self.figure("tree_queries", tree, samples)
        tree = trees[(depths[0], False)]
        elapsed = unfiltered_ancestors_ms(Node.objects.get(pk=tree.head_id))
        shown = "skipped (over the cap)" if elapsed is None else f"{elapsed:.1f} ms, one run"
        self.stdout.write(f"without tree_filter, path {depths[0]} (whole table, cap {UNFILTERED_CAP_S} s): {shown}")

    def report_queries(self, turns: dict[int, tuple[int, float]]) -> None:
        self.section("SQL queries per whole arbor/echo turn, as the API runs it (detached.run_here: the turn, its "
                     "run and its event log; CaptureQueriesContext counts every statement, BEGIN/COMMIT included; "
                     "echo input limit and turn-lock life raised for the count)")
        for depth, (count, seconds) in turns.items():
            self.stdout.write(f"path {depth:>5}  queries per turn {count}   (the turn took {seconds:.1f} s)")

    def report_turn_overhead(self, owner, repeat: int) -> None:
        count, overheads, call_times = turn_overhead(owner, repeat)
        self.section("A whole turn at path depth 10 (detached.run_here, arbor/echo answering at once): what the "
                     f"turn adds to its model call, median / p95 of {repeat} runs after {WARMUP} warm-up runs")
        self.stdout.write(f"statements per turn {count}; overhead {statistics.median(overheads):.1f} / "
                          f"{p95(overheads):.1f} ms; the model call itself {statistics.median(call_times):.1f} / "
                          f"{p95(call_times):.1f} ms")
        self.figures[("turn_overhead", 10, False)] = statistics.median(overheads)
        self.figures[("turn_statements", 10, False)] = count

    def report_targets(self, depths: tuple[int, ...], counts: dict[int, int]) -> None:
        middle, deep = depths[1], depths[2]
        vs_floor = self.figures[("assembly", middle, False)] / self.figures[("floor", middle, False)]
        growth = [self.figures[("assembly", d, True)] / self.figures[("assembly", d, False)] for d in (middle, deep)]
        self.section("Targets")
        self.target(f"assembly at path {middle} <= 1.5x the raw-SQL floor", vs_floor <= 1.5, f"{vs_floor:.2f}x")
        self.target(f"<= 1.15x change when the tree grows {BUSHIER}x (paths {middle}, {deep})",
                    all(1 / 1.15 <= g <= 1.15 for g in growth), ", ".join(f"{g:.2f}x" for g in growth))
        self.target("queries per turn constant in depth", len(set(counts.values())) == 1,
                    " vs ".join(f"{c} at path {d}" for d, c in counts.items()))
        statements = self.figures[("turn_statements", 10, False)]
        self.target("a single-round turn makes at most 8 queries (issue 13)", statements <= 8, f"{statements}")
        overhead = self.figures[("turn_overhead", 10, False)]
        self.target("a turn adds at most 10 ms to its model call at depth 10 (issue 13)", overhead <= 10,
                    f"{overhead:.1f} ms")

    # --- printing ---

    def section(self, title: str) -> None:
        self.stdout.write(f"\n== {title}")

    def figure(self, name: str, tree: Tree, samples: list[float]) -> None:
        median = statistics.median(samples)
        self.figures[(name, tree.spec.depth, tree.spec.side > SIDE)] = median
        shape = "bushier" if tree.spec.side > SIDE else "normal"
        self.stdout.write(f"path {tree.spec.depth:>5}  {shape:<7} tree {tree.nodes:>7,} nodes   "
                          f"median {median:9.3f} ms   p95 {p95(samples):9.3f} ms   ({len(samples)} runs)")

    def target(self, label: str, met: bool, value: str) -> None:
        self.stdout.write(f"[{'met' if met else 'MISSED'}] {label}: {value}")
