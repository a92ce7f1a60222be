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

import functools
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, connections
from django.db.models import BooleanField, ExpressionWrapper, F, OuterRef, Q, Subquery, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from config.api import INT64_MAX, INT64_MIN
from config.errors import NotFound
from config.together import update_sql
from conversations.errors import TooManyTurns, TurnInProgress
from conversations.models import Conversation, Preferences, Project, TurnRun, UsageBudget
from conversations.selectors import conversation_for_user


def now() -> datetime:
    """The time the stored expiry is measured in (tests may replace it)."""
    return timezone.now()


logger = logging.getLogger("arbor.locks")


def _expiry(at: datetime | None = None) -> datetime:
    return (at or now()) + timedelta(seconds=settings.ARBOR_TURN_LOCK_SECONDS)


def is_free(at: datetime | None = None) -> Q:
    """Conversations whose lock nobody holds (or whose holder let it expire) at `at` (default: now)."""
    return Q(turn_token__isnull=True) | Q(turn_expires_at__lt=at or now())


_CLEARED = {"turn_token": None, "turn_expires_at": None}


def head_guard(lock: TurnLock | None, *, release: bool = False) -> tuple[Q, dict[str, Any]]:
    """The condition and extra changes for a head move: with a lock, only while it is held (and, with
    `release`, the same UPDATE gives it back: the turn's last move); without one, only while nobody holds it,
    and then an expired lock is cleared so its late holder cannot move the head."""
    if lock is not None:
        return Q(turn_token=lock.token), dict(_CLEARED) if release else {}
    return is_free(), dict(_CLEARED)


def left_unreleased() -> Q:
    """Conversations whose lock a holder let run out without giving it back (it died between rounds)."""
    return is_free() & Q(turn_token__isnull=False)


def run_lock_gone() -> Q:
    """Turn runs (`TurnRun`) whose turn no longer holds its conversation's lock: given back, taken over, or run
    out. A run's id is its lock's token."""
    return (Q(conversation__turn_token__isnull=True) | ~Q(conversation__turn_token=F("pk"))
            | Q(conversation__turn_expires_at__lt=now()))


def run_state(run_id: uuid.UUID, *, owner: int) -> tuple[datetime | None, bool] | None:
    """`owner`'s run's end (None while it runs) and whether its turn still holds the lock, in one query; None if
    there is no such run. A lock whose lease ran out is not held: its process died (a reader stops following it)."""
    row = (TurnRun.objects.filter(owner_id=owner, pk=run_id)
           .values("ended_at", "conversation__turn_token", "conversation__turn_expires_at").first())
    if row is None:
        return None
    expires = row["conversation__turn_expires_at"]
    return row["ended_at"], row["conversation__turn_token"] == run_id and expires is not None and (
        expires > timezone.now())


def _held_by_owner(at: datetime):
    """How many turns the conversation's owner runs on other conversations at `at`: the locks held, each counted
    by its weight (a subquery)."""
    return (Conversation.objects.filter(owner_id=OuterRef("owner_id"), turn_token__isnull=False,
                                        turn_expires_at__gte=at)
            .exclude(pk=OuterRef("pk")).order_by().values("owner_id").annotate(n=Sum("turn_weight")).values("n"))


def _held_count(conversation: Conversation) -> int:
    """How many turns the conversation's owner runs on other conversations now."""
    return (Conversation.objects.filter(owner_id=conversation.owner_id, turn_token__isnull=False,
                                        turn_expires_at__gte=now()).exclude(pk=conversation.pk)
            .aggregate(n=Coalesce(Sum("turn_weight"), 0))["n"])


_FIELDS = Conversation._meta.concrete_fields

# The lock-taking statement is compiled once per shape: built by the ORM for every turn, it cost more CPU than
# its round trip (issue 13). It is compiled with stand-in values, each found again among the parameters, so
# that a call only puts its own in their places.
_STAND_INS: dict[str, Any] = {
    "pk": -900_001, "owner": -900_002, "token": uuid.UUID(int=900_003),
    "now": datetime(2001, 2, 3, 4, 5, 6, 900_004, tzinfo=dt_timezone.utc),
    "expires": datetime(2001, 2, 3, 4, 5, 6, 900_005, tzinfo=dt_timezone.utc),
}
_SLOT_FIELDS = {"pk": "id", "owner": "owner", "token": "turn_token", "now": "turn_expires_at",
                "expires": "turn_expires_at"}


@dataclass(frozen=True)
class _Fixed:
    value: Any  # a parameter that is the same in every call (the limit, say)


def _adapted(slot: str, value: Any) -> Any:
    """`value` as the ORM passes it to the database for that slot's column."""
    return Conversation._meta.get_field(_SLOT_FIELDS[slot]).get_db_prep_value(value, connection)


@functools.lru_cache(maxsize=64)
def _take_statement(by_owner: bool, limit: int, weight: int, vendor: str) -> tuple[str, tuple[str | _Fixed, ...]]:
    """The lock-taking UPDATE … RETURNING (the conversation, its owner's budget and instructions, its project's
    instructions), and for each of
    its parameters the slot it takes its value from, or the value it always has."""
    v = _STAND_INS
    free = Conversation.objects.filter(is_free(at=v["now"]), pk=v["pk"])
    if by_owner:
        free = free.filter(owner_id=v["owner"])
    if limit:  # fairness: in the same UPDATE, the owner's other running turns are counted
        free = free.alias(held=Coalesce(Subquery(_held_by_owner(v["now"])), 0)).filter(held__lte=limit - weight)
    sql, params = update_sql(free, turn_token=v["token"], turn_expires_at=v["expires"], turn_weight=weight,
                             turn_took_over=ExpressionWrapper(Q(turn_token__isnull=False), output_field=BooleanField()))
    stand_ins = {slot: _adapted(slot, value) for slot, value in v.items() if by_owner or slot != "owner"}
    slots = tuple(next((slot for slot, value in stand_ins.items() if type(value) is type(p) and value == p),
                       _Fixed(p)) for p in params)
    if set(stand_ins) - set(slots):  # a value the ORM passed in some other form: better no lock than a wrong one
        raise RuntimeError(f"the lock statement lost its stand-ins {set(stand_ins) - set(slots)}: {sql}")
    table = connection.ops.quote_name(Conversation._meta.db_table)
    returning = ", ".join(f"{table}.{connection.ops.quote_name(field.column)}" for field in _FIELDS)
    preferences = connection.ops.quote_name(Preferences._meta.db_table)
    projects = connection.ops.quote_name(Project._meta.db_table)
    budgets = connection.ops.quote_name(UsageBudget._meta.db_table)
    budget = f"FROM {budgets} ub WHERE ub.owner_id = {table}.owner_id"
    return (f"{sql} RETURNING {returning}, (SELECT ub.monthly_tokens {budget}), (SELECT ub.monthly_cost_usd "
            f"{budget}), (SELECT p.instructions FROM {preferences} p WHERE p.user_id = {table}.owner_id ORDER BY "
            f"p.id LIMIT 1), (SELECT pr.instructions FROM {projects} pr WHERE pr.id = {table}.project_id)"), slots


def _from_database(values) -> list:
    """A RETURNING row's values as a SELECT's would be: the backend's converters (SQLite's dates and UUIDs)."""
    converted = []
    for field, value in zip(_FIELDS, values, strict=True):
        column = field.cached_col
        for converter in connection.ops.get_db_converters(column) + column.get_db_converters(connection):
            value = converter(value, column, connection)
        converted.append(value)
    return converted


class TurnLock:
    """A held turn lock. Release it once (a `with` block does); releasing twice is harmless."""

    def __init__(self, conversation: Conversation, token: uuid.UUID, *, took_over: bool = False):
        self.conversation = conversation
        self.token = token
        # Taken from a holder that never gave it back (its lease ran out): nothing has moved the head since
        # that holder took it, or the move would have cleared it (`head_guard`).
        self.took_over = took_over
        self.lost = False  # set when a renewal found another holder (this one outlived its lease)
        self.owner_instructions: str | None = None  # read with the lock by `take`
        self.project_instructions: str | None = None  # its project's (issue 30), read with it too
        self.budget: tuple[int | None, float | None] = (None, None)  # its owner's monthly tokens and dollars
        self._released = False
        self._handed_over = False
        self._stop = threading.Event()

    @classmethod
    def take(cls, *, owner, conversation_id: Any, weight: int = 1) -> TurnLock:
        """Take the lock of one of `owner`'s conversations and read the conversation (with the owner's own
        instructions: `owner_instructions`) in one UPDATE … RETURNING: state read under the lock, in one
        round trip where it took four (issue 13). NotFound for anyone else's, like a missing one.

        `weight`: how many turns the lock is taken for (issue 33: one per model asked at once); the owner's
        limit must leave room for all of them."""
        try:
            pk = int(conversation_id)
        except (TypeError, ValueError):
            raise NotFound("No such conversation.") from None
        if not INT64_MIN <= pk <= INT64_MAX:  # no id column holds it (SQLite's driver would overflow: a 500)
            raise NotFound("No such conversation.")
        taken = cls._take(pk, owner_id=owner.pk, weight=max(1, weight))
        if taken is None:
            cls._refuse(conversation_for_user(user=owner, conversation_id=pk), weight=max(1, weight))
        return taken

    @classmethod
    def acquire(cls, conversation: Conversation) -> TurnLock:
        """Take the lock of `conversation` (already read), or raise TurnInProgress (or TooManyTurns)."""
        taken = cls._take(conversation.pk)
        if taken is None:
            cls._refuse(conversation)
        conversation.turn_token, conversation.turn_expires_at = taken.token, taken.conversation.turn_expires_at
        taken.conversation = conversation
        return taken

    @classmethod
    def _take(cls, pk: int, *, owner_id: int | None = None, weight: int = 1) -> TurnLock | None:
        """The one conditional UPDATE that takes a lock: None if the conversation is not free (or is not
        `owner_id`'s, or its owner has too many turns running to start `weight` more)."""
        token, at = uuid.uuid4(), now()
        limit = settings.ARBOR_MAX_CONCURRENT_TURNS_PER_USER
        if limit and weight > limit:
            return None
        sql, slots = _take_statement(owner_id is not None, limit, weight, connection.vendor)
        values = {"pk": pk, "owner": owner_id, "token": token, "now": at, "expires": _expiry(at)}
        params = [_adapted(slot, values[slot]) if isinstance(slot, str) else slot.value for slot in slots]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
        if row is None:
            return None
        conversation = Conversation.from_db(connection.alias, [f.attname for f in _FIELDS],
                                            _from_database(row[:-4]))
        lock = cls(conversation, conversation.turn_token, took_over=conversation.turn_took_over)
        lock.budget = (row[-4], row[-3])
        lock.owner_instructions, lock.project_instructions = row[-2] or "", row[-1] or ""
        return lock

    @staticmethod
    def _refuse(conversation: Conversation, *, weight: int = 1) -> None:
        # Why, from the owner's count: asking whether this conversation is free now would blame the limit
        # for a lease that ran out between the two queries.
        limit = settings.ARBOR_MAX_CONCURRENT_TURNS_PER_USER
        if limit and weight > limit:
            raise TooManyTurns(f"You may run {limit} turns at once; asking {weight} models at once runs {weight}.")
        if limit and (held := _held_count(conversation)) > limit - weight:
            if weight == 1:
                raise TooManyTurns(f"You have {limit} turns running; wait for one to end.")
            raise TooManyTurns(f"You have {held} of your {limit} turns running; asking {weight} models at once "
                               "needs room for each: wait for one to end.")
        raise TurnInProgress()

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
                # A renewal that raced the holder's own release found no row: given back, not lost.
                self.lost = not self._released
                return False
        except DatabaseError as error:
            logger.warning("turn lock of conversation %s: renewal failed: %r", self.conversation.pk, error)
        return True

    @contextmanager
    def until_handed_over(self) -> Iterator[TurnLock]:
        """Hold the lock for the block; unless a `Turn` took it over meanwhile (`hand_over`), give it back when
        the block ends, refused or not. From the hand-over on, the turn is the one owner that releases it."""
        try:
            yield self
        finally:
            if not self._handed_over:
                self.release()

    def hand_over(self) -> None:
        self._handed_over = True

    def release(self) -> None:
        """Give the lock back; a second call costs nothing (a turn frees it before its last event, then its
        `with` block ends)."""
        if self._released:
            return
        self._released = True
        self._stop.set()
        Conversation.objects.filter(pk=self.conversation.pk, turn_token=self.token).update(**_CLEARED)
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
