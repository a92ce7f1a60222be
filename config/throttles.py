"""Request rates (issue 13, fairness): the API per caller, and sign-in attempts.

Counts live in the default cache: Redis when `REDIS_URL` is set, so every process counts together. A cache
that cannot be reached lets the request through and logs it: Redis down must not take the API with it.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.contrib.auth.views import LoginView
from django.http import HttpResponse
from rest_framework.exceptions import Throttled
from rest_framework.permissions import BasePermission
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


class _SignInCounter(SimpleRateThrottle):
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

