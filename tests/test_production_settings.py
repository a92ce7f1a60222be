"""Production settings (issue 14 finding 7): HTTPS switched on from the environment, and the
Content-Security-Policy on every response, the admin and the API docs included.

Settings are read once, when config/settings.py is imported, so each environment is tried in a fresh
interpreter; the header is checked in-process through the test clients.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from django.core.management.utils import get_random_secret_key
from django.db import connection
from django.http import HttpRequest
from django.test import Client
from django.urls import path, reverse

from config.middleware import CONTENT_SECURITY_POLICY
from conversations.bench.processes import database_url
from tests.conversations.helpers import ask

# Every variable these settings read: a developer's own shell must not change what the tests see.
OURS = ("ARBOR_HTTPS", "ARBOR_SECURE_COOKIES", "ARBOR_SSL_REDIRECT", "ARBOR_HSTS_SECONDS",
        "ARBOR_HSTS_INCLUDE_SUBDOMAINS", "ARBOR_HSTS_PRELOAD", "ARBOR_PROXY_SSL_HEADER",
        "DJANGO_CSRF_TRUSTED_ORIGINS", "DJANGO_DEBUG", "DJANGO_ALLOWED_HOSTS", "DJANGO_SECRET_KEY")
PRODUCTION = {"ARBOR_HTTPS": "1", "DJANGO_DEBUG": "0", "DJANGO_ALLOWED_HOSTS": "arbor.example.com"}
PRINT_SETTINGS = """
import json
from config import settings as s
names = ["DEBUG", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", "SECURE_SSL_REDIRECT", "SECURE_HSTS_SECONDS",
         "SECURE_HSTS_INCLUDE_SUBDOMAINS", "SECURE_HSTS_PRELOAD", "SECURE_PROXY_SSL_HEADER", "CSRF_TRUSTED_ORIGINS"]
print(json.dumps({name: getattr(s, name) for name in names}))
"""
ONE_YEAR = 365 * 24 * 3600


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    from django.conf import settings

    clean = {name: value for name, value in os.environ.items() if name not in OURS}
    secret = {"DJANGO_SECRET_KEY": get_random_secret_key()}  # 50 characters, as production needs
    return subprocess.run([sys.executable, *args], env={**clean, **secret, **env}, cwd=settings.BASE_DIR,
                          capture_output=True, text=True, timeout=300)


def _settings_under(env: dict[str, str]) -> dict:
    result = _run(["-c", PRINT_SETTINGS], env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.slow
def test_check_deploy_passes_without_a_warning_in_the_production_environment(django_db_setup):
    """issue 14 finding 7: `manage.py check --deploy` has nothing to say with ARBOR_HTTPS=1 and HSTS preload
    chosen (the one HSTS part ARBOR_HTTPS leaves to a person: it commits the whole domain). On PostgreSQL it
    reaches the test database (a missing one costs the check 40 s of connection retries, not a failure)."""
    reach = {"DATABASE_URL": database_url()} if connection.vendor == "postgresql" else {}
    result = _run(["manage.py", "check", "--deploy", "--fail-level", "WARNING"],
                  {**PRODUCTION, "ARBOR_HSTS_PRELOAD": "1", **reach})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "System check identified no issues" in output and "WARNING" not in output, output


def test_arbor_https_turns_on_secure_cookies_hsts_and_the_redirect():
    """issue 14 finding 7: ARBOR_HTTPS=1 alone gives what the README says: Secure session and CSRF cookies,
    the https redirect, a year of HSTS with subdomains; no preload, no proxy header, no extra origins."""
    assert _settings_under(PRODUCTION) == {
        "DEBUG": False, "SESSION_COOKIE_SECURE": True, "CSRF_COOKIE_SECURE": True, "SECURE_SSL_REDIRECT": True,
        "SECURE_HSTS_SECONDS": ONE_YEAR, "SECURE_HSTS_INCLUDE_SUBDOMAINS": True, "SECURE_HSTS_PRELOAD": False,
        "SECURE_PROXY_SSL_HEADER": None, "CSRF_TRUSTED_ORIGINS": [],
    }


def test_each_https_part_has_its_own_variable():
    """issue 14 finding 7: every part ARBOR_HTTPS turns on can be overridden alone; the proxy's header name
    becomes Django's META key, and trusted origins are a comma-separated list."""
    values = _settings_under({
        **PRODUCTION, "ARBOR_SECURE_COOKIES": "0", "ARBOR_SSL_REDIRECT": "0", "ARBOR_HSTS_SECONDS": "3600",
        "ARBOR_HSTS_INCLUDE_SUBDOMAINS": "0", "ARBOR_HSTS_PRELOAD": "1", "ARBOR_PROXY_SSL_HEADER": "X-Forwarded-Proto",
        "DJANGO_CSRF_TRUSTED_ORIGINS": "https://arbor.example.com, https://chat.example.com",
    })
    assert values == {
        "DEBUG": False, "SESSION_COOKIE_SECURE": False, "CSRF_COOKIE_SECURE": False, "SECURE_SSL_REDIRECT": False,
        "SECURE_HSTS_SECONDS": 3600, "SECURE_HSTS_INCLUDE_SUBDOMAINS": False, "SECURE_HSTS_PRELOAD": True,
        "SECURE_PROXY_SSL_HEADER": ["HTTP_X_FORWARDED_PROTO", "https"],
        "CSRF_TRUSTED_ORIGINS": ["https://arbor.example.com", "https://chat.example.com"],
    }
    other_proxy = _settings_under({**PRODUCTION, "ARBOR_PROXY_SSL_HEADER": "X-Forwarded-Ssl=on"})
    assert other_proxy["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_SSL", "on"]


def test_without_arbor_https_debug_off_still_serves_plain_http():
    """issue 14 finding 7: the quick start (scripts/start: DEBUG off, plain http) sets nothing that needs https."""
    values = _settings_under({"DJANGO_DEBUG": "0"})
    assert values == {
        "DEBUG": False, "SESSION_COOKIE_SECURE": False, "CSRF_COOKIE_SECURE": False, "SECURE_SSL_REDIRECT": False,
        "SECURE_HSTS_SECONDS": 0, "SECURE_HSTS_INCLUDE_SUBDOMAINS": False, "SECURE_HSTS_PRELOAD": False,
        "SECURE_PROXY_SSL_HEADER": None, "CSRF_TRUSTED_ORIGINS": [],
    }


@pytest.mark.django_db
def test_sign_in_over_plain_http_works_with_the_default_settings(user):
    """issue 14 finding 7: with ARBOR_HTTPS off the session cookie is not Secure, so signing in over http works."""
    client = Client()
    response = client.post(reverse("login"), {"username": "ada", "password": "pw-ada-12345"})
    assert response.status_code == 302 and response.url == "/chat/"
    assert client.cookies["sessionid"]["secure"] == ""
    assert client.get("/chat/").status_code == 200


@pytest.mark.django_db
def test_behind_a_tls_proxy_the_forwarded_scheme_counts_and_plain_http_is_redirected(settings, user):
    """issue 14 finding 7: with the redirect, HSTS and ARBOR_PROXY_SSL_HEADER's tuple, a request the proxy marks
    https is served with HSTS and Secure cookies (no redirect loop); one it does not is sent to https."""
    settings.SECURE_SSL_REDIRECT = settings.SESSION_COOKIE_SECURE = settings.CSRF_COOKIE_SECURE = True
    settings.SECURE_HSTS_SECONDS = ONE_YEAR
    settings.SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    client = Client()
    plain = client.get(reverse("login"))
    assert plain.status_code == 301 and plain.url == "https://testserver/accounts/login/"
    response = client.post(reverse("login"), {"username": "ada", "password": "pw-ada-12345"},
                           HTTP_X_FORWARDED_PROTO="https")
    assert response.status_code == 302 and response.url == "/chat/"
    assert response["Strict-Transport-Security"] == f"max-age={ONE_YEAR}; includeSubDomains"
    assert client.cookies["sessionid"]["secure"] is True


# The Content-Security-Policy on every response.


def _has_csp(response) -> bool:
    return response.get("Content-Security-Policy") == CONTENT_SECURITY_POLICY


@pytest.fixture
def staff(user) -> Client:
    user.is_staff = user.is_superuser = True
    user.save()
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_the_sign_in_page_has_the_csp():
    """issue 14 finding 7: the sign-in page (no signed-in person, no page() shell) carries the header."""
    response = Client().get(reverse("login"))
    assert response.status_code == 200 and _has_csp(response)


@pytest.mark.django_db
def test_admin_pages_have_the_csp(staff, conversation):
    """issue 14 finding 7: the admin, signed in as staff: the index, a list, the tree page."""
    ask(conversation, "hello")
    for url in [reverse("admin:index"), reverse("admin:conversations_conversation_changelist"),
                reverse("admin:conversations_conversation_change", args=[conversation.pk])]:
        response = staff.get(url)
        assert response.status_code == 200 and _has_csp(response), url


@pytest.mark.django_db
def test_the_api_schema_and_docs_have_the_csp_and_the_docs_load_no_inline_script():
    """issue 14 finding 7: the schema, Swagger UI and its start-up script (served from a URL by the split view,
    since the policy forbids inline script) all carry the header."""
    client = Client()
    schema = client.get(reverse("schema"))
    docs = client.get(reverse("api-docs"))
    script = client.get(reverse("api-docs") + "?script=")
    assert all(r.status_code == 200 and _has_csp(r) for r in (schema, docs, script))
    assert script["Content-Type"].startswith("application/javascript") and "SwaggerUIBundle" in script.content.decode()
    scripts = re.findall(r"<script\b[^>]*>", docs.content.decode())
    assert len(scripts) == 3 and all(" src=" in tag for tag in scripts), scripts


@pytest.mark.django_db
def test_json_api_responses_have_the_csp(api, conversation):
    """issue 14 finding 7: an API answer (JSON, token-authenticated) carries the header too."""
    response = api.get(reverse("conversation-list"))
    assert response.status_code == 200 and response["Content-Type"] == "application/json" and _has_csp(response)


@pytest.mark.django_db
def test_not_found_pages_have_the_csp(page, api):
    """issue 14 finding 7: a 404 page, and an API 404 in the API's error format."""
    missing_page = page.get("/no-such-page/")
    missing_api = api.get("/api/no-such-thing/")
    assert missing_page.status_code == 404 and _has_csp(missing_page)
    assert missing_api.status_code == 404 and _has_csp(missing_api)


def _broken_view(request: HttpRequest):
    raise RuntimeError("a bug")


urlpatterns = [path("broken/", _broken_view)]


@pytest.mark.urls(__name__)
def test_a_server_error_page_has_the_csp():
    """issue 14 finding 7: the 500 page made from an exception passes through the middleware too."""
    response = Client(raise_request_exception=False).get("/broken/")
    assert response.status_code == 500 and _has_csp(response)


async def test_the_async_request_path_sets_the_csp_too(async_client):
    """issue 14 finding 7: under ASGI the middleware runs as a coroutine (no hop to the shared thread)."""
    response = await async_client.get("/accounts/login/")
    assert response.status_code == 200 and _has_csp(response)


# What the policy would block: inline <script> (a json_script data block is not run), <style>, style="..."
# and on...="..." handlers.
INLINE = re.compile(r'<script\b(?![^>]*\b(?:src=|type="application/json"))[^>]*>|<style\b|\sstyle="|\son[a-z]+="',
                    re.IGNORECASE)

@pytest.mark.django_db
@pytest.mark.parametrize("url_name", [
    "login", "admin:index", "admin:conversations_conversation_changelist", "admin:conversations_node_changelist",
    "admin:auth_user_changelist", "admin:auth_user_add", "admin:auth_group_add", "chat-conversation",
    "playbook-page-list",
    "admin:conversations_conversation_change", "admin:conversations_node_change",
    "admin:auth_user_change", "api-docs",
])
def test_pages_hold_nothing_inline_the_policy_would_block(staff, conversation, url_name):
    """issue 14 finding 7: with `script-src 'self'; style-src 'self'` on every response, the pages (the Django
    admin's included) must not rely on inline scripts or styles."""
    ask(conversation, "hello")
    conversation.refresh_from_db()
    args = {"chat-conversation": [conversation.pk], "admin:conversations_conversation_change": [conversation.pk],
            "admin:conversations_node_change": [conversation.head_id],
            "admin:auth_user_change": [conversation.owner_id]}.get(url_name, [])
    response = staff.get(reverse(url_name, args=args))
    assert response.status_code == 200 and _has_csp(response)
    assert INLINE.findall(response.content.decode()) == []
