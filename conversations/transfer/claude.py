"""Claude.ai's data export (`conversations.json`): a list of conversations, each with its `chat_messages` from
`human` and `assistant`. A message's `content` blocks are read in order: text, `thinking` (reasoning), `tool_use`
and the `tool_result` claude.ai's own tools gave back inside the same answer (the export gives neither an id:
a result belongs to the call before it). An attachment whose text the export holds (`extracted_content`: what
claude.ai read of a pasted text or an uploaded document) becomes a file of the importer's, sent with its question
again as it was (X1); files the export holds no bytes of (images) are placeholders. The bulk export lists one
branch in order; a conversation as claude.ai's web app serves it also has `parent_message_uuid` and
`current_leaf_message_uuid`, and then its branches are kept."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings

from conversations import items as it
from conversations.transfer.message_tree import (
    RECEIVED,
    SENT,
    At,
    Read,
    capped,
    children_by_parent,
    one_or_many,
    placeholder,
    tree_plan,
)
from conversations.transfer.plan import ImportRefused, Plan, show_files
from files.sniff import UnsupportedFile, sniff

PROVIDER = "claude.ai"  # thinking claude.ai showed: kept and shown, never sent to a model (C4)


def entries(document: Any) -> list | None:
    def conversation(entry: Any) -> bool:
        return isinstance(entry, dict) and isinstance(entry.get("chat_messages"), list)
    if isinstance(document, dict) and isinstance(document.get("conversations"), list):  # a viewer's wrapper
        document = document["conversations"]
    return one_or_many(document, conversation)


def plan(entry: Any, index: int) -> Plan:
    where = f"conversations[{index}]"
    if not isinstance(entry, dict) or not isinstance(entry.get("chat_messages"), list):
        raise ImportRefused(f"{where}: not a Claude conversation (it has no chat_messages).")
    messages: dict[str, dict] = {}
    for position, message in enumerate(entry["chat_messages"]):
        if not isinstance(message, dict):
            raise ImportRefused(f"{where}.chat_messages[{position}]: expected an object.")
        messages[str(message.get("uuid") or position)] = message
    keys = list(messages)
    linked = all(m.get("parent_message_uuid") for m in messages.values())
    children = children_by_parent({key: messages[key].get("parent_message_uuid") if linked else
                                   (keys[position - 1] if position else None) for position, key in enumerate(keys)})

    attached: dict[str, dict[str, Any]] = {}  # the attachments' texts, by a key of this file's own

    def read(key: str, at: At) -> list[Read]:
        return _read(key, messages[key], at, attached)

    plan = tree_plan(children=children, read=read, total=len(messages), where=where,
                     current=entry.get("current_leaf_message_uuid") if linked else (keys[-1] if keys else None),
                     title=entry.get("name") or "")
    plan.files.update(attached)
    for node in plan.nodes.values():
        show_files(node, [ref for item in node.fields.get("sent") or [] if item.get("type") == "user"
                          for ref in item.get("files", ())])
    return plan


def _block_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content or [] if isinstance(b, dict) and b.get("type") == "text")


def _read(key: str, message: dict, at: At, attached: dict[str, dict[str, Any]]) -> list[Read]:
    blocks = [b for b in message.get("content") or [] if isinstance(b, dict)]
    if message.get("sender") == "human":
        return _question(key, message, blocks, attached)
    if message.get("sender") != "assistant":
        return []
    if not blocks:
        text = message.get("text") if isinstance(message.get("text"), str) else ""
        return [Read(RECEIVED, (it.text(capped(text)),))] if text else []
    reads, call = [], at.call
    for index, block in enumerate(blocks):
        read, call = _answer_block(key, index, block, call)
        if read is not None:
            reads.append(read)
    return reads


def _question(key: str, message: dict, blocks: list[dict], attached: dict[str, dict[str, Any]]) -> list[Read]:
    """A person's message: its text, a placeholder for each attached file (named once, as the person saw it), and
    the attachments whose text the export holds as files of the question (bounded as uploads are)."""
    text = _block_text(blocks) or (message.get("text") if isinstance(message.get("text"), str) else "")
    named = [a for a in [*(message.get("attachments") or []), *(message.get("files") or [])]
             if isinstance(a, dict) and isinstance(a.get("file_name"), str) and a["file_name"]]
    names = {}
    for attachment in named:
        names.setdefault(attachment["file_name"], attachment.get("file_type") or attachment.get("file_kind") or "")
    refs = _attached_texts(key, named, attached)
    files = [placeholder("file", name, f"({kind})" if kind else "") for name, kind in names.items()]
    question = capped("\n".join(x for x in (text, *files) if x))
    return [Read(SENT, (it.user(question, refs or None),))] if question else []


def _attached_texts(key: str, named: list[dict], attached: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The question's references to the attachments whose text the export holds, each put in `attached` (by a key
    of this file's own), bounded as uploads are."""
    refs = []
    for index, attachment in enumerate(named):
        content = attachment.get("extracted_content")
        data = content.encode() if isinstance(content, str) and content.strip() else b""
        name = _text_name(attachment["file_name"])
        if data and len(data) <= settings.ARBOR_FILE_MAX_BYTES and len(refs) < settings.ARBOR_FILES_PER_TURN \
                and _reads_as_text(data, name):
            attached[f"{key}/{index}"] = {"name": name, "data": data}
            refs.append({"id": f"{key}/{index}", "name": name, "kind": "document"})
    return refs


def _reads_as_text(data: bytes, name: str) -> bool:
    """Whether the bytes are read as the text they are: text that begins like a picture or an archive would be
    kept as one, so it stays a placeholder."""
    try:
        return sniff(data, name)[0].startswith("text/")
    except UnsupportedFile:
        return False


def _text_name(name: str) -> str:
    """What claude.ai kept of a document is its text: a file of text, whatever it was uploaded as."""
    return name if name.lower().endswith((".txt", ".md")) else f"{name}.txt"


def _answer_block(key: str, index: int, block: dict, call: it.Item | None) -> tuple[Read | None, it.Item | None]:
    """One block of an answer as what it adds, with the tool call still waiting for its result afterwards (a
    `tool_result` block answers the `tool_use` before it, T4)."""
    kind = block.get("type")
    if kind == "text" and block.get("text"):
        return Read(RECEIVED, (it.text(capped(block["text"])),)), call
    if kind == "thinking" and block.get("thinking"):
        return Read(RECEIVED, ({"type": "reasoning", "provider": PROVIDER, "text": capped(block["thinking"]),
                                "data": None},)), call
    if kind == "tool_use":
        call = it.tool_call(str(block.get("id") or f"call_{key}_{index}"), str(block.get("name") or "tool"),
                            json.dumps(block.get("input") or {}))
        return Read(RECEIVED, (call,)), call
    if kind == "tool_result" and call is not None:
        return Read(SENT, (it.tool_result(call["id"], call["name"],
                                          capped(_block_text(block.get("content")) or "(no output)"),
                                          is_error=bool(block.get("is_error"))),)), None
    return None, call
