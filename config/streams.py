"""Server-sent event responses, and the per-person bound on how many one process streams (issue 26)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable

from django.conf import settings
from django.http import StreamingHttpResponse
from rest_framework.request import Request
from rest_framework.views import APIView

from config.errors import TooManyStreams


class EventStream(StreamingHttpResponse):
    """The one server-sent event response: the turn API's events and the OpenAI surface's chunks and events alike.
    Never cached, never buffered by a proxy in front: each event leaves when it is written. It holds one of its
    person's stream slots (`StreamSlotView`) until the server closes it, whether the client read it all or left."""

    def __init__(self, events: AsyncIterator[bytes]):
        super().__init__(events, content_type="text/event-stream")
        self["Cache-Control"] = "no-cache"
        self["X-Accel-Buffering"] = "no"
        self._release: Callable[[], None] | None = None

    def hold(self, release: Callable[[], None]) -> None:
        self._release = release

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self._release is not None:
                self._release()


class _StreamSlots:
    """How many streams each person follows in this process. A stream holds no database connection while it
    waits (issue 26), but it holds a socket, a task and memory: past ARBOR_MAX_STREAMS_PER_USER, one more is a
    429, so no one person's curl loop can starve the process."""

    def __init__(self):
        self._held: Counter[int] = Counter()
        self._lock = threading.Lock()

    def take(self, owner_id: int) -> Callable[[], None]:
        """A slot for one stream of `owner_id`; call what comes back once to give it back (more calls are free)."""
        limit = settings.ARBOR_MAX_STREAMS_PER_USER
        with self._lock:
            if limit and self._held[owner_id] >= limit:
                raise TooManyStreams(f"You follow {limit} streams already; close one (or let it end) first.",
                                     retry_after=5)
            self._held[owner_id] += 1
        given_back = threading.Event()

        def release() -> None:
            with self._lock:
                if not given_back.is_set():
                    given_back.set()
                    self._held[owner_id] -= 1

        return release

    def held(self, owner_id: int) -> int:
        with self._lock:
            return self._held[owner_id]


stream_slots = _StreamSlots()


class StreamSlotView(APIView):
    """A view that may answer with an `EventStream`: when the request asks for one (`wants_stream`), a slot is
    taken before the view does anything (so a refused stream starts no turn), handed to the stream, or given back
    with any other answer."""

    def wants_stream(self, request: Request) -> bool:
        raise NotImplementedError

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        self._stream_slot = stream_slots.take(request.user.pk) if self.wants_stream(request) else None

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        release = getattr(self, "_stream_slot", None)
        if release is not None:
            if isinstance(response, EventStream):
                response.hold(release)
            else:
                release()
        return response
