"""Issue 33 (X5) in headless Chromium against Daphne: a share opened signed out shows the shared path's messages,
with no control of the chat's, and axe finds no serious or critical problem on it."""

from __future__ import annotations

import pytest
from selenium.webdriver.common.by import By

from shares.services import share_create
from tests.conversations.helpers import ask
from tests.support.browser import screenshot, wait
from tests.test_accessibility import _violations

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]


def test_x5_a_share_opened_signed_out_shows_its_messages_and_nothing_to_act_on(browser, asgi_server, user,
                                                                               conversation):
    ask(conversation, "what is a tree?")
    ask(conversation, '#tool sql_query {"sql": "select 3 as branches"}')
    _, token = share_create(user=user, conversation_id=conversation.pk)
    ask(conversation, "a question after sharing")

    browser.delete_all_cookies()
    browser.get(f"{asgi_server.url}/s/{token}/")
    wait(browser).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#message-list article.msg"))
    questions = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#message-list article.msg.user .body")]
    answers = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#message-list article.msg.assistant .body")]
    assert questions == ["what is a tree?", '#tool sql_query {"sql": "select 3 as branches"}']
    assert answers[0].startswith("echo: what is a tree?") and len(answers) == 2
    tool = browser.find_element(By.CSS_SELECTOR, "#message-list details.msg.tool")
    assert "sql_query" in tool.text
    tool.find_element(By.TAG_NAME, "summary").click()
    wait(browser).until(lambda d: "branches" in tool.text)
    assert not browser.find_elements(By.CSS_SELECTOR, "[data-turn-control], [data-action], #message-list form")
    assert browser.find_element(By.CSS_SELECTOR, ".share-continue button").text.startswith("Sign in to continue")
    screenshot(browser, "share-signed-out")

    browser.set_script_timeout(60)
    assert _violations(browser) == []
    assert browser.execute_script("return document.querySelectorAll('h1').length") == 1
