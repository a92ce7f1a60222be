"""Issue 13, no fixed small cap on concurrent turns: a real server process answers more JSON turns at once
than the event loop's default thread pool holds (six on two cores), each waiting on its model together."""

from __future__ import annotations

import threading
import time

import pytest
import requests
from rest_framework.authtoken.models import Token

from conversations import services
from conversations.models import Node
from tests.support.servers import Server

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TURNS = 12


def test_issue_13_a_dozen_json_turns_wait_on_their_models_at_the_same_time(user):
    conversations = [services.conversation_create(owner=user, title=f"c{i}").pk for i in range(TURNS)]
    headers = {"Authorization": f"Token {Token.objects.get_or_create(user=user)[0].key}"}
    spans: dict[int, tuple[float, float, int]] = {}

    def turn(conversation_id: int) -> None:
        began = time.monotonic()
        response = requests.post(server.url(f"/api/conversations/{conversation_id}/turns/"),
                                 json={"content": "#slow a b c d e f"}, headers=headers, timeout=120)
        spans[conversation_id] = (began, time.monotonic(), response.status_code)

    with Server(ARBOR_ECHO_WORD_SECONDS="0.25", ARBOR_MAX_CONCURRENT_TURNS_PER_USER="0") as server:
        threads = [threading.Thread(target=turn, args=(pk,)) for pk in conversations]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    assert {status for _, _, status in spans.values()} == {201}
    # When each call began and ended, as the server recorded them (a queued request has no node yet).
    calls = Node.objects.filter(conversation_id__in=conversations).values_list("created_at", "finished_at")
    assert len(calls) == TURNS
    last_start = max(began for began, _ in calls)
    first_end = min(ended for _, ended in calls)
    assert last_start < first_end, "every call was under way before any ended: none waited for a thread"
