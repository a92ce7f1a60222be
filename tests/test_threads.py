"""Issue 34: the pool that long views, sockets' sync calls and model calls run in makes its threads from a
thread of its own. `Thread.start()` waits for the new thread to run; called on the event loop under load
(ThreadPoolExecutor's `submit` makes its threads there) it stopped the loop in 70% of its stack samples at 300
SSE streams."""

from __future__ import annotations

import threading
import time

import pytest

from config.threads import GrowingThreads


def _started_by(monkeypatch) -> list[str]:
    """The names of the threads that start a thread from now on."""
    starters: list[str] = []
    real_start = threading.Thread.start

    def start(thread):
        starters.append(threading.current_thread().name)
        return real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    return starters


def test_issue_34_the_caller_never_starts_a_thread_and_idle_ones_are_used_again(monkeypatch):
    pool = GrowingThreads("t-grow")
    assert pool.submit(lambda: "warm").result(timeout=10) == "warm"  # the maker, the one thread a caller starts
    starters = _started_by(monkeypatch)
    gate, all_running = threading.Event(), threading.Barrier(21)

    def work(n):
        all_running.wait(10)
        gate.wait(10)
        return n

    futures = [pool.submit(work, n) for n in range(20)]
    all_running.wait(10)  # 20 at once, each in a thread of its own
    gate.set()
    assert [future.result(timeout=10) for future in futures] == list(range(20))
    assert len(starters) == 19 and set(starters) == {"t-grow-maker"}, "20 at once: 19 more threads, all by the maker"
    assert [pool.submit(lambda n=n: n * 2).result(timeout=10) for n in range(5)] == [0, 2, 4, 6, 8]
    assert len(starters) == 19, "one at a time afterwards: an idle thread takes each"


def test_issue_34_at_the_ceiling_work_waits_for_a_free_thread_and_a_failure_reaches_its_caller():
    pool = GrowingThreads("t-ceiling", most=2)
    gate, running, most_at_once = threading.Event(), [], []
    lock = threading.Lock()

    def work(n):
        with lock:
            running.append(n)
            most_at_once.append(len(running))
        gate.wait(10)
        with lock:
            running.remove(n)
        return n

    futures = [pool.submit(work, n) for n in range(5)]
    deadline = time.monotonic() + 10
    while len(most_at_once) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.2)  # a third would have started by now
    assert len(most_at_once) == 2
    gate.set()
    assert [future.result(timeout=10) for future in futures] == list(range(5))
    assert max(most_at_once) == 2

    def broken():
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        pool.submit(broken).result(timeout=10)
    assert pool.submit(lambda: "still serving").result(timeout=10) == "still serving"
