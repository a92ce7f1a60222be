"""Issue 31 / API.md "Round 3": an `Idempotency-Key` on a POST that starts a turn (Stripe's semantics). A retry
with the same key gets the first request's outcome and never calls the model again: the same nodes for a JSON
answer, the same run followed from its first event for a stream, on the API and on /v1; the same key with another
body is a 422 that records nothing; a refused request lets its key go; two requests at once with one key run once.
Rule D1 (nothing doubled, nothing lost): the node counts say it."""

from __future__ import annotations

import json
import threading

import httpx
import openai
import pytest
from rest_framework.authtoken.models import Token

from conversations import services
from conversations.models import IdempotentRequest, Node

MODEL = "arbor/echo"


def _turn(api, cid: int, content: str, key: str | None, **extra):
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    return api.post(f"/api/conversations/{cid}/turns/", {"content": content}, format="json", **headers, **extra)


@pytest.mark.django_db
def test_issue_31_a_retried_turn_with_the_same_key_says_the_first_outcome_and_calls_nothing(api, conversation):
    first = _turn(api, conversation.pk, "What is 2 + 2?", "key-1")
    assert first.status_code == 201 and "Idempotent-Replayed" not in first
    again = _turn(api, conversation.pk, "What is 2 + 2?", "key-1")
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json() and Node.objects.count() == 1, "one call, said twice"

    reused = _turn(api, conversation.pk, "Something else", "key-1")
    assert reused.status_code == 422 and reused.json()["error"]["code"] == "idempotency_key_reused"
    assert Node.objects.count() == 1, "a refused reuse records nothing"
    other = _turn(api, conversation.pk, "What is 2 + 2?", "key-2")
    assert other.status_code == 201 and Node.objects.count() == 2, "another key is another request"
    plain = _turn(api, conversation.pk, "What is 2 + 2?", None)
    assert plain.status_code == 201 and Node.objects.count() == 3, "no key: every request runs"


@pytest.mark.django_db
def test_issue_31_a_refused_request_lets_its_key_go_and_keys_are_per_person(api, other_api, user, other_user):
    mine = services.conversation_create(owner=user)
    refused = _turn(api, mine.pk, "", "key-9")
    assert refused.status_code == 400 and not IdempotentRequest.objects.exists(), "nothing kept for a 400"
    assert _turn(api, mine.pk, "now with words", "key-9").status_code == 201
    theirs = services.conversation_create(owner=other_user)
    assert _turn(other_api, theirs.pk, "now with words", "key-9").status_code == 201, "another person's key"
    assert Node.objects.count() == 2
    too_long = _turn(api, mine.pk, "x", "k" * 256)
    assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "bad_idempotency_key"


@pytest.mark.django_db
def test_issue_31_f1_a_failed_call_is_said_again_not_called_again(api, conversation):
    failed = _turn(api, conversation.pk, "#fail", "key-f")
    assert failed.status_code == 502
    again = _turn(api, conversation.pk, "#fail", "key-f")
    assert (again.status_code, again.json()) == (502, failed.json())
    assert Node.objects.filter(status=Node.Status.FAILED).count() == 1


def _sse_events(text: str) -> list[tuple[str, dict]]:
    events = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "data" in fields:
            events.append((fields.get("event", "message"), json.loads(fields["data"])))
    return events


@pytest.mark.django_db(transaction=True)
def test_issue_31_a_retried_stream_follows_the_first_run_again_and_concurrent_requests_run_once(asgi_server, user):
    """A streamed turn retried with its key streams the same run again, from its first event; two requests sent
    at once with one key (a client that retried before the first answered) make one call between them."""
    conversation = services.conversation_create(owner=user)
    headers = {"Authorization": f"Token {Token.objects.create(user=user).key}", "Idempotency-Key": "stream-1",
               "Accept": "text/event-stream"}
    url = f"{asgi_server.url}/api/conversations/{conversation.pk}/turns/"
    first = httpx.post(url, json={"content": "#slow tell me"}, headers=headers, timeout=60)
    again = httpx.post(url, json={"content": "#slow tell me"}, headers=headers, timeout=60)
    assert again.headers["idempotent-replayed"] == "true"
    assert _sse_events(again.text) == _sse_events(first.text) and _sse_events(first.text)[-1][0] == "done"
    assert Node.objects.count() == 1

    answers: list[httpx.Response] = []
    at_once = {**headers, "Idempotency-Key": "json-2", "Accept": "application/json"}

    def send():
        answers.append(httpx.post(url, json={"content": "#slow once"}, headers=at_once, timeout=60))

    threads = [threading.Thread(target=send) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(a.status_code for a in answers) == [201, 201], [a.text for a in answers]
    assert answers[0].json() == answers[1].json() and Node.objects.count() == 2, "run once, said to both"


@pytest.mark.django_db(transaction=True)
def test_issue_31_v1_creates_with_an_idempotency_key_run_once(asgi_server, user):
    """The official SDK's retries send the key it was given: a plain chat completion, a streamed response and an
    Anthropic message, each retried with its key, are one node each, said again the same."""
    client = openai.OpenAI(api_key=Token.objects.create(user=user).key, base_url=f"{asgi_server.url}/v1",
                           max_retries=0)
    once = {"Idempotency-Key": "v1-chat"}
    first = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                           extra_headers=once)
    again = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                           extra_headers=once)
    assert again.id == first.id and again.choices[0].message.content == first.choices[0].message.content

    streamed = {"Idempotency-Key": "v1-responses"}
    with client.responses.stream(model=MODEL, input="stream me", extra_headers=streamed) as stream:
        one = stream.get_final_response()
    with client.responses.stream(model=MODEL, input="stream me", extra_headers=streamed) as stream:
        two = stream.get_final_response()
    assert (two.id, two.output_text) == (one.id, one.output_text)
    with pytest.raises(openai.UnprocessableEntityError, match="another request"):
        client.responses.create(model=MODEL, input="stream me, differently", extra_headers=streamed)
    assert Node.objects.count() == 2


# --- the chat socket: a message's id -------------------------------------------------------------------------

SLOW = "#slow " + " ".join(f"w{i}" for i in range(12))


@pytest.mark.django_db(transaction=True)
async def test_issue_31_a_message_resent_with_its_id_after_a_reconnect_never_doubles_the_question(user):
    """The page sends each turn message with an id and sends it again after a reconnect: the server starts
    nothing for an id it has seen, and the new socket shows the first sending's turn; the same id with another
    message is refused; a new id is a new question."""
    from conversations.models import Conversation
    from tests.support.async_db import in_own_thread
    from tests.support.sockets import chat_socket, receive_until, session_cookie

    conversation = await in_own_thread(lambda: services.conversation_create(owner=user))()
    cookie = await in_own_thread(lambda: session_cookie(user))()
    first = chat_socket(conversation.pk, cookie)
    await first.connect()
    await first.send_json_to({"type": "ask", "content": SLOW, "id": "m-1"})
    assert (await first.receive_json_from(timeout=30))["type"] == "token"
    await first.disconnect()  # the drop: the turn goes on

    again = chat_socket(conversation.pk, cookie)
    await again.connect()
    await again.send_json_to({"type": "ask", "content": SLOW, "id": "m-1"})
    events = await receive_until(again, "done")
    assert events[-1]["answer"].startswith("echo: #slow"), "the first sending's turn, shown to the new socket"
    nodes = await in_own_thread(lambda: list(Node.objects.values_list("sent", flat=True)))()
    assert len(nodes) == 1, "one question, however often it was sent"

    await again.send_json_to({"type": "ask", "content": "another question", "id": "m-1"})
    refused = await again.receive_json_from(timeout=10)
    assert refused["code"] == "idempotency_key_reused"
    await again.send_json_to({"type": "ask", "content": "another question", "id": "m-2"})
    done = await receive_until(again, "done")
    assert done[-1]["answer"].startswith("echo: another question")
    head = await in_own_thread(lambda: Conversation.objects.get(pk=conversation.pk).head_id)()
    assert await in_own_thread(lambda: Node.objects.count())() == 2 and head == done[-1]["head"]
    await again.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_issue_31_a_message_id_that_is_no_text_is_refused_and_starts_nothing(user):
    from tests.support.async_db import in_own_thread
    from tests.support.sockets import chat_socket, session_cookie

    conversation = await in_own_thread(lambda: services.conversation_create(owner=user))()
    socket = chat_socket(conversation.pk, await in_own_thread(lambda: session_cookie(user))())
    await socket.connect()
    for bad in (5, "", "x" * 201):
        await socket.send_json_to({"type": "ask", "content": "hi", "id": bad})
        refused = await socket.receive_json_from(timeout=10)
        assert refused["code"] == "bad_input" and "id" in refused["message"]
    assert await in_own_thread(lambda: Node.objects.count())() == 0
    await socket.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_issue_31_a_message_resent_after_its_turn_ended_shows_that_turn_again(user):
    """A resend that arrives after its turn has ended (the page never saw the answer) starts nothing: the new
    socket is shown the first sending's run from its first event to its end."""
    from tests.support.async_db import in_own_thread
    from tests.support.sockets import chat_socket, receive_until, session_cookie

    conversation = await in_own_thread(lambda: services.conversation_create(owner=user))()
    cookie = await in_own_thread(lambda: session_cookie(user))()
    first = chat_socket(conversation.pk, cookie)
    await first.connect()
    await first.send_json_to({"type": "ask", "content": "once only", "id": "m-9"})
    answered = await receive_until(first, "done")
    await first.disconnect()
    again = chat_socket(conversation.pk, cookie)
    await again.connect()
    await again.send_json_to({"type": "ask", "content": "once only", "id": "m-9"})
    shown = await receive_until(again, "done")
    assert shown[0]["type"] == "joined" and shown[-1]["head"] == answered[-1]["head"]
    assert await in_own_thread(lambda: Node.objects.count())() == 1
    await again.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_issue_31_a_resend_while_its_turn_runs_joins_it_and_a_refused_message_keeps_no_id(user):
    """One path for a message id (the claim, as an Idempotency-Key): the running turn's own message sent again
    on the same socket is that turn ("joined"), not a refusal; another message while it runs is refused
    (turn_in_progress) and lets its id go, so the page can send it again once the turn has ended."""
    from tests.support.async_db import in_own_thread
    from tests.support.sockets import chat_socket, receive_until, session_cookie

    conversation = await in_own_thread(lambda: services.conversation_create(owner=user))()
    socket = chat_socket(conversation.pk, await in_own_thread(lambda: session_cookie(user))())
    await socket.connect()
    await socket.send_json_to({"type": "ask", "content": SLOW, "id": "m-1"})
    assert (await socket.receive_json_from(timeout=30))["type"] == "token"
    await socket.send_json_to({"type": "ask", "content": SLOW, "id": "m-1"})
    assert (await receive_until(socket, "joined"))[-1]["type"] == "joined"
    await socket.send_json_to({"type": "ask", "content": "next question", "id": "m-2"})
    refused = await receive_until(socket, "error")
    assert refused[-1]["code"] == "turn_in_progress"
    await receive_until(socket, "done")
    await socket.send_json_to({"type": "ask", "content": "next question", "id": "m-2"})
    done = await receive_until(socket, "done")
    assert done[-1]["answer"].startswith("echo: next question")
    assert await in_own_thread(lambda: Node.objects.count())() == 2
    await socket.disconnect()
