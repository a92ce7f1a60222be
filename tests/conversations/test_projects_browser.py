"""Issue 30 as a person uses it in Chromium: make a project on its page, give it instructions and a knowledge file,
start a chat in it and ask; arbor/echo's answer shows what the call got: the project's instructions and the file's
passage (X2, R2). A chat outside the project, asked the same, gets neither (nothing crosses the border). Headless
Chromium against Daphne (tests/support/browser.py)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from conversations import services
from conversations.jobs import worker
from conversations.models import Conversation, Project
from tests.support.browser import sign_in, wait

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]


def _ask(browser, question: str) -> str:
    """Send `question` from the open chat page; the answer's text once it has ended."""
    wait(browser).until(lambda d: d.execute_script(
        "const chat = document.getElementById('chat'); return chat && chat.dataset.connected"))
    browser.find_element(By.ID, "composer-input").send_keys(question + Keys.ENTER)
    wait(browser).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#message-list article.msg.assistant .body")
                        and not d.find_elements(By.CSS_SELECTOR, ".msg.streaming"))
    return browser.find_element(By.CSS_SELECTOR, "#message-list article.msg.assistant .body").text


def test_issue_30_x2_a_project_made_on_its_page_gives_its_chats_its_instructions_and_knowledge(
        browser, asgi_server, user, settings):
    settings.STORAGES = {**settings.STORAGES, "default": {  # where the server keeps files: the worker reads there
        "BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": asgi_server.files_dir}}}
    sign_in(browser, asgi_server, user)
    browser.get(f"{asgi_server.url}/projects/")
    browser.find_element(By.ID, "project-name").send_keys("Launch" + Keys.ENTER)
    wait(browser).until(lambda d: Project.objects.filter(owner=user, name="Launch").exists()
                        and d.find_elements(By.ID, "project-instructions"))
    project = Project.objects.get(owner=user, name="Launch")
    browser.find_element(By.ID, "project-instructions").send_keys("We launch in May.")
    browser.find_element(By.CSS_SELECTOR, "form[action$='/update/'] button[type=submit]").click()
    wait(browser).until(lambda d: Project.objects.get(pk=project.pk).instructions == "We launch in May.")

    pricing = Path(tempfile.mkdtemp()) / "pricing.md"
    pricing.write_text("The Oak plan costs 12 dollars a month.")
    wait(browser).until(lambda d: d.find_elements(By.ID, "project-file"))
    browser.find_element(By.ID, "project-file").send_keys(str(pricing))
    browser.find_element(By.CSS_SELECTOR, "form[action$='/files/'] button[type=submit]").click()
    wait(browser).until(lambda d: project.files.filter(name="pricing.md").exists())
    worker.run_due()  # R4: the file is read

    browser.find_element(By.XPATH, "//button[contains(., 'New chat in this project')]").click()
    wait(browser).until(lambda d: Conversation.objects.filter(owner=user, project=project).exists())
    inside = _ask(browser, "What does the Oak plan cost?")
    assert "system:We launch in May." in inside, "the project's instructions"
    assert "From the project's file" in inside, "the knowledge passage, for this call"

    elsewhere = services.conversation_create(owner=user, title="Elsewhere")
    browser.get(f"{asgi_server.url}/chat/{elsewhere.pk}/")
    outside = _ask(browser, "What does the Oak plan cost?")
    assert "We launch in May" not in outside and "From the project's file" not in outside, \
        "a chat outside the project gets neither"
