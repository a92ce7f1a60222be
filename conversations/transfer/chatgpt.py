"""ChatGPT's `conversations.json`: exported with branches kept in `mapping`, and imported with them kept:
a question with several answers (regenerations) becomes sibling turns, as do edits."""

from __future__ import annotations

import json
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from typing import Any

from django.conf import settings

from conversations import items as it
from conversations.models import Conversation, Node
from conversations.selectors import tree_node_ids
from conversations.transfer.chunks import id_chunks, joined, json_object_start, json_text, snapshot
from conversations.transfer.plan import ImportRefused, Plan, PlannedNode, check_count, check_graph, text_field

ROOT = "client-created-root"


def _message(message_id: str, role: str, text: str, *, created: float | None, name: str | None = None,
             recipient: str = "all", metadata: dict | None = None) -> dict[str, Any]:
    return {"id": message_id, "author": {"role": role, "name": name, "metadata": {}}, "create_time": created,
            "update_time": None, "content": {"content_type": "text", "parts": [text]},
            "status": "finished_successfully", "end_turn": role == "assistant", "weight": 1.0,
            "metadata": metadata or {}, "recipient": recipient}


_SHOWN = {"user", "text", "tool_call", "tool_result"}


def _shown_items(node: Node) -> list[tuple[int, dict[str, Any]]]:
    """The items of a node that become messages, each with its place among the node's items (its message id):
    what it sent, then (if it succeeded) what it received (T5).

    Side calls (titles, summarising calls, playbook drafts) are no part of the conversation a person had,
    and a compaction root contributes only its summary: its kept turns are already there, as themselves.
    """
    if node.kind != Node.Kind.TURN and not (node.kind == Node.Kind.COMPACTION and node.parent_id is None):
        return []
    items = [*node.sent, *(node.received if node.status == Node.Status.SUCCEEDED else [])]
    if node.kind == Node.Kind.COMPACTION:
        items = [i for i in items if i.get("type") == "summary"]
    return [(index, item) for index, item in enumerate(items)
            if item.get("type") in _SHOWN or (item.get("type") == "summary" and item.get("text"))]


def _node_messages(node: Node) -> list[dict[str, Any]]:
    """One Arbor node as ChatGPT messages (see `_shown_items`)."""
    created = node.created_at.timestamp() if node.created_at else None
    meta = {"arbor_node": node.pk, "arbor_status": node.status}
    out = []
    for index, item in _shown_items(node):
        message_id = f"arbor-{node.pk}-{index}"
        kind = item.get("type")
        if kind == "user":
            out.append(_message(message_id, "user", item["text"], created=created, metadata=meta))
        elif kind == "text":
            out.append(_message(message_id, "assistant", item["text"], created=created, metadata=meta))
        elif kind == "tool_call":
            out.append(_message(message_id, "assistant", item["arguments"], created=created, recipient=item["name"],
                                metadata={**meta, "arbor_call_id": item["id"]}))
        elif kind == "tool_result":
            out.append(_message(message_id, "tool", item["content"], created=created, name=item.get("name"),
                                metadata={**meta, "arbor_call_id": item["call_id"]}))
        else:
            out.append(_message(message_id, "system", item["text"], created=created, metadata=meta))
    return out


class _Links:
    """Where every node's messages hang in `mapping`, found in a first pass over the nodes without keeping any
    message (issue 13): a few numbers a node, in arrays.

    Every node becomes a chain of messages below its anchor's last message: its parent's, or for a compaction
    root (which starts a tree of its own in Arbor) its original's, which is where a person met it. A node with no
    messages passes its place on to the nodes below it.
    """

    def __init__(self, ids: array):
        n = len(ids)
        self.ids = ids
        self.anchor = array("q", [-1]) * n  # the index of the node a node's messages hang below, -1: the root
        self.first = array("q", [-1]) * n  # a node's first and last message's place among its items; -1: none
        self.last = array("q", [-1]) * n
        self.up = array("q", [-1]) * n  # the nearest node above, by anchors, that has messages; -1: the root
        self.offsets = array("q", [0]) * (n + 2)  # the nodes hanging below each node (the root last), as ranges
        self.below = array("q")

    def index(self, node_id: int | None) -> int:
        i = bisect_left(self.ids, node_id) if node_id is not None else len(self.ids)
        return i if i < len(self.ids) and self.ids[i] == node_id else -1

    def read(self, nodes: Iterable[Node]) -> None:
        for node in nodes:
            i = self.index(node.pk)
            anchor = node.parent_id if node.parent_id is not None else node.compacted_from_id
            self.anchor[i] = self.index(anchor)
            shown = _shown_items(node)
            if shown:
                self.first[i], self.last[i] = shown[0][0], shown[-1][0]

    def link(self) -> None:
        n = len(self.ids)
        for i in range(n):
            j, steps = self.anchor[i], 0
            while j >= 0 and self.first[j] < 0 and steps <= n:  # a node without messages: look above it
                j, steps = self.anchor[j], steps + 1
            self.up[i] = j if steps <= n else -1  # (a loop would be a corrupt tree: hang it at the root)
        shown = [i for i in range(n) if self.first[i] >= 0]
        for i in shown:
            self.offsets[self.up[i] % (n + 1) + 1] += 1
        for slot in range(1, n + 2):
            self.offsets[slot] += self.offsets[slot - 1]
        self.below = array("q", [0]) * len(shown)
        filled = self.offsets[:-1]
        for i in shown:  # in id order: children in the order they were made
            slot = self.up[i] % (n + 1)
            self.below[filled[slot]] = i
            filled[slot] += 1

    def last_message(self, i: int) -> str:
        return ROOT if i < 0 else f"arbor-{self.ids[i]}-{self.last[i]}"

    def children(self, i: int) -> list[str]:
        """The first messages of the nodes hanging below node `i`'s last message (-1: below the root)."""
        slot = i % (len(self.ids) + 1)
        return [f"arbor-{self.ids[k]}-{self.first[k]}" for k in self.below[self.offsets[slot]:self.offsets[slot + 1]]]

    def current(self, head: int | None) -> str:
        i = self.index(head)
        return self.last_message(i if i < 0 or self.first[i] >= 0 else self.up[i])


def _nodes(ids: array) -> Iterator[Node]:
    for chunk in id_chunks(ids):
        yield from Node.objects.filter(pk__in=chunk).order_by("id").only(
            "id", "parent_id", "compacted_from_id", "kind", "status", "sent", "received", "created_at")


def _entry(key: str, message: dict[str, Any] | None, parent: str | None, children: list[str]) -> str:
    return f"{json_text(key)}: {json_text({'id': key, 'message': message, 'parent': parent, 'children': children})}"


def _entries(links: _Links) -> Iterator[str]:
    yield _entry(ROOT, None, None, links.children(-1))
    for node in _nodes(links.ids):
        i = links.index(node.pk)
        messages = _node_messages(node)
        for k, message in enumerate(messages):
            parent = messages[k - 1]["id"] if k else links.last_message(links.up[i])
            children = [messages[k + 1]["id"]] if k + 1 < len(messages) else links.children(i)
            yield _entry(message["id"], message, parent, children)


def chatgpt_chunks(conversation: Conversation) -> Iterator[str]:
    """ChatGPT's conversations.json (an array holding this conversation) as text, in parts (issue 13): a `mapping`
    tree with parents, children and `current_node`, so branches stay branches. The nodes are read twice, a chunk
    at a time in one snapshot: once to link them (`_Links`), once to write their messages."""
    with snapshot():
        links = _Links(tree_node_ids(conversation))
        links.read(_nodes(links.ids))
        links.link()
        yield "[" + json_object_start({
            "title": conversation.title or f"Conversation {conversation.pk}",
            "create_time": conversation.created_at.timestamp(), "update_time": conversation.updated_at.timestamp(),
        }, "mapping") + "{"
        yield from joined(_entries(links))
        yield "}, " + json_text({"current_node": links.current(conversation.head_id),
                                 "conversation_id": f"arbor-{conversation.pk}",
                                 "default_model_slug": conversation.model})[1:] + "]"


def export_chatgpt(conversation: Conversation) -> dict[str, Any]:
    """One entry of ChatGPT's conversations.json (`chatgpt_chunks`), in memory: for tests and small trees."""
    return json.loads("".join(chatgpt_chunks(conversation)))[0]


def _chatgpt_text(message: dict[str, Any], where: str) -> str:
    content = message.get("content")
    if not isinstance(content, dict):
        raise ImportRefused(f"{where}.content: expected an object.")
    parts = content.get("parts") or []
    if not isinstance(parts, list):
        raise ImportRefused(f"{where}.content.parts: expected a list.")
    texts = [p for p in parts if isinstance(p, str)]  # images and files are not imported
    return text_field("\n".join(texts), f"{where}.content")


def chatgpt_plan(document: dict[str, Any], index: int) -> Plan:
    """Questions and answers become turn nodes: a user message with k answers (regenerations) becomes k
    sibling nodes, a message with several user children (edits) sibling turns: branches stay branches."""
    where = f"conversations[{index}]"
    mapping = document.get("mapping")
    if not isinstance(mapping, dict):
        raise ImportRefused(f"{where}.mapping: expected an object.")
    check_count(len(mapping))
    root, messages, children = _chatgpt_messages(mapping, where)
    nodes, mapped = _chatgpt_turns(root, messages, children, where)
    current = document.get("current_node")
    head = mapped.get(current) if isinstance(current, str) else None
    if head is None and nodes:
        head = next(reversed(nodes))
    title = document.get("title") or ""
    plan = Plan(title=text_field(title if isinstance(title, str) else "", f"{where}.title", limit=200),
                model=settings.ARBOR_MODEL, instructions="", head=head, nodes=nodes)
    check_graph(plan)
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
        if parent is not None and (not isinstance(parent, str) or parent not in mapping):
            raise ImportRefused(f"{where}.mapping[{key!r}]: its parent {parent!r} is not in the file.")
        children.setdefault(parent, []).append(key)
        message = entry.get("message")
        author = message.get("author") if isinstance(message, dict) else None
        role = author.get("role") if isinstance(author, dict) else None
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
                while node_key in messages or node_key in nodes:  # a message id may look like a node key
                    node_key += "'"
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
