"""The admin shows playbooks with their conversion chains (P1), read-only."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from playbooks import services
from playbooks.selectors import conversion_chain
from tests.playbooks.helpers import sales_conversation

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(django_user_model) -> Client:
    client = Client()
    client.force_login(django_user_model.objects.create_superuser("root", "root@example.com", "pw-root-12345"))
    return client


def test_p1_the_playbook_page_links_every_try_of_each_conversion_chain(staff, conversation):
    sales_conversation(conversation, "#draft-invalid 1")
    playbook = services.playbook_convert(user=conversation.owner, conversation_id=conversation.pk)
    first, second = conversion_chain(playbook.conversion_node_id)
    listed = staff.get(reverse("admin:playbooks_playbook_changelist"))
    assert listed.status_code == 200 and playbook.name in listed.content.decode()
    response = staff.get(reverse("admin:playbooks_playbook_change", args=[playbook.pk]))
    assert response.status_code == 200
    html = response.content.decode()
    for node in (first, second):
        assert f'href="{reverse("admin:conversations_node_change", args=[node.pk])}"' in html
    assert f"node {first.pk}</a> (succeeded) → " in html
    assert reverse("admin:conversations_conversation_change", args=[conversation.pk]) in html
    change_url = reverse("admin:playbooks_playbook_change", args=[playbook.pk])
    assert staff.post(change_url, {"name": "renamed"}).status_code == 403
    playbook.refresh_from_db()
    assert playbook.name != "renamed"
    node_page = staff.get(reverse("admin:conversations_node_change", args=[second.pk])).content.decode()
    assert "no_such_column" in node_page, "the retry's page shows the errors it sent"
