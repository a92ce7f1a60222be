"""Fixtures the turn tests share: a clock the turn lock reads, and a place for turns that "died"."""

from __future__ import annotations

import pytest

from conversations import locks


@pytest.fixture
def frozen_now(monkeypatch):
    clock = {"now": locks.now()}
    monkeypatch.setattr(locks, "now", lambda: clock["now"])
    return clock


@pytest.fixture
def graveyard(db):
    """Dead turns stay unclosed during the test; closed at its end, inside its database transaction, so
    the garbage collector does not close them later against another test's database."""
    dead: list = []
    yield dead
    for events in dead:
        events.close()
