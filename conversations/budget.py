"""The budget (C1): how many input tokens a call may use, and what a path and new items cost.

The limit is the model's *input* limit (litellm's model info, or a setting), never its context window;
a reserve is kept free for the answer; compaction runs before a call that would pass the threshold, a
share of what is left. Every node stores its own count and its path's (`Node.tokens`,
`Node.path_tokens`), so the check before a call costs O(new items), not O(path).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.conf import settings

from conversations import items as it
from conversations import llm
from conversations.context import PathNode, to_messages


@dataclass(frozen=True)
class Budget:
    limit: int  # the model's max input tokens
    reserve: int  # kept free for the answer
    threshold: int  # compaction runs before a call that would pass this

    @property
    def allowed(self) -> int:
        return self.limit - self.reserve


def budget_for(model: str) -> Budget:
    """Read at call time: settings may change between calls (and do, in tests).

    The reserve is what every call sends as `max_tokens` (`llm.answer_reserve`): the model's output limit,
    capped by `ARBOR_ANSWER_RESERVE_TOKENS` and by a quarter of the input limit.
    """
    limit = llm.max_input_tokens(model)
    reserve = llm.answer_reserve(model)
    return Budget(limit=limit, reserve=reserve, threshold=int((limit - reserve) * settings.ARBOR_COMPACTION_THRESHOLD))


def items_tokens(items: Sequence[it.Item], *, model: str, provider: str | None) -> int:
    """What `items` cost as messages for `model`: a node's own count, its questions' files included (X1, C1)."""
    return llm.count_tokens(model, to_messages(items, provider=provider)) + files_tokens(items) if items else 0


def files_tokens(items: Sequence[it.Item]) -> int:
    """What the files `items`' questions refer to add to a call: each reference's estimate, made once when it
    was attached (`files.services.files_to_send`), so no file is read to count a path."""
    return sum(ref.get("tokens", 0) for item in items if item.get("type") == "user" for ref in item.get("files", ()))


def node_tokens(sent: Sequence[it.Item], received: Sequence[it.Item], *, model: str) -> int:
    """A node's own count as a turn stores it: what it sent, then what it received, counted for `model`. An
    import and a recount after a model switch count with this (a file's counts may be missing or made for
    another model, and a count of 0 would keep a long conversation from ever compacting)."""
    provider = llm.provider_of(model)
    return items_tokens(sent, model=model, provider=provider) + items_tokens(received, model=model, provider=provider)


def call_tokens(path: Sequence[PathNode], new_items: Sequence[it.Item], *, model: str, provider: str | None,
                instructions: str = "", tools: list[dict] | None = None) -> int:
    """The input of a call below the last node of `path`: the path's stored count plus what is new."""
    messages = to_messages(new_items, provider=provider)
    if instructions:
        messages.insert(0, {"role": "system", "content": instructions})
    return (path[-1].path_tokens if path else 0) + llm.count_tokens(model, messages, tools) + files_tokens(new_items)
