"""The one turn runner (R1).

Every way of asking the model something (`start.py`: a new question, an edit, a regenerate, a retry, a
turn resumed after an approval) first decides *where the new node's parent is*, then hands over to
`Turn.events`, which runs the rounds:

    check ownership -> load state -> compact if needed -> gather instructions -> assemble -> call the
    model, streaming -> keep what came back -> write node, head, bubbles and jobs together (one statement
    on PostgreSQL: `config.together`).

Loading the state expands a compaction root the conversation's model cannot read (C3,
`selectors.context_path`); before each round's call, `turns.compaction` runs when the call
would pass the budget's threshold (C1, C2). `Turn.events` is a generator of `TurnEvent`s; closing it (a
stop) ends the turn as failed/cancelled. A client that goes away does not close it: `turns.detached`
runs a turn apart from its clients. Every node is written by the one
recorder (`records.py`); the head moves only through `services.head_move`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Generator, Iterable, Iterator

from django.conf import settings

from config.db import release_connection
from config.together import Together, Written, together
from conversations import items as it
from conversations import llm, services
from conversations.context import PathNode, assemble
from conversations.locks import TurnLock
from conversations.models import Conversation, Node
from conversations.selectors import context_path, instructions_for, path_node, tool_servers_of
from conversations.turns import calls, compaction, records
from conversations.turns.events import ENDINGS, EventType, TurnEvent
from conversations.turns.model_call import ModelCall
from conversations.turns.retrieval import retrieved_items
from conversations.turns.tool_policy import ArborTools, CallerTools, RoundEnd, ServerTools
from files import attached
from files.knowledge import knowledge_items


class Turn:
    """A turn whose lock is held and whose starting point is decided. Run it with `events()`, once."""

    def __init__(self, *, conversation: Conversation, lock: TurnLock, path: list[PathNode],
                 new_items: list[it.Item], instructions: str | None = None,
                 tools: list[dict] | ServerTools | None = None,
                 model: str | None = None, call_options: dict | None = None, written_before: Iterable[int] = ()):
        self.conversation = conversation
        self.lock = lock
        self.new_items = new_items
        self.nodes: list[int] = []
        # Nodes recorded for this turn before it began (a /v1 list's earlier answers): its jobs look at them too.
        self.written_before = list(written_before)
        self.recorded: dict[int, Node] = {}  # the nodes of `nodes` this turn wrote, as it wrote them (its answer)
        self._first_call: int | None = None  # this turn's first call's node: what its later rounds name
        self.model = model or conversation.effective_model  # a gateway call names its own
        self.provider = llm.provider_of(self.model)
        # A caller of the OpenAI-compatible surface sends its own instructions and tools with each call, or names
        # MCP servers of Arbor's (`ServerTools`), and Arbor's own tools stay out of it; everyone else's turns use
        # the conversation's and Arbor's.
        self.instructions = (instructions if instructions is not None
                             else instructions_for(conversation, owner_instructions=lock.owner_instructions,
                                                   project_instructions=lock.project_instructions))
        self.tools = (ArborTools(servers=tool_servers_of(conversation)) if tools is None
                      else CallerTools(tools) if isinstance(tools, list) else tools)
        self.call_options = call_options or {}  # a gateway call's own (temperature, tool_choice, …), every round
        question = it.question_of(new_items)
        if conversation.retrieval and question:  # R2: for this call; later ones drop them unless kept
            self.new_items = [*retrieved_items(conversation, question), *self.new_items]
        if conversation.project_id is not None and question and tools is None:  # X2: the project's files, R2 too
            self.new_items = [*knowledge_items(project_id=conversation.project_id, owner_id=conversation.owner_id,
                                               question=question), *self.new_items]
        self._path = path  # up to the first node's parent; each round's node is appended
        tip = path[-1] if path else None
        # Calls still needing results (a caller of the OpenAI-compatible surface sends them itself).
        self._open: PathNode | None = tip if self.tools.runs_calls and calls.open_calls(tip) else None
        self._pending: Node | None = None  # the node whose call is under way
        self._started = False
        self._summary_failed = False  # a failed summary is not tried again in the same turn
        # Asked while a call streams or is silent (turns.detached sets it: a stop asked through the database).
        self.stop_requested: Callable[[], bool] = lambda: False
        # Issue 33: a turn asked of several models at once (`siblings.py`) holds the lock as a group, which gives
        # it back when the last branch ends; only its first model's branch moves the head.
        self.gives_back_lock = True
        self.moves_head = True
        lock.hand_over()  # from here this turn is the lock's one owner: its `events()` gives it back

    # --- a group's one compaction (issue 33) ---------------------------------------------------------

    def would_compact(self) -> bool:
        """C1: whether this turn's first call would pass its model's threshold."""
        path = context_path(self._path, self.provider, owner=self.conversation.owner_id)
        return compaction.needed(path, self.new_items, model=self.model,
                                 provider=self.provider, instructions=self.instructions,
                                 tools=self.tools.offered(last_round=False))

    def compact_first(self) -> compaction.Compaction | None:
        """C1, C2 before the turn begins, its starting point then being the new root (`siblings.py`: several
        models asked at once compact once, so their answers stay siblings below one root). None when there was
        nothing to compact, or it could not be made (then `summary_failed`; a failed summary is recorded); a stop
        during the summary raises its `SummaryFailed`."""
        path = context_path(self._path, self.provider, owner=self.conversation.owner_id)
        try:
            done = compaction.compact(conversation=self.conversation, path=path, model=self.model,
                                      instructions=self.instructions, keep_ephemeral=self.conversation.keep_retrieved,
                                      stop_requested=self.stop_requested)
        except compaction.NothingToCompact:
            return None
        except compaction.CannotCompact:
            self._summary_failed = True
            return None
        except compaction.SummaryFailed as failed:
            self.nodes.extend(failed.written)
            if failed.error.reason == Node.FailureReason.CANCELLED:
                raise
            self._summary_failed = True
            return None
        self.nodes.extend(done.written)
        return done

    @property
    def summary_failed(self) -> bool:
        return self._summary_failed

    def stopped_before_call(self, error: llm.LLMError) -> TurnEvent:
        """End the turn before its first call (a group's summary was stopped): its question is kept on a node of
        its own, stopped (F1), as a single turn's is when its summary is."""
        self._start_node(parent=self._path[-1] if self._path else None, sent=self.new_items)
        self.new_items = []
        return self._fail(llm.LLMError(error.reason, error.message))

    def starts_below(self, root: PathNode) -> None:
        """Go on from a compaction root made before the turn began (`compact_first`); no later round compacts
        again within the same turn unless its own call needs it."""
        self._path = [root]

    def skip_compaction(self) -> None:
        self._summary_failed = True

    # --- running ---------------------------------------------------------------------------------------

    def events(self) -> Iterator[TurnEvent]:
        if self._started:
            return  # a turn runs once
        self._started = True
        rounds = self._rounds()
        with self.lock if self.gives_back_lock else contextlib.nullcontext():
            try:
                for event in rounds:
                    if event.type in ENDINGS and self.gives_back_lock:
                        # Committed: give the conversation back before saying so, or a client that asks
                        # again the moment it reads this event would find its own turn still holding it.
                        self.lock.release()
                    yield event
            except GeneratorExit:
                rounds.close()  # a call under way is closed and keeps what it had received
                self._fail(llm.LLMError("cancelled", "stopped by the user"))
                raise
            except BaseException as error:
                self._fail(llm.LLMError("interrupted", f"the turn stopped: {error!r}"))
                raise

    # --- the rounds ------------------------------------------------------------------------------------

    def _rounds(self) -> Iterator[TurnEvent]:
        max_rounds = max(1, settings.ARBOR_MAX_ROUNDS_PER_TURN)
        # Read once, when the turn began (T5): later rounds append their own node. C3: expanded when
        # this model cannot read the compaction result the path starts with.
        path = context_path(self._path, self.provider, owner=self.conversation.owner_id)
        for round_number in range(1, max_rounds + 1):
            path, ended = yield from self._round(path, last_round=round_number == max_rounds)
            if ended:
                return
        # The last round offered no tools, yet the model asked for some.
        yield self._fail(llm.LLMError("round_limit", f"the model still asked for tools after {max_rounds} "
                                      "rounds; those calls were not run"))

    def _round(self, path: list[PathNode], *, last_round: bool
               ) -> Generator[TurnEvent, None, tuple[list[PathNode], bool]]:
        """One model call and what follows it; return the path for the next round and whether the turn ended."""
        tools = self.tools.offered(last_round=last_round)
        path, node, messages = yield from self._before_call(path, tools)
        if node is None:
            return path, True
        result = yield from self._call_model(node, messages, tools)
        if result is None:
            return path, True
        return (yield from self._after_call(path, node, result, last_round=last_round))

    def _before_call(self, path: list[PathNode], tools: list[dict] | None
                     ) -> Generator[TurnEvent, None, tuple[list[PathNode], Node | None, list[dict]]]:
        """The round's sent items (the open calls' results first), a compaction if the call needs one, and its
        pending node; None for the node when a stop ended the turn meanwhile."""
        # A call the new items answer already (a caller's function call, before it names MCP servers: issue 32)
        # gets no second result.
        answered = {item["call_id"] for item in self.new_items if item.get("type") == "tool_result"}
        sent = [*(calls.resolve(self._open, run=True, stop_requested=self.stop_requested,
                                owner_id=self.conversation.owner_id, allowed=self.tools.allows,
                                conversation_id=self.conversation.pk, answered=answered) if self._open else []),
                *self.new_items]
        self.new_items = []
        try:
            path, compacted = self._compact_if_needed(path, sent, tools)
        except compaction.SummaryFailed as stopped:  # a stop during the summary: the question is kept, stopped
            self._start_node(parent=path[-1] if path else None, sent=sent)
            # The question's own call never began: the summary's text is the summary node's, not its answer.
            yield self._fail(llm.LLMError(stopped.error.reason, stopped.error.message))
            return path, None, []
        files = attached.contents(self.conversation.owner_id, path, sent)
        messages = assemble(path, sent, instructions=self.instructions, provider=self.provider,
                            keep_ephemeral=self.conversation.keep_retrieved, attached=files)
        node = self._start_node(parent=path[-1] if path else None, sent=sent, call_settings=llm.wire_settings(
            self.model, messages, tools=tools, options=self.call_options), file_parts=attached.parts_chosen(files))
        if compacted:
            yield TurnEvent(EventType.COMPACTION, {"node": compacted.root.id, "summary_call": compacted.summary_call,
                                                   "compacted_from": compacted.root.compacted_from_id})
        for item in sent:
            if item.get("type") == "tool_result":
                yield TurnEvent(EventType.TOOL_RESULT, {"call_id": item["call_id"], "name": item["name"],
                                                        "content": item["content"], "is_error": item["is_error"]})
        return path, node, messages

    def _after_call(self, path: list[PathNode], node: Node, result: llm.CallResult, *, last_round: bool
                    ) -> Generator[TurnEvent, None, tuple[list[PathNode], bool]]:
        """Record the answer and decide by the tool policy whether the turn ends here (T4, F3)."""
        result = dataclasses.replace(result, received=self.tools.received(result.received))
        asked = it.tool_calls(result.received)
        end, waiting = self.tools.round_end(asked, last_round=last_round)
        if not self._succeed(node, result, head_moves=end != RoundEnd.RUN_CALLS):
            yield self._superseded(node)
            return path, True
        if end == RoundEnd.RUN_CALLS:
            # From here, a stop gives these calls 'not run' results. Shifted like its parent (C3).
            parent = path[-1] if path else None
            self._open = path_node(node, shift=parent.shift if parent else 0)
            path = [*path, self._open]
        for call in asked:
            yield TurnEvent(EventType.TOOL_CALL, {**records.tool_bubble_data(call), "node": node.pk})
        if end == RoundEnd.ANSWERED:
            yield TurnEvent(EventType.DONE, {"answer": it.answer_text(result.received), "head": node.pk,
                                             "nodes": list(self.nodes)})
            return path, True
        if end == RoundEnd.WAITING:
            yield TurnEvent(EventType.APPROVAL_REQUIRED, {"node": node.pk,
                                                          "calls": [records.tool_bubble_data(c) for c in waiting]})
            return path, True
        return path, False  # the calls ran in the next round; after the last one, the round limit ends the turn

    def _compact_if_needed(self, path: list[PathNode], sent: list[it.Item], tools: list[dict] | None
                           ) -> tuple[list[PathNode], compaction.Compaction | None]:
        """C1, C2: compact before a call that would pass the threshold; the call then hangs below the root.

        When the path's tip is the head (a new question), the head moves to the root at once, so a call
        that then fails leaves it on the compacted path; otherwise it moves at the turn's end, as always.
        A failed summarising call is recorded and the turn goes on uncompacted, without trying again in
        a later round: the call itself may still fit the limit, and if it does not, its overflow is
        recorded like any other (F2).
        """
        if self._summary_failed or not compaction.needed(path, sent, model=self.model, provider=self.provider,
                                                         instructions=self.instructions, tools=tools):
            return path, None
        results = [item for item in sent if item.get("type") == "tool_result"]
        try:
            done = compaction.compact(conversation=self.conversation, path=path, model=self.model,
                                      instructions=self.instructions, pending_results=results,
                                      keep_ephemeral=self.conversation.keep_retrieved,
                                      stop_requested=self.stop_requested)
        except compaction.NothingToCompact:
            return path, None
        except compaction.CannotCompact:
            self._summary_failed = True
            return path, None
        except compaction.SummaryFailed as failed:
            self.nodes.extend(failed.written)
            if failed.error.reason == Node.FailureReason.CANCELLED:
                raise  # a stop: the turn ends (`_before_call`)
            self._summary_failed = True
            return path, None
        self.nodes.extend(done.written)
        if done.root.compacted_from_id == self.conversation.head_id:
            self._move_head(done.root.id)
        return [done.root], done

    def _call_model(self, node: Node, messages: list[dict], tools: list[dict] | None
                    ) -> Generator[TurnEvent, None, llm.CallResult | None]:
        """Stream one call as token events; return its result, or None once its failure is recorded."""
        release_connection()  # no database connection is held while the model thinks
        call = ModelCall(llm.stream_call(model=self.model, messages=messages, tools=tools, options=self.call_options),
                         stop_requested=self.stop_requested)
        saved_at = time.monotonic()
        try:
            for token in call.tokens():
                if time.monotonic() - saved_at >= settings.ARBOR_PARTIAL_SAVE_SECONDS:
                    records.save_partial(node, "".join(call.text))  # what a crash would otherwise lose
                    saved_at = time.monotonic()
                yield TurnEvent(EventType.TOKEN, {"text": token, "node": node.pk})
        except GeneratorExit:
            self._fail(llm.LLMError("cancelled", "stopped by the user", partial=call.leave()))
            raise
        except llm.LLMError as error:
            yield self._fail(error)
            return None
        except Exception as error:  # a bug mid-stream: leave the call and keep what it had received (D3)
            self._fail(llm.LLMError("interrupted", f"the turn stopped: {error!r}", partial=call.leave()))
            raise
        if call.stopped:  # also while the model was silent: the call is left, not waited out
            yield self._fail(llm.LLMError("cancelled", "stopped by the user", partial=call.leave()))
            return None
        return call.result

    # --- what is written -------------------------------------------------------------------------------

    def _start_node(self, *, parent: PathNode | None, sent: list[it.Item], call_settings: dict | None = None,
                    file_parts: dict | None = None) -> Node:
        """T3: the node exists, pending, before its call; the question's bubble (or the tool results on the
        calls' bubbles) is written with it, in one round trip."""
        with together() as writes:
            node = records.start(conversation=self.conversation, parent=parent, kind=Node.Kind.TURN, sent=sent,
                                 model=self.model, instructions=self.instructions, call_settings=call_settings,
                                 keep_ephemeral=self.conversation.keep_retrieved, file_parts=file_parts,
                                 first_round=self._first_call, writes=writes)
            records.question_bubble(node, sent, writes=writes)
            results = [i for i in sent if i.get("type") == "tool_result"]
            if results and self._open is not None:
                # The node that made the calls; after a compaction between rounds it is not the parent.
                records.result_bubbles(self._open.id, results, owner=self.conversation.owner_id, writes=writes)
        self._pending = node
        self._open = None
        self.nodes.append(node.pk)
        self.recorded[node.pk] = node
        self._first_call = self._first_call or node.pk
        return node

    def _succeed(self, node: Node, result: llm.CallResult, *, head_moves: bool) -> bool:
        """One round trip: the answered node, its bubbles, the head move at the turn's end, the jobs.

        Return False if this turn lost its lock (it outlived its expiry and another turn took over):
        its node is kept all the same, but it may not move the head (R3).
        """
        with together() as writes:
            settled = records.succeed(node, result, writes=writes)
            records.answer_bubbles(node, received=result.received, needs_approval=calls.needs_approval,
                                   writes=writes, when=settled)
            moved = None
            if head_moves:  # the turn's end: the lock goes back in the same UPDATE
                moved = self._move_head(node.pk, release=True, writes=writes, when=settled)
                # A turn waiting for approval too, and one that lost its lock (its answer is kept as a branch):
                # the jobs look at this turn's nodes only, so no later turn's finds them.
                records.committed(self.conversation, head=node.pk, nodes=self._written(), writes=writes,
                                  when=settled)
        if not settled.count:  # a sweep had failed it: the answer went on a sibling, whose bubbles these are
            records.answer_bubbles(node, needs_approval=calls.needs_approval)
            records.committed(self.conversation, nodes=[*self._written(), node.pk])
        self._pending = None
        return moved is None or bool(moved.count)

    def _written(self) -> list[int]:
        """Every node written for this turn: what its after-turn jobs (R4) look at."""
        return [*self.written_before, *self.nodes]

    def _move_head(self, node_id: int, *, release: bool = False, writes: Together | None = None,
                   when: Written | None = None) -> Written | None:
        """None for a branch that does not move the head (issue 33: a sibling asked beside the first model)."""
        if not self.moves_head:
            return None
        return services.head_move_held(conversation=self.conversation, to=node_id, lock=self.lock,
                                       release=release and self.gives_back_lock, writes=writes, when=when)

    def _superseded(self, node: Node) -> TurnEvent:
        return TurnEvent(EventType.ERROR, {"code": "turn_superseded", "node": node.pk, "head": None,
                                           "message": "This turn ran past its lock and another took over; its "
                                                      "answer is kept as a branch.", "nodes": list(self.nodes)})

    def _fail(self, error: llm.LLMError) -> TurnEvent:
        """F1/F2: record the failure; the head moves to the failed node unless the context overflowed.

        Stopped between rounds, the open calls get 'not run' results in a failed node of their own,
        so the question and the calls stay on the path (C4, F1).
        """
        if self._pending is None and self._open is not None:
            self._start_node(parent=self._open, sent=calls.resolve(self._open, run=False,
                                                                   owner_id=self.conversation.owner_id,
                                                                   note=f"not run: {error.message}"))
        node = self._pending
        if node is None:
            return TurnEvent(EventType.ERROR, {"code": error.reason, "message": error.message})
        moves = error.reason != Node.FailureReason.CONTEXT_OVERFLOW
        with together() as writes:
            settled = records.fail(node, error, writes=writes)
            records.error_bubble(node, error, writes=writes, when=settled)
            if moves:
                self._move_head(node.pk, writes=writes, when=settled)
            # R4: a failed turn's question is searchable too
            records.committed(self.conversation, head=node.pk if moves else self.conversation.head_id,
                              nodes=self._written(), writes=writes, when=settled)
        if not settled.count:  # a sweep had failed it: this failure went on a sibling (`records._settle`)
            records.error_bubble(node, error)
            records.committed(self.conversation, nodes=[*self._written(), node.pk])
        self._pending = None
        return TurnEvent(EventType.ERROR, {"code": error.reason, "message": error.message, "node": node.pk,
                                           "head": self.conversation.head_id, "nodes": list(self.nodes)})
