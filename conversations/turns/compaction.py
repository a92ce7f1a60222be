"""Compaction (C1–C3): replace a long path by a short one that starts at a parentless node.

Called by the one turn runner between "load state" and "assemble" when the next call would pass the
threshold (R1), and by hand (`turns.start.turn_compact`). Not a second turn runner: it decides where two new
nodes go, and its model calls are recorded side calls (`turns.side_calls.run_side_call`), like titles.

Where the nodes go, and where the head moves:

- The *summarising call* is a node of kind `compaction` whose parent is the tip being compacted (the
  old head). It sends the compaction prompt (and the results of the tip's open tool calls, T4) and
  receives the summary; it is recorded, with its usage, like every call. It is never a head, never a
  branch tip, and nothing hangs below it, so it never appears in a turn's context.
- The *compaction root* (C2) has no parent, kind `compaction`, `compacted_from` = the tip (C3) and
  `summary_call` = the summarising call. Its `sent` is the compacted context: the summary item, then,
  verbatim, the last turns (`ARBOR_COMPACTION_KEEP_TURNS`) — whole turns, so a tool call is never
  split from its result and open calls stay with their turn. It is `succeeded` with nothing received.
  The next call's parent is the root, so assembly stops there; the instructions are not stored in it,
  every call sends the current ones.
- When the model cannot take the part before the kept turns in one call (a switch to a smaller model
  that must read the whole expanded history, C3), that part is summarised in windows, oldest first,
  each a recorded call that fits; each later window hangs below an intermediate compaction root
  holding the previous window's summary (see `_Summariser`). Nothing is ever sent over the limit: a
  single node too large for the model is refused (`CannotCompact`).
- `compact` never moves the head: it returns the root, and the caller moves the head through
  `services.head_move` like every move (the one head mover) — at once when the tip is the head
  (compaction by hand, or before a new question), otherwise (an edit's turn, a later round) at the
  turn's end, as always.
- T10 follows from where the root is: a question asked in a turn that compacted mid-turn (between two
  rounds) lies before that turn's root, so it cannot be edited or regenerated any more; the answer it
  got is below the root and is kept, and a new question can be asked.

If the summarising call fails (a provider error, or any other exception: failed/interrupted, or
cancelled when its turn is closed), its node is recorded as failed and nothing else changes: no root,
the head where it was. The turn runner tries once per turn.

A provider that answers with an opaque item of its own (arbor/echo) gets it back verbatim; any other
provider gets the original path expanded instead (`selectors.context_path`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from django.conf import settings
from django.utils import timezone

from config.errors import ArborError
from conversations import budget, llm
from conversations import items as it
from conversations.context import PathNode, assemble, is_compaction_root, path_items
from conversations.models import Conversation, Node
from conversations.selectors import opens_turn, path_node
from conversations.turns.side_calls import run_side_call
from files import attached

logger = logging.getLogger("arbor.compaction")

COMPACTION_PROMPT = (
    "Summarise the conversation above so it can go on from your summary alone; its last turns are kept "
    "word for word after it. List briefly: facts; decisions (and who took them); open questions; every "
    "number, name, date and query result that may be needed again. Give each point its source in "
    "brackets, e.g. [user, 3rd question] or [sql_query result]. Add nothing else."
)


class NothingToCompact(ArborError):
    code = "nothing_to_compact"
    status = 400


class SummaryFailed(Exception):
    """The summarising call failed, or was stopped (`error.reason` cancelled); its node is recorded, with any
    windows written before it (`written`), and nothing else changed."""

    def __init__(self, error: llm.LLMError, node_id: int, written: tuple[int, ...] = ()):
        super().__init__(error.message)
        self.error = error
        self.node_id = node_id
        self.written = written or (node_id,)


@dataclass(frozen=True)
class Compaction:
    root: PathNode
    summary_call: int
    written: tuple[int, ...] = ()  # every node written, oldest first: windows' calls and roots, the call, the root


def needed(path: list[PathNode], new_items: list[it.Item], *, model: str, provider: str | None,
           instructions: str, tools: list[dict] | None) -> bool:
    """C1: would the call below the last node of `path` pass the threshold of `model`'s budget?"""
    if not path:
        return False
    cost = budget.call_tokens(path, new_items, model=model, provider=provider, instructions=instructions,
                              tools=tools)
    return cost > budget.budget_for(model).threshold


def kept_from(path: list[PathNode], *, threshold: int) -> int:
    """Index of the first node kept verbatim: the start of the last turns, whole turns only.

    Fewer turns are kept when they alone would take more than half the threshold (a compaction that
    keeps everything would run again at once), but the last turn always stays. A turn that opens with
    the results of an earlier turn's calls pulls that turn in too, so no pair is split.
    """
    openers = [i for i, p in enumerate(path) if opens_turn(p)]
    if not openers:
        return len(path)
    keep = max(1, settings.ARBOR_COMPACTION_KEEP_TURNS)
    chosen = max(0, len(openers) - keep)
    total = path[-1].path_tokens

    def tokens_from(i: int) -> int:
        return total - (path[i - 1].path_tokens if i else 0)

    while chosen < len(openers) - 1 and tokens_from(openers[chosen]) > threshold // 2:
        chosen += 1
    while chosen > 0 and any(item.get("type") == "tool_result" for item in path[openers[chosen]].sent):
        chosen -= 1
    start = openers[chosen]
    if chosen == 0 and any(item.get("type") == "tool_result" for item in path[start].sent):
        return 0
    return start


def compact(*, conversation: Conversation, path: list[PathNode], model: str, instructions: str,
            pending_results: Sequence[it.Item] = (), keep_ephemeral: bool = False,
            stop_requested: Callable[[], bool] | None = None) -> Compaction:
    """Summarise `path` with `model` and start a new path at a compaction root (C2, C3); the head does
    not move (the caller moves it).

    `path` is what a call to `model` assembles from (already expanded for its provider). `keep_ephemeral`
    is the conversation's
    retrieval policy (R2): kept retrieved items are summarised and kept like any others. Raise
    `NothingToCompact` (nothing written) when everything on it would be kept verbatim anyway,
    `SummaryFailed` (the failed summarising call recorded) when the model fails, and `CannotCompact`
    when a single node is too large to summarise within the model's limit (no call is sent that would
    exceed it). `stop_requested` is asked while each summarising call streams or is silent: a stop ends the
    call at once, as `SummaryFailed` with a cancelled error.
    """
    provider = llm.provider_of(model)
    limits = budget.budget_for(model)
    start = kept_from(path, threshold=limits.threshold)
    if all(is_compaction_root(p) for p in path[:start]):
        raise NothingToCompact("Nothing to compact yet: the last turns are always kept word for word, and "
                               "there is nothing before them.")
    summariser = _Summariser(conversation=conversation, model=model, provider=provider, instructions=instructions,
                             allowed=limits.allowed, keep_ephemeral=keep_ephemeral, stop_requested=stop_requested)
    call, received = summariser.run(path, start, pending_results)
    root = _create_root(conversation=conversation, call=call, compacted_from=path[-1].id, model=model,
                        provider=provider, kept=path_items(path[start:], keep_ephemeral=keep_ephemeral),
                        received=received, keep_ephemeral=keep_ephemeral)
    return Compaction(root=root, summary_call=call.pk, written=(*summariser.written, root.id))


class CannotCompact(ArborError):
    code = "cannot_compact"
    status = 400


@dataclass
class _Summariser:
    """Where the summarising calls hang and what each sends; every call checked against `allowed` first.

    Below the tip, normally: its context is then the prefix the conversation's last call already sent
    (cheap with prompt caches) and the summary sees the kept turns as context. When that would not fit,
    the part before the kept turns is summarised instead (the kept turns stay verbatim anyway) — in
    *windows* when even that does not fit, e.g. after a switch to a model with a smaller limit that must
    read the whole expanded history (C3): the first window's call hangs below the window's last node; each
    later one hangs below an intermediate compaction root holding the previous window's summary (made
    from that window's last node, C3) and sends its own window's items, then the prompt. Every window is
    a recorded call whose context ("what the model saw") is exactly what it was sent, and its summary is
    carried into the next, oldest first; the last window's summary goes into the real root.
    """

    conversation: Conversation
    model: str
    provider: str
    instructions: str
    allowed: int
    keep_ephemeral: bool = False
    stop_requested: Callable[[], bool] | None = None
    written: list[int] = field(default_factory=list)

    def run(self, path: list[PathNode], start: int, pending_results: Sequence[it.Item]
            ) -> tuple[Node, list[it.Item]]:
        prompt = [it.user(COMPACTION_PROMPT)]
        with_results = [*pending_results, *prompt]
        messages = self._messages(path, with_results)
        if self._fits(messages):
            return self._call(path[-1], with_results, messages)
        carried: PathNode | None = None  # the intermediate root holding the previous window's summary
        costs = [budget.items_tokens(self._items([p]), model=self.model, provider=self.provider)
                 for p in path[:start]]
        begin = 0
        while True:
            end = self._window_end(path, costs, begin, start, carried, prompt)
            if carried is None:
                sent, parent, messages = prompt, path[end - 1], self._messages(path[:end], prompt)
            else:
                sent = [*self._items(path[begin:end]), *prompt]
                parent, messages = carried, self._messages([carried], sent)
            call, received = self._call(parent, sent, messages)
            if end == start:
                return call, received
            carried = _create_root(conversation=self.conversation, call=call, compacted_from=path[end - 1].id,
                                   model=self.model, provider=self.provider, kept=[], received=received,
                                   keep_ephemeral=self.keep_ephemeral, window=True)
            self.written.append(carried.id)
            begin = end

    def _window_end(self, path: list[PathNode], costs: list[int], begin: int, start: int,
                    carried: PathNode | None, prompt: list[it.Item]) -> int:
        """The end of the longest window from `begin` that fits; a cut where no tool result follows, if
        one fits, so no call is split from its result (T4, T6)."""
        fixed = self._count(self._messages([carried] if carried else [], prompt))
        end, total = begin, fixed
        while end < start and total + costs[end] <= self.allowed:
            total += costs[end]
            end += 1
        while end > begin:
            clean = [e for e in range(end, begin, -1) if e == start or not _sends_results(path[e])]
            candidate = clean[0] if clean else end
            window = path[:candidate] if carried is None else [carried]
            sent = prompt if carried is None else [*self._items(path[begin:candidate]), *prompt]
            if self._fits(self._messages(window, sent)):
                return candidate
            end = candidate - 1
        raise CannotCompact(f"Node {path[begin].id} alone is more than {self.model} accepts ({self.allowed} "
                            "tokens with the summary before it); it cannot be summarised by this model.")

    def _items(self, path: Sequence[PathNode]) -> list[it.Item]:
        return path_items(path, keep_ephemeral=self.keep_ephemeral)

    def _messages(self, path: Sequence[PathNode], sent: list[it.Item]) -> list[dict]:
        """What the summary call reads: the path as its calls got it, its questions' files included (X1), so what
        a document said survives into the summary."""
        return assemble(path, sent, instructions=self.instructions, provider=self.provider,
                        keep_ephemeral=self.keep_ephemeral,
                        # A large document's parts by words, as "what the model saw" shows this call's (R2).
                        attached=attached.contents(self.conversation.owner_id, path, sent, recorded={}))

    def _count(self, messages: list[dict]) -> int:
        return llm.count_tokens(self.model, messages)

    def _fits(self, messages: list[dict]) -> bool:
        return self._count(messages) <= self.allowed

    def _call(self, parent: PathNode, sent: list[it.Item], messages: list[dict]) -> tuple[Node, list[it.Item]]:
        call = run_side_call(conversation=self.conversation, parent=parent, kind=Node.Kind.COMPACTION, sent=sent,
                             messages=messages, model=self.model, instructions=self.instructions,
                             keep_ephemeral=self.keep_ephemeral, stop_requested=self.stop_requested,
                             compaction=True)
        self.written.append(call.node.pk)
        if call.result is None:
            error = call.error
            logger.warning("the summarising call %s failed (%s): %s", call.node.pk, error.reason, error.message)
            raise SummaryFailed(error, call.node.pk, tuple(self.written))
        return call.node, call.result.received


def _sends_results(node: PathNode) -> bool:
    return any(item.get("type") == "tool_result" for item in node.sent)


def summary_item(received: list[it.Item]) -> it.Item:
    """The provider's own opaque compaction result if it sent one (C3), else the summary text."""
    opaque = next((i for i in received if i.get("type") == "summary" and i.get("provider")), None)
    return opaque or it.summary(it.answer_text(received))


def _create_root(*, conversation: Conversation, call: Node, compacted_from: int, model: str, provider: str,
                 kept: list[it.Item], received: list[it.Item], keep_ephemeral: bool,
                 window: bool = False) -> PathNode:
    sent = [summary_item(received), *kept]
    tokens = budget.items_tokens(sent, model=model, provider=provider)
    root = Node.objects.create(
        parent=None, conversation=conversation, owner_id=conversation.owner_id, kind=Node.Kind.COMPACTION,
        status=Node.Status.SUCCEEDED,
        sent=sent, provider=provider, model=model, instructions=call.instructions,
        compacted_from_id=compacted_from, summary_call=call, tokens=tokens, path_tokens=tokens,
        keep_ephemeral=keep_ephemeral, window_root=window, finished_at=timezone.now(),
    )
    return path_node(root)
