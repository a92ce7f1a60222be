"""A small tree builder for tests: nodes as the runner would leave them, without calling a model.

    tree = TreeBuilder(conversation)
    q1 = tree.turn("q1", "a1")                       # below the head's tip so far (or `parent=`)
    broken = tree.turn("q2", fail="provider_error")  # a failed call keeps its sent items (F1)
    root = tree.compaction(of=q1)                    # a parentless root pointing at its original (C2, C3)
    tree.move_head(q1)

Nodes go through the one recorder's `start` (token counts and path tokens as a real call leaves them).
"""

from __future__ import annotations

from conversations import items as it
from conversations import services
from conversations.models import Conversation, Node
from conversations.selectors import path_node
from conversations.turns import records


class TreeBuilder:
    def __init__(self, conversation: Conversation, *, model: str = "arbor/echo"):
        self.conversation = conversation
        self.model = model
        self.tip: Node | None = None

    def node(self, *, sent: list, received: list | None = None, parent: Node | None = None, kind: str = "turn",
             fail: str = "") -> Node:
        """A call below `parent` (default: the last node built), succeeded with `received` or failed with `fail`."""
        parent = parent if parent is not None else self.tip
        node = records.start(conversation=self.conversation, parent=path_node(parent) if parent else None,
                             kind=kind, sent=sent, model=self.model)
        if fail:
            node.status, node.failure_reason, node.failure_message = Node.Status.FAILED, fail, f"{fail} (built)"
        else:
            node.status = Node.Status.SUCCEEDED
        node.received = received or []
        node.save()
        self.tip = node
        return node

    def turn(self, question: str, answer: str = "", **options) -> Node:
        answer = answer or ("" if options.get("fail") else f"answer to {question}")
        return self.node(sent=[it.user(question)], received=[it.text(answer)] if answer else [], **options)

    def chain(self, length: int, *, parent: Node | None = None) -> list[Node]:
        """`length` turns q0/a0, q1/a1, … one below the other."""
        if parent is not None:
            self.tip = parent
        return [self.turn(f"q{i}", f"a{i}") for i in range(length)]

    def compaction(self, *, of: Node, summary: str = "summary of the conversation so far") -> Node:
        """A compaction root (C2) whose original is `of` (C3); the tip moves to it."""
        root = Node.objects.create(kind=Node.Kind.COMPACTION, status=Node.Status.SUCCEEDED,
                                   conversation=self.conversation, compacted_from=of, sent=[it.system(summary)])
        self.tip = root
        return root

    def move_head(self, node: Node | None = None) -> Node | None:
        node = node if node is not None else self.tip
        services.head_move(conversation=self.conversation, to=node.pk if node else None)
        return node
