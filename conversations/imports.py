"""Import a conversation from Arbor's tree JSON (lossless) or ChatGPT's conversations.json (branches kept).

Everything is checked before anything is written (where a head may rest, by the one query that says
so, just before the head moves), and the writes are one transaction: a malformed or hostile file (deep
nesting, cycles, dangling references, huge fields, too many nodes) gets a clear error and creates
nothing. Node ids are allocated up front, so the whole tree goes in with a few bulk inserts whatever its
shape (the tree's foreign keys are deferred to the commit). Creation times are the import's own:
`created_at` says when a row entered this database.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from config.errors import BadInput, TooLarge
from conversations import items as it
from conversations import jobs, services
from conversations.exports import TREE_FORMAT, TREE_VERSION
from conversations.models import Bubble, Conversation, Node, ToolApproval

MAX_DEPTH = 32  # JSON nesting; Arbor's own files nest about 8 deep
# Each item type and the fields assembly reads from it (conversations.items).
ITEM_FIELDS: dict[str, dict[str, type]] = {
    "user": {"text": str}, "system": {"text": str}, "text": {"text": str}, "summary": {"text": str},
    "tool_call": {"id": str, "name": str, "arguments": str},
    "tool_result": {"call_id": str, "name": str, "content": str, "is_error": bool},
    "reasoning": {},
}
_BATCH = 1000


class ImportRefused(BadInput):
    code = "import_refused"


# --- reading the file --------------------------------------------------------------------------------


def parse(raw: bytes) -> Any:
    """Decode the upload; refuse what is too big or nested too deep before building anything from it."""
    if len(raw) > settings.ARBOR_IMPORT_MAX_BYTES:
        raise TooLarge(f"The file is larger than {settings.ARBOR_IMPORT_MAX_BYTES} bytes.")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ImportRefused("The file is not UTF-8 text.") from None
    _check_nesting(text)
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as error:
        raise ImportRefused(f"The file is not valid JSON: {error}") from None


def _check_nesting(text: str) -> None:
    """Count brackets outside strings: deep nesting is refused without recursing into it."""
    depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise ImportRefused(f"The file nests deeper than {MAX_DEPTH} levels.")
        elif char in "]}":
            depth -= 1


def import_any(*, owner, document: Any) -> list[Conversation]:
    """Import Arbor's tree format or ChatGPT's, whichever `document` is."""
    if isinstance(document, dict) and document.get("format") == TREE_FORMAT:
        return [import_tree(owner=owner, document=document)]
    if isinstance(document, dict) and "mapping" in document:
        document = [document]
    if isinstance(document, list) and document and all(isinstance(c, dict) and "mapping" in c for c in document):
        plans = [_chatgpt_plan(c, index) for index, c in enumerate(document)]
        with transaction.atomic():
            return [_write(owner=owner, plan=plan) for plan in plans]
    raise ImportRefused("Unknown file: expected Arbor's tree export or ChatGPT's conversations.json.")


# --- the plan: validated, in memory, nothing written yet -----------------------------------------------


@dataclass
class PlannedNode:
    key: Any
    parent: Any
    fields: dict[str, Any]
    compacted_from: Any = None
    summary_call: Any = None
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


def _text(value: Any, where: str, *, limit: int | None = None, blank: bool = True) -> str:
    limit = limit or settings.ARBOR_MAX_CONTENT_CHARS
    if not isinstance(value, str) or (not blank and not value):
        raise ImportRefused(f"{where}: expected {'text' if blank else 'non-empty text'}.")
    if len(value) > limit:
        raise ImportRefused(f"{where}: longer than {limit} characters.")
    return value


def _items(value: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise ImportRefused(f"{where}: expected a list of items.")
    for index, item in enumerate(value):
        if not isinstance(item, dict) or item.get("type") not in ITEM_FIELDS:
            raise ImportRefused(f"{where}[{index}]: not an item (unknown or missing type).")
        for key, kind in ITEM_FIELDS[item["type"]].items():
            if not isinstance(item.get(key), kind):
                raise ImportRefused(f"{where}[{index}].{key}: missing, or not {kind.__name__}.")
        for key, text in item.items():
            if isinstance(text, str):
                _text(text, f"{where}[{index}].{key}")
    return value


def _choice(value: Any, choices, where: str) -> str:
    if value not in choices:
        raise ImportRefused(f"{where}: {value!r} is not one of {', '.join(sorted(choices))}.")
    return value


def _when(value: Any, where: str) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        parsed = None
    if parsed is None:
        raise ImportRefused(f"{where}: not an ISO date-time.")
    return parsed if timezone.is_aware(parsed) else timezone.make_aware(parsed)


def _tree_plan(document: dict[str, Any]) -> Plan:
    if document.get("version") != TREE_VERSION:
        raise ImportRefused(f"Unsupported version {document.get('version')!r}; this Arbor reads {TREE_VERSION}.")
    meta = document.get("conversation")
    raw_nodes = document.get("nodes")
    if not isinstance(meta, dict) or not isinstance(raw_nodes, list):
        raise ImportRefused("`conversation` must be an object and `nodes` a list.")
    _check_count(len(raw_nodes))
    nodes: dict[Any, PlannedNode] = {}
    for index, raw in enumerate(raw_nodes):
        node = _tree_node(raw, f"nodes[{index}]")
        if node.key in nodes:
            raise ImportRefused(f"nodes[{index}]: the id {node.key!r} is used twice.")
        nodes[node.key] = node
    _attach_bubbles_and_approvals(document, nodes)
    plan = Plan(title=_text(meta.get("title", ""), "conversation.title", limit=200),
                model=_allowed_model(_text(meta.get("model", ""), "conversation.model", limit=200)),
                instructions=_text(meta.get("instructions", ""), "conversation.instructions", limit=20000),
                head=meta.get("head"), nodes=nodes, retrieval=meta.get("retrieval") is True,
                keep_retrieved=meta.get("keep_retrieved") is True)
    _check_graph(plan)
    return plan


def _tree_node(raw: Any, where: str) -> PlannedNode:
    if not isinstance(raw, dict) or not isinstance(raw.get("id"), int | str) or isinstance(raw.get("id"), bool):
        raise ImportRefused(f"{where}: each node needs an `id`.")
    status = _choice(raw.get("status"), Node.Status.values, f"{where}.status")
    reason = raw.get("failure_reason") or ""
    if (status == Node.Status.FAILED) != bool(reason):
        raise ImportRefused(f"{where}: a failure reason goes with status failed, and only with it.")
    usage = raw.get("usage") or {}
    if not isinstance(usage, dict):
        raise ImportRefused(f"{where}.usage: expected an object.")
    tokens = raw.get("tokens", 0)
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
        raise ImportRefused(f"{where}.tokens: expected a count.")
    return PlannedNode(
        key=raw["id"], parent=raw.get("parent"), compacted_from=raw.get("compacted_from"),
        summary_call=raw.get("summary_call"),
        fields={
            "kind": _choice(raw.get("kind"), Node.Kind.values, f"{where}.kind"),
            "status": status,
            "failure_reason": _choice(reason, {"", *Node.FailureReason.values}, f"{where}.failure_reason"),
            "failure_message": _text(raw.get("failure_message", ""), f"{where}.failure_message"),
            "sent": _items(raw.get("sent", []), f"{where}.sent"),
            "received": _items(raw.get("received", []), f"{where}.received"),
            "provider": _text(raw.get("provider", ""), f"{where}.provider", limit=64),
            "model": _text(raw.get("model", ""), f"{where}.model", limit=200),
            "usage": usage,
            "instructions": _text(raw.get("instructions", ""), f"{where}.instructions"),
            "keep_ephemeral": raw.get("keep_ephemeral") is True,
            "window_root": raw.get("window_root") is True,
            "tokens": tokens,
            "finished_at": _when(raw.get("finished_at"), f"{where}.finished_at"),
        },
    )


def _attach_bubbles_and_approvals(document: dict[str, Any], nodes: dict[Any, PlannedNode]) -> None:
    for index, raw in enumerate(document.get("bubbles") or []):
        where = f"bubbles[{index}]"
        if not isinstance(raw, dict) or not _is_reference(raw.get("node")) or raw["node"] not in nodes:
            raise ImportRefused(f"{where}: its node is not in the file.")
        data = raw.get("data") or {}
        if not isinstance(data, dict):
            raise ImportRefused(f"{where}.data: expected an object.")
        nodes[raw["node"]].bubbles.append({"role": _choice(raw.get("role"), Bubble.Role.values, f"{where}.role"),
                                           "content": _text(raw.get("content", ""), f"{where}.content"),
                                           "data": data})
    for index, raw in enumerate(document.get("approvals") or []):
        where = f"approvals[{index}]"
        if (not isinstance(raw, dict) or not _is_reference(raw.get("node")) or raw["node"] not in nodes
                or not isinstance(raw.get("approved"), bool)):
            raise ImportRefused(f"{where}: needs a node in the file and `approved` true or false.")
        call_id = _text(raw.get("call_id"), f"{where}.call_id", limit=200, blank=False)
        nodes[raw["node"]].approvals.append({"call_id": call_id, "approved": raw["approved"],
                                             "result": raw.get("result")})


def _allowed_model(model: str) -> str:
    """A file may name any model; a conversation only gets one this server offers (else the default)."""
    return model if model in settings.ARBOR_MODELS else settings.ARBOR_MODEL


def _check_count(count: int) -> None:
    if count > settings.ARBOR_IMPORT_MAX_NODES:
        raise TooLarge(f"The file holds {count} nodes; at most {settings.ARBOR_IMPORT_MAX_NODES} are imported.")


def _check_graph(plan: Plan) -> None:
    """Every reference points into the file, there is no cycle, shapes match the tree's rules (C2, C3)."""
    nodes = plan.nodes
    for node in nodes.values():
        for name in ("parent", "compacted_from", "summary_call"):
            ref = getattr(node, name)
            if ref is not None and (not _is_reference(ref) or ref not in nodes):
                raise ImportRefused(f"node {node.key!r}: its {name} {ref!r} is not in the file.")
        root = node.fields["kind"] == Node.Kind.COMPACTION and node.parent is None
        if root != (node.compacted_from is not None) or (node.summary_call is not None and not root):
            raise ImportRefused(f"node {node.key!r}: only a parentless compaction node points at an original.")
    _order(plan)  # raises on a cycle of parents
    _check_acyclic(plan)  # and of parents, originals and summarising calls together (C3)
    if plan.head is not None and (not _is_reference(plan.head) or plan.head not in nodes):
        raise ImportRefused(f"conversation.head {plan.head!r} is not in the file.")


def _is_reference(value: Any) -> bool:
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


def _order(plan: Plan) -> list[PlannedNode]:
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


# --- ChatGPT's conversations.json -----------------------------------------------------------------------


def _chatgpt_text(message: dict[str, Any], where: str) -> str:
    content = message.get("content")
    if not isinstance(content, dict):
        raise ImportRefused(f"{where}.content: expected an object.")
    parts = content.get("parts") or []
    if not isinstance(parts, list):
        raise ImportRefused(f"{where}.content.parts: expected a list.")
    texts = [p for p in parts if isinstance(p, str)]  # images and files are not imported
    return _text("\n".join(texts), f"{where}.content")


def _chatgpt_plan(document: dict[str, Any], index: int) -> Plan:
    """Questions and answers become turn nodes: a user message with k answers (regenerations) becomes k
    sibling nodes, a message with several user children (edits) sibling turns: branches stay branches."""
    where = f"conversations[{index}]"
    mapping = document.get("mapping")
    if not isinstance(mapping, dict):
        raise ImportRefused(f"{where}.mapping: expected an object.")
    _check_count(len(mapping))
    root, messages, children = _chatgpt_messages(mapping, where)
    nodes, mapped = _chatgpt_turns(root, messages, children, where)
    current = document.get("current_node")
    head = mapped.get(current) if isinstance(current, str) else None
    if head is None and nodes:
        head = next(reversed(nodes))
    title = document.get("title") or ""
    plan = Plan(title=_text(title if isinstance(title, str) else "", f"{where}.title", limit=200),
                model=settings.ARBOR_MODEL, instructions="", head=head, nodes=nodes)
    _check_graph(plan)
    return plan


def _chatgpt_messages(mapping: dict[str, Any], where: str):
    """Each entry's (role, text), and children by parent, from the entries' own `parent` fields."""
    roots = [key for key, entry in mapping.items() if isinstance(entry, dict) and entry.get("parent") is None]
    if len(roots) != 1:
        raise ImportRefused(f"{where}.mapping: expected exactly one root message, found {len(roots)}.")
    messages: dict[str, tuple[str | None, str]] = {}
    children: dict[str, list[str]] = {}
    for key, entry in mapping.items():
        if not isinstance(entry, dict):
            raise ImportRefused(f"{where}.mapping[{key!r}]: expected an object.")
        parent = entry.get("parent")
        if parent is not None and parent not in mapping:
            raise ImportRefused(f"{where}.mapping[{key!r}]: its parent {parent!r} is not in the file.")
        children.setdefault(parent, []).append(key)
        message = entry.get("message")
        role = (message.get("author") or {}).get("role") if isinstance(message, dict) else None
        text = _chatgpt_text(message, f"{where}.mapping[{key!r}].message") if role else ""
        messages[key] = (role, text)
    return roots[0], messages, children


def _chatgpt_turns(root: str, messages: dict, children: dict, where: str) -> tuple[dict, dict]:
    """Walk the messages from the root (iteratively); return the planned nodes and message -> node."""
    nodes: dict[Any, PlannedNode] = {}
    mapped: dict[str, Any] = {}
    stack: list[tuple[str, Any]] = [(root, None)]
    seen = 0
    while stack:
        key, parent_node = stack.pop()
        seen += 1
        role, text = messages[key]
        below = parent_node
        if role == "user":
            answers = [c for c in children.get(key, []) if messages[c][0] == "assistant"]
            seen += len(answers)
            for answer in answers or [None]:
                node_key = f"{key}->{answer}"
                nodes[node_key] = _chatgpt_node(node_key, parent_node, text, messages[answer][1] if answer else "")
                mapped.setdefault(key, node_key)
                if answer:
                    mapped[answer] = node_key
                    stack.extend((c, node_key) for c in reversed(children.get(answer, [])))
            below = mapped[key]
            stack.extend((c, below) for c in reversed(children.get(key, [])) if c not in answers)
            continue
        if role == "assistant":  # an answer with no question before it (a greeting, a continuation)
            nodes[key] = _chatgpt_node(key, parent_node, None, text)
            mapped[key] = below = key
        elif parent_node is not None:  # system and tool messages, and empty ones, are not imported
            mapped[key] = parent_node
        stack.extend((c, below) for c in reversed(children.get(key, [])))
    if seen != len(messages):
        raise ImportRefused(f"{where}.mapping: some messages are not reachable from the root (a cycle).")
    return nodes, mapped


def _chatgpt_node(key: str, parent: Any, question: str | None, answer: str) -> PlannedNode:
    sent = [it.user(question)] if question is not None else []
    received = [it.text(answer)] if answer else []
    bubbles = ([{"role": "user", "content": question, "data": {}}] if question is not None else [])
    if answer:
        bubbles.append({"role": "assistant", "content": answer, "data": {}})
    return PlannedNode(key=key, parent=parent, bubbles=bubbles, fields={
        "kind": Node.Kind.TURN, "status": Node.Status.SUCCEEDED, "failure_reason": "", "failure_message": "",
        "sent": sent, "received": received, "provider": "", "model": "", "usage": {}, "instructions": "",
        "keep_ephemeral": False, "window_root": False,
        "tokens": 0, "finished_at": None,
    })


# --- writing ---------------------------------------------------------------------------------------------


def import_tree(*, owner, document: dict[str, Any]) -> Conversation:
    plan = _tree_plan(document)
    with transaction.atomic():
        return _write(owner=owner, plan=plan)


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


def _write(*, owner, plan: Plan) -> Conversation:
    conversation = Conversation.objects.create(owner=owner, title=plan.title, model=plan.model,
                                               instructions=plan.instructions, retrieval=plan.retrieval,
                                               keep_retrieved=plan.keep_retrieved)
    ordered = _order(plan)
    # Ids follow the file's order, not the insert order: "latest" (the largest id) means the same here
    # as where the tree came from, so switching branches lands on the same tips (T8).
    ids = dict(zip(plan.nodes, _allocate_ids(len(plan.nodes)), strict=True))
    path_tokens: dict[Any, int] = {}
    rows = []
    for planned in ordered:  # parents first, so path_tokens is the parent's plus the node's own
        fields = planned.fields
        path_tokens[planned.key] = fields["tokens"] + (path_tokens[planned.parent] if planned.parent is not None else 0)
        rows.append(Node(
            id=ids[planned.key], conversation=conversation, path_tokens=path_tokens[planned.key],
            parent_id=ids.get(planned.parent), compacted_from_id=ids.get(planned.compacted_from),
            summary_call_id=ids.get(planned.summary_call), **fields,
        ))
    Node.objects.bulk_create(rows, batch_size=_BATCH)
    Bubble.objects.bulk_create(
        [Bubble(conversation=conversation, node_id=ids[p.key], **b) for p in ordered for b in p.bubbles],
        batch_size=_BATCH)
    ToolApproval.objects.bulk_create(
        [ToolApproval(node_id=ids[p.key], decided_by=owner, **a) for p in ordered for a in p.approvals],
        batch_size=_BATCH)
    if plan.head is not None:
        # The one rule for where a head may rest (no side call, call under way or overflow, F2); refusing
        # here rolls the whole import back, so a refused file still creates nothing.
        if not Node.objects.can_be_head().filter(pk=ids[plan.head]).exists():
            raise ImportRefused("conversation.head must be a turn or a compaction node that a head can rest on.")
        services.head_move(conversation=conversation, to=ids[plan.head])
    # R4: indexed for search (and titled if it has none) by the worker, after the commit.
    jobs.enqueue_after_turn(conversation_id=conversation.pk, head=conversation.head_id)
    return conversation
