"""The playbook pages in headless Chromium against Daphne: convert from the chat, run for another month.

Screenshots (playbook-detail, playbook-run-form, playbook-run-result) go to var/screenshots/.
"""

from __future__ import annotations

import pytest
from selenium.webdriver.common.by import By

from playbooks.models import Playbook, PlaybookRun
from tests.playbooks.helpers import sales_conversation
from tests.support.browser import screenshot, sign_in, wait

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]


def test_convert_from_the_chat_then_run_for_another_month(browser, asgi_server, user, conversation):
    """P1, P2 and a run, as a person does them: the chat's button, the detail page, the run form, the result."""
    sales_conversation(conversation)
    sign_in(browser, asgi_server, user)
    browser.get(f"{asgi_server.url}/chat/{conversation.pk}/")
    browser.find_element(By.XPATH, "//button[normalize-space()='Convert to playbook']").click()
    wait(browser).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".playbook-page h1"))
    playbook = Playbook.objects.get()
    assert browser.current_url.endswith(f"/playbooks/{playbook.pk}/")
    assert "Call sql_query with" in browser.find_element(By.CSS_SELECTOR, ".playbook-steps").text
    screenshot(browser, "playbook-detail")
    browser.find_element(By.LINK_TEXT, "Run…").click()
    month = wait(browser).until(lambda d: d.find_element(By.ID, "param-month"))
    month.clear()
    month.send_keys("2026-09")
    screenshot(browser, "playbook-run-form")
    browser.find_element(By.XPATH, "//button[normalize-space()='Run']").click()
    wait(browser).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".run-messages .msg.assistant"))
    run = PlaybookRun.objects.get()
    assert run.values["month"] == "2026-09"
    assert browser.find_element(By.CSS_SELECTOR, ".run-messages .msg.assistant").text.startswith("echo: Run the")
    screenshot(browser, "playbook-run-result")
    conversation.refresh_from_db()
    assert conversation.head_id == playbook.source_head_id, "P2: the chat's head did not move"
