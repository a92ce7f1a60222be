"""The turn lock (T9, R3): the only code that reads or writes a conversation's `turn_token`.

A turn, a compaction by hand and a playbook conversion each hold it while they call a model, so nothing
else moves the head meanwhile. It lives in the database, so it holds across processes. It is a short
lease (`ARBOR_TURN_LOCK_SECONDS`): inside its `with` block a heartbeat thread renews it every
`ARBOR_TURN_HEARTBEAT_SECONDS`, whatever the holder does (a model may think for minutes and send
nothing), so a holder whose process died frees the conversation within one lease, and a lock taken for a
turn that never began runs out on its own. A holder that lost it can no longer move the
head (`head_guard`).

    with TurnLock.acquire(conversation) as lock:   # TurnInProgress when another holds it
        ...                                         # renewed in the background meanwhile
        services.head_move(conversation=conversation, to=node_id, lock=lock)

The stored expiry is measured by `now`, which tests may replace.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connections
from django.db.models import Count, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from conversations.errors import TooManyTurns, TurnInProgress
from conversations.models import Conversation


def now() -> datetime:
    """The time the stored expiry is measured in (tests may replace it)."""
    return timezone.now()


logger = logging.getLogger("arbor.locks")


def _expiry() -> datetime:
    return now() + timedelta(seconds=settings.ARBOR_TURN_LOCK_SECONDS)


def is_free() -> Q:
    """Conversations whose lock nobody holds (or whose holder let it expire)."""
    return Q(turn_token__isnull=True) | Q(turn_expires_at__lt=now())


def head_guard(lock: TurnLock | None) -> tuple[Q, dict[str, Any]]:
    """The condition and extra changes for a head move: with a lock, only while it is held; without one,
    only while nobody holds it, and then an expired lock is cleared so its late holder cannot move the head."""
    if lock is not None:
        return Q(turn_token=lock.token), {}
    return is_free(), {"turn_token": None, "turn_expires_at": None}


def _held_by_owner():
    """How many locks the conversation's owner holds on other conversations (a subquery)."""
    return (Conversation.objects.filter(owner_id=OuterRef("owner_id"), turn_token__isnull=False,
                                        turn_expires_at__gte=now())
            .exclude(pk=OuterRef("pk")).order_by().values("owner_id").annotate(n=Count("pk")).values("n"))


def _held_count(conversation: Conversation) -> int:
    """How many locks the conversation's owner holds on other conversations now."""
    return (Conversation.objects.filter(owner_id=conversation.owner_id, turn_token__isnull=False,
                                        turn_expires_at__gte=now()).exclude(pk=conversation.pk).count())


class TurnLock:
    """A held turn lock. Release it once (a `with` block does); releasing twice is harmless."""

    def __init__(self, conversation: Conversation, token: uuid.UUID, *, took_over: bool = False):
        self.conversation = conversation
        self.token = token
        # Taken from a holder that never gave it back (its lease ran out): nothing has moved the head since
        # that holder took it, or the move would have cleared it (`head_guard`).
        self.took_over = took_over
        self.lost = False  # set when a renewal found another holder (this one outlived its lease)
        self._released = False
        self._stop = threading.Event()

    @classmethod
    def acquire(cls, conversation: Conversation) -> TurnLock:
        """Take the lock in one conditional UPDATE, or raise TurnInProgress."""
        token = uuid.uuid4()
        expires = _expiry()
        took_over = conversation.turn_token is not None  # as last read: a holder that is gone
        free = Conversation.objects.filter(is_free(), pk=conversation.pk)
        limit = settings.ARBOR_MAX_CONCURRENT_TURNS_PER_USER
        if limit:  # fairness: in the same UPDATE, the owner's other held locks are counted
            free = free.alias(held=Coalesce(Subquery(_held_by_owner()), 0)).filter(held__lt=limit)
        if not free.update(turn_token=token, turn_expires_at=expires):
            # Why, from the owner's count: asking whether this conversation is free now would blame the limit
            # for a lease that ran out between the two queries.
            if limit and _held_count(conversation) >= limit:
                raise TooManyTurns(f"You have {limit} turns running; wait for one to end.")
            raise TurnInProgress()
        conversation.turn_token, conversation.turn_expires_at = token, expires
        return cls(conversation, token, took_over=took_over)

    def renew(self) -> bool:
        """Push the expiry one lease ahead; False if the lock was lost (it expired and another took it)."""
        renewed = Conversation.objects.filter(pk=self.conversation.pk, turn_token=self.token).update(
            turn_expires_at=_expiry())
        return bool(renewed)

    def beat(self) -> bool:
        """One heartbeat (the process's `_heartbeat` calls it): renew; False once the lock is lost. A renewal the
        database refused (an outage) is tried again at the next beat: when the database is back, a lock nobody
        took meanwhile is renewed, and one that was taken is reported lost."""
        try:
            if not self.renew():
                self.lost = True
                return False
        except DatabaseError as error:
            logger.warning("turn lock of conversation %s: renewal failed: %r", self.conversation.pk, error)
        return True

    def release(self) -> None:
        """Give the lock back; a second call costs nothing (a turn frees it before its last event, then its
        `with` block ends)."""
        if self._released:
            return
        self._released = True
        self._stop.set()
        Conversation.objects.filter(pk=self.conversation.pk, turn_token=self.token).update(
            turn_token=None, turn_expires_at=None)
        self.conversation.turn_token = self.conversation.turn_expires_at = None

    def released_with_head_move(self) -> None:
        """The turn's last head move cleared the lock in its own UPDATE (`services.head_move_held`)."""
        self._released = True
        self._stop.set()
        self.conversation.turn_token = self.conversation.turn_expires_at = None

    def __enter__(self) -> TurnLock:
        _heartbeat.add(self)
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()


class _Heartbeat:
    """One thread per process renews every lock held in it, each every ARBOR_TURN_HEARTBEAT_SECONDS (no
    thread started per turn: starting one cost a turn milliseconds on a busy machine, issue 13)."""

    def __init__(self):
        self._due: dict[TurnLock, float] = {}
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, lock: TurnLock) -> None:
        with self._changed:
            self._due[lock] = time.monotonic() + settings.ARBOR_TURN_HEARTBEAT_SECONDS
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="arbor-lock-heartbeat", daemon=True)
                self._thread.start()
            self._changed.notify()

    def _run(self) -> None:
        while True:
            with self._changed:
                for gone in [lock for lock in self._due if lock._stop.is_set()]:  # released (or a test's "death")
                    del self._due[gone]
                now = time.monotonic()
                due = [lock for lock, at in self._due.items() if at <= now]
                for lock in due:
                    self._due[lock] = now + settings.ARBOR_TURN_HEARTBEAT_SECONDS
                if not due:
                    self._changed.wait(min(self._due.values(), default=now + 1) - now)
                    continue
            for lock in due:
                if not lock._stop.is_set() and not lock.beat():
                    lock._stop.set()
            connections.close_all()  # this thread's own connection, between beats


_heartbeat = _Heartbeat()
