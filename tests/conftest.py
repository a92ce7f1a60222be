"""Shared fixtures: users, API clients, and the loopback OpenAI-compatible stub server."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.db import connections
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from config import news
from conversations import services
from tests.support.browser import asgi_server, browser  # noqa: F401 - fixtures for the browser tests
from tests.support.openai_stub import OpenAIStub


def pytest_configure(config):
    """The tests' users are made with a quick hasher (tests/support/hashers.py): minutes of CPU a whole run."""
    from django.conf import settings

    settings.PASSWORD_HASHERS = ["tests.support.hashers.OneIterationPBKDF2"]


@pytest.fixture(scope="session", autouse=True)
def _news_listener_stops(django_db_setup, django_db_blocker):
    """The news listener (config.news) holds a connection to the test database, and so does the connection pool
    for each connection a thread gave back (`release_connection`): end them before the database is dropped."""
    yield
    with django_db_blocker.unblock():
        news.stop()
        for database in connections.all():
            if database.vendor == "postgresql":
                database.close()
                database.close_pool()


@pytest.fixture(autouse=True)
def _fresh_rate_counts():
    """Throttle counts (config/throttles.py) start at zero in each test: ids and addresses repeat; so does the
    question vectors' cache (files/embedding.py), whose stub providers differ between tests."""
    cache.clear()
    from files.embedding import _question_vector

    _question_vector.cache_clear()


@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create_user(username="ada", password="pw-ada-12345")


@pytest.fixture
def other_user(django_user_model):
    return django_user_model.objects.create_user(username="bob", password="pw-bob-12345")


def _client_for(user) -> APIClient:
    client = APIClient()
    token, _ = Token.objects.get_or_create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


@pytest.fixture
def api(user) -> APIClient:
    return _client_for(user)


@pytest.fixture
def other_api(other_user) -> APIClient:
    return _client_for(other_user)


@pytest.fixture
def page(user) -> Client:
    """The pages' client: `user` signed in with a session."""
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def conversation(user):
    return services.conversation_create(owner=user, title="t")


@pytest.fixture(scope="session")
def openai_stub():
    stub = OpenAIStub().start()
    yield stub
    stub.stop()


@pytest.fixture
def stub(openai_stub, settings, monkeypatch):
    """The stub, emptied, and a model list that admits it."""
    openai_stub.reset()
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-loopback")
    monkeypatch.setenv("HOSTED_VLLM_API_KEY", "sk-test-loopback")
    settings.ARBOR_MODELS = [*settings.ARBOR_MODELS, "openai/stub-model", "hosted_vllm/stub-model"]
    settings.ARBOR_API_BASE = openai_stub.base_url
    return openai_stub


def pytest_collection_modifyitems(config, items):
    """The `slow` tests first (in their own order), so parallel workers (scripts/test) start the long ones at once
    instead of one worker finishing a six-minute test while the others wait at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
