"""Issue 14's findings, each closed and named: what an attacker with an account (or a stolen default) tried."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from rest_framework.authtoken.models import Token

from conversations import outbox
from conversations.jobs import worker
from conversations.models import Conversation
from tests.support.async_db import in_own_thread
from tests.support.sockets import chat_socket, session_cookie

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]


def _start_django(env: dict[str, str]) -> subprocess.CompletedProcess:
    code = "import django; django.setup(); from django.conf import settings; print(len(settings.SECRET_KEY))"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**env, "DJANGO_SETTINGS_MODULE": "config.settings"}, check=False)


@pytest.mark.slow
def test_high_3_the_server_refuses_to_start_without_a_secret_key_of_its_own(tmp_path):
    """No key in the environment and none kept in var/: Django does not start (no repository default)."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SECRET_KEY"}
    refused = _start_django({**env, "ARBOR_SECRET_KEY_FILE": str(tmp_path / "missing")})
    assert refused.returncode != 0 and "No secret key" in refused.stderr
    short = _start_django({**env, "DJANGO_SECRET_KEY": "too-short"})
    assert short.returncode != 0 and "No secret key" in short.stderr
    kept = tmp_path / "secret_key"
    kept.write_text("k" * 50)
    started = _start_django({**env, "ARBOR_SECRET_KEY_FILE": str(kept)})
    assert started.returncode == 0 and started.stdout.strip() == "50"


def test_medium_4_creating_a_conversation_with_its_retrieval_policy_answers_201(api):
    response = api.post("/api/conversations/", {"title": "r", "retrieval": True, "keep_retrieved": True},
                        format="json")
    assert response.status_code == 201, response.content
    conversation = Conversation.objects.get(pk=response.json()["id"])
    assert (conversation.retrieval, conversation.keep_retrieved) == (True, True)


def test_medium_6_view_only_staff_cannot_see_api_tokens_and_superusers_see_only_a_prefix(
        django_user_model, user, admin_client):
    token = Token.objects.create(user=user)
    staff = django_user_model.objects.create_user(username="viewer", password="pw-viewer-123", is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(codename__startswith="view_"))
    client = Client()
    client.force_login(staff)
    listing = reverse("admin:authtoken_tokenproxy_changelist")
    assert client.get(listing).status_code == 403
    assert token.key not in client.get(reverse("admin:index")).content.decode()
    page = admin_client.get(listing).content.decode()
    assert token.key[:6] in page and token.key not in page


def test_medium_8_failed_jobs_are_visible_in_the_admin(admin_client, settings):
    settings.ARBOR_WORKER_MAX_ATTEMPTS = 1
    job = outbox.enqueue(kind="title", payload={"conversation": "not a number"})
    assert worker.run_due().failed == 1
    page = admin_client.get(reverse("admin:conversations_outboxjob_changelist") + "?status__exact=failed")
    assert page.status_code == 200
    text = page.content.decode()
    assert f">{job.pk}<" in text and "ValueError" in text


@pytest.mark.parametrize(("path", "hint"), [
    ("/api/no-such-thing/", ""),
    ("/api/conversations", "Did you mean /api/conversations/"),
])
def test_low_an_unknown_api_path_answers_the_json_error_format(api, path, hint):
    response = api.get(path)
    assert response.status_code == 404 and response["Content-Type"].startswith("application/json")
    error = response.json()["error"]
    assert error["code"] == "not_found" and hint in error["message"]


@pytest.mark.django_db(transaction=True)
async def test_low_a_frame_that_is_not_json_gets_an_error_and_the_socket_stays_open(user):
    conversation = await in_own_thread(lambda: Conversation.objects.create(owner=user, title="t"))()

    socket = chat_socket(conversation.pk, await in_own_thread(lambda: session_cookie(user))())
    connected, _ = await socket.connect()
    assert connected
    for frame in ("not json {", "[" * 5000 + "]" * 5000):
        await socket.send_to(text_data=frame)
        reply = await socket.receive_json_from(timeout=30)
        assert (reply["type"], reply["code"]) == ("error", "bad_input")
    await socket.send_to(bytes_data=b"\x00\x01")
    assert (await socket.receive_json_from(timeout=30))["code"] == "bad_input"
    await socket.send_json_to({"type": "stop"})
    assert await socket.receive_json_from(timeout=30) == {"type": "stopped"}, "the socket is still open"
    await socket.disconnect()
