"""A chat app's messages into Arbor's nodes: the one builder every peer format's import uses (ChatGPT, Open WebUI,
LibreChat, Claude.ai, chatbot-ui).

A format says what each of its messages is (`read`: a question or a tool's output, which a node sends; an answer,
a call or thoughts, which a node receives; or nothing, for what a person never saw) and how its messages hang
together (children by parent). `tree_plan` walks that tree and builds nodes as turns made them (T3, T4): a question
or an output starts a node below the node its parent message ended in, and what the model said goes on that node.
Where that node has already gone on differently (a regenerated answer, an edited question), the message goes on a
sibling that repeats what came before it, so branches stay branches (T8).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from conversations import items as it
from conversations.models import Node, ToolStatus
from conversations.transfer.plan import (  # noqa: F401 - placeholder: the formats' readers take it from here
    ImportRefused,
    Plan,
    PlannedNode,
    check_count,
    check_graph,
    placeholder,
    text_field,
)

SENT, RECEIVED = "sent", "received"


@dataclass(frozen=True)
class Read:
    """What (a part of) one message is: SENT or RECEIVED items, or nothing (side None); with the custom
    instructions it held, if any."""

    side: str | None = None
    items: tuple = ()
    instructions: str = ""


@dataclass(frozen=True)
class At:
    """Where the conversation stands after a message: its node (None: before any), how many of that node's sent
    and received items were there then, and a tool call still waiting for its output."""

    node: Any = None
    sent: int = 0
    received: int = 0
    call: dict | None = None


def capped(text: str) -> str:
    """A text cut to what a node's item may hold, saying so (a long tool output must not refuse the file)."""
    limit = settings.ARBOR_MAX_CONTENT_CHARS
    return text if len(text) <= limit else f"{text[:limit - 40]}\n[cut at {limit - 40} characters]"


def one_or_many(document: Any, is_one: Callable[[Any], bool]) -> list | None:
    """A format's entries: the document if it is one, or a list holding some (the others are skipped when read);
    None if the document is no file of this format."""
    if is_one(document):
        return [document]
    if isinstance(document, list) and any(is_one(e) for e in document):
        return document
    return None


def children_by_parent(parents: dict[Any, Any]) -> dict[Any, list[Any]]:
    """Children by parent, in `parents`' order; a message whose parent is not in the file is a root (None)."""
    children: dict[Any, list[Any]] = {}
    for key, parent in parents.items():
        children.setdefault(parent if parent in parents else None, []).append(key)
    return children


@dataclass
class _Node:
    parent: Any
    sent: list
    received: list


class _Turns:
    def __init__(self) -> None:
        self.nodes: dict[str, _Node] = {}
        self.instructions: list[str] = []

    def _new(self, key: str, parent: Any, sent: list, received: list) -> str:
        while key in self.nodes:
            key += "'"
        self.nodes[key] = _Node(parent, sent, received)
        return key

    def _ends_at(self, at: At) -> bool:
        node = self.nodes.get(at.node)
        return node is not None and (len(node.sent), len(node.received)) == (at.sent, at.received)

    def add(self, key: str, reads: Sequence[Read], at: At) -> At:
        for read in reads:
            if read.instructions and read.instructions not in self.instructions:
                self.instructions.append(read.instructions)
            if read.side is not None and read.items:
                at = (self._receive if read.side == RECEIVED else self._send)(key, list(read.items), at)
        return at

    def _receive(self, key: str, items: list, at: At) -> At:
        if at.node is None:
            node = self._new(key, None, [], items)
        elif self._ends_at(at):
            node = at.node
            self.nodes[node].received += items
        else:
            base = self.nodes[at.node]
            node = self._new(key, base.parent, base.sent[:at.sent], [*base.received[:at.received], *items])
        calls = [i for i in items if i["type"] == "tool_call"]
        return At(node, at.sent, at.received + len(items), calls[-1] if calls else at.call)

    def _send(self, key: str, items: list, at: At) -> At:
        if at.call is not None and items[0]["type"] == "user":
            # The person went on while a call waited: it gets the result a stopped call gets (F1, C4).
            items.insert(0, it.tool_result(at.call["id"], at.call["name"], "not run: the conversation went on"))
        if (at.node is not None and at.received == 0 and self._ends_at(at)
                and all(i["type"] == "tool_result" for i in self.nodes[at.node].sent)):
            self.nodes[at.node].sent += items  # several outputs, or outputs and the person's next question
            return At(at.node, at.sent + len(items), 0, None)
        parent = at.node
        if parent is not None and not self._ends_at(at):  # the node went on past this point: a sibling ends here
            base = self.nodes[parent]
            parent = self._new(f"{key}<", base.parent, base.sent[:at.sent], base.received[:at.received])
        return At(self._new(key, parent, items, []), len(items), 0, None)


def tree_plan(*, children: dict[Any, list[Any]], read: Callable[[Any, At], Sequence[Read]], total: int,
              current: Any, title: Any, where: str, instructions: str = "") -> Plan:
    """The plan of one conversation: `children` by parent key (None: the roots), `read` what each message is
    (given where the conversation stands before it), `total` how many messages the file has (any not reached
    from a root is refused: a cycle), `current` the message the conversation was left at (else the newest node
    is the head)."""
    check_count(total)
    turns, states = _Turns(), {}
    stack: list[tuple[Any, At]] = [(key, At()) for key in reversed(children.get(None, []))]
    while stack:
        key, at = stack.pop()
        states[key] = at = turns.add(str(key), read(key, at), at)
        stack.extend((child, at) for child in reversed(children.get(key, [])))
    if len(states) != total:
        raise ImportRefused(f"{where}: some messages are not reachable from a root (a cycle).")
    head = states[current].node if current is not None and current in states else None
    if head is None and turns.nodes:
        head = next(reversed(turns.nodes))
    results: dict[Any, dict[str, it.Item]] = {}  # the outputs each node's calls got, from the nodes below it
    for node in turns.nodes.values():
        results.setdefault(node.parent, {}).update((r["call_id"], r) for r in node.sent if r["type"] == "tool_result")
    nodes = {key: _planned(key, node, results.get(key, {})) for key, node in turns.nodes.items()}
    plan = Plan(title=text_field(title if isinstance(title, str) else "", f"{where}.title", limit=200),
                model=settings.ARBOR_MODEL, head=head, nodes=nodes,
                instructions=capped("\n\n".join(x for x in (instructions, *turns.instructions) if x)))
    check_graph(plan)
    return plan


def _planned(key: str, node: _Node, results: dict[str, it.Item]) -> PlannedNode:
    """A node with what a person sees of it (T8): the question, the answer, each call with its output."""
    bubbles = []
    question = it.question_of(node.sent)
    if question is not None:
        bubbles.append({"role": "user", "content": question, "data": {}})
    answer = it.answer_text(node.received)
    if answer:
        bubbles.append({"role": "assistant", "content": answer, "data": {}})
    for call in it.tool_calls(node.received):
        result = results.get(call["id"]) or it.tool_result(call["id"], call["name"], "(the file holds no output)")
        bubbles.append({"role": "tool", "content": call["name"], "data": {
            "call_id": call["id"], "name": call["name"], "arguments": call["arguments"],
            "status": ToolStatus.ERROR if result["is_error"] else ToolStatus.DONE, "result": result["content"],
            "is_error": result["is_error"]}})
    return PlannedNode(key=key, parent=node.parent, bubbles=bubbles, fields={
        "kind": Node.Kind.TURN, "status": Node.Status.SUCCEEDED, "failure_reason": "", "failure_message": "",
        "sent": node.sent, "received": node.received, "provider": "", "model": "", "usage": {}, "instructions": "",
        "keep_ephemeral": False, "window_root": False, "tokens": 0, "finished_at": None,
    })
