"""Export a conversation: its current path as Markdown, or its whole tree as JSON (Arbor's own format,
which imports back losslessly) or as ChatGPT's `conversations.json` (branches kept in `mapping`).

Reads only; `imports.py` is the other direction.
"""

from __future__ import annotations

from typing import Any

from conversations.models import Bubble, Conversation, Node, ToolApproval
from conversations.screen import path_bubbles
from conversations.selectors import conversation_nodes, history_ids

TREE_FORMAT = "arbor.tree"
TREE_VERSION = 1
NODE_FIELDS = ("kind", "status", "failure_reason", "failure_message", "sent", "received", "provider", "model",
               "usage", "instructions", "keep_ephemeral", "window_root", "tokens", "path_tokens")
NODE_REFERENCES = ("parent_id", "compacted_from_id", "summary_call_id")


def _iso(value) -> str | None:
    return value.isoformat() if value else None


def tree_nodes(conversation: Conversation) -> list[Node]:
    """The conversation's nodes, plus every node they point at (shared history, originals behind a
    compaction, summarising calls), so the export holds everything its paths need."""
    ids = set(conversation_nodes(conversation=conversation).values_list("id", flat=True))
    ids |= set(history_ids(conversation.head_id))
    while True:
        refs = Node.objects.filter(pk__in=ids).values_list(*NODE_REFERENCES)
        missing = {ref for row in refs for ref in row if ref is not None} - ids
        if not missing:
            break
        for node_id in missing:  # rare: shared history of another conversation, read up to its root
            ids |= set(history_ids(node_id))
    return list(Node.objects.filter(pk__in=ids).order_by("id"))


def export_tree(conversation: Conversation) -> dict[str, Any]:
    """The whole tree: nodes, statuses, kinds, head, compaction pointers, bubbles and approvals."""
    nodes = tree_nodes(conversation)
    node_ids = [n.pk for n in nodes]
    bubbles = Bubble.objects.filter(node_id__in=node_ids).order_by("id")
    approvals = ToolApproval.objects.filter(node_id__in=node_ids).order_by("id")
    return {
        "format": TREE_FORMAT,
        "version": TREE_VERSION,
        "conversation": {"title": conversation.title, "model": conversation.model,
                         "instructions": conversation.instructions, "retrieval": conversation.retrieval,
                         "keep_retrieved": conversation.keep_retrieved, "head": conversation.head_id},
        "nodes": [
            {"id": n.pk, "parent": n.parent_id, "compacted_from": n.compacted_from_id,
             "summary_call": n.summary_call_id, **{f: getattr(n, f) for f in NODE_FIELDS},
             "created_at": _iso(n.created_at), "finished_at": _iso(n.finished_at)}
            for n in nodes
        ],
        "bubbles": [{"node": b.node_id, "role": b.role, "content": b.content, "data": b.data} for b in bubbles],
        "approvals": [{"node": a.node_id, "call_id": a.call_id, "approved": a.approved, "result": a.result}
                      for a in approvals],
    }


def export_markdown(conversation: Conversation) -> str:
    """The current path as a person saw it: questions, answers, tool calls, failures."""
    lines = [f"# {conversation.title or f'Conversation {conversation.pk}'}", ""]
    for view in path_bubbles(conversation=conversation):
        bubble = view.bubble
        if bubble.role == Bubble.Role.USER:
            lines += ["## Question", "", bubble.content, ""]
        elif bubble.role == Bubble.Role.ASSISTANT:
            lines += ["## Answer", "", bubble.content, ""]
        elif bubble.role == Bubble.Role.TOOL:
            data = bubble.data
            lines += [f"**Tool `{data.get('name', bubble.content)}`** ({data.get('status', '')})", "",
                      "```json", str(data.get("arguments", "")), "```", ""]
            if data.get("result") is not None:
                lines += ["```", str(data["result"]), "```", ""]
        elif bubble.role == Bubble.Role.ERROR:
            lines += [f"> The call failed ({bubble.data.get('reason', 'error')}): {bubble.content}", ""]
        else:  # the compaction marker
            lines += ["---", f"*{bubble.content}*", ""]
    return "\n".join(lines).rstrip() + "\n"


# --- ChatGPT's conversations.json --------------------------------------------------------------------


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
