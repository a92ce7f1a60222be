"""Arbor's own file: the whole tree as JSON (nodes, statuses, kinds, head, compaction pointers, bubbles and
approvals), exported and imported back losslessly."""

from __future__ import annotations

import base64
import binascii
import json
from array import array
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.core.files.storage import default_storage
from django.db import transaction

from conversations import items as it
from conversations.models import Bubble, Conversation, Node, ToolApproval, ToolStatus, offered_model
from conversations.selectors import tree_node_ids
from conversations.transfer.chunks import id_chunks, json_array, json_object_start, snapshot
from conversations.transfer.plan import (
    ImportRefused,
    Plan,
    PlannedNode,
    check_count,
    check_graph,
    choice_field,
    count_field,
    file_parts_field,
    is_reference,
    item_field,
    items_field,
    object_field,
    text_field,
    usage_field,
    when_field,
    write,
)
from conversations.turns.calls import needs_approval
from files.models import SentFile, StoredFile
from files.sniff import UnsupportedFile, sniff

TREE_FORMAT = "arbor.tree"

TREE_VERSION = 1

NODE_FIELDS = ("kind", "status", "failure_reason", "failure_message", "sent", "received", "provider", "model",
               "usage", "instructions", "keep_ephemeral", "window_root", "tokens", "path_tokens", "label", "starred")


def _iso(value) -> str | None:
    return value.isoformat() if value else None


def tree_chunks(conversation: Conversation) -> Iterator[str]:
    """The whole tree as JSON text, in parts (issue 13): nodes, statuses, kinds, head, compaction pointers, bubbles
    and approvals, read NODES_PER_QUERY nodes at a time in one snapshot. Bubbles and approvals come in node order,
    each node's in their own order: what an import rebuilds."""
    with snapshot():
        ids = tree_node_ids(conversation)
        yield json_object_start({
            "format": TREE_FORMAT,
            "version": TREE_VERSION,
            "conversation": {"title": conversation.title, "model": conversation.model,
                             "instructions": conversation.instructions, "retrieval": conversation.retrieval,
                             "keep_retrieved": conversation.keep_retrieved, "head": conversation.head_id},
        }, "nodes")
        owner = conversation.owner_id
        yield from json_array(_nodes(ids, owner))
        yield ', "bubbles": '
        yield from json_array(_rows(ids, owner, Bubble, {"node": "node_id", "role": "role", "content": "content",
                                                  "data": "data"}))
        yield ', "approvals": '
        yield from json_array(_rows(ids, owner, ToolApproval, {"node": "node_id", "call_id": "call_id",
                                                        "approved": "approved", "result": "result"}))
        yield ', "files": '
        yield from json_array(_files(ids, owner))
        yield "}"


def export_tree(conversation: Conversation) -> dict[str, Any]:
    """`tree_chunks` as one document, in memory: for tests and small trees."""
    return json.loads("".join(tree_chunks(conversation)))


_NODE_COLUMNS = ("id", "parent_id", "compacted_from_id", "summary_call_id", "first_round_id", "file_parts",
                 *NODE_FIELDS, "created_at", "finished_at")


def _nodes(ids: array, owner: int) -> Iterator[dict[str, Any]]:
    for chunk in id_chunks(ids):
        for n in Node.objects.filter(owner_id=owner, pk__in=chunk).order_by("id").values(*_NODE_COLUMNS):
            # A turn's later round names its first call (issue 32); a call the large documents' parts it was sent
            # (issue 29): said only where there is something to say.
            said = {name: n[column] for name, column in (("first_round", "first_round_id"),
                                                         ("file_parts", "file_parts")) if n[column] is not None}
            yield {"id": n["id"], "parent": n["parent_id"], "compacted_from": n["compacted_from_id"],
                   "summary_call": n["summary_call_id"], **said, **{f: n[f] for f in NODE_FIELDS},
                   "created_at": _iso(n["created_at"]), "finished_at": _iso(n["finished_at"])}


def _files(ids: array, owner_id: int) -> Iterator[dict[str, Any]]:
    """The owner's files the nodes sent (X1), each once, its bytes in base64: the import makes them the
    importer's files again."""
    sent: set[int] = set()
    for chunk in id_chunks(ids):
        sent.update(SentFile.objects.filter(owner_id=owner_id, node_id__in=chunk).values_list("file_id", flat=True))
    for stored in StoredFile.objects.filter(pk__in=sent, owner_id=owner_id).order_by("id"):
        with default_storage.open(stored.blob.name, "rb") as handle:
            data = base64.b64encode(handle.read()).decode()
        yield {"id": stored.pk, "name": stored.name, "content_type": stored.content_type, "data": data}


def _rows(ids: array, owner: int, model, fields: dict[str, str]) -> Iterator[dict[str, Any]]:
    """The rows of `model` (bubbles, approvals) that belong to `owner`'s nodes, as {file key: column}, in node
    order."""
    for chunk in id_chunks(ids):
        rows = (model.objects.filter(owner_id=owner, node_id__in=chunk).order_by("node_id", "id")
                .values_list(*fields.values()))
        for row in rows.iterator(chunk_size=100):
            yield dict(zip(fields, row, strict=True))


def _tree_plan(document: dict[str, Any]) -> Plan:
    if type(document.get("version")) is not int or document["version"] != TREE_VERSION:  # true and 1.0 are no 1
        raise ImportRefused(f"Unsupported version {document.get('version')!r}; this Arbor reads {TREE_VERSION}.")
    meta = document.get("conversation")
    raw_nodes = document.get("nodes")
    if not isinstance(meta, dict) or not isinstance(raw_nodes, list):
        raise ImportRefused("`conversation` must be an object and `nodes` a list.")
    check_count(len(raw_nodes))
    nodes: dict[Any, PlannedNode] = {}
    for index, raw in enumerate(raw_nodes):
        node = _tree_node(raw, f"nodes[{index}]")
        if node.key in nodes:
            raise ImportRefused(f"nodes[{index}]: the id {node.key!r} is used twice.")
        nodes[node.key] = node
    starred = [key for key, node in nodes.items() if node.fields["starred"]]
    if len(starred) > 1:
        raise ImportRefused(f"nodes: {len(starred)} nodes are starred; a conversation has one star at most.")
    _attach_bubbles_and_approvals(document, nodes)
    files = carried_files(document)
    plan = Plan(files=files, title=text_field(meta.get("title", ""), "conversation.title", limit=200),
                model=offered_model(text_field(meta.get("model", ""), "conversation.model", limit=200)),
                instructions=text_field(meta.get("instructions", ""), "conversation.instructions", limit=20000),
                head=meta.get("head"), nodes=nodes, retrieval=meta.get("retrieval") is True,
                keep_retrieved=meta.get("keep_retrieved") is True)
    check_graph(plan)
    _tool_bubbles_from_calls(nodes)  # once every parent is known to be a node of the file
    return plan


def carried_files(document: dict[str, Any]) -> dict[Any, dict[str, Any]]:
    """The files the document carries (`files`: id, name, base64 bytes), each checked as an upload is: bounded,
    and a kind of file Arbor reads."""
    carried: dict[Any, dict[str, Any]] = {}
    total = 0
    for index, raw in enumerate(_entries(document, "files")):
        where = f"files[{index}]"
        if not isinstance(raw, dict) or not isinstance(raw.get("id"), int | str) or isinstance(raw.get("id"), bool):
            raise ImportRefused(f"{where}: each file needs an `id`.")
        try:
            data = base64.b64decode(raw.get("data") if isinstance(raw.get("data"), str) else "", validate=True)
        except (binascii.Error, ValueError):
            raise ImportRefused(f"{where}.data: not base64.") from None
        total += len(data)
        if len(data) > settings.ARBOR_FILE_MAX_BYTES or total > settings.ARBOR_IMPORT_MAX_BYTES:
            raise ImportRefused(f"{where}: the files are larger than this server takes.")
        name = text_field(raw.get("name", ""), f"{where}.name", limit=255) or "file"
        try:
            sniff(data, name)
        except UnsupportedFile as refused:
            raise ImportRefused(f"{where}: {refused.message}") from None
        carried[raw["id"]] = {"name": name, "data": data}
    return carried


def _tree_node(raw: Any, where: str) -> PlannedNode:
    if not isinstance(raw, dict) or not isinstance(raw.get("id"), int | str) or isinstance(raw.get("id"), bool):
        raise ImportRefused(f"{where}: each node needs an `id`.")
    status = choice_field(raw.get("status"), Node.Status.values, f"{where}.status")
    reason = raw.get("failure_reason") or ""
    if (status == Node.Status.FAILED) != bool(reason):
        raise ImportRefused(f"{where}: a failure reason goes with status failed, and only with it.")
    usage = usage_field(raw.get("usage"), f"{where}.usage")
    tokens = count_field(raw.get("tokens", 0), f"{where}.tokens")
    return PlannedNode(
        key=raw["id"], parent=raw.get("parent"), compacted_from=raw.get("compacted_from"),
        summary_call=raw.get("summary_call"), first_round=raw.get("first_round"),
        fields={
            "kind": choice_field(raw.get("kind"), Node.Kind.values, f"{where}.kind"),
            "status": status,
            "failure_reason": choice_field(reason, {"", *Node.FailureReason.values}, f"{where}.failure_reason"),
            "failure_message": text_field(raw.get("failure_message", ""), f"{where}.failure_message"),
            "sent": items_field(raw.get("sent", []), f"{where}.sent"),
            "received": items_field(raw.get("received", []), f"{where}.received"),
            "provider": text_field(raw.get("provider", ""), f"{where}.provider", limit=64),
            "model": text_field(raw.get("model", ""), f"{where}.model", limit=200),
            "usage": usage,
            "instructions": text_field(raw.get("instructions", ""), f"{where}.instructions"),
            "keep_ephemeral": raw.get("keep_ephemeral") is True,
            "window_root": raw.get("window_root") is True,
            "label": text_field(raw.get("label", ""), f"{where}.label", limit=40),
            "starred": _starred(raw, where),
            "tokens": tokens,
            "finished_at": when_field(raw.get("finished_at"), f"{where}.finished_at"),
            "file_parts": file_parts_field(raw.get("file_parts"), f"{where}.file_parts"),
        },
    )


def _starred(raw: dict[str, Any], where: str) -> bool:
    """A star only where the conversation could open: a turn, or a compaction root, that did not overflow (F2)."""
    if raw.get("starred") is not True:
        return False
    opens = (raw.get("kind") == Node.Kind.TURN or (raw.get("kind") == Node.Kind.COMPACTION and raw.get("parent") is None
                                                   and raw.get("window_root") is not True))
    if not opens or raw.get("failure_reason") == Node.FailureReason.CONTEXT_OVERFLOW:
        raise ImportRefused(f"{where}.starred: only a turn the conversation can open on is starred.")
    return True


def _entries(document: dict[str, Any], name: str) -> list[Any]:
    entries = document.get(name)
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise ImportRefused(f"`{name}` must be a list.")
    return entries


def _attach_bubbles_and_approvals(document: dict[str, Any], nodes: dict[Any, PlannedNode]) -> None:
    shown: set[tuple[Any, str]] = set()  # (node, role) of the roles a node shows once
    for index, raw in enumerate(_entries(document, "bubbles")):
        where = f"bubbles[{index}]"
        if not isinstance(raw, dict) or not is_reference(raw.get("node")) or raw["node"] not in nodes:
            raise ImportRefused(f"{where}: its node is not in the file.")
        data = object_field(raw.get("data"), f"{where}.data")
        role = choice_field(raw.get("role"), Bubble.Role.values, f"{where}.role")
        # Issue 26: bubbles are bounded by the tree, as a live node's are: one question, one answer and one error a
        # node at most, and a tool bubble a call (`_tool_bubbles_from_calls`). A million bubbles on one node made
        # a 131 MB page.
        if role != Bubble.Role.TOOL:
            if (raw["node"], role) in shown:
                raise ImportRefused(f"{where}: node {raw['node']!r} already has its {role} bubble; a node shows one.")
            shown.add((raw["node"], role))
        nodes[raw["node"]].bubbles.append({"role": role,
                                           "content": text_field(raw.get("content", ""), f"{where}.content"),
                                           "data": data})
    decided: set[tuple[Any, str]] = set()
    for index, raw in enumerate(_entries(document, "approvals")):
        where = f"approvals[{index}]"
        if (not isinstance(raw, dict) or not is_reference(raw.get("node")) or raw["node"] not in nodes
                or not isinstance(raw.get("approved"), bool)):
            raise ImportRefused(f"{where}: needs a node in the file and `approved` true or false.")
        call_id = text_field(raw.get("call_id"), f"{where}.call_id", limit=200, blank=False)
        if (raw["node"], call_id) in decided:
            raise ImportRefused(f"{where}: call {call_id!r} of node {raw['node']!r} is decided twice.")
        decided.add((raw["node"], call_id))
        if raw.get("result") is None:
            # D4: an approval is a person's act on this server. A decision without its result would make the
            # next turn run the action although nobody here approved it: the call stays undecided instead.
            continue
        result = item_field(raw["result"], f"{where}.result")
        if result["type"] != "tool_result" or result["call_id"] != call_id:
            raise ImportRefused(f"{where}.result: expected the tool_result of call {call_id!r}.")
        nodes[raw["node"]].approvals.append({"call_id": call_id, "approved": raw["approved"], "result": result})


def _tool_bubbles_from_calls(nodes: dict[Any, PlannedNode]) -> None:
    """What a tool bubble shows (the call's name, arguments, state and result) comes from the tree, never from the
    file's bubble (issue 26): the approval card must show the call that Approve would run, and no file may mark a
    waiting call done (or a done one waiting). The file's bubble only says which call of its node it shows."""
    results: dict[Any, dict[str, it.Item]] = {}  # the results each node's calls got, from the nodes below it
    for node in nodes.values():
        results.setdefault(node.parent, {}).update(
            (item["call_id"], item) for item in node.fields["sent"] if item["type"] == "tool_result")
    for key, node in nodes.items():
        calls = {call["id"]: call for call in it.tool_calls(node.fields["received"])}
        decisions = {approval["call_id"]: approval for approval in node.approvals}
        shown: set[str] = set()
        for index, bubble in enumerate(node.bubbles):
            if bubble["role"] != Bubble.Role.TOOL:
                continue
            call = calls.get(bubble["data"].get("call_id"))
            if call is None:
                raise ImportRefused(f"A tool bubble of node {key!r} names no tool call of that node "
                                    f"(data.call_id {bubble['data'].get('call_id')!r}); bubble {index} of it.")
            if call["id"] in shown:
                raise ImportRefused(f"Node {key!r} has two tool bubbles for call {call['id']!r}; a call shows one.")
            shown.add(call["id"])
            bubble["content"] = call["name"]
            bubble["data"] = call_state(call, results.get(key, {}).get(call["id"]), decisions.get(call["id"]))


def call_state(call: it.Item, result: it.Item | None, decision: dict[str, Any] | None) -> dict[str, Any]:
    """A tool bubble's data as the tree has it: the call's own name and arguments; its result (from the node below,
    or stored with a person's decision) and status; waiting for approval only while nobody decided it."""
    data = {"call_id": call["id"], "name": call["name"], "arguments": call["arguments"]}
    result = result or (decision or {}).get("result")
    if result is None:  # open: it waits for a person (F3), or for the turn that runs it
        waiting = needs_approval(call) and decision is None
        return {**data, "status": ToolStatus.AWAITING_APPROVAL if waiting else ToolStatus.RUNNING}
    status = ToolStatus.ERROR if result["is_error"] else ToolStatus.DONE
    if decision is not None and not decision["approved"]:
        status = ToolStatus.REFUSED
    return {**data, "status": status, "result": result["content"], "is_error": result["is_error"]}


def import_tree(*, owner, document: dict[str, Any]) -> Conversation:
    plan = _tree_plan(document)
    with transaction.atomic():
        return write(owner=owner, plan=plan)
