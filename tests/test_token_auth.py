"""`config.token_auth`: the API's token check, its look-up compiled once (issue 34: CPU per turn). It must answer
as DRF's own check does, on PostgreSQL and SQLite: the same token and user, the same 401s, and a revoked key
refused at once (nothing is cached but the statement)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from config.token_auth import token_and_user

pytestmark = pytest.mark.django_db


def _client(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def test_issue_34_the_look_up_gives_what_the_orms_gives(user):
    """The token and its user, field by field, with every value converted as the ORM converts it (dates as aware
    datetimes on SQLite too), in one statement."""
    token = Token.objects.create(user=user)
    user.first_name = "Ünï"
    user.save()
    expected = Token.objects.select_related("user").get(key=token.key)
    with CaptureQueriesContext(connection) as queries:
        found = token_and_user(token.key)
    assert len(queries) == 1
    assert found is not None and not found._state.adding
    for field in Token._meta.concrete_fields:
        assert getattr(found, field.attname) == getattr(expected, field.attname), field.name
    for field in type(user)._meta.concrete_fields:
        assert getattr(found.user, field.attname) == getattr(expected.user, field.attname), field.name
    assert found.created.tzinfo is not None and found.user.date_joined.tzinfo is not None
    assert found.user.pk == user.pk and found.user_id == user.pk
    assert token_and_user("no-such-key") is None and token_and_user("") is None


def test_issue_34_the_api_answers_as_drfs_token_check(user, other_user):
    """A good key reads the person's own data; an unknown key, an inactive person's key and a deleted key are
    each a 401 saying why, at once (no cached answer outlives the token)."""
    key = Token.objects.create(user=user).key
    assert _client(key).post("/api/conversations/", {}, format="json").status_code == 201
    listed = _client(key).get("/api/conversations/")
    assert listed.status_code == 200 and listed.json()["count"] == 1

    unknown = _client("0" * 40).get("/api/conversations/")
    assert unknown.status_code == 401 and "Invalid token" in unknown.json()["error"]["message"]

    other_key = Token.objects.create(user=other_user).key
    other_user.is_active = False
    other_user.save()
    inactive = _client(other_key).get("/api/conversations/")
    assert inactive.status_code == 401 and "inactive" in inactive.json()["error"]["message"]

    for odd in ("abc\x00def", "x" * 41, "é" * 40):  # a NUL (PostgreSQL refuses it: a 500), too long, not a key
        assert token_and_user(odd) is None
        refused = APIClient().get("/v1/models", HTTP_X_API_KEY=odd)  # a header passed on as it came (Anthropic's)
        assert refused.status_code == 401, (odd, refused.content)

    Token.objects.filter(key=key).delete()
    revoked = _client(key).get("/api/conversations/")
    assert revoked.status_code == 401 and "Invalid token" in revoked.json()["error"]["message"]
