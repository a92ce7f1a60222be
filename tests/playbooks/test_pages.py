"""The playbook pages over HTTP (Django test client): convert, list, detail, edit, save, run."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from conversations.models import Conversation
from playbooks import services
from playbooks.models import Playbook, PlaybookRun
from playbooks.pages import form_values
from playbooks.schema import bind_values
from tests.playbooks.helpers import sales_conversation

pytestmark = pytest.mark.django_db


@pytest.fixture
def playbook(conversation):
    sales_conversation(conversation)
    return services.playbook_convert(user=conversation.owner, conversation_id=conversation.pk)


def test_the_chat_page_offers_convert_and_the_nav_links_playbooks(page, conversation):
    html = page.get(reverse("chat-conversation", args=[conversation.pk])).content.decode()
    assert reverse("playbook-page-convert", args=[conversation.pk]) in html and "Convert to playbook" in html
    assert reverse("playbook-page-list") in html


def test_p1_p2_convert_from_the_chat_page_makes_a_playbook_and_leaves_the_chat_as_it_was(page, conversation):
    sales_conversation(conversation)
    head = conversation.head_id
    response = page.post(reverse("playbook-page-convert", args=[conversation.pk]))
    playbook = Playbook.objects.get()
    assert response.status_code == 302 and response.url == reverse("playbook-page-detail", args=[playbook.pk])
    conversation.refresh_from_db()
    assert conversation.head_id == head


def test_p1_an_invalid_conversion_comes_back_to_the_chat_with_the_last_errors(page, conversation):
    sales_conversation(conversation, "#draft-invalid always")
    back = reverse("chat-conversation", args=[conversation.pk])
    response = page.post(reverse("playbook-page-convert", args=[conversation.pk]), HTTP_REFERER=back, follow=True)
    assert response.redirect_chain[-1][0] == back
    html = response.content.decode()
    assert "still invalid after 3 tries" in html and "no such column: no_such_column" in html
    assert not Playbook.objects.exists()


def test_convert_of_an_empty_chat_says_why(page, conversation):
    back = reverse("chat-conversation", args=[conversation.pk])
    response = page.post(reverse("playbook-page-convert", args=[conversation.pk]), HTTP_REFERER=back, follow=True)
    assert "nothing to turn into a playbook" in response.content.decode()


def test_list_and_detail_show_steps_parameters_and_versions(page, playbook):
    listed = page.get(reverse("playbook-page-list")).content.decode()
    assert reverse("playbook-page-detail", args=[playbook.pk]) in listed and playbook.name in listed
    response = page.get(reverse("playbook-page-detail", args=[playbook.pk]))
    assert response.status_code == 200 and "Content-Security-Policy" in response.headers
    html = response.content.decode()
    for expected in ["<code>month</code>", "<code>include_overseas</code>", "Call <code>sql_query</code>",
                     "{{month}}", "v1", "Open edit conversation", reverse("playbook-page-run", args=[playbook.pk])]:
        assert expected in html, expected


def test_p3_open_the_edit_conversation_then_save_from_the_pages(page, playbook, conversation):
    response = page.post(reverse("playbook-page-edit", args=[playbook.pk]))
    edit = Conversation.objects.exclude(pk=conversation.pk).get()
    assert response.url == reverse("chat-conversation", args=[edit.pk]) and edit.head_id == conversation.head_id
    assert "Save as a new version" in page.get(reverse("playbook-page-detail", args=[playbook.pk])).content.decode()
    response = page.post(reverse("playbook-page-save", args=[playbook.pk]), follow=True)
    assert "Saved as version 2." in response.content.decode()


def test_the_run_form_has_one_input_per_parameter_and_shows_the_result(page, playbook):
    form = page.get(reverse("playbook-page-run", args=[playbook.pk])).content.decode()
    for field in ['type="text" name="month"', 'type="number" name="limit"', 'type="checkbox" name="include_overseas"']:
        assert field in form
    response = page.post(reverse("playbook-page-run", args=[playbook.pk]), {"month": "2026-09", "limit": "3"})
    run = PlaybookRun.objects.get()
    assert response.url == reverse("playbook-page-run-detail", args=[playbook.pk, run.pk])
    assert run.values == {"month": "2026-09", "limit": 3, "include_overseas": False}
    html = page.get(response.url).content.decode()
    assert "Tool <code>sql_query</code>" in html and "month = :month" in html
    assert "&quot;month&quot;: &quot;2026-09&quot;" in html
    assert "echo: Run the playbook" in html and reverse("chat-conversation", args=[run.conversation_id]) in html


def test_bad_run_values_come_back_on_the_form_named(page, playbook):
    response = page.post(reverse("playbook-page-run", args=[playbook.pk]), {"month": "Sept", "limit": "ten"})
    assert response.status_code == 400
    html = response.content.decode()
    assert "month: &#x27;Sept&#x27; does not match the pattern" in html
    assert "limit: &#x27;ten&#x27; is not an integer" in html
    assert not PlaybookRun.objects.exists()


def test_anyone_elses_playbook_pages_are_not_found(playbook, other_user):
    other = Client()
    other.force_login(other_user)
    for method, name in [("get", "playbook-page-detail"), ("get", "playbook-page-run"), ("post", "playbook-page-run"),
                         ("post", "playbook-page-edit"), ("post", "playbook-page-save")]:
        assert getattr(other, method)(reverse(name, args=[playbook.pk])).status_code == 404, name
    run = services.playbook_run(user=playbook.owner, playbook_id=playbook.pk, values={}).run
    assert other.get(reverse("playbook-page-run-detail", args=[playbook.pk, run.pk])).status_code == 404
    assert other.post(reverse("playbook-page-convert", args=[playbook.source_conversation_id])).status_code == 404
    listed = other.get(reverse("playbook-page-list")).content.decode()
    assert reverse("playbook-page-detail", args=[playbook.pk]) not in listed


def test_playbook_pages_need_a_signed_in_person(playbook):
    response = Client().get(reverse("playbook-page-detail", args=[playbook.pk]))
    assert response.status_code == 302 and response.url.startswith("/accounts/login/")


@pytest.mark.parametrize("raw", ["nan", "inf", "-Infinity"])
def test_n3_a_form_number_that_is_not_finite_is_refused(raw):
    parameters = [{"name": "x", "type": "number", "description": ""}]
    assert bind_values(parameters, form_values(parameters, {"x": raw}))[1] == [f"x: {float(raw)!r} is not a finite "
                                                                                "number"]


def test_s4_the_run_page_shows_the_status_and_a_deviated_run(page, playbook):
    response = page.post(reverse("playbook-page-run", args=[playbook.pk]), {"month": "2026-09"})
    html = page.get(response.url).content.decode()
    assert 'run-done">done</span>' in html and "differ from this playbook" not in html
    run = PlaybookRun.objects.get()
    run.playbook_version.definition["steps"].insert(0, {"tool": "sql_query", "arguments": {"sql": "SELECT 1"}})
    run.playbook_version.save()
    assert "differ from this playbook's tool steps" in page.get(response.url).content.decode()
