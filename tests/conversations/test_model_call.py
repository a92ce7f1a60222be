"""The one loop that reads a model call (`ModelCall.tokens()`), issue 34: what arrived while the turn was busy is
passed on as one text, what comes one by one is passed on one by one, and the call's end or failure comes after
the text that came before it (T3, F1: nothing received is lost or reordered)."""

from __future__ import annotations

import threading
import time

import pytest

from conversations import llm
from conversations.turns.model_call import ModelCall

RESULT = llm.CallResult(received=[{"type": "text", "text": "a b c d e"}], usage={}, provider="p", model="p/m")


def _queued(call: ModelCall, count: int) -> None:
    """Wait until the call's reader has handed over `count` items (the turn was busy meanwhile)."""
    deadline = time.monotonic() + 5
    while call._queue.qsize() < count:
        assert time.monotonic() < deadline, "the reader thread never handed the call's items over"
        time.sleep(0.005)


def test_issue_34_t3_tokens_that_arrived_together_are_one_text_then_the_calls_result():
    def instant():
        yield from ["a ", "b ", "c ", "d ", "e"]
        return RESULT

    call = ModelCall(instant())
    _queued(call, 6)  # five tokens and the end
    assert list(call.tokens()) == ["a b c d e"]
    assert call.result is RESULT and call.text == ["a b c d e"] and not call.stopped


def test_issue_34_t3_tokens_that_come_one_by_one_are_passed_on_one_by_one():
    asked = threading.Semaphore(0)

    def paced():
        for word in ["a ", "b ", "c"]:
            asked.acquire()  # the next word only once the turn has taken the last
            yield word
        return RESULT

    call = ModelCall(paced())
    got = []
    asked.release()
    for text in call.tokens():
        got.append(text)
        asked.release()
    assert got == ["a ", "b ", "c"] and call.result is RESULT


def test_issue_34_f1_a_failure_after_queued_tokens_comes_after_their_text():
    def failing():
        yield from ["kept ", "text"]
        raise llm.LLMError("provider_error", "the provider broke off")

    call = ModelCall(failing())
    _queued(call, 3)
    tokens = call.tokens()
    assert next(tokens) == "kept text"
    with pytest.raises(llm.LLMError, match="broke off"):
        next(tokens)
    assert call.text == ["kept text"] and call.leave() == [{"type": "text", "text": "kept text"}]
