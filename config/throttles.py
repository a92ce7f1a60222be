"""Request rates (issue 13, fairness): the API per caller, and sign-in attempts.

Counts live in the default cache: Redis when `REDIS_URL` is set, so every process counts together. A cache
that cannot be reached lets the request through and logs it: Redis down must not take the API with it.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.contrib.auth.views import LoginView
from rest_framework.throttling import AnonRateThrottle, SimpleRateThrottle, UserRateThrottle

logger = logging.getLogger("arbor.throttles")


class _FailOpen:
    def allow_request(self, request, view) -> bool:
        try:
            return super().allow_request(request, view)
        except Exception as error:  # the cache is away: serve rather than refuse everyone
            logger.warning("throttle cache unavailable, request let through: %r", error)
            return True


class UserThrottle(_FailOpen, UserRateThrottle):
    pass


class AnonThrottle(_FailOpen, AnonRateThrottle):
    pass


class _SignInCounter(SimpleRateThrottle):
    """Sign-in attempts per key (an address or a user name) in ARBOR_SIGNIN_RATE."""

    def __init__(self, key: str):
        self.rate = settings.ARBOR_SIGNIN_RATE
        self.num_requests, self.duration = self.parse_rate(self.rate)
        self._key = key

    def get_cache_key(self, request, view) -> str:
        return f"arbor-signin:{self._key}"


class ThrottledLoginView(LoginView):
    """Django's sign-in, refused with 429 while an address or a user name has tried too often lately: a
    password cannot be guessed at the server's pace, from one address or from many at one account."""

    def post(self, request, *args, **kwargs):
        username = (request.POST.get("username") or "").strip().lower()[:150]
        keys = [f"addr:{request.META.get('REMOTE_ADDR', '')}", f"user:{username}"]
        for key in keys:
            counter = _SignInCounter(key)
            try:
                allowed = counter.allow_request(request, self)
            except Exception as error:  # the cache is away: sign-in goes on
                logger.warning("sign-in throttle cache unavailable: %r", error)
                allowed = True
            if not allowed:
                message = f"Too many sign-in attempts; try again in {int(counter.wait() or 1)} s."
                context = self.get_context_data(form=self.get_form(), throttled=message)
                return self.render_to_response(context, status=429)
        return super().post(request, *args, **kwargs)

