"""Context assembly: the one place that turns a path into the messages a model receives (T5, T6, C4).

Pure functions: no database, no settings, no litellm. The turn runner and the context endpoint call
`assemble`; every later view of "what the model saw" must call it too, never rebuild it.

Its last step, `shape`, is the one place where provider quirks are met at send time (C4): reasoning
blocks stay verbatim for their own provider and are dropped for any other (in `_assistant_message`),
tool-call ids are mapped to ids the target accepts (the same map for a call and its result, so pairs
stay paired and a path maps the same way every time), and Anthropic gets a `cache_control` marker on
the last message of the stable prefix: everything that came from the path, which is exactly the
previous call's context plus its answer (prefix stability).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from conversations.items import ASSISTANT_TYPES, Item

logger = logging.getLogger("arbor.context")


class PathNode(NamedTuple):
    """The columns of a node that assembly needs, read by the one path query.

    A NamedTuple: the path query builds thousands of these positionally on the hot path.
    """

    id: int
    parent_id: int | None
    kind: str
    status: str
    sent: list[Item]
    received: list[Item]
    provider: str = ""
    model: str = ""
    tokens: int = 0
    path_tokens: int = 0  # C1: tokens from the path's first node down to this one
    compacted_from_id: int | None = None  # C3: set on a compaction root
    # C3: tokens a provider switch's expansion put before this node; `path_tokens` includes them, the
    # stored figure does not (it counts from the compaction root the node really hangs below).
    shift: int = 0

    @property
    def stored_path_tokens(self) -> int:
        return self.path_tokens - self.shift


SUMMARY_PREFIX = "Summary of the earlier conversation (compacted):\n"


def is_compaction_root(node: PathNode | Any) -> bool:
    """The one test for a compaction root (C2): a parentless compaction node. Takes a PathNode or a Node."""
    return node.kind == "compaction" and node.parent_id is None


def readable_by(items: Iterable[Item], provider: str | None) -> bool:
    """False if an item is another provider's opaque compaction result, which `provider` cannot read (C3)."""
    return not any(item.get("type") == "summary" and item.get("provider") not in (None, provider) for item in items)


def path_items(path: Sequence[PathNode], *, keep_ephemeral: bool = False) -> list[Item]:
    """Concatenate root-first each node's sent items, and received items where the call succeeded (T5).

    Items marked ephemeral (R2: retrieval results) were for the call that sent them; later calls
    drop them unless the conversation's policy keeps them.
    """
    items: list[Item] = []
    for node in path:
        items.extend(node.sent)
        if node.status == "succeeded":
            items.extend(node.received)
    if keep_ephemeral:
        return items
    return [item for item in items if not item.get("ephemeral")]


def _orphan_tool_ids(items: list[Item]) -> set[str]:
    call_ids = {item["id"] for item in items if item.get("type") == "tool_call"}
    result_ids = {item["call_id"] for item in items if item.get("type") == "tool_result"}
    orphans = call_ids ^ result_ids
    if orphans:
        logger.warning("assembly dropped tool items with no partner: %s", sorted(orphans))
    return orphans


def drop_orphan_tool_items(items: list[Item], orphans: set[str] | None = None) -> list[Item]:
    """Drop tool calls without a result and results without a call (T6); log it, it is a defect upstream."""
    if orphans is None:
        orphans = _orphan_tool_ids(items)
    if not orphans:
        return items
    return [
        item
        for item in items
        if not (
            (item.get("type") == "tool_call" and item["id"] in orphans)
            or (item.get("type") == "tool_result" and item["call_id"] in orphans)
        )
    ]


def _assistant_message(items: list[Item], provider: str | None) -> dict[str, Any]:
    """One assistant message from one run of assistant items, in a single pass (this is the hot loop)."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    thoughts: list[str] = []
    blocks: list[Any] = []
    for item in items:
        kind = item["type"]
        if kind == "text":
            texts.append(item["text"])
        elif kind == "tool_call":
            calls.append({"id": item["id"], "type": "function",
                          "function": {"name": item["name"], "arguments": item["arguments"]}})
        elif item.get("provider") == provider:  # C4: reasoning is opaque to every other provider
            thoughts.append(item.get("text") or "")
            data = item.get("data")
            blocks.extend(data if isinstance(data, list) else [data] if data else [])
    # Texts of one run (a partial answer kept from a failed call, then the retry's) are paragraphs of their own:
    # glued, the model read "…compute this.My apologies…".
    message: dict[str, Any] = {"role": "assistant", "content": "\n\n".join(t for t in texts if t) or
                               (None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    if blocks:
        message["thinking_blocks"] = blocks
    if any(thoughts):
        message["reasoning_content"] = "".join(thoughts)
    return message


def user_content(item: Item, attached: Mapping[int, dict[str, Any]] | None = None) -> str | list[dict[str, Any]]:
    """A question as a model gets it (X1): its text, then each file it refers to, labelled with its name: an
    image as an image part, a document as its text. `attached`: the files' contents by id (`files.attached`);
    a file not in it (a side call's assembly, or a file gone) is its label alone."""
    refs = item.get("files")
    if not refs:
        return item["text"]
    parts: list[dict[str, Any]] = [{"type": "text", "text": item["text"]}]
    for ref in refs:
        content = (attached or {}).get(ref["id"])
        if content is None:
            parts.append({"type": "text", "text": f"[{'image' if ref['kind'] == 'image' else 'file'} {ref['name']}]"})
        elif ref["kind"] == "image":
            parts += [{"type": "text", "text": f"[image {ref['name']}]"},
                      {"type": "image_url", "image_url": {"url": content["url"]}}]
        else:  # a large document's label says which of its parts came (R2: retrieved for this call)
            label = f"{ref['name']}, {content['parts']}" if content.get("parts") else ref["name"]
            parts.append({"type": "text", "text": f"[file {label}]\n{content['text']}"})
    return parts


def to_messages(items: Iterable[Item], *, provider: str | None = None,
                attached: Mapping[int, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Convert items into OpenAI-format messages (litellm's lingua franca), shaped for `provider`; a question's
    files come from `attached` (`user_content`)."""
    messages: list[dict[str, Any]] = []
    pending_assistant: list[Item] = []

    def flush() -> None:
        if pending_assistant:
            messages.append(_assistant_message(pending_assistant, provider))
            pending_assistant.clear()

    for item in items:
        kind = item.get("type")
        if kind in ASSISTANT_TYPES:
            pending_assistant.append(item)
            continue
        flush()
        if kind == "user":
            messages.append({"role": "user", "content": user_content(item, attached)})
        elif kind == "system":
            messages.append({"role": "system", "content": item["text"]})
        elif kind == "tool_result":
            messages.append(
                {"role": "tool", "tool_call_id": item["call_id"], "name": item.get("name", ""),
                 "content": item["content"]}
            )
        elif kind == "summary":
            message = _summary_message(item, provider)
            if message:
                messages.append(message)
        else:
            logger.warning("assembly skipped an item of unknown type %r", kind)
    flush()
    # A reasoning-only assistant message from another provider would be empty: leave it out.
    return [m for m in messages if not (m["role"] == "assistant" and m["content"] == "" and "tool_calls" not in m
                                       and "thinking_blocks" not in m and "reasoning_content" not in m)]


def _summary_message(item: Item, provider: str | None) -> dict[str, Any] | None:
    """A compaction summary as a user message: the provider's own opaque data verbatim, or the text."""
    owner = item.get("provider")
    if owner is None:
        return {"role": "user", "content": SUMMARY_PREFIX + item.get("text", "")}
    if owner == provider:
        return {"role": "user", "content": item["data"]}
    # The turn runner expands the original instead (C3); reaching here is a defect upstream.
    logger.warning("assembly dropped a compaction result of provider %r that %r cannot read", owner, provider)
    return None


def assemble(
    path: Sequence[PathNode],
    new_items: Sequence[Item] = (),
    *,
    instructions: str = "",
    provider: str | None = None,
    keep_ephemeral: bool = False,
    attached: Mapping[int, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Return the message list for a call whose parent is the last node of `path` (T5, T6, C4, R2); the files
    its questions refer to come from `attached` (X1, `files.attached.contents`)."""
    old = path_items(path, keep_ephemeral=keep_ephemeral)
    new = list(new_items)
    orphans = _orphan_tool_ids([*old, *new])
    messages = to_messages(drop_orphan_tool_items(old, orphans), provider=provider, attached=attached)
    stable = len(messages)  # what came from the path: the previous call's context and its answer
    messages.extend(to_messages(drop_orphan_tool_items(new, orphans), provider=provider, attached=attached))
    if instructions:
        messages.insert(0, {"role": "system", "content": instructions})
        stable += 1
    return shape(messages, provider=provider, stable=stable)


# --- send-time shaping (C4) ------------------------------------------------------------------------

_ANTHROPIC_CALL_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")
# What each provider accepts as a tool-call id; any other provider gets the common safe form.
_CALL_ID_RULES: dict[str, re.Pattern[str]] = {
    "anthropic": _ANTHROPIC_CALL_ID,
    "bedrock": _ANTHROPIC_CALL_ID,
    "vertex_ai": _ANTHROPIC_CALL_ID,
    "openai": re.compile(r".{1,40}", re.DOTALL),
    "mistral": re.compile(r"[a-zA-Z0-9]{9}"),
}
_SAFE_CALL_ID = re.compile(r"[a-zA-Z0-9_-]{1,40}")
_CACHE_MARKER_PROVIDERS = frozenset({"anthropic"})


def call_id_for(call_id: str, provider: str | None) -> str:
    """`call_id` if `provider` accepts it, else a deterministic replacement it does accept."""
    rule = _CALL_ID_RULES.get(provider or "", _SAFE_CALL_ID)
    if rule.fullmatch(call_id):
        return call_id
    digest = hashlib.sha256(call_id.encode()).hexdigest()
    return digest[:9] if provider == "mistral" else f"call_{digest[:24]}"


def shape(messages: list[dict[str, Any]], *, provider: str | None, stable: int = 0) -> list[dict[str, Any]]:
    """The last assembly step: make `messages` valid for `provider` (C4). `stable`: how many lead
    messages are the prefix the previous call already sent."""
    for message in messages:
        if message["role"] == "tool":
            message["tool_call_id"] = call_id_for(message["tool_call_id"], provider)
        for call in message.get("tool_calls") or ():
            call["id"] = call_id_for(call["id"], provider)
    if provider in _CACHE_MARKER_PROVIDERS:
        _mark_cache_breakpoint(messages, stable)
    if provider in _ONE_USER_MESSAGE_PROVIDERS:
        messages = _joined_user_messages(messages)
    return messages


# Providers that take no two user messages in a row: litellm would merge them on the way, after "what the model
# saw" was recorded; they are merged here instead, each text a block of its own, as the provider receives them.
_ONE_USER_MESSAGE_PROVIDERS = frozenset({"anthropic", "bedrock", "vertex_ai"})


def _blocks(content: Any) -> list[dict[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def _joined_user_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    joined: list[dict[str, Any]] = []
    for message in messages:
        if message["role"] == "user" and joined and joined[-1]["role"] == "user":
            joined[-1] = {**joined[-1], "content": [*_blocks(joined[-1]["content"]), *_blocks(message["content"])]}
        else:
            joined.append(message)
    return joined


def _mark_cache_breakpoint(messages: list[dict[str, Any]], stable: int) -> None:
    """Anthropic prompt caching: `cache_control` on the last text-bearing message of the stable prefix."""
    for message in reversed(messages[:stable]):
        content = message.get("content")
        if isinstance(content, str) and content:
            message["content"] = [{"type": "text", "text": content, "cache_control": {"type": "ephemeral"}}]
            return
        if isinstance(content, list) and content and isinstance(content[-1], dict):
            message["content"] = [*content[:-1], {**content[-1], "cache_control": {"type": "ephemeral"}}]
            return
