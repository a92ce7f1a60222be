"""Chat Completions on the tree (issue 17): a request carries the whole message list; Arbor finds the longest
stored path of the caller's conversations that the list extends, hangs the new call below it, and records only
what is new. Resending a list with an earlier message edited therefore makes a branch where the edit is, not a
copy of the conversation.

The list is read as turns: the messages a call sent (user and tool messages) and the assistant message it got
back. The last turn has no answer yet: it is the new call. Turns past the longest match that already have their
answer are calls the client made elsewhere (an edited list's later answers): they are recorded as they were
(`records.record_supplied`) before the new call hangs below them. System and developer messages are the call's
instructions.
"""

from __future__ import annotations

import heapq
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.db.models.fields.json import KT
from django.db.models.functions import Left

from config.errors import BadInput, NotFound, TooLarge
from conversations import items as it
from conversations.models import QUESTION_OPENING_CHARS, Conversation, Node
from conversations.openai.parts import user_content
from conversations.openai.shapes import cut_short, instructions_text


@dataclass
class ListedTurn:
    sent: list[it.Item] = field(default_factory=list)
    received: list[it.Item] | None = None  # None: the new call


def _text(content: Any, where: str) -> str:
    text = _parts_text(content, where)
    if len(text) > settings.ARBOR_MAX_CONTENT_CHARS:
        raise TooLarge(f"{where}: longer than {settings.ARBOR_MAX_CONTENT_CHARS} characters.")
    return text


def _question(message: dict, where: str) -> it.Item:
    """A user message as the question it is: its text and the files its parts carry (pending, X1)."""
    text, files = user_content(message.get("content"), where)
    if len(text) > settings.ARBOR_MAX_CONTENT_CHARS:
        raise TooLarge(f"{where}: longer than {settings.ARBOR_MAX_CONTENT_CHARS} characters.")
    return it.user(text, files)


def _parts_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for index, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise BadInput(f"{where}.content[{index}]: only text parts are read by this server.")
            parts.append(part["text"])
        return "\n".join(parts)
    raise BadInput(f"{where}.content: expected text or a list of text parts.")


def _reasoning(message: dict, where: str, provider: str | None) -> list[it.Item]:
    """An assistant message's thinking (Anthropic's `thinking_blocks`), kept verbatim as the answer's reasoning
    for the provider the call goes to (C4)."""
    blocks = message.get("thinking_blocks")
    if blocks is None:
        return []
    if not (isinstance(blocks, list) and all(isinstance(b, dict) for b in blocks)):
        raise BadInput(f"{where}.thinking_blocks: expected a list of thinking blocks.")
    if len(json.dumps(blocks)) > settings.ARBOR_MAX_CONTENT_CHARS:
        raise TooLarge(f"{where}: thinking longer than {settings.ARBOR_MAX_CONTENT_CHARS} characters.")
    return [{"type": "reasoning", "provider": provider or "",
             "text": "".join(str(b.get("thinking", "")) for b in blocks), "data": blocks}] if blocks else []


def _calls(tool_calls: Any, where: str) -> list[it.Item]:
    if not isinstance(tool_calls, list):
        raise BadInput(f"{where}.tool_calls: expected a list.")
    calls = []
    for index, call in enumerate(tool_calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(call.get("id"), str) or not isinstance(
                function.get("name"), str):
            raise BadInput(f"{where}.tool_calls[{index}]: expected an id and a function with a name.")
        arguments = function.get("arguments")
        arguments = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
        if len(arguments) > settings.ARBOR_MAX_CONTENT_CHARS:
            raise TooLarge(f"{where}.tool_calls[{index}]: arguments longer than {settings.ARBOR_MAX_CONTENT_CHARS}.")
        calls.append(it.tool_call(call["id"], function["name"], arguments, client=True))
    return calls


def _answer(message: dict, where: str, reasoning_provider: str | None) -> list[it.Item]:
    """An assistant message's items: its thinking, its text and its tool calls."""
    text = _text(message.get("content"), where)
    return [*_reasoning(message, where, reasoning_provider), *([it.text(text)] if text else []),
            *_calls(message.get("tool_calls") or [], where)]


def read_messages(messages: Any, *, field: str = "messages", positions: list[int] | None = None,
                  reasoning_provider: str | None = None) -> tuple[str | None, list[ListedTurn]]:
    """The call's instructions (system and developer messages) and the list's turns, the last one new. Errors
    name the message as `field[i]`, i its place in the request (`positions`, where messages were read from
    another list)."""
    if not isinstance(messages, list) or not messages:
        raise BadInput("`messages` must be a non-empty list.", param="messages")
    instructions: list[str] = []
    turns = [ListedTurn()]
    calls: dict[str, str] = {}  # call id -> tool name, for the tool messages that answer them
    for index, message in enumerate(messages):
        where = f"{field}[{positions[index] if positions else index}]"
        role = message.get("role") if isinstance(message, dict) else None
        if role in ("system", "developer"):
            instructions.append(_text(message.get("content"), where))
        elif role == "user":
            if turns[-1].received is not None:
                turns.append(ListedTurn())
            turns[-1].sent.append(_question(message, where))
        elif role == "tool":
            if turns[-1].received is not None:
                turns.append(ListedTurn())
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or call_id not in calls:
                raise BadInput(f"{where}.tool_call_id: {call_id!r} answers no tool call before it.")
            turns[-1].sent.append(it.tool_result(call_id, calls[call_id], _text(message.get("content"), where),
                                                 is_error=message.get("is_error") is True))  # Anthropic's flag
        elif role == "assistant":
            if not turns[-1].sent or turns[-1].received is not None:
                raise BadInput(f"{where}: an assistant message answers the messages before it; two in a row, or "
                               "one first, is not a call this server can store.")
            turns[-1].received = _answer(message, where, reasoning_provider)
            calls.update({c["id"]: c["name"] for c in it.tool_calls(turns[-1].received)})
        else:
            raise BadInput(f"{where}.role: expected system, developer, user, assistant or tool.")
    if turns[-1].received is not None or not turns[-1].sent:
        raise BadInput("The last message must be the user's (or the results of the tools called): it is what "
                       "the model answers.", param="messages")
    return instructions_text("\n\n".join(instructions), "messages (system)"), turns


def _same_sent(stored: list[it.Item], listed: list[it.Item]) -> bool:
    def key(items):  # a question's files by their bytes: the same words with another picture are another question
        return [(i["type"], i.get("text"), i.get("call_id"), i.get("content"),
                 [ref.get("sha256") or ref.get("id") for ref in i.get("files", ())]) for i in items
                if i.get("type") in ("user", "system", "tool_result") and not i.get("ephemeral")]
    return key(stored) == key(listed)


def _same_received(stored: list[it.Item], listed: list[it.Item]) -> bool:
    def key(items):
        return (it.answer_text(items).strip(), [(c["id"], c["name"], c["arguments"]) for c in it.tool_calls(items)])
    return key(stored) == key(listed)


def _next_calls(node: Node):
    """The calls that followed `node` in its conversation: its children, and the first calls below a compaction
    root that replaced it (C3: the list goes on through a compaction, the stored path does too)."""
    below_root = Q(parent__kind=Node.Kind.COMPACTION, parent__compacted_from=node, parent__parent__isnull=True,
                   parent__window_root=False)
    return Node.objects.filter(Q(parent=node) | below_root, conversation_id=node.conversation_id,
                               kind=Node.Kind.TURN, status=Node.Status.SUCCEEDED).order_by("-id")


@dataclass
class Match:
    conversation: Conversation | None
    node: Node | None  # the deepest stored call the list extends; None: none (a new root)
    matched: int  # how many of the list's turns it covers


def _candidate_roots(user, conversation: Conversation | None, *, first: it.Item) -> Iterator[Node]:
    """The roots a list's first call may be, newest first, each once. For a first question, only the roots that
    asked the same (by the index `node_roots_by_question` of their first question's opening) and those of
    conversations with retrieval on, which put their found items first (R2): indexed reads, however many other
    conversations the person has (issue 34). A root both reads find (retrieval turned on meanwhile) comes once."""
    roots = Node.objects.filter(owner=user, conversation__owner=user, parent__isnull=True, kind=Node.Kind.TURN,
                                status=Node.Status.SUCCEEDED).select_related("conversation").order_by("-id")
    if conversation is not None:
        roots = roots.filter(conversation=conversation)
    if first["type"] != "user":
        return roots.iterator(chunk_size=200)
    asked = (roots.alias(opening=Left(KT("sent__0__text"), QUESTION_OPENING_CHARS))
             .filter(opening=first["text"][:QUESTION_OPENING_CHARS], sent__0__text=first["text"]))
    retrieving = Conversation.objects.filter(owner=user, retrieval=True)  # by `conversation_with_retrieval`
    if conversation is not None:
        retrieving = retrieving.filter(pk=conversation.pk)
    ids = list(retrieving.order_by().values_list("pk", flat=True))
    if not ids:
        return asked.iterator(chunk_size=200)
    merged = heapq.merge(asked.iterator(chunk_size=200), roots.filter(conversation__in=ids).iterator(chunk_size=200),
                         key=lambda n: -n.pk)
    return (next(same) for _, same in itertools.groupby(merged, key=lambda n: n.pk))


def longest_match(*, user, turns: list[ListedTurn], conversation: Conversation | None) -> Match:
    """The stored path of the caller's conversations (or of `conversation`) that the list's answered turns
    extend furthest: the roots it may start at (`_candidate_roots`), then one query a level below."""
    answered = [t for t in turns if t.received is not None]
    best = Match(conversation=conversation, node=None, matched=0)
    if not answered:
        return best
    for root in _candidate_roots(user, conversation, first=answered[0].sent[0]):
        if not (_same_sent(root.sent, answered[0].sent) and _same_received(root.received, answered[0].received)):
            continue
        node, depth = root, 1
        while depth < len(answered):
            below = next((child for child in _next_calls(node)
                          if _same_sent(child.sent, answered[depth].sent)
                          and _same_received(child.received, answered[depth].received)), None)
            if below is None:
                break
            node, depth = below, depth + 1
        if depth > best.matched:
            best = Match(conversation=root.conversation, node=node, matched=depth)
        if depth == len(answered):
            break
    return best


def named_conversation(*, user, request, body: dict) -> Conversation | None:
    """The conversation a caller names (`X-Arbor-Conversation` or `metadata.conversation`), if it does."""
    metadata = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
    name = request.headers.get("X-Arbor-Conversation") or metadata.get("conversation")
    if name is None:
        return None
    if not isinstance(name, str) or not name.isdigit():
        raise BadInput("The conversation is named by its id (digits).", param="metadata.conversation")
    found = Conversation.objects.filter(pk=int(name), owner=user).first() if len(name) < 19 else None
    if found is None:
        raise NotFound(f"No conversation {name}.")
    return found


def finish_reason(node: Node, *, calls: bool) -> str:
    return "tool_calls" if calls else "length" if cut_short(node) else "stop"


def completion_of(node: Node, *, model: str) -> dict[str, Any]:
    """The ChatCompletion of the call `node` made."""
    calls = it.tool_calls(node.received)
    message: dict[str, Any] = {"role": "assistant", "content": it.answer_text(node.received) or None,
                               "refusal": None}
    if calls:
        message["tool_calls"] = [{"id": c["id"], "type": "function",
                                  "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]
    usage = node.usage or {}
    return {"id": f"chatcmpl-{node.pk}", "object": "chat.completion", "created": int(node.created_at.timestamp()),
            "model": model, "choices": [{"index": 0, "message": message, "logprobs": None,
                                         "finish_reason": finish_reason(node, calls=bool(calls))}],
            "usage": {"prompt_tokens": usage.get("prompt_tokens", 0),
                      "completion_tokens": usage.get("completion_tokens", 0),
                      "total_tokens": usage.get("total_tokens", 0)}}
