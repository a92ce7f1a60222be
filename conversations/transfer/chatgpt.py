"""ChatGPT's `conversations.json`: exported with branches kept in `mapping`, and imported with them kept: a
question with several answers (regenerations) becomes sibling turns, as do edits. The import reads today's
exports (issue 15): Code Interpreter and browsing as tool rounds, thoughts as reasoning, files as placeholders,
custom instructions as the conversation's, and nothing a person never saw (see "import" below)."""

from __future__ import annotations

import hashlib
import json
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from typing import Any

from conversations import items as it
from conversations.models import Conversation, Node
from conversations.selectors import tree_node_ids
from conversations.transfer.chunks import id_chunks, joined, json_object_start, json_text, snapshot
from conversations.transfer.message_tree import RECEIVED, SENT, At, Read, capped, one_or_many, tree_plan
from conversations.transfer.plan import ImportRefused, Plan, shallow

ROOT = "client-created-root"


def _message(message_id: str, role: str, text: str, *, created: float | None, name: str | None = None,
             recipient: str = "all", metadata: dict | None = None, content: dict | None = None) -> dict[str, Any]:
    return {"id": message_id, "author": {"role": role, "name": name, "metadata": {}}, "create_time": created,
            "update_time": None, "content": content or {"content_type": "text", "parts": [text]},
            "status": "finished_successfully", "end_turn": role == "assistant", "weight": 1.0,
            "metadata": metadata or {}, "recipient": recipient}


def _root_message(instructions: str) -> dict[str, Any] | None:
    """The conversation's instructions where ChatGPT keeps custom instructions: a hidden system message."""
    if not instructions:
        return None
    return _message(ROOT, "system", "", created=None, content={"content_type": "text", "parts": [""]},
                    metadata={"is_visually_hidden_from_conversation": True, "is_user_system_message": True,
                              "user_context_message_data": {"about_model_message": instructions}})


_SHOWN = {"user", "text", "tool_call", "tool_result", "reasoning"}


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


def _node_messages(node: Node, *, after: int = -1) -> list[dict[str, Any]]:
    """One Arbor node as ChatGPT messages (see `_shown_items`), those of its items after place `after` only."""
    created = node.created_at.timestamp() if node.created_at else None
    meta = {"arbor_node": node.pk, "arbor_status": node.status}
    out = []
    for index, item in _shown_items(node):
        if index <= after:
            continue
        message_id = f"arbor-{node.pk}-{index}"
        kind = item.get("type")
        if kind == "user":
            out.append(_message(message_id, "user", item["text"], created=created, metadata=meta))
        elif kind == "text":
            out.append(_message(message_id, "assistant", item["text"], created=created, metadata=meta))
        elif kind == "tool_call":  # as ChatGPT writes a call to its tools: code to a recipient
            out.append(_message(message_id, "assistant", "", created=created, recipient=item["name"],
                                content={"content_type": "code", "language": "json", "text": item["arguments"]},
                                metadata={**meta, "arbor_call_id": item["id"]}))
        elif kind == "reasoning":
            out.append(_message(message_id, "assistant", "", created=created, content={
                "content_type": "thoughts", "thoughts": [{"summary": "", "content": item.get("text") or ""}]},
                metadata={**meta, "arbor_provider": item.get("provider"), "arbor_data": item.get("data")}))
        elif kind == "tool_result":
            out.append(_message(message_id, "tool", item["content"], created=created, name=item.get("name"),
                                metadata={**meta, "arbor_call_id": item["call_id"],
                                          "arbor_is_error": item["is_error"]}))
        else:
            out.append(_message(message_id, "system", item["text"], created=created, metadata=meta))
    return out


class _Links:
    """Where every node's messages hang in `mapping`, found in a first pass over the nodes without keeping any
    message (issue 13): a few numbers a node, in arrays.

    Every node becomes a chain of messages below its anchor's last message: its parent's, or for a compaction
    root (which starts a tree of its own in Arbor) its original's, which is where a person met it. A node with no
    messages passes its place on to the nodes below it. A regenerated answer (a node that sent what an earlier
    sibling sent) hangs below that sibling's question, as ChatGPT keeps it: one question, several answers.
    """

    def __init__(self, ids: array):
        n = len(ids)
        self.ids = ids
        self.anchor = array("q", [-1]) * n  # the index of the node a node's messages hang below, -1: the root
        self.first = array("q", [-1]) * n  # a node's first and last message's place among its items; -1: none
        self.last = array("q", [-1]) * n
        self.up = array("q", [-1]) * n  # the nearest node above, by anchors, that has messages; -1: the root
        self.asked = array("q", [-1]) * n  # the place of a node's last message that it sent (a question); -1: none
        self.shares = array("q", [-1]) * n  # the earlier sibling whose question a regenerated answer hangs below
        self.sharers: dict[int, list[int]] = {}  # a node's regenerated answers' nodes
        self.offsets = array("q", [0]) * (n + 2)  # the nodes hanging below each node (the root last), as ranges
        self.below = array("q")

    def index(self, node_id: int | None) -> int:
        i = bisect_left(self.ids, node_id) if node_id is not None else len(self.ids)
        return i if i < len(self.ids) and self.ids[i] == node_id else -1

    def read(self, nodes: Iterable[Node]) -> None:
        asking: dict[tuple[int, str], int] = {}  # (anchor, what was sent) -> the first node that sent it there
        for node in nodes:
            i = self.index(node.pk)
            anchor = node.parent_id if node.parent_id is not None else node.compacted_from_id
            self.anchor[i] = self.index(anchor)
            shown = _shown_items(node)
            if not shown:
                continue
            self.first[i], self.last[i] = shown[0][0], shown[-1][0]
            asked = [index for index, _ in shown if index < len(node.sent)]
            answered = [index for index, _ in shown if index >= len(node.sent)]
            if not asked:
                continue
            self.asked[i] = asked[-1]
            key = (self.anchor[i], hashlib.sha1(json_text(node.sent).encode()).hexdigest())
            if key in asking and answered:
                j = self.shares[i] = asking[key]
                self.first[i] = answered[0]
                self.sharers.setdefault(j, []).append(i)
            else:
                asking.setdefault(key, i)

    def link(self) -> None:
        n = len(self.ids)
        for i in range(n):
            j, steps = self.anchor[i], 0
            while j >= 0 and self.first[j] < 0 and steps <= n:  # a node without messages: look above it
                j, steps = self.anchor[j], steps + 1
            self.up[i] = j if steps <= n else -1  # (a loop would be a corrupt tree: hang it at the root)
        shown = [i for i in range(n) if self.first[i] >= 0 and self.shares[i] < 0]
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

    def question(self, i: int) -> str:
        return f"arbor-{self.ids[i]}-{self.asked[i]}"

    def answers(self, i: int) -> list[str]:
        """The first messages of the regenerated answers hanging below node `i`'s question."""
        return [f"arbor-{self.ids[k]}-{self.first[k]}" for k in self.sharers.get(i, [])]

    def current(self, head: int | None) -> str:
        i = self.index(head)
        return self.last_message(i if i < 0 or self.first[i] >= 0 else self.up[i])


def _nodes(ids: array, owner: int) -> Iterator[Node]:
    for chunk in id_chunks(ids):
        yield from Node.objects.filter(owner_id=owner, pk__in=chunk).order_by("id").only(
            "id", "parent_id", "compacted_from_id", "kind", "status", "sent", "received", "created_at")


def _entry(key: str, message: dict[str, Any] | None, parent: str | None, children: list[str]) -> str:
    return f"{json_text(key)}: {json_text({'id': key, 'message': message, 'parent': parent, 'children': children})}"


def _entries(links: _Links, instructions: str, owner: int) -> Iterator[str]:
    yield _entry(ROOT, _root_message(instructions), None, links.children(-1))
    for node in _nodes(links.ids, owner):
        i = links.index(node.pk)
        shared = links.shares[i]
        messages = _node_messages(node, after=links.asked[i] if shared >= 0 else -1)
        for k, message in enumerate(messages):
            if k:
                parent = messages[k - 1]["id"]
            else:
                parent = links.question(shared) if shared >= 0 else links.last_message(links.up[i])
            children = [messages[k + 1]["id"]] if k + 1 < len(messages) else links.children(i)
            if links.sharers.get(i) and message["id"] == links.question(i):
                children = [*children, *links.answers(i)]
            yield _entry(message["id"], message, parent, children)


def chatgpt_chunks(conversation: Conversation) -> Iterator[str]:
    """ChatGPT's conversations.json (an array holding this conversation) as text, in parts (issue 13): a `mapping`
    tree with parents, children and `current_node`, so branches stay branches. The nodes are read twice, a chunk
    at a time in one snapshot: once to link them (`_Links`), once to write their messages."""
    with snapshot():
        links = _Links(tree_node_ids(conversation))
        links.read(_nodes(links.ids, conversation.owner_id))
        links.link()
        yield "[" + json_object_start({
            "title": conversation.title or f"Conversation {conversation.pk}",
            "create_time": conversation.created_at.timestamp(), "update_time": conversation.updated_at.timestamp(),
        }, "mapping") + "{"
        yield from joined(_entries(links, conversation.instructions, conversation.owner_id))
        yield "}, " + json_text({"current_node": links.current(conversation.head_id),
                                 "conversation_id": f"arbor-{conversation.pk}",
                                 "default_model_slug": conversation.model})[1:] + "]"


def export_chatgpt(conversation: Conversation) -> dict[str, Any]:
    """One entry of ChatGPT's conversations.json (`chatgpt_chunks`), in memory: for tests and small trees."""
    return json.loads("".join(chatgpt_chunks(conversation)))[0]


# --- import ---------------------------------------------------------------------------------------------
#
# A message of today's exports is one of: a question (text, or multimodal_text with images and files), an answer,
# the assistant calling a tool (`code`, or text with a `recipient` other than "all": python, web.run, browser, the
# image tool), the tool's output (role `tool`: execution_output, tether_browsing_display, tether_quote, text,
# images), the model's thoughts (`thoughts`), or something a person never saw (hidden system and context messages;
# `reasoning_recap`, "Thought for 7 seconds"). Questions and tool outputs are what a node sends; answers, calls and
# thoughts what it receives (T3, T4). Custom instructions become the conversation's instructions.

_CUSTOM_INSTRUCTIONS = "user_editable_context"
_NEVER_SHOWN = {"model_editable_context", "reasoning_recap"}
READING_PROVIDER = "chatgpt"  # thoughts ChatGPT wrote: kept and shown, never sent to a model (C4)


def _part_text(part: Any) -> str:
    """One of `parts`: text as it is, an image or a file as a placeholder a person and a model can read."""
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        return ""
    kind = part.get("content_type") or ("file" if part.get("asset_pointer") else "attachment")
    if kind == "audio_transcription":
        return part.get("text") or ""
    if kind in ("audio_asset_pointer", "real_time_user_audio_video_asset_pointer"):
        return ""  # the spoken words are the transcription beside it
    if kind == "image_asset_pointer":
        size = f" {part['width']}x{part['height']}" if part.get("width") and part.get("height") else ""
        prompt = ((part.get("metadata") or {}).get("dalle") or {}).get("prompt")
        return f"[image{size}: {part.get('asset_pointer', '')}]" + (f" (made from: {prompt})" if prompt else "")
    return f"[{kind}: {part['asset_pointer']}]" if part.get("asset_pointer") else f"[{kind}]"


def _joined(values: Any, separator: str = "\n") -> str:
    return separator.join(x for x in values if isinstance(x, str) and x)


def _parts_text(content: dict) -> str:
    """Text, multimodal text, a system error and whatever comes next: its parts, else its text."""
    parts = content.get("parts")
    if isinstance(parts, list):
        return "\n".join(t for t in map(_part_text, parts) if t)
    return content.get("text") if isinstance(content.get("text"), str) else ""


# What each kind of content shows as text, by `content_type`.
_CONTENT_TEXT = {
    "code": lambda c: c.get("text") or "",
    "execution_output": lambda c: c.get("text") or "",
    "tether_quote": lambda c: _joined((c.get("title"), c.get("url"), c.get("text"))),
    "tether_browsing_display": lambda c: _joined((c.get("summary"), c.get("result"))),
    "thoughts": lambda c: "\n\n".join(_joined((t.get("summary"), t.get("content")))
                                       for t in c.get("thoughts") or [] if isinstance(t, dict)),
}


def _content_text(content: dict, metadata: dict) -> str:
    text = _CONTENT_TEXT.get(content.get("content_type"), _parts_text)(content)
    files = [f"[file: {a.get('name') or a.get('id', '')}" + (f" ({a['mime_type']})" if a.get("mime_type") else "") + "]"
             for a in metadata.get("attachments") or [] if isinstance(a, dict)]
    return capped("\n".join(x for x in (text.strip("\n"), *files) if x))


def _instructions(content: dict, metadata: dict) -> str:
    """Custom instructions, as the person wrote them where the file keeps that (`user_context_message_data`)."""
    data = metadata.get("user_context_message_data") or {}
    about_user, about_model = data.get("about_user_message"), data.get("about_model_message")
    if not (about_user or about_model):
        about_user, about_model = content.get("user_profile"), content.get("user_instructions")
    return "\n\n".join(x for x in ((f"About me: {about_user}" if about_user else ""), about_model or "")
                        if isinstance(x, str) and x)


def _read(key: str, message: Any, at: At, where: str) -> Read:
    """What one message becomes (see the top of this part)."""
    if not isinstance(message, dict):
        return Read(None)
    author, content = message.get("author"), message.get("content")
    role = author.get("role") if isinstance(author, dict) else None
    if role is None:
        return Read(None)
    if not isinstance(content, dict):
        raise ImportRefused(f"{where}.content: expected an object.")
    if "parts" in content and not isinstance(content["parts"], list):
        raise ImportRefused(f"{where}.content.parts: expected a list.")
    metadata = message.get("metadata") if isinstance(message.get("metadata"), dict) else {}
    kind = content.get("content_type")
    if kind == _CUSTOM_INSTRUCTIONS or metadata.get("is_user_system_message"):
        return Read(None, instructions=_instructions(content, metadata))
    if metadata.get("is_visually_hidden_from_conversation") or kind in _NEVER_SHOWN or role == "system":
        return Read(None)
    text = _content_text(content, metadata)
    if role == "user":
        return Read(SENT, (it.user(text),)) if text else Read(None)
    return _reply(key, message, text, at)


def _reply(key: str, message: dict, text: str, at: At) -> Read:
    """What an assistant's or a tool's message becomes: a call, thoughts, an answer, a call's output."""
    role, name = message["author"]["role"], message["author"].get("name") or "tool"
    content, recipient = message["content"], message.get("recipient") or "all"
    # What Arbor's own export keeps beside ChatGPT's fields (a call's id and arguments, a result's error flag,
    # whose reasoning it was), so a round trip loses nothing.
    arbor = {k: v for k, v in (message.get("metadata") or {}).items() if k.startswith("arbor_")}
    if role == "assistant":
        return _assistant(key, content, recipient, text, arbor)
    if role == "tool":
        return _tool_output(content, name, text, at, arbor)
    return Read(None)


def _assistant(key: str, content: dict, recipient: str, text: str, arbor: dict) -> Read:
    """The assistant's message: a call (to a recipient other than all), its thoughts, or its answer."""
    if recipient != "all":
        if isinstance(arbor.get("arbor_call_id"), str):
            return Read(RECEIVED, (it.tool_call(arbor["arbor_call_id"], recipient, content.get("text") or "{}"),))
        arguments = json.dumps({"code": text, **({"language": content["language"]}
                                                  if content.get("language") not in (None, "unknown") else {})})
        return Read(RECEIVED, (it.tool_call(f"call_{key}", recipient, arguments),))
    if content.get("content_type") == "thoughts":
        provider = arbor.get("arbor_provider") if isinstance(arbor.get("arbor_provider"), str) else READING_PROVIDER
        return Read(RECEIVED, ({"type": "reasoning", "provider": provider, "text": text,
                                "data": shallow(arbor.get("arbor_data"), f"mapping.{key}.metadata.arbor_data")},)
                    if text else ())
    return Read(RECEIVED, (it.text(text),)) if text else Read(None)


def _tool_output(content: dict, name: str, text: str, at: At, arbor: dict) -> Read:
    """A tool's message: the result of the call before it (T4); of the call Arbor's own export names, when two
    calls of one round come before their outputs."""
    is_error = content.get("content_type") == "system_error" or arbor.get("arbor_is_error") is True
    if isinstance(arbor.get("arbor_call_id"), str):
        return Read(SENT, (it.tool_result(arbor["arbor_call_id"], name, text or "(no output)", is_error=is_error),))
    if at.call is not None:
        return Read(SENT, (it.tool_result(at.call["id"], at.call["name"], text or "(no output)", is_error=is_error),))
    # Output with no call before it (a tool that spoke on its own): the person saw it as the assistant's.
    return Read(RECEIVED, (it.text(f"[{name}] {text}"),)) if text else Read(None)


def entries(document: Any) -> list | None:
    """The conversations of a conversations.json, or None if `document` is not one."""
    return one_or_many(document, lambda e: isinstance(e, dict) and "mapping" in e)


def chatgpt_plan(document: Any, index: int) -> Plan:
    """One entry of conversations.json as a plan (`message_tree`); `current_node` is the head."""
    where = f"conversations[{index}]"
    if not isinstance(document, dict) or "mapping" not in document:
        raise ImportRefused(f"{where}: not a ChatGPT conversation (it has no mapping).")
    mapping = document.get("mapping")
    if not isinstance(mapping, dict):
        raise ImportRefused(f"{where}.mapping: expected an object.")
    root, children = _tree(mapping, where)

    def read(key: str, at: At) -> list[Read]:
        return [_read(key, mapping[key].get("message"), at, f"{where}.mapping[{key!r}].message")]

    current = document.get("current_node")
    return tree_plan(children={None: [root], **children}, read=read, total=len(mapping), where=where,
                     current=current if isinstance(current, str) else None, title=document.get("title") or "")


def _tree(mapping: dict[str, Any], where: str) -> tuple[str, dict[str, list[str]]]:
    """The root, and children by parent, from the entries' own `parent` fields."""
    roots = [key for key, entry in mapping.items() if isinstance(entry, dict) and entry.get("parent") is None]
    if len(roots) != 1:
        raise ImportRefused(f"{where}.mapping: expected exactly one root message, found {len(roots)}.")
    children: dict[str, list[str]] = {}
    for key, entry in mapping.items():
        if not isinstance(entry, dict):
            raise ImportRefused(f"{where}.mapping[{key!r}]: expected an object.")
        parent = entry.get("parent")
        if parent is not None and (not isinstance(parent, str) or parent not in mapping):
            raise ImportRefused(f"{where}.mapping[{key!r}]: its parent {parent!r} is not in the file.")
        children.setdefault(parent, []).append(key)
    return roots[0], children


