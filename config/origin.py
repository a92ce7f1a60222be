"""The chat socket's Origin check (issue 14): a handshake is accepted only from this site's own pages.

Channels' AllowedHostsOriginValidator compares the Origin's host with ALLOWED_HOSTS and ignores the port, so a page
served by anything else on the same host (http://localhost:9999) could open a socket with the person's session.
Here the Origin must be the request's own origin (scheme, host and port, as the browser's Host header and the
request's scheme give it, the way Django's CSRF check builds it) or one of CSRF_TRUSTED_ORIGINS, and the Host must
be one of ALLOWED_HOSTS. A handshake without an Origin is refused: every browser sends one, and a script can too.
Settings are read for each handshake. Imports no app.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.utils.http import is_same_domain

logger = logging.getLogger("arbor.web")

_DEFAULT_PORTS = {"http": 80, "https": 443}

Origin = tuple[str, str, int]  # scheme, host (lower case, IPv6 without brackets), port (the default filled in)


def parse_origin(value: str) -> Origin | None:
    """An http(s) origin as (scheme, host, port); None for anything else ("null", a path, a bad port)."""
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname or parts.path or parts.query or parts.fragment:
        return None
    return parts.scheme, parts.hostname, port or _DEFAULT_PORTS[parts.scheme]


def origin_allowed(scope: dict) -> bool:
    """Whether a WebSocket handshake's Origin may open a socket with the cookies it carries."""
    headers: dict[bytes, str] = {name.lower(): value.decode("latin-1") for name, value in scope.get("headers", [])}
    origin = parse_origin(headers.get(b"origin", ""))
    host = _host(headers)
    if origin is None or host is None:
        return False
    own = parse_origin(f"{'https' if _secure(scope, headers) else 'http'}://{host}")
    return origin == own or _trusted(origin)


def _host(headers: dict[bytes, str]) -> str | None:
    """The request's host as Django's `request.get_host()` takes it, if ALLOWED_HOSTS admits it."""
    forwarded = headers.get(b"x-forwarded-host") if settings.USE_X_FORWARDED_HOST else None
    host = forwarded if forwarded is not None else headers.get(b"host", "")
    domain, _port = split_domain_port(host)
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    return host if domain and validate_host(domain, allowed) else None


def _secure(scope: dict, headers: dict[bytes, str]) -> bool:
    """wss, or (behind a proxy that ends TLS) SECURE_PROXY_SSL_HEADER says https, as `request.is_secure()`."""
    if scope.get("scheme") in {"wss", "https"}:
        return True
    if not settings.SECURE_PROXY_SSL_HEADER:
        return False
    meta_name, secure_value = settings.SECURE_PROXY_SSL_HEADER
    name = meta_name.removeprefix("HTTP_").lower().replace("_", "-").encode("latin-1")
    value = headers.get(name)
    return value is not None and value.split(",", 1)[0].strip() == secure_value


def _trusted(origin: Origin) -> bool:
    """One of CSRF_TRUSTED_ORIGINS: exactly, or under a `https://*.example.com` entry (same scheme and port)."""
    scheme, host, port = origin
    for entry in settings.CSRF_TRUSTED_ORIGINS:
        wildcard = "://*." in entry
        trusted = parse_origin(entry.replace("://*.", "://", 1))
        if trusted is None or trusted[0] != scheme or trusted[2] != port:
            continue
        if host == trusted[1] or wildcard and is_same_domain(host, f".{trusted[1]}"):
            return True
    return False


class SameOriginValidator:
    """ASGI middleware in front of the socket routes: a handshake from any other origin is closed (HTTP 403)."""

    def __init__(self, application):
        self.application = application

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and not origin_allowed(scope):
            headers = dict(scope.get("headers", []))
            logger.warning("refused a socket from origin %r to host %r", headers.get(b"origin"), headers.get(b"host"))
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
