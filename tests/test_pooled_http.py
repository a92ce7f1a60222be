"""The server's ASGI handler (`config.pooled_http.PooledASGIHandler`), driven with raw ASGI messages as uvicorn and
Daphne drive it (issue 34): a request starts no thread on the event loop, its signals go in the view's own thread,
and what Django's handler did for a client that leaves, a streamed file and a refused body it still does."""

from __future__ import annotations

import asyncio
import io
import threading

import pytest
from django.core import signals
from django.http import FileResponse, HttpResponse, StreamingHttpResponse
from django.urls import path

from config.pooled_http import PooledASGIHandler
from config.streams import EventStream

released = threading.Event()
seen: dict[str, list[str]] = {}


def _plain(request):
    seen.setdefault("view", []).append(threading.current_thread().name)
    return HttpResponse(b"plain answer")


def _waits(request):
    seen.setdefault("view", []).append(threading.current_thread().name)
    released.wait(10)
    return HttpResponse(b"nobody reads this")


file_content = io.BytesIO()


def _file(request):
    global file_content
    file_content = io.BytesIO(b"0123456789" * 20_000)  # read by a sync iterator, in chunks
    return FileResponse(file_content, content_type="application/octet-stream")


def _streamed(request):
    async def parts():
        for word in ("one ", "two ", "three"):
            await asyncio.sleep(0)
            yield word.encode()

    return StreamingHttpResponse(parts(), content_type="text/plain")


def _event_stream(request):
    """As the turn API's stream: a slot held until the server closes the response."""
    if request.GET.get("wait"):
        released.wait(10)

    async def events():
        for word in ("one", "two"):
            await asyncio.sleep(0)
            yield f"data: {word}\n\n".encode()
        if request.GET.get("break"):
            raise RuntimeError("the stream broke")

    stream = EventStream(events())
    stream.hold(lambda: seen.setdefault("slot given back", []).append(threading.current_thread().name))
    return stream


urlpatterns = [path("plain/", _plain), path("waits/", _waits), path("file/", _file), path("streamed/", _streamed),
               path("events/", _event_stream)]


@pytest.fixture(autouse=True)
def _urls(settings):
    settings.ROOT_URLCONF = __name__
    seen.clear()
    released.clear()
    yield
    released.set()


@pytest.fixture
def recorded_signals():
    def receiver(name):
        def record(sender, **kwargs):
            seen.setdefault(name, []).append(threading.current_thread().name)
        return record

    started, finished = receiver("request_started"), receiver("request_finished")
    signals.request_started.connect(started)
    signals.request_finished.connect(finished)
    yield
    signals.request_started.disconnect(started)
    signals.request_finished.disconnect(finished)


def _soon(what: str) -> list[str]:
    for _ in range(500):
        if what in seen:
            return seen[what]
        threading.Event().wait(0.01)
    raise AssertionError(f"{what!r} never came: {seen}")


async def _given_back() -> None:
    for _ in range(500):
        if "slot given back" in seen:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the stream's slot was never given back: {seen}")


def _scope(url: str, method: str = "GET", headers: list | None = None, query: bytes = b"") -> dict:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
            "path": url, "raw_path": url.encode(), "query_string": query, "root_path": "",
            "headers": [(b"host", b"testserver"), *(headers or [])], "client": ("127.0.0.1", 5000),
            "server": ("testserver", 80)}


async def _call(handler, url: str, *, body: bytes = b"", leave: asyncio.Event | None = None, **scope) -> list[dict]:
    """One request; `leave`: the client disconnects once it is set (else it waits for the end, as a client does)."""
    sent: list[dict] = []
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        if messages:
            return messages.pop(0)
        await (leave.wait() if leave is not None else asyncio.Event().wait())
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await handler(_scope(url, **scope), receive, send)
    return sent


def _body(sent: list[dict]) -> bytes:
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_issue_34_a_request_starts_no_thread_on_the_event_loop_and_its_signals_go_in_the_views_thread(
        monkeypatch, recorded_signals):
    """Django's handler started two threads on the loop a request (its ThreadSensitiveContext's and the one joining
    it); under hundreds of streams each start held the loop until the new thread got the GIL."""
    handler = PooledASGIHandler()
    on_loop: list[str] = []
    start, loop_thread = threading.Thread.start, threading.current_thread()  # asyncio.run's loop runs here

    def recording_start(thread):
        if threading.current_thread() is loop_thread:
            on_loop.append(thread.name)
        return start(thread)

    async def two_requests():
        first = await _call(handler, "/plain/")  # the view pool's first thread may be made here
        monkeypatch.setattr(threading.Thread, "start", recording_start)
        second = await _call(handler, "/plain/")
        return first, second

    first, second = asyncio.run(two_requests())
    assert first[0]["status"] == second[0]["status"] == 200 and _body(second) == b"plain answer"
    assert on_loop == [], f"threads started on the event loop: {on_loop}"
    assert seen["request_started"] == seen["view"] == seen["request_finished"], seen
    assert all(name.startswith("arbor-view") for name in seen["view"]), seen


def test_issue_34_a_client_that_leaves_while_the_view_runs_is_let_go_and_the_request_finishes(recorded_signals):
    handler = PooledASGIHandler()

    async def leaving():
        leave = asyncio.Event()
        call = asyncio.create_task(_call(handler, "/waits/", leave=leave))
        while "view" not in seen:
            await asyncio.sleep(0.01)
        leave.set()
        return await asyncio.wait_for(call, 5)  # the handler returns although the view still runs

    sent = asyncio.run(leaving())
    assert sent == [], "nothing is sent to a client that left"
    assert "request_finished" not in seen, "the view still runs"
    released.set()
    assert _soon("request_finished") == seen["request_started"] == seen["view"], "finished in the view's thread"


def test_issue_26_34_a_stream_gives_its_slot_back_read_whole_left_mid_stream_or_left_before_its_view_ended():
    """The server closes every stream it was given (EventStream.close gives the person's stream slot back)."""
    handler = PooledASGIHandler()
    sent = asyncio.run(_call(handler, "/events/"))
    assert _body(sent) == b"data: one\n\ndata: two\n\n" and len(_soon("slot given back")) == 1

    async def leaves_at_once():  # the disconnect is there right after the request (a client that read and left)
        left = asyncio.Event()
        left.set()
        await _call(handler, "/events/", leave=left)
        await _given_back()  # on this loop, which a server keeps running

    seen.clear()
    asyncio.run(leaves_at_once())
    assert len(seen["slot given back"]) == 1

    async def leaves_mid_view():
        leave = asyncio.Event()
        call = asyncio.create_task(_call(handler, "/events/", query=b"wait=1", leave=leave))
        await asyncio.sleep(0.2)
        leave.set()
        await asyncio.wait_for(call, 5)
        assert "slot given back" not in seen, "the view still runs"
        released.set()
        await _given_back()  # once the view ends, although the handler has returned

    seen.clear()
    asyncio.run(leaves_mid_view())
    assert len(seen.get("slot given back", [])) == 1, seen


@pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume synchronous iterators")  # a file's, as Django
def test_issue_34_a_file_is_streamed_whole_then_closed_and_an_async_stream_in_order():
    handler = PooledASGIHandler()
    sent = asyncio.run(_call(handler, "/file/"))
    assert sent[0]["status"] == 200 and _body(sent) == b"0123456789" * 20_000
    assert sent[-1] == {"type": "http.response.body"} and file_content.closed
    sent = asyncio.run(_call(handler, "/streamed/"))
    assert sent[0]["status"] == 200 and _body(sent) == b"one two three"


def test_a_stream_that_breaks_mid_send_fails_the_request_as_under_django_and_still_gives_its_slot_back():
    async def breaking():
        with pytest.raises(RuntimeError, match="the stream broke"):
            await _call(PooledASGIHandler(), "/events/", query=b"break=1")
        await _given_back()

    asyncio.run(breaking())
    assert len(seen["slot given back"]) == 1


def test_a_request_django_cannot_read_is_answered_400_by_the_handler_and_no_view_runs(recorded_signals):
    sent = asyncio.run(_call(PooledASGIHandler(), "/plain/", query=b"q=\xff"))  # not UTF-8
    assert sent[0]["status"] == 400 and "view" not in seen
    assert seen["request_started"] == seen["request_finished"] and seen["request_started"][0].startswith("arbor-view")
    with pytest.raises(ValueError, match="only handle ASGI/HTTP"):
        asyncio.run(PooledASGIHandler()({"type": "lifespan"}, None, None))
