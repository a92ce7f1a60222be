"""Idempotency keys on every POST that starts or decides a turn (issue 31, Stripe's semantics; API.md "Round 3").

A client that sends `Idempotency-Key` and retries after a timeout gets the first request's outcome, never a second
model call: the same key from the same person within KEY_HOURS says the stored JSON answer again, or follows the
first request's stream again from its first event (the run's log keeps them). The same key with another body is a
422 `idempotency_key_reused`. Two requests with one key at once run once: the later waits for the first's outcome.
A request refused before it changed anything (a 4xx: bad input, a turn in progress) keeps nothing, so a corrected
retry with the same key runs.

`IdempotentView` puts this in front of a view's POST; the view says how to follow a run again (`stream_run`).
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from rest_framework.response import Response

from config.errors import ArborError, BadInput
from config.streams import EventStream
from conversations.models import IdempotentRequest

KEY_HOURS = 24
MAX_KEY_CHARS = 255
WAIT_STEP_SECONDS = 0.05
ABANDONED_AFTER_SECONDS = 60  # past the model call's timeout


class Replay(Exception):  # noqa: N818 - not an error: the first request's outcome, said again
    def __init__(self, claim: IdempotentRequest):
        super().__init__(claim.key)
        self.claim = claim


def digest(where: str, data) -> str:
    """What a request asked, where: a body as JSON is compared by its meaning, not its spacing."""
    body = json.dumps(data, sort_keys=True, default=str) if isinstance(data, dict | list) else repr(data)
    return hashlib.sha256(f"{where}\n{body}".encode()).hexdigest()


def fingerprint(request) -> str:
    """The method, the path, what picks the conversation and the answer's form beside the body (a chat list's
    `X-Arbor-Conversation`, `Accept`), and the body."""
    where = (f"{request.method} {request.path} {request.headers.get('X-Arbor-Conversation', '')} "
             f"{request.headers.get('Accept', '')}")
    return digest(where, request.data)


def _key(request) -> str | None:
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return None
    if not key.strip() or len(key) > MAX_KEY_CHARS:
        raise BadInput(f"`Idempotency-Key` must be 1 to {MAX_KEY_CHARS} characters.", code="bad_idempotency_key")
    return key


def claim(request) -> IdempotentRequest | None:
    """This request's hold on its key, or None without one; `Replay` when the key already has an outcome (waiting
    for it while the first request with the key still runs)."""
    key = _key(request)
    return None if key is None else claim_key(request.user, key, fingerprint(request))


def claim_key(user, key: str, mine: str) -> IdempotentRequest:
    """`user`'s hold on `key` for the request whose digest is `mine`; `Replay`, or 422 for another request."""
    now = timezone.now()
    IdempotentRequest.objects.filter(owner=user, key=key, created_at__lt=now - timedelta(hours=KEY_HOURS)).delete()
    # A first request that never said how it ended (its process died before it answered) lets its key go once no
    # call of its could still be running: a retry then runs, rather than waiting on it for a day.
    IdempotentRequest.objects.filter(owner=user, key=key, done=False, run_id="", created_at__lt=now - timedelta(
        seconds=settings.ARBOR_LLM_TIMEOUT_SECONDS + ABANDONED_AFTER_SECONDS)).delete()
    try:
        with transaction.atomic():
            return IdempotentRequest.objects.create(owner=user, key=key, fingerprint=mine)
    except IntegrityError:
        pass
    first = outcome_of(user, key)
    if first.fingerprint != mine:
        raise ArborError("This Idempotency-Key was used with another request; send a new key for a new request.",
                         code="idempotency_key_reused", status=422)
    raise Replay(first)


def outcome_of(user, key: str) -> IdempotentRequest:
    """The first request's row once it has an outcome to say again (a stream has one as soon as it started)."""
    deadline = time.monotonic() + settings.ARBOR_LLM_TIMEOUT_SECONDS + 30
    while True:
        first = IdempotentRequest.objects.filter(owner=user, key=key).first()
        if first is None:  # the first was refused and let the key go meanwhile: nothing to say again
            raise ArborError("The first request with this Idempotency-Key was refused; send it again.",
                             code="idempotency_key_released", status=409)
        if first.done or first.run_id or time.monotonic() > deadline:
            break
        time.sleep(WAIT_STEP_SECONDS)
    if not (first.done or first.run_id):
        raise ArborError("The first request with this Idempotency-Key has not finished; try again later.",
                         code="idempotency_in_progress", status=409)
    return first


def settle_run(held: IdempotentRequest | None, run_id) -> None:
    """A socket's message started the run `run_id` (None: an approval recorded, others still wait)."""
    if held is not None:
        IdempotentRequest.objects.filter(pk=held.pk).update(run_id=str(run_id or ""), done=True,
                                                            status_code=200 if run_id else 202)


def release(held: IdempotentRequest | None) -> None:
    """The request was refused before it changed anything: its key may be sent again."""
    if held is not None:
        IdempotentRequest.objects.filter(pk=held.pk).delete()


def settle(held: IdempotentRequest, response) -> None:
    """Keep what the request answered: a stream's run, or a JSON answer (a success, or a failure after the call
    was recorded, a 5xx); a refusal (4xx) changed nothing and lets the key go."""
    run_id = getattr(response, "run_id", None) if isinstance(response, EventStream) else None
    if run_id is not None:
        IdempotentRequest.objects.filter(pk=held.pk).update(run_id=str(run_id), status_code=response.status_code,
                                                            done=True)
    elif 400 <= response.status_code < 500:
        release(held)
    else:
        IdempotentRequest.objects.filter(pk=held.pk).update(done=True, status_code=response.status_code,
                                                            body=getattr(response, "data", None))


class IdempotentView:
    """Mixin for an APIView (before it in the bases) whose POST starts or decides a turn. The view's
    `stream_run(request, run_id)` builds its stream of a run; a replayed stream is that, from the first event."""

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)  # signed in, throttled, stream slot taken
        self._idempotent = claim(request) if request.method == "POST" else None

    def handle_exception(self, exc):
        if isinstance(exc, Replay):
            return self.replay(exc.claim)
        try:
            return super().handle_exception(exc)
        except Exception:  # unhandled (a 500 Django answers): nothing to say again, and the key may be sent again
            release(getattr(self, "_idempotent", None))
            self._idempotent = None
            raise

    def replay(self, first: IdempotentRequest):
        if first.run_id:
            stream = self.stream_run(self.request, uuid.UUID(first.run_id))
            stream["Idempotent-Replayed"] = "true"
            return stream
        response = Response(first.body, status=first.status_code)
        response["Idempotent-Replayed"] = "true"
        return response

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        held = getattr(self, "_idempotent", None)
        if held is not None:
            settle(held, response)
        return response
