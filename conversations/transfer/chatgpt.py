"""ChatGPT's `conversations.json`: exported with branches kept in `mapping`, and imported with them kept:
a question with several answers (regenerations) becomes sibling turns, as do edits."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from conversations import items as it
from conversations.models import Conversation, Node
from conversations.selectors import tree_nodes
from conversations.transfer.plan import ImportRefused, Plan, PlannedNode, check_count, check_graph, text_field


def _message(message_id: str, role: str, text: str, *, created: float | None, name: str | None = None,
             recipient: str = "all", metadata: dict | None = None) -> dict[str, Any]:
    return {"id": message_id, "author": {"role": role, "name": name, "metadata": {}}, "create_time": created,
            "update_time": None, "content": {"content_type": "text", "parts": [text]},
            "status": "finished_successfully", "end_turn": role == "assistant", "weight": 1.0,
            "metadata": metadata or {}, "recipient": recipient}


def _node_messages(node: Node) -> list[dict[str, Any]]:
    """One Arbor node as ChatGPT messages: what it sent, then (if it succeeded) what it received (T5).

    Side calls (titles, summarising calls, playbook drafts) are no part of the conversation a person had,
    and a compaction root contributes only its summary: its kept turns are already there, as themselves.
    """
    if node.kind != Node.Kind.TURN and not (node.kind == Node.Kind.COMPACTION and node.parent_id is None):
        return []
    created = node.created_at.timestamp() if node.created_at else None
    meta = {"arbor_node": node.pk, "arbor_status": node.status}
    out = []
    items = [*node.sent, *(node.received if node.status == Node.Status.SUCCEEDED else [])]
    if node.kind == Node.Kind.COMPACTION:
        items = [i for i in items if i.get("type") == "summary"]
    for index, item in enumerate(items):
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
        elif kind == "summary" and item.get("text"):
            out.append(_message(message_id, "system", item["text"], created=created, metadata=meta))
    return out


def export_chatgpt(conversation: Conversation) -> dict[str, Any]:
    """One entry of ChatGPT's conversations.json: a `mapping` tree with parents, children and `current_node`.

    Every node becomes a chain of messages under its parent's last message, so branches stay branches.
    A compaction node starts a tree of its own in Arbor; here it hangs below the node it compacted
    (its original), which is where a person met it.
    """
    nodes = tree_nodes(conversation)
    root_id = "client-created-root"
    mapping: dict[str, dict[str, Any]] = {root_id: {"id": root_id, "message": None, "parent": None, "children": []}}
    last_of: dict[int, str] = {}
    for node in nodes:  # ids grow with creation, so a parent and an original come before their children
        anchor_node = node.parent_id if node.parent_id is not None else node.compacted_from_id
        anchor = last_of.get(anchor_node, root_id) if anchor_node is not None else root_id
        for message in _node_messages(node):
            mapping[message["id"]] = {"id": message["id"], "message": message, "parent": anchor, "children": []}
            mapping[anchor]["children"].append(message["id"])
            anchor = message["id"]
        last_of[node.pk] = anchor
    created = conversation.created_at.timestamp()
    return {"title": conversation.title or f"Conversation {conversation.pk}", "create_time": created,
            "update_time": conversation.updated_at.timestamp(), "mapping": mapping,
            "current_node": last_of.get(conversation.head_id, root_id), "conversation_id": f"arbor-{conversation.pk}",
            "default_model_slug": conversation.model}


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
