"""The turn lock (T9, R3): the only code that reads or writes a conversation's `turn_token`.

A turn, a compaction by hand and a playbook conversion each hold it while they call a model, so nothing
else moves the head meanwhile. It lives in the database, so it holds across processes, and it expires
(`ARBOR_TURN_LOCK_SECONDS`) so a holder that died frees the conversation; a live holder renews it at a
third of its life. A holder that let it expire can no longer move the head (`head_guard`).

    with TurnLock.acquire(conversation) as lock:   # TurnInProgress when another holds it
        ...
        lock.renew_if_due()                         # while tokens stream or a tool runs
        services.head_move(conversation=conversation, to=node_id, lock=lock)

The clocks are injectable (`now` for the stored expiry, `monotonic` or a holder's `clock` for the renewal
pace), so tests need no wall-clock windows.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from config.db import release_connection
from conversations.errors import TurnInProgress
from conversations.models import Conversation


def now() -> datetime:
    """The time the stored expiry is measured in (tests may replace it)."""
    return timezone.now()


def monotonic() -> float:
    """The clock a holder paces its renewals by (tests may replace it)."""
    return time.monotonic()


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


class TurnLock:
    """A held turn lock. Release it once (a `with` block does); releasing twice is harmless."""

    def __init__(self, conversation: Conversation, token: uuid.UUID, *, clock: Callable[[], float] | None = None):
        self.conversation = conversation
        self.token = token
        self._clock = clock or (lambda: monotonic())
        self._renewed_at = self._clock()
        self._released = False

    @classmethod
    def acquire(cls, conversation: Conversation, *, clock: Callable[[], float] | None = None) -> TurnLock:
        """Take the lock in one conditional UPDATE, or raise TurnInProgress."""
        token = uuid.uuid4()
        expires = _expiry()
        if not Conversation.objects.filter(is_free(), pk=conversation.pk).update(turn_token=token,
                                                                                 turn_expires_at=expires):
            raise TurnInProgress()
        conversation.turn_token, conversation.turn_expires_at = token, expires
        return cls(conversation, token, clock=clock)

    def renew(self) -> bool:
        """Push the expiry one lock life ahead; False if the lock was lost (it expired and another took it)."""
        renewed = Conversation.objects.filter(pk=self.conversation.pk, turn_token=self.token).update(
            turn_expires_at=_expiry())
        self._renewed_at = self._clock()
        return bool(renewed)

    def renew_if_due(self) -> None:
        """Renew at a third of the lock's life; give the connection back (a model may think for a while)."""
        if self._clock() - self._renewed_at > settings.ARBOR_TURN_LOCK_SECONDS / 3:
            self.renew()
            release_connection()

    def release(self) -> None:
        """Give the lock back; a second call costs nothing (a turn frees it before its last event, then its
        `with` block ends)."""
        if self._released:
            return
        self._released = True
        Conversation.objects.filter(pk=self.conversation.pk, turn_token=self.token).update(
            turn_token=None, turn_expires_at=None)
        self.conversation.turn_token = self.conversation.turn_expires_at = None

    def __enter__(self) -> TurnLock:
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()
