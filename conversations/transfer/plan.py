"""An import's plan: every node, bubble and approval of a file, validated in memory before anything is
written, then written in one go (`write`). Each file format (`arbor_tree.py`, `chatgpt.py`) builds a plan.

Everything is checked before anything is written (where a head may rest, by the one query that says so,
just before the head moves), and the writes are one transaction: a malformed or hostile file (deep nesting,
cycles, dangling references, huge fields, too many nodes) gets a clear error and creates nothing. Node ids
are allocated up front, so the whole tree goes in with a few bulk inserts whatever its shape (the tree's
foreign keys are deferred to the commit). Creation times are the import's own: `created_at` says when a
row entered this database.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from config.api import MAX_JSON_DEPTH, nesting
from config.errors import BadInput, TooLarge
from conversations import budget, outbox, services
from conversations import items as it
from conversations.models import Bubble, Conversation, Node, ToolApproval
from files.models import SentFile
from files.services import imported_files

_BATCH = 1000


class ImportRefused(BadInput):
    code = "import_refused"


@dataclass
class PlannedNode:
    key: Any
    parent: Any
    fields: dict[str, Any]
    compacted_from: Any = None
    summary_call: Any = None
    first_round: Any = None  # a turn's later round: the node of its first call (issue 32)
    bubbles: list[dict[str, Any]] = field(default_factory=list)
    approvals: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Plan:
    title: str
    model: str
    instructions: str
    head: Any
    nodes: dict[Any, PlannedNode]
    retrieval: bool = False
    keep_retrieved: bool = False
    files: dict[Any, dict[str, Any]] = field(default_factory=dict)  # the file's own key -> name and bytes (X1)


def text_field(value: Any, where: str, *, limit: int | None = None, blank: bool = True) -> str:
    limit = limit or settings.ARBOR_MAX_CONTENT_CHARS
    if not isinstance(value, str) or (not blank and not value):
        raise ImportRefused(f"{where}: expected {'text' if blank else 'non-empty text'}.")
    if len(value) > limit:
        raise ImportRefused(f"{where}: longer than {limit} characters.")
    return value


def items_field(value: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise ImportRefused(f"{where}: expected a list of items.")
    return [item_field(item, f"{where}[{index}]") for index, item in enumerate(value)]


def shallow(value: Any, where: str) -> Any:
    """A value to be stored as it is, refused if it nests deeper than a request may (the file as a whole may
    nest deeper, for LibreChat's recursive export, but nothing stored does)."""
    if nesting(value) > MAX_JSON_DEPTH:
        raise ImportRefused(f"{where}: nests deeper than {MAX_JSON_DEPTH} levels.")
    return value


def item_field(item: Any, where: str) -> dict[str, Any]:
    """One item of the shapes in `conversations.items`: a known type, its required fields of their types."""
    if not isinstance(item, dict) or not isinstance(item.get("type"), str) or item["type"] not in it.ITEM_FIELDS:
        raise ImportRefused(f"{where}: not an item (unknown or missing type).")
    shallow(item, where)
    for key, kind in it.ITEM_FIELDS[item["type"]].items():
        if not isinstance(item.get(key), kind):
            raise ImportRefused(f"{where}.{key}: missing, or not {kind.__name__}.")
    if "files" in item:
        item = _file_refs(item, where)
    for key, text in item.items():
        if isinstance(text, str):
            text_field(text, f"{where}.{key}")
    return item


def _file_refs(item: dict[str, Any], where: str) -> dict[str, Any]:
    """A question's file references as the file says them (X1): each an id of the file's own `files` and a name.
    Only the writer makes them the importer's (`write`); an id is never looked up among anyone's files."""
    refs = item["files"]
    if not isinstance(refs, list) or len(refs) > settings.ARBOR_FILES_PER_TURN:
        raise ImportRefused(f"{where}.files: a list of at most {settings.ARBOR_FILES_PER_TURN} file references.")
    kept = []
    for index, ref in enumerate(refs):
        at = f"{where}.files[{index}]"
        if not isinstance(ref, dict) or not isinstance(ref.get("id"), int | str) or isinstance(ref.get("id"), bool):
            raise ImportRefused(f"{at}: a file reference has an `id`.")
        kind = ref.get("kind") if ref.get("kind") in ("image", "document") else "document"
        kept.append({"id": ref["id"], "name": text_field(ref.get("name", ""), f"{at}.name", limit=255), "kind": kind})
    return {**item, "files": kept}


def choice_field(value: Any, choices, where: str) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ImportRefused(f"{where}: {value!r} is not one of {', '.join(sorted(choices))}.")
    return value


MAX_COUNT = 2**31 - 1  # what the database's integer columns hold


def count_field(value: Any, where: str) -> int:
    """A whole number from 0 to MAX_COUNT (not a bool, not a float, not text)."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_COUNT:
        raise ImportRefused(f"{where}: expected a whole number from 0 to {MAX_COUNT}.")
    return value


MAX_FILE_PARTS = 100  # of one call's large documents (a call sends at most ARBOR_FILES_PER_TURN a question)


def file_parts_field(value: Any, where: str) -> dict[str, Any] | None:
    """The parts of each large document a call was sent (`Node.file_parts`, issue 29): by the file's key, its chunks'
    places and how they were chosen."""
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > MAX_FILE_PARTS:
        raise ImportRefused(f"{where}: expected an object of at most {MAX_FILE_PARTS} files.")
    for key, chosen in value.items():
        if not isinstance(chosen, dict) or set(chosen) != {"chunks", "by"} or not isinstance(chosen["by"], str) or len(
                chosen["by"]) > 40 or not isinstance(chosen["chunks"], list) or len(chosen["chunks"]) > MAX_COUNT:
            raise ImportRefused(f"{where}.{key}: expected its chunks and how they were chosen.")
        for index, number in enumerate(chosen["chunks"]):
            count_field(number, f"{where}.{key}.chunks[{index}]")
    return value


USAGE_COUNTS = ("prompt_tokens", "completion_tokens", "total_tokens")


def usage_field(value: Any, where: str) -> dict[str, Any]:
    """A call's usage as Arbor records it: token counts and a cost; anything else is refused (the admin sums
    these, so a string here would break its pages for every staff member)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ImportRefused(f"{where}: expected an object.")
    for key, number in value.items():
        if key in USAGE_COUNTS:
            count_field(number, f"{where}.{key}")
        elif key == "cost_usd":
            if (not isinstance(number, int | float) or isinstance(number, bool) or not math.isfinite(number)
                    or not 0 <= number <= 1e9):
                raise ImportRefused(f"{where}.cost_usd: expected a cost from 0 to 1e9.")
        else:
            raise ImportRefused(f"{where}: unknown field {key!r} (expected {', '.join(USAGE_COUNTS)}, cost_usd).")
    return value


def object_field(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ImportRefused(f"{where}: expected an object.")
    return shallow(value, where)


def when_field(value: Any, where: str) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        parsed = None
    if parsed is None:
        raise ImportRefused(f"{where}: not an ISO date-time.")
    return parsed if timezone.is_aware(parsed) else timezone.make_aware(parsed)


def check_count(count: int) -> None:
    if count > settings.ARBOR_IMPORT_MAX_NODES:
        raise TooLarge(f"The file holds {count} nodes; at most {settings.ARBOR_IMPORT_MAX_NODES} are imported.")


def check_graph(plan: Plan) -> None:
    """Every reference points into the file, there is no cycle, shapes match the tree's rules (C2, C3)."""
    nodes = plan.nodes
    for node in nodes.values():
        for name in ("parent", "compacted_from", "summary_call"):
            ref = getattr(node, name)
            if ref is not None and (not is_reference(ref) or ref not in nodes):
                raise ImportRefused(f"node {node.key!r}: its {name} {ref!r} is not in the file.")
        root = node.fields["kind"] == Node.Kind.COMPACTION and node.parent is None
        if root != (node.compacted_from is not None) or (node.summary_call is not None and not root):
            raise ImportRefused(f"node {node.key!r}: only a parentless compaction node points at an original.")
    order(plan)  # raises on a cycle of parents
    _check_acyclic(plan)  # and of parents, originals and summarising calls together (C3)
    for node in nodes.values():
        if node.first_round is not None:
            _check_first_round(plan, node)
    if plan.head is not None and (not is_reference(plan.head) or plan.head not in nodes):
        raise ImportRefused(f"conversation.head {plan.head!r} is not in the file.")


def _check_first_round(plan: Plan, node: PlannedNode) -> None:
    """A later round (a call that carried only tool results) names a turn's first call above it, a turn's rounds
    away at most (through a compaction made between them, C2): no file makes a call a round of a response it did
    not follow."""
    target, key = node.first_round, node.key
    sent = node.fields["sent"]
    carries_results = bool(sent) and all(item.get("type") == "tool_result" for item in sent)
    if (not is_reference(target) or target not in plan.nodes or node.fields["kind"] != Node.Kind.TURN
            or not carries_results or plan.nodes[target].first_round is not None):
        raise ImportRefused(f"node {key!r}: its first_round {target!r} is not a call above it in the file.")
    for _ in range(2 * settings.ARBOR_MAX_ROUNDS_PER_TURN + 2):
        above = plan.nodes[key]
        key = above.compacted_from if above.parent is None else above.parent
        if key is None:
            break
        if key == target:
            if plan.nodes[key].fields["kind"] == Node.Kind.TURN:
                return
            break
    raise ImportRefused(f"node {node.key!r}: its first_round {target!r} is not a call above it in the file.")


def is_reference(value: Any) -> bool:
    return isinstance(value, int | str) and not isinstance(value, bool)


def _check_acyclic(plan: Plan) -> None:
    """Following parents, compaction originals and summarising calls from any node must end (iteratively)."""
    state: dict[Any, int] = {}  # 1: on the current walk, 2: known to end
    for start in plan.nodes:
        stack = [start]
        while stack:
            key = stack[-1]
            if state.get(key) == 2:
                stack.pop()
                continue
            state[key] = 1
            node = plan.nodes[key]
            nexts = [ref for ref in (node.parent, node.compacted_from, node.summary_call)
                     if ref is not None and state.get(ref) != 2]
            if any(state.get(ref) == 1 for ref in nexts):
                raise ImportRefused(f"node {key!r}: its parents and originals lead back to it (a cycle).")
            if nexts:
                stack.extend(nexts)
            else:
                state[key] = 2
                stack.pop()


def order(plan: Plan) -> list[PlannedNode]:
    """Parents before children (iterative: a 100,000-deep chain is fine); a cycle is refused."""
    children: dict[Any, list[Any]] = {}
    for node in plan.nodes.values():
        children.setdefault(node.parent, []).append(node.key)
    ordered, stack = [], list(reversed(children.get(None, [])))
    while stack:
        key = stack.pop()
        ordered.append(plan.nodes[key])
        stack.extend(reversed(children.get(key, [])))
    if len(ordered) != len(plan.nodes):
        raise ImportRefused("The nodes' parents form a cycle.")
    return ordered


def _allocate_ids(count: int) -> Iterator[int]:
    """Reserve `count` node ids: the sequence on PostgreSQL; past the largest id on SQLite, whose
    IMMEDIATE transactions already hold the write lock."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"SELECT nextval(pg_get_serial_sequence('{Node._meta.db_table}', 'id')) "
                           "FROM generate_series(1, %s)", [count])
            return iter([row[0] for row in cursor.fetchall()])
        cursor.execute(f"SELECT COALESCE(MAX(id), 0) FROM {Node._meta.db_table}")
        start = cursor.fetchone()[0] + 1
        return iter(range(start, start + count))


def show_files(node: PlannedNode, refs: list[dict[str, Any]]) -> None:
    """The question's bubble of `node` shows the files its question carries (X1), as a sent one's does."""
    for bubble in node.bubbles if refs else ():
        if bubble.get("role") == "user":
            bubble["data"] = {**(bubble.get("data") or {}), "files": refs}


def placeholder(kind: str, name: str, detail: str = "") -> str:
    """A file or an image a person saw, as text a person and a model can read: `[image 1024x768: name]`."""
    return f"[{kind}{f' {detail}' if detail else ''}: {name}]" if name else f"[{kind}]"


def _parts_of_files(parts: dict[str, Any] | None, kept: dict[Any, dict[str, Any]]) -> dict[str, Any] | None:
    """A call's chosen parts (issue 29) by the importer's file ids; a file the import does not carry goes."""
    by_key = {str(key): ref["id"] for key, ref in kept.items()}
    moved = {str(by_key[key]): chosen for key, chosen in (parts or {}).items() if key in by_key}
    return moved or None


def _with_files(items: list[dict[str, Any]], kept: dict[Any, dict[str, Any]]) -> list[dict[str, Any]]:
    """Items whose file references name the importer's files (`kept`, by the file's key); a reference to a file
    the import does not carry becomes its name in the question's text, a placeholder a person and a model read."""
    made = []
    for item in items:
        if item.get("files"):
            refs = [kept[ref["id"]] for ref in item["files"] if ref["id"] in kept]
            names = [placeholder("image" if ref["kind"] == "image" else "file", ref["name"]) for ref in item["files"]
                     if ref["id"] not in kept]
            item = {key: value for key, value in item.items() if key != "files"}
            item["text"] = "\n".join([item["text"], *names]) if names else item["text"]
            if refs:
                item["files"] = refs
        made.append(item)
    return made


def _bubble_files(bubble: dict[str, Any], kept: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    """A question bubble names the importer's files, never ids of the file's."""
    files = (bubble.get("data") or {}).get("files") if isinstance(bubble.get("data"), dict) else None
    if not files:
        return bubble
    refs = [kept[ref["id"]] for ref in files if isinstance(ref, dict) and isinstance(ref.get("id"), int | str)
            and ref["id"] in kept]
    data = {key: value for key, value in bubble["data"].items() if key != "files"}
    return {**bubble, "data": {**data, "files": refs} if refs else data}


def write(*, owner, plan: Plan) -> Conversation:
    conversation = Conversation.objects.create(owner=owner, title=plan.title, model=plan.model,
                                               instructions=plan.instructions, retrieval=plan.retrieval,
                                               keep_retrieved=plan.keep_retrieved)
    ordered = order(plan)
    kept = imported_files(user=owner, files=plan.files)
    # Ids follow the file's order, not the insert order: "latest" (the largest id) means the same here
    # as where the tree came from, so switching branches lands on the same tips (T8).
    ids = dict(zip(plan.nodes, _allocate_ids(len(plan.nodes)), strict=True))
    path_tokens: dict[Any, int] = {}
    rows = []
    model = conversation.effective_model
    for planned in ordered:  # parents first, so path_tokens is the parent's plus the node's own
        # C1: counted for the conversation's model, whatever the file says
        fields = {**planned.fields, "sent": _with_files(planned.fields.get("sent") or [], kept),
                  "file_parts": _parts_of_files(planned.fields.get("file_parts"), kept)}
        fields["tokens"] = budget.node_tokens(fields["sent"], planned.fields.get("received") or [], model=model)
        path_tokens[planned.key] = fields["tokens"] + (path_tokens[planned.parent] if planned.parent is not None else 0)
        rows.append(Node(
            id=ids[planned.key], conversation=conversation, owner_id=conversation.owner_id,
            path_tokens=path_tokens[planned.key],
            parent_id=ids.get(planned.parent), compacted_from_id=ids.get(planned.compacted_from),
            summary_call_id=ids.get(planned.summary_call), first_round_id=ids.get(planned.first_round), **fields,
        ))
    Node.objects.bulk_create(rows, batch_size=_BATCH)
    SentFile.objects.bulk_create([SentFile(node_id=row.pk, owner_id=row.owner_id, file_id=file_id) for row in rows
                                  for file_id in dict.fromkeys(it.file_ids(row.sent))], batch_size=_BATCH)
    Bubble.objects.bulk_create(
        [Bubble(conversation=conversation, owner_id=conversation.owner_id, node_id=ids[p.key],
                **_bubble_files(b, kept)) for p in ordered
         for b in p.bubbles], batch_size=_BATCH)
    ToolApproval.objects.bulk_create(
        [ToolApproval(node_id=ids[p.key], owner_id=conversation.owner_id, decided_by=owner, **a) for p in ordered
         for a in p.approvals],
        batch_size=_BATCH)
    if plan.head is not None:
        # The one rule for where a head may rest (no side call, call under way or overflow, F2); refusing
        # here rolls the whole import back, so a refused file still creates nothing.
        if not Node.objects.can_be_head().filter(pk=ids[plan.head]).exists():
            raise ImportRefused("conversation.head must be a turn or a compaction node that a head can rest on.")
        services.head_move(conversation=conversation, to=ids[plan.head])
    # R4: indexed for search (and titled if it has none) by the worker, after the commit.
    outbox.enqueue_after_turn(conversation_id=conversation.pk, head=conversation.head_id)
    return conversation
