"""Issue 13, fairness and limits: a person's concurrent turns are capped (429 `too_many_turns`), the API is
throttled per caller and sign-in per address and per user name, and a throttle whose cache is away lets
requests through rather than refusing everyone."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.urls import reverse

from conversations import services
from conversations.errors import TooManyTurns, TurnInProgress
from conversations.locks import TurnLock
from conversations.models import Conversation, Node

pytestmark = pytest.mark.django_db


def _conversations(user, n):
    return [services.conversation_create(owner=user, title=f"c{i}") for i in range(n)]


def test_issue_13_a_person_holds_at_most_the_limit_of_turns_and_a_freed_one_lets_the_next_in(user, other_user,
                                                                                            settings):
    settings.ARBOR_MAX_CONCURRENT_TURNS_PER_USER = 2
    first, second, third = _conversations(user, 3)
    held = [TurnLock.acquire(first), TurnLock.acquire(second)]
    with pytest.raises(TooManyTurns) as refused:
        TurnLock.acquire(third)
    assert refused.value.status == 429 and "2 turns running" in refused.value.message
    assert Conversation.objects.get(pk=third.pk).turn_token is None, "a refusal changes nothing"
    with pytest.raises(TurnInProgress):
        TurnLock.acquire(Conversation.objects.get(pk=first.pk)), "a held conversation is still a 409"
    TurnLock.acquire(_conversations(other_user, 1)[0]).release()  # another person is not held back
    held[0].release()
    TurnLock.acquire(Conversation.objects.get(pk=third.pk)).release()


def test_issue_13_an_expired_lease_does_not_count_against_the_person(user, settings, monkeypatch):
    from conversations import locks

    settings.ARBOR_MAX_CONCURRENT_TURNS_PER_USER = 1
    dead, fresh = _conversations(user, 2)
    TurnLock.acquire(dead)  # its process "dies": never released
    later = locks.now() + __import__("datetime").timedelta(seconds=settings.ARBOR_TURN_LOCK_SECONDS + 1)
    monkeypatch.setattr(locks, "now", lambda: later)
    TurnLock.acquire(fresh).release()


def test_issue_13_the_api_answers_429_too_many_turns_and_records_nothing(api, user, settings):
    settings.ARBOR_MAX_CONCURRENT_TURNS_PER_USER = 1
    busy, idle = _conversations(user, 2)
    lock = TurnLock.acquire(busy)
    response = api.post(reverse("turn-create", args=[idle.pk]), {"content": "hello"}, format="json")
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "too_many_turns"
    assert not Node.objects.filter(conversation=idle).exists()
    lock.release()
    assert api.post(reverse("turn-create", args=[idle.pk]), {"content": "hello"}, format="json").status_code == 201


def test_issue_13_the_api_is_throttled_per_caller(api, other_user, monkeypatch):
    from rest_framework.throttling import SimpleRateThrottle

    from tests.conftest import _client_for

    # The rates as DEFAULT_THROTTLE_RATES would give them (read once, when DRF is imported).
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {"user": "3/min", "anon": "2/min"})
    codes = [api.get(reverse("conversation-list")).status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    refused = api.get(reverse("conversation-list"))
    assert refused.json()["error"]["code"] == "throttled" and "Retry-After" in refused.headers
    assert _client_for(other_user).get(reverse("conversation-list")).status_code == 200, "others go on"


def test_issue_26_the_anonymous_rate_applies_before_any_permission_refuses(monkeypatch):
    """Issue 26: a caller with no credentials was answered 401 for ever (permissions run before throttles), so the
    anonymous rate never applied. Now it is counted first, on the API and on /v1, once a request."""
    from rest_framework.test import APIClient
    from rest_framework.throttling import SimpleRateThrottle

    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {"user": "100/min", "anon": "3/min"})
    anonymous = APIClient()
    codes = [anonymous.get(reverse("conversation-list")).status_code for _ in range(3)]
    assert codes == [401, 401, 401], "three requests are three, not six (counted once each)"
    refused = anonymous.get(reverse("conversation-list"))
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "throttled"
    assert int(refused["Retry-After"]) >= 1
    assert anonymous.get("/v1/models").status_code == 429, "the same address, the same count on /v1"


def test_issue_13_a_throttle_whose_cache_is_away_lets_requests_through(api, monkeypatch):
    def away(*args, **kwargs):
        raise ConnectionError("redis is down")

    monkeypatch.setattr(cache, "get", away)
    monkeypatch.setattr(cache, "set", away)
    assert api.get(reverse("conversation-list")).status_code == 200


def test_issue_13_sign_in_is_refused_with_429_after_too_many_attempts(client, user, settings):
    settings.ARBOR_SIGNIN_RATE = "3/min"
    url = reverse("login")
    for _ in range(3):
        assert client.post(url, {"username": user.username, "password": "wrong"}).status_code == 200
    refused = client.post(url, {"username": user.username, "password": "wrong"})
    assert refused.status_code == 429 and b"Too many sign-in attempts" in refused.content
    assert int(refused["Retry-After"]) >= 1
    user.set_password("right-password-123")
    user.save()
    assert client.post(url, {"username": user.username, "password": "right-password-123"}).status_code == 429, \
        "even the right password waits: the attempts are counted, not only the failures"
    cache.clear()
    assert client.post(url, {"username": user.username, "password": "right-password-123"}).status_code == 302


def test_issue_26_the_admins_sign_in_has_the_same_limit(client, django_user_model, settings):
    """Issue 26: /admin/login/ had no limit (54 wrong superuser passwords, then the right one worked). Now the
    same attempts count, across both forms, and a refusal says when to come back (Retry-After)."""
    settings.ARBOR_SIGNIN_RATE = "3/min"
    root = django_user_model.objects.create_superuser(username="root", password="right-password-123")
    url = reverse("admin:login")
    assert url == "/admin/login/"
    for _ in range(3):
        assert client.post(url, {"username": root.username, "password": "wrong"}).status_code == 200
    refused = client.post(url, {"username": root.username, "password": "right-password-123"})
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1
    assert b"Too many sign-in attempts" in refused.content
    assert client.get("/admin/").status_code == 302, "the right password, refused, signed nobody in"
    assert client.post(reverse("login"), {"username": root.username, "password": "right-password-123"}
                       ).status_code == 429, "the site's form counts the same attempts"
    cache.clear()
    assert client.post(url, {"username": root.username, "password": "right-password-123",
                             "next": "/admin/"}).status_code == 302
    assert client.get("/admin/").status_code == 200


def test_issue_13_a_busy_conversation_whose_lease_runs_out_meanwhile_is_409_not_429(user, settings, monkeypatch):
    """The conditional UPDATE finds the conversation held; its lease runs out before the refusal is worded.
    The refusal is a 409 (try again), not "too many turns": the person holds no other lock."""
    from datetime import timedelta

    from django.db.models.query import QuerySet

    from conversations import locks

    settings.ARBOR_MAX_CONCURRENT_TURNS_PER_USER = 1
    conversation = _conversations(user, 1)[0]
    TurnLock.acquire(conversation)  # another turn holds it
    base, jumped = locks.now(), []
    monkeypatch.setattr(locks, "now", lambda: base + timedelta(seconds=(settings.ARBOR_TURN_LOCK_SECONDS + 1)
                                                                  if jumped else 0))
    update = QuerySet.update

    def update_then_time_passes(self, **changes):
        done = update(self, **changes)
        jumped.append(True)
        return done

    monkeypatch.setattr(QuerySet, "update", update_then_time_passes)
    with pytest.raises(TurnInProgress):
        TurnLock.acquire(Conversation.objects.get(pk=conversation.pk))


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_issues_13_34_requests_at_once_are_each_counted_in_redis_over_a_few_kept_connections(user):
    """A real server with REDIS_URL set and a rate of 30 a minute; after one request, 40 more from 4 threads at
    once. Exactly 29 are let through and the rest refused with 429, every one counted in Redis. DRF's own
    count was a read and a write, so requests at once lost counts and went past the rate (29 of 41 counted).
    And Django made a connection pool per request: each request opened a new connection to Redis (41 for
    41); now the server keeps a few."""
    import shutil
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    import requests
    from rest_framework.authtoken.models import Token

    from tests.conversations.test_turn_log_stores import ThrowawayRedis
    from tests.support.servers import Server

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    token = Token.objects.create(user=user).key
    redis = ThrowawayRedis().start()

    def ask(*args: str) -> str:
        return subprocess.run(["redis-cli", "-p", str(redis.port), *args], capture_output=True, text=True,
                              check=True).stdout

    def connections() -> int:
        (line,) = [line for line in ask("info", "stats").splitlines() if line.startswith("total_connections_received:")]
        return int(line.split(":")[1])

    try:
        with Server(REDIS_URL=redis.url, ARBOR_API_USER_RATE="30/min") as server:
            def list_conversations(_=None) -> requests.Response:
                return requests.get(server.url("/api/conversations/"), headers={"Authorization": f"Token {token}"},
                                    timeout=30)

            assert list_conversations().status_code == 200
            before = connections()
            with ThreadPoolExecutor(4) as pool:
                answers = list(pool.map(list_conversations, range(40)))
            opened = connections() - before
            (key,) = [key for key in ask("--scan", "--pattern", "*throttle_user*").split() if key]
            counted = ask("llen", key).strip()
            redis.stop()
            assert list_conversations().status_code == 200, "Redis away: the request is let through"
        codes = [answer.status_code for answer in answers]
        assert (codes.count(200), codes.count(429)) == (29, 11)
        assert all(1 <= int(answer.headers["Retry-After"]) <= 60 for answer in answers if answer.status_code == 429)
        assert counted == "30", "each request let through is counted"
        assert opened <= 4, f"{opened} new connections to Redis for 40 requests"
    finally:
        redis.stop()


def test_issue_13_requests_at_once_in_this_process_are_each_counted(user, monkeypatch):
    """The embedded default counts in this process's memory: 8 threads' 40 requests at once at a rate of 10 a
    minute let exactly 10 through. The cache's read is made slow, as a busy process's is: DRF's read and write
    of the count, unlocked, then lost nearly every count."""
    import threading
    import time
    from types import SimpleNamespace

    from django.core.cache.backends.locmem import LocMemCache

    from config.throttles import UserThrottle

    monkeypatch.setattr(UserThrottle, "THROTTLE_RATES", {**UserThrottle.THROTTLE_RATES, "user": "10/min"})
    read = LocMemCache.get

    def slow_read(*args, **kwargs):
        value = read(*args, **kwargs)
        time.sleep(0.002)
        return value

    monkeypatch.setattr(LocMemCache, "get", slow_read)  # each thread has a cache object of its own
    request = SimpleNamespace(user=user, META={})
    start, allowed = threading.Barrier(8), []

    def send():
        start.wait()
        allowed.extend(UserThrottle().allow_request(request, None) for _ in range(5))

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (allowed.count(True), allowed.count(False)) == (10, 30)
