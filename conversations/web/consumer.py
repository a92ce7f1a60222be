"""The chat WebSocket: one conversation per socket, one reading task per turn (issue 3's transport).

The consumer parses messages and forwards them to the same turn functions the API uses; it never
assembles context, moves a head or runs a turn its own way. A turn it starts is detached (issue 12): a
socket that closes stops reading, never the turn; `stop` asks the running turn to stop through the
database, so it stops a turn started in another tab or process too.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from types import SimpleNamespace
from typing import Any

from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.contrib import auth

from config.api import UnsafeJSON, strict_loads
from config.errors import ArborError, BadInput, NotFound
from config.web import in_pool_thread
from conversations import idempotency
from conversations.apis.serializers import ApprovalIn, EditIn, RegenerateIn, TurnIn
from conversations.errors import TurnInProgress
from conversations.selectors import conversation_for_user
from conversations.turns import detached
from conversations.turns.events import ENDINGS, EventType
from conversations.turns.runner import Turn
from conversations.turns.siblings import SiblingTurns
from conversations.turns.start import turn_ask, turn_decide, turn_edit, turn_regenerate, turn_retry
from conversations.turns.streaming import follow_log
from conversations.web import run_watch

TOKEN_BATCH_SECONDS = 0.05  # tokens go out in small batches, not one frame each
STOP_WAIT_SECONDS = 10


def _ask(*, content: str, files: list[int] = (), models: list[str] = (), **common) -> Turn | SiblingTurns:
    return turn_ask(content=content, files=files, models=models, **common)


def _edit(*, node: int, content: str, files: list[int] | None = None, models: list[str] = (), **common
          ) -> Turn | SiblingTurns:
    return turn_edit(node_id=node, content=content, files=files, models=models, **common)


def _regenerate(*, node: int | None = None, **common) -> Turn:
    return turn_regenerate(node_id=node, **common)


def _approve(*, tool_call_id: str, approve: bool, **common) -> Turn | None:
    return turn_decide(call_id=tool_call_id, approve=approve, **common)


# A message's type -> the API serializer its fields must pass, and the turn start it calls.
_STARTS: dict[str, tuple[type | None, Callable[..., Turn | None]]] = {
    "ask": (TurnIn, _ask),
    "edit": (EditIn, _edit),
    "regenerate": (RegenerateIn, _regenerate),
    "retry": (None, turn_retry),
    "approve": (ApprovalIn, _approve),
}


@dataclass(frozen=True)
class _Started:
    run_id: uuid.UUID | None  # None: an approval recorded, others still wait
    resent: bool = False  # the message was sent before (its id): this is the first sending's run


def _begin_and_launch(begin: Callable[[], Turn | None], *, user=None, message_id: str | None = None,
                      asked: str = "", busy: bool = False) -> _Started:
    """Start the turn a message asks for and launch it. A message with an `id` the page sent before (a resend
    after a reconnect) starts nothing: it is the first sending's run (issue 31, as an Idempotency-Key), even
    while that run goes on (`busy`: this socket's turn has not ended), which refuses any other message."""
    held = None
    if message_id is not None:
        try:
            held = _claim(user, message_id, asked)
        except idempotency.Replay as replay:
            run_id = replay.claim.run_id
            return _Started(uuid.UUID(run_id) if run_id else None, resent=True)
    try:
        if busy:
            raise TurnInProgress("A turn is running on this conversation; stop it or wait.")
        turn = begin()
    except Exception:
        idempotency.release(held)
        raise
    run_id = None if turn is None else detached.launch(turn)
    idempotency.settle_run(held, run_id)
    return _Started(run_id)


def _claim(user, key: str, asked: str):
    """`idempotency.claim_key`, where a first sending that was refused meanwhile (and let its id go) makes this
    one the first."""
    try:
        return idempotency.claim_key(user, key, asked)
    except ArborError as error:
        if error.code != "idempotency_key_released":
            raise
        return idempotency.claim_key(user, key, asked)


def _message_id(content: dict[str, Any]) -> str | None:
    """The page's own id for a message (a resend carries the same): text of at most 200 characters, or none."""
    value = content.get("id")
    if value is not None and (not isinstance(value, str) or not 0 < len(value) <= 200):
        raise BadInput("id: a message's id is text of 1 to 200 characters.")
    return value


def _asked(content: dict[str, Any]) -> str:
    return idempotency.digest("socket", {k: v for k, v in content.items() if k != "id"})


class ChatConsumer(AsyncJsonWebsocketConsumer):
    async def dispatch(self, message):
        """As Channels' own, without the `close_old_connections` it runs on the one shared sync thread before
        every message (hundreds of sockets queued there, issue 13): this consumer uses the database only in
        pool threads (`in_pool_thread`), which close their connections themselves."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def connect(self):
        self.generation: asyncio.Task | None = None  # the task reading the turn this socket shows
        self.turn_ended = False  # the running generation has sent its turn's last event (done, error, approval)
        self.following = None  # the run it reads (its own or one it joined)
        self.watching = False
        self.starting = False  # a message of this socket is starting a turn
        self.user = self.scope.get("user")
        self.conversation_id = self.scope["url_route"]["kwargs"]["conversation_id"]
        await self.accept()
        if not (self.user and self.user.is_authenticated) or not await self._owns():
            # Anyone else's conversation is "not found", as over HTTP. Accepted first: a socket refused
            # during the handshake reaches a browser as 1006 with no reason.
            await self.close(code=4404)
            return
        self.watching = True
        run_watch.watch().add(self.conversation_id, self._on_running)

    async def disconnect(self, code):
        if self.watching:
            run_watch.watch().remove(self.conversation_id, self._on_running)
        await self._stop_reading()  # the turn itself runs on

    def _on_running(self, run_id) -> None:
        """Join a turn that runs on this conversation but not through this socket (another tab, the API,
        or its own turn after a reload or reconnect): its events so far, then live (issue 12)."""
        busy = self.starting or (self.generation and not self.generation.done())
        if not busy and run_id != self.following:
            self.turn_ended = False
            self.following = run_id
            self.generation = asyncio.create_task(self._join(run_id))

    async def _join(self, run_id, *, announce: bool = True) -> None:
        """Read a run's log to its end: this socket's own turn, or (`announce`d as `joined`) another's."""
        if announce:
            await self.send_json({"type": "joined"})
        async with contextlib.aclosing(follow_log(run_id, owner=self.user.pk)) as events:
            await self._forward(events)
        if not self.turn_ended:  # a run whose process is gone ends with no event of its own
            self.turn_ended = True
            await self.send_json({"type": "ended"})

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        """One bad frame gets an error and keeps the socket (and any turn it runs) open. Frames are read like API
        bodies (`strict_loads`): deep nesting, NUL, lone surrogates and out-of-range numbers are refused."""
        try:
            content = strict_loads(text_data) if text_data is not None else None
        except UnsafeJSON as error:
            path = {"path": error.path} if error.path else {}
            await self.send_json({"type": "error", "code": "bad_input", "message": str(error), **path})
            return
        except ValueError:
            content = None
        if content is None:
            await self.send_json({"type": "error", "code": "bad_input", "message": "Send a JSON object with a type."})
            return
        await self.receive_json(content)

    async def receive_json(self, content: Any, **kwargs):
        if not isinstance(content, dict) or not isinstance(content.get("type"), str):
            await self.send_json({"type": "error", "code": "bad_input", "message": "Send a JSON object with a type."})
            return
        refusal = await self._refusal()  # checked on every message: access may have changed since connect
        if refusal is not None:
            code, message, close_code = refusal
            await self.send_json({"type": "error", "code": code, "message": message})
            await self.close(code=close_code)
            return
        if content["type"] == "stop":
            await self._stop_turn()
            # Sent once the stopped node is written, so a page can redraw from the server's record.
            await self.send_json({"type": "stopped"})
            return
        try:
            begin = self._begin_for(content)
            message_id = _message_id(content)
        except ArborError as error:
            await self.send_json({"type": "error", "code": error.code, "message": error.message})
            return
        if begin is None:
            await self.send_json({"type": "error", "code": "bad_input",
                                  "message": f"Unknown message type {content['type']!r}."})
            return
        busy = False
        if self.generation and not self.generation.done():
            if self.turn_ended:
                with contextlib.suppress(Exception):  # its turn has ended and said so; only its thread winds down
                    await self.generation
            else:
                busy = True
        self.starting = True  # the watcher must not join the turn this socket is starting
        try:
            # One step in a thread: the turn (its question written) and the thread that runs it. A socket
            # that drops meanwhile cancels only this wait; the turn runs all the same.
            started = await in_pool_thread(functools.partial(
                _begin_and_launch, begin, user=self.user, message_id=message_id and self._message_key(message_id),
                asked=_asked(content), busy=busy))
        except ArborError as error:
            await self.send_json({"type": "error", "code": error.code, "message": error.message})
            return
        finally:
            self.starting = False
        if started.resent:  # sent before (a resend after a reconnect, or by another socket): the first's run
            await self._show_resent(started.run_id)
            return
        run_id = started.run_id
        if run_id is None:  # an approval recorded; others still wait
            await self.send_json({"type": "approval_recorded"})
            return
        self.turn_ended = False
        self.following = run_id
        self.generation = asyncio.create_task(self._join(run_id, announce=False))

    def _message_key(self, message_id: str) -> str:
        """A message id's key: the page's id, in this conversation (ids are the page's own, so never shared)."""
        return f"socket:{self.conversation_id}:{message_id}"

    async def _show_resent(self, run_id) -> None:
        if run_id is None:
            await self.send_json({"type": "approval_recorded"})
        elif run_id != self.following or self.generation is None or self.generation.done():
            await self._stop_reading()
            self.turn_ended = False
            self.following = run_id
            self.generation = asyncio.create_task(self._join(run_id))
        else:
            await self.send_json({"type": "joined"})  # already showing it: say the question was taken

    def _begin_for(self, content: dict[str, Any]) -> Callable[[], Turn | None] | None:
        """The turn start a message asks for, its fields checked by the API's own input serializer;
        None for an unknown type. Raises BadInput (a 400's message) for bad fields."""
        kind = content["type"]
        if kind not in _STARTS:
            return None
        serializer_class, start = _STARTS[kind]
        fields = {k: v for k, v in content.items() if k not in ("type", "id")}
        data = serializer_class(data=fields) if serializer_class else None
        if data is not None and not data.is_valid():
            raise BadInput(" ".join(f"{name}: {' '.join(map(str, errors))}" for name, errors in data.errors.items()))
        values = data.validated_data if data is not None else {}
        return lambda: start(user=self.user, conversation_id=self.conversation_id, **values)

    async def _forward(self, events) -> None:
        """Send a turn's numbered events on, tokens in small batches: a token waits at most
        TOKEN_BATCH_SECONDS (a timer sends the batch; it never waits for the next token)."""
        pending: list[str] = []
        node = model = None  # a token's node, and its model when several are asked at once (issue 33)
        timer: asyncio.TimerHandle | None = None
        loop = asyncio.get_running_loop()
        sending = asyncio.Lock()  # the timer's batch and the loop's events go out one at a time, in order

        async def flush():
            nonlocal timer
            if timer is not None:
                timer.cancel()
                timer = None
            async with sending:
                if pending:
                    text = "".join(pending)
                    pending.clear()
                    await self.send_json({"type": "token", "text": text, "node": node,
                                          **({"model": model} if model else {})})

        def due():
            nonlocal timer
            timer = None
            batches.add(task := loop.create_task(flush()))
            task.add_done_callback(batches.discard)

        batches: set[asyncio.Task] = set()
        try:
            async for _, event in events:
                if event.type == EventType.TOKEN:
                    if pending and event.data["node"] != node:
                        await flush()
                    pending.append(event.data["text"])
                    node, model = event.data["node"], event.data.get("model")
                    if timer is None:
                        timer = loop.call_later(TOKEN_BATCH_SECONDS, due)
                    continue
                await flush()
                self.turn_ended = event.type in ENDINGS
                async with sending:
                    await self.send_json({"type": event.type, **event.data})
            await flush()
        finally:
            if timer is not None:
                timer.cancel()

    async def _stop_reading(self) -> None:
        task, self.generation = self.generation, None
        if task and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _stop_turn(self) -> None:
        """Ask the conversation's running turn to stop and wait until it has recorded how it ended (its
        node failed/cancelled), whichever tab or process runs it."""
        conversation = await in_pool_thread(
            lambda: conversation_for_user(user=self.user, conversation_id=self.conversation_id))
        if not await in_pool_thread(detached.request_stop, conversation):
            return
        task = self.generation
        if task and not task.done():
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(task), timeout=STOP_WAIT_SECONDS)
            return
        for _ in range(int(STOP_WAIT_SECONDS / 0.1)):
            if not await in_pool_thread(detached.running, conversation):
                return
            await asyncio.sleep(0.1)

    async def _owns(self) -> bool:
        def owns() -> bool:
            try:
                conversation_for_user(user=self.user, conversation_id=self.conversation_id)
            except NotFound:
                return False
            return True

        return await in_pool_thread(owns)

    async def _refusal(self) -> tuple[str, str, int] | None:
        """Why this socket may no longer act (its session signed out, in this tab or another, or the conversation
        is not the person's any more), or None (issue 26: a signed-out tab could still ask, and was answered)."""
        if not await in_pool_thread(_still_signed_in, self.scope, self.user.pk):
            return "signed_out", "You are signed out: sign in again to go on.", 4401
        if not await self._owns():
            return "not_found", "No such conversation.", 4404
        return None


def _still_signed_in(scope, user_id: int) -> bool:
    """Whether the socket's session, read again from the session store now, still signs in `user_id` (a sign-out
    deletes it; a password change makes its hash stale)."""
    key = getattr(scope.get("session"), "session_key", None)
    if not key:
        return False
    store = import_module(settings.SESSION_ENGINE).SessionStore(key)
    user = auth.get_user(SimpleNamespace(session=store))
    return user.is_authenticated and user.pk == user_id
