"""Issue 33 in headless Chromium, as a person uses it: tick a second model, ask, watch both answers come side by
side, then go on from the one that was not the default (a switch, T8). The browser tests' server offers two
offline models (arbor/echo and arbor/echo-2, tests/support/browser.py)."""

from __future__ import annotations

import pytest
from selenium.webdriver.common.by import By

from conversations.models import Node
from tests.conversations.helpers import head
from tests.conversations.test_chat_browser import _open, _send, _wait_idle
from tests.support.browser import screenshot, sign_in, wait

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

ENDED = "[aria-label=\"The models' answers side by side\"]"


def _columns(browser) -> dict[str, str]:
    return browser.execute_script(
        "return Object.fromEntries([...document.querySelectorAll(arguments[0] + ' .side')]"
        ".map(c => [c.dataset.model, c.querySelector('.body').textContent]))", ENDED)


def test_issue_33_ask_two_models_see_both_side_by_side_and_go_on_from_either(browser, asgi_server, user,
                                                                             conversation):
    sign_in(browser, asgi_server, user)
    _open(browser, asgi_server, conversation)
    browser.find_element(By.CSS_SELECTOR, "#also-ask summary").click()
    default = browser.find_element(By.CSS_SELECTOR, "#also-ask input[value='arbor/echo']")
    assert default.is_selected(), "the conversation's model is ticked already"
    browser.find_element(By.CSS_SELECTOR, "#also-ask input[value='arbor/echo-2']").click()
    assert browser.find_element(By.CSS_SELECTOR, "#also-ask summary").text == "Ask several models (2 ticked)"

    _send(browser, "#slow which of you answers better")
    wait(browser).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".side-by-side .side")) == 2
                        and d.find_elements(By.CSS_SELECTOR, ".side-by-side .msg.streaming"))
    screenshot(browser, "several-models-streaming")
    wait(browser).until(lambda d: d.find_elements(By.CSS_SELECTOR, ENDED))
    _wait_idle(browser)

    columns = _columns(browser)
    assert list(columns) == ["arbor/echo", "arbor/echo-2"]
    assert all("which of you answers better" in text for text in columns.values())
    answers = [Node.objects.get(conversation=conversation, model=model) for model in columns]
    assert answers[0].parent_id == answers[1].parent_id is None, "siblings"
    assert head(conversation).pk == answers[0].pk, "the ticked default goes on"
    chosen = browser.find_element(By.CSS_SELECTOR, f"{ENDED} .side.chosen")
    assert chosen.get_attribute("data-model") == "arbor/echo"
    def index(node: Node) -> str:  # ◀ k/n ▶ orders the answers to a question as they were written
        return f"{sorted(a.pk for a in answers).index(node.pk) + 1}/2"

    assert browser.find_element(By.CSS_SELECTOR, "#message-list article.msg.assistant .branch-index").text == \
        index(answers[0]), "the list's answer steps through both (T7)"
    browser.set_window_size(375, 800)
    screenshot(browser, "several-models-375")
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth + 1")

    other = browser.find_element(By.CSS_SELECTOR, f"{ENDED} .side[data-model='arbor/echo-2'] button")
    other.click()
    wait(browser).until(lambda d: "arbor/echo-2" in d.find_element(By.ID, "composer-status").text)
    conversation.refresh_from_db()
    assert conversation.head_id == answers[1].pk, "choosing an answer is a switch"
    assert browser.find_element(By.CSS_SELECTOR, "#message-list article.msg.assistant .branch-index").text == \
        index(answers[1])

    browser.find_element(By.CSS_SELECTOR, "#also-ask input[value='arbor/echo-2']").click()  # back to one model
    _send(browser, "and on")
    wait(browser).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#message-list article.msg.assistant"))
                        == 2 and not d.find_elements(By.CSS_SELECTOR, ".msg.streaming"))
    _wait_idle(browser)
    last = head(conversation)
    assert last.parent_id == answers[1].pk and last.model == "arbor/echo", "one model again, from the chosen answer"
    assert not browser.find_elements(By.CSS_SELECTOR, ".side-by-side")
