"""Request rates (issue 13, fairness): the API per caller, and sign-in attempts.

Counts live in the default cache: Redis when `REDIS_URL` is set, so every process counts together. A cache
that cannot be reached lets the request through and logs it: Redis down must not take the API with it.

A request is checked and counted in one step (`_CountedAtOnce`). DRF's own throttle reads a caller's recent
requests and writes them back with the new one: requests at once each read the same list, and all but one of
their counts were lost (4 threads' 40 requests were counted 29 times), so a caller sending at once went past
its rate. With Redis the step is one script, run atomically and in one round trip (DRF's took two); in this
process's memory it is under a lock.
"""

from __future__ import annotations

import logging
import threading

from django.conf import settings
from django.contrib.auth.views import LoginView
from django.core.cache import DEFAULT_CACHE_ALIAS, caches
from django.core.cache import cache as default_cache
from django.core.cache.backends.redis import RedisCache
from django.http import HttpResponse
from rest_framework.exceptions import Throttled
from rest_framework.permissions import BasePermission
from rest_framework.throttling import AnonRateThrottle, SimpleRateThrottle, UserRateThrottle

logger = logging.getLogger("arbor.throttles")


# KEYS[1]: the caller's requests in the window, newest first. ARGV: now, the window (s), the rate's number.
# Returns whether this request is allowed (and counted), the count, and the oldest request's time.
_COUNT_IN_WINDOW = """
local key, now, window, limit = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
while true do
  local oldest = redis.call('LINDEX', key, -1)
  if not oldest or tonumber(oldest) > now - window then break end
  redis.call('RPOP', key)
end
local count = redis.call('LLEN', key)
local allowed = 0
if count < limit then
  redis.call('LPUSH', key, ARGV[1])
  redis.call('EXPIRE', key, math.ceil(window))
  count = count + 1
  allowed = 1
end
return {allowed, count, redis.call('LINDEX', key, -1)}
"""
_IN_MEMORY = threading.Lock()


class _CountedAtOnce:
    """DRF's sliding window (the same rates, the same `wait()`), checked and counted in one step."""

    _in_redis: tuple[int, float | None] | None = None  # the window's count and oldest time, as Redis left them

    def allow_request(self, request, view) -> bool:
        if self.rate is None or (key := self.get_cache_key(request, view)) is None:
            return True
        self.key = key
        # DRF's `cache` is Django's proxy to this request's cache object.
        backend = caches[DEFAULT_CACHE_ALIAS] if self.cache is default_cache else self.cache
        if not isinstance(backend, RedisCache):
            with _IN_MEMORY:
                return super().allow_request(request, view)
        self.now = self.timer()
        # Its own key: DRF's pickled list under the plain key (an older version's count) is no Redis list.
        window = backend.make_and_validate_key(f"{key}:window")
        client = backend._cache.get_client(window, write=True)  # Django's pool (config/redis_pool.py)
        count_in_window = client.register_script(_COUNT_IN_WINDOW)  # EVALSHA, the script sent once per server
        allowed, count, oldest = count_in_window(keys=[window], args=[repr(self.now), self.duration,
                                                                      self.num_requests])
        self._in_redis = (count, float(oldest) if oldest is not None else None)
        return bool(allowed)

    def wait(self) -> float | None:
        if self._in_redis is None:
            return super().wait()
        count, oldest = self._in_redis  # as DRF reads its list: its length and its last (oldest) entry
        remaining = self.duration - (self.now - oldest) if oldest is not None else self.duration
        available = self.num_requests - count + 1
        return remaining / float(available) if available > 0 else None


class _FailOpen:
    def allow_request(self, request, view) -> bool:
        try:
            return super().allow_request(request, view)
        except Exception as error:  # the cache is away: serve rather than refuse everyone
            logger.warning("throttle cache unavailable, request let through: %r", error)
            return True


class UserThrottle(_FailOpen, _CountedAtOnce, UserRateThrottle):
    pass


class AnonThrottle(_FailOpen, _CountedAtOnce, AnonRateThrottle):
    def allow_request(self, request, view) -> bool:
        if getattr(request, "_arbor_anon_counted", False):  # counted already, before the permissions
            return True
        return super().allow_request(request, view)


class AnonRateFirst(BasePermission):
    """The anonymous rate, counted before any permission refuses: DRF checks permissions before throttles, so a
    caller with no credentials got its 401 for ever and the anonymous rate never applied (issue 26). First in
    every view's permissions; `AnonThrottle` then does not count the request again."""

    def has_permission(self, request, view) -> bool:
        if request.user and request.user.is_authenticated:
            return True
        throttle = AnonThrottle()
        if not throttle.allow_request(request, view):
            raise Throttled(throttle.wait())
        request._arbor_anon_counted = True
        return True


class _SignInCounter(_CountedAtOnce, SimpleRateThrottle):
    """Sign-in attempts per key (an address or a user name) in ARBOR_SIGNIN_RATE."""

    def __init__(self, key: str):
        self.rate = settings.ARBOR_SIGNIN_RATE
        self.num_requests, self.duration = self.parse_rate(self.rate)
        self._key = key

    def get_cache_key(self, request, view) -> str:
        return f"arbor-signin:{self._key}"


def sign_in_wait(request) -> int | None:
    """Seconds to wait before another sign-in, if an address or a user name has tried too often lately (the
    attempt is counted); None to let it through. Every sign-in form asks this: the site's and the admin's."""
    username = (request.POST.get("username") or "").strip().lower()[:150]
    for key in (f"addr:{request.META.get('REMOTE_ADDR', '')}", f"user:{username}"):
        counter = _SignInCounter(key)
        try:
            allowed = counter.allow_request(request, None)
        except Exception as error:  # the cache is away: sign-in goes on
            logger.warning("sign-in throttle cache unavailable: %r", error)
            allowed = True
        if not allowed:
            return max(1, int(counter.wait() or 1))
    return None


class ThrottledLoginView(LoginView):
    """Django's sign-in, refused with 429 while an address or a user name has tried too often lately: a
    password cannot be guessed at the server's pace, from one address or from many at one account."""

    def post(self, request, *args, **kwargs):
        wait = sign_in_wait(request)
        if wait is not None:
            message = f"Too many sign-in attempts; try again in {wait} s."
            context = self.get_context_data(form=self.get_form(), throttled=message)
            response = self.render_to_response(context, status=429)
            response["Retry-After"] = str(wait)
            return response
        return super().post(request, *args, **kwargs)


def throttled_admin_login(request, extra_context=None):
    """The admin's sign-in (`admin.site.login`) under the same limit as the site's (issue 26: it had none)."""
    from django.contrib import admin

    if request.method == "POST" and (wait := sign_in_wait(request)) is not None:
        response = HttpResponse(f"Too many sign-in attempts; try again in {wait} s.", status=429,
                                content_type="text/plain; charset=utf-8")
        response["Retry-After"] = str(wait)
        return response
    return admin.site.login(request, extra_context)

