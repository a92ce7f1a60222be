"""The one loop that reads a model call: a turn's rounds and the side calls (titles, summaries, playbook drafts)
all read their stream through `ModelCall.tokens()`.

The call is read in a thread of its own, so the reader can look up from it while it is silent: a provider may
think for a minute and send nothing, and a blocked read cannot notice a stop. The thread hands each token over
through a queue, so `tokens()` waits at most `STOP_POLL_SECONDS` at a time before asking `stop_requested`. The
tokens waiting in the queue when the reader comes back for more are passed on as one text: a reader behind its model
(an instant one, or a process busy with hundreds of streams) pays once for what arrived meanwhile, not once a token
(issue 34: per token, the hand-off, the event, the log and the readers' wake-ups cost a quick turn of arbor/echo
about a sixth of its server CPU). A
stopped call is not waited out: the thread closes it as soon as it next speaks, and `leave()` keeps the text
passed on, with the call's other items when the call gives them back at once.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Generator, Iterator
from typing import Any

from conversations import items as it
from conversations import llm

LEAVE_WAIT_SECONDS = 0.2  # how long a leaving reader waits for the call's own partial items
STOP_POLL_SECONDS = 0.25  # how often a silent call looks up for a stop


class ModelCall:
    SILENT = object()  # nothing arrived within the timeout
    DONE = object()  # the call ended: `result` holds what it returned

    def __init__(self, call: Generator[str, None, llm.CallResult], *,
                 stop_requested: Callable[[], bool] | None = None):
        self.result: llm.CallResult | None = None
        self.stopped = False  # `tokens()` ended on a stop: `leave()` what arrived
        self.text: list[str] = []  # the tokens passed on so far
        self._stop_requested = stop_requested or (lambda: False)
        self._queue: queue.Queue = queue.Queue()
        self._leaving = threading.Event()
        self._closed = threading.Event()
        self._partial: list[dict] | None = None
        self._held: tuple[str, Any] | None = None  # the call's end, found behind tokens passed on first
        _readers.submit(self._read, call)

    def _read(self, call: Generator[str, None, llm.CallResult]) -> None:
        try:
            while not self._leaving.is_set():
                self._queue.put(("token", next(call)))
        except StopIteration as stop:
            self._queue.put(("done", stop.value))
            return
        except BaseException as error:  # handed to the turn, which records it
            self._queue.put(("error", error))
            return
        try:
            call.close()
        except llm.LLMError as closed:  # a closed call says what it had received
            self._partial = closed.partial
        except Exception:  # a provider that fails to close: its text is kept by the turn
            pass
        finally:
            self._closed.set()

    def tokens(self) -> Iterator[str]:
        """The text as it arrives: a token, or the tokens that arrived together, as one. Ends when the call ends
        (`result` holds what it returned) or, also while the model is silent, when a stop is asked (`stopped`; the
        caller then `leave()`s). A failure is raised."""
        while True:
            token = self._next(timeout=STOP_POLL_SECONDS)
            if token is self.DONE:
                return
            if self._stop_requested():
                self.stopped = True
                return
            if token is self.SILENT:
                continue
            text = self._with_waiting(token)
            self.text.append(text)
            yield text

    def _next(self, *, timeout: float) -> Any:
        """The next token, SILENT, or DONE; a failure of the call is raised here."""
        if self._held is not None:
            (kind, value), self._held = self._held, None
        else:
            try:
                kind, value = self._queue.get(timeout=timeout)
            except queue.Empty:
                return self.SILENT
        if kind == "done":
            self.result = value
            return self.DONE
        if kind == "error":
            raise value
        return value

    def _with_waiting(self, token: str) -> str:
        """`token` and the tokens queued behind it, joined; the call's end, if it is queued too, is held for the
        next `_next` (its result, or its failure, comes after the text that came before it)."""
        texts = [token]
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item[0] != "token":
                self._held = item
                break
            texts.append(item[1])
        return texts[0] if len(texts) == 1 else "".join(texts)

    def leave(self) -> list[dict]:
        """Stop reading; return what was received: the text passed on, with the call's other items when it gives
        them back at once."""
        self._leaving.set()
        with contextlib.suppress(Exception):
            self._closed.wait(LEAVE_WAIT_SECONDS)
        # The reader may have read ahead of the turn: the text kept is what the turn passed on (and the
        # person saw), the call's other items (reasoning, tool calls) as the call gave them back.
        delivered = [it.text("".join(self.text))] if self.text else []
        others = [item for item in self._partial or [] if item.get("type") != "text"]
        calls = [item for item in others if item.get("type") == "tool_call"]
        return [*(item for item in others if item.get("type") != "tool_call"), *delivered, *calls]


class _Readers:
    """The threads that read model calls, kept between calls: starting a thread per call cost a turn
    milliseconds on a busy machine (issue 13). One more is made when none is idle, so a call never waits
    for another to end. Daemon threads: a call hanging on a silent provider never holds up the process's exit."""

    def __init__(self):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = 0
        self._lock = threading.Lock()

    def submit(self, read: Callable[..., None], *args: Any) -> None:
        with self._lock:
            grow = self._idle == 0
            if not grow:
                self._idle -= 1
        self._jobs.put((read, args))
        if grow:
            threading.Thread(target=self._work, name="arbor-call", daemon=True).start()

    def _work(self) -> None:
        while True:
            read, args = self._jobs.get()
            read(*args)  # `ModelCall._read` hands every outcome, errors included, to its turn
            with self._lock:
                self._idle += 1


_readers = _Readers()
