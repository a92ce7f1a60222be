"""Issue 16: the chat page where people trip: scrolling, typed text, keyboard. Headless Chromium against Daphne,
WebSockets and arbor/echo (tests/support/browser.py); the scroll checks read scrollTop and scrollHeight.

Screenshots (var/screenshots/): chat-jump-to-latest, chat-switched-in-place, chat-overflow-unsent, chat-shortcuts.
"""

from __future__ import annotations

import json

import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from conversations import services
from conversations.models import Conversation, Node
from tests.conversations.helpers import ask
from tests.conversations.test_big_conversations import bulk_conversation
from tests.conversations.test_chat_browser import _answers, _open, _send, _wait_for_answer_count, _wait_idle
from tests.support.browser import screenshot, sign_in, wait

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

BOX = "document.getElementById('messages')"


def _scroll(browser) -> dict:
    return browser.execute_script(f"const b = {BOX}; return {{top: b.scrollTop, height: b.scrollHeight, "
                                  "view: b.clientHeight}")


def _at_bottom(browser) -> bool:
    place = _scroll(browser)
    return place["top"] + place["view"] >= place["height"] - 4


def _on_top(browser, element) -> bool:
    """Shown and not covered: what a person sees at its centre is the element."""
    return browser.execute_script("""
        const e = arguments[0], r = e.getBoundingClientRect();
        return !e.hidden && r.width > 0 && document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2) === e;
    """, element)


def _streamed_length(browser) -> int:
    return browser.execute_script(
        "const b = document.querySelector('.msg.streaming .body'); return b ? b.textContent.length : -1")


@pytest.mark.slow
def test_issue_16_the_view_follows_a_stream_until_the_person_scrolls_up_then_offers_jump_to_latest(
        browser, asgi_server, user):
    """Opened at the newest message; a streaming answer is followed (scrollTop at the bottom as it grows); once the
    person scrolls up the view stays put while tokens arrive and "Jump to latest" appears; it brings them back,
    and the finished answer is in view."""
    # Twenty turns fill more than the view; arbor/echo's answer repeats the question and a digest of every
    # message it saw, a word each 0.1 s with #slow, so the conversation stays short enough to end in seconds.
    conversation = bulk_conversation(user, turns=20, branch_every=0)
    sign_in(browser, asgi_server, user)
    _open(browser, asgi_server, conversation)
    assert _scroll(browser)["height"] > 2 * _scroll(browser)["view"]
    assert _at_bottom(browser), "opens at the newest message"
    _send(browser, "#slow " + " ".join(f"word{i}" for i in range(60)))
    wait(browser).until(lambda d: _streamed_length(d) > 60)
    assert _at_bottom(browser), "follows the stream"
    wait(browser).until(lambda d: _streamed_length(d) > 120)
    assert _at_bottom(browser), "still following"

    browser.execute_script(f"{BOX}.scrollTop = {BOX}.scrollTop - 600")
    jump = browser.find_element(By.ID, "jump-latest")
    wait(browser).until(lambda d: _on_top(d, jump))
    held = _scroll(browser)["top"]
    grown = _streamed_length(browser)
    wait(browser).until(lambda d: _streamed_length(d) > grown + 30)
    assert _scroll(browser)["top"] == held, "scrolled up, the view stays where the person put it"
    screenshot(browser, "chat-jump-to-latest")
    jump.click()
    assert _at_bottom(browser) and not _on_top(browser, jump)
    finished = WebDriverWait(browser, 180, ignored_exceptions=(StaleElementReferenceException,))
    finished.until(lambda d: len(_answers(d)) == 21 and not d.find_elements(By.CSS_SELECTOR, ".msg.streaming"))
    _wait_idle(browser)
    assert _at_bottom(browser), "the finished answer is in view"


# Keeps each WebSocket the page opens, so a test can hand the page an event as if the server had sent it.
KEEP_SOCKETS = """
    window.sockets = [];
    const Real = window.WebSocket;
    window.WebSocket = class extends Real { constructor(...args) { super(...args); window.sockets.push(this); } };
"""


def test_issue_16_a_scroll_up_just_before_a_token_is_not_undone(browser, asgi_server, user):
    """A person's scroll up whose "scroll" event has not fired yet when a token arrives (Chromium fires it at the
    next frame; a socket message can come first) is theirs: the token does not pull the view back down, and
    "Jump to latest" appears. The token is handed to the page's socket in the same script as the scroll, so the
    order is certain."""
    conversation = bulk_conversation(user, turns=20, branch_every=0)
    browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": KEEP_SOCKETS})
    sign_in(browser, asgi_server, user)
    _open(browser, asgi_server, conversation)
    assert _at_bottom(browser)
    held, after = browser.execute_script(f"""
        const box = {BOX};
        box.scrollTop = box.scrollTop - 600;
        const held = box.scrollTop;
        const token = JSON.stringify({{type: "token", text: "one more word "}});
        window.sockets.at(-1).dispatchEvent(new MessageEvent("message", {{data: token}}));
        return [held, box.scrollTop];
    """)
    assert browser.find_elements(By.CSS_SELECTOR, ".msg.streaming"), "the token reached the page"
    assert after == held, "the token left the view where the person put it"
    jump = browser.find_element(By.ID, "jump-latest")
    wait(browser).until(lambda d: _on_top(d, jump))
    assert _scroll(browser)["top"] == held


def test_issue_16_t8_arrows_switch_versions_in_place_keeping_the_question_where_it_stood(browser, asgi_server, user):
    """◀ / ▶ switch branches without a reload (the page's own state survives) and without moving the question:
    its distance from the top of the list's view is kept, and focus stays on the arrows."""
    conversation = bulk_conversation(user, turns=40, branch_every=10)  # question 35 is an edit of question 34
    services.head_switch(conversation=conversation, node_id=Node.objects.get(sent__0__text="question 34",
                                                                              conversation=conversation).pk)
    sign_in(browser, asgi_server, user)
    _open(browser, asgi_server, conversation)
    question = browser.find_element(By.XPATH, "//article[.//div[text()='question 34']]")
    browser.execute_script("window.notReloaded = true")
    place = f"return arguments[0].getBoundingClientRect().top - {BOX}.getBoundingClientRect().top"
    before = browser.execute_script(place, question)
    assert question.find_element(By.CSS_SELECTOR, ".branch-index").text == "1/2"
    question.find_element(By.CSS_SELECTOR, "button[aria-label='Next version of this question']").click()
    switched = wait(browser).until(lambda d: d.find_element(By.XPATH, "//article[.//div[text()='question 35']]"))
    after = browser.execute_script(place, switched)
    assert browser.execute_script("return window.notReloaded === true"), "switched in place, no reload"
    assert abs(after - before) <= 2, (before, after)
    assert switched.find_element(By.CSS_SELECTOR, ".branch-index").text == "2/2"
    assert browser.switch_to.active_element.get_attribute("aria-label") == "Previous version of this question"
    assert len(_questions(browser)) > 5 and _questions(browser)[-1] == "question 39", "the branch's latest tip"
    conversation.refresh_from_db()
    assert Node.objects.get(pk=conversation.head_id).sent[0]["text"] == "question 39"
    screenshot(browser, "chat-switched-in-place")


def _questions(browser) -> list[str]:
    return browser.execute_script(
        "return [...document.querySelectorAll('#message-list article.msg.user .body')].map(e => e.textContent)")


def test_issue_16_typed_text_survives_a_refused_send_and_a_reload(browser, asgi_server, user, conversation):
    """A question sent while an approval waits is refused: its text comes back to the composer, not lost; what is
    typed survives a reload of the page."""
    sign_in(browser, asgi_server, user)
    _open(browser, asgi_server, conversation)
    _send(browser, f"#tool send_email {json.dumps({'to': 'a@example.com', 'subject': 's', 'body': 'b'})}")
    wait(browser).until(lambda d: d.find_elements(By.CSS_SELECTOR, "details.msg.tool[open] .approval"))
    _wait_idle(browser)
    _send(browser, "Is it sent yet?")
    box = browser.find_element(By.ID, "composer-input")
    wait(browser).until(lambda d: box.get_attribute("value") == "Is it sent yet?")
    wait(browser).until(lambda d: "approv" in d.find_element(By.ID, "composer-status").text.lower())
    assert Node.objects.filter(conversation=conversation).count() == 1, "nothing was written"

    box.send_keys(" Please check.")
    browser.refresh()
    _wait_idle(browser)
    assert browser.find_element(By.ID, "composer-input").get_attribute("value") == "Is it sent yet? Please check."


def test_issue_16_f2_a_question_too_long_is_shown_not_sent_and_comes_back_to_the_composer(
        browser, asgi_server, user, conversation):
    """F2: the overflowed question was shown nowhere, even after a reload. It is shown, marked "Not sent", and its
    text is back in the composer to be shortened; after a reload the card offers to put it back."""
    sign_in(browser, asgi_server, user)
    _open(browser, asgi_server, conversation)
    _send(browser, "A very long question #overflow")
    card = wait(browser).until(lambda d: d.find_element(By.CSS_SELECTOR, "article.msg.unsent"))
    assert "A very long question #overflow" in card.text and "Not sent." in card.text
    box = browser.find_element(By.ID, "composer-input")
    wait(browser).until(lambda d: box.get_attribute("value") == "A very long question #overflow")
    screenshot(browser, "chat-overflow-unsent")

    browser.execute_script("localStorage.clear()")
    browser.refresh()
    _wait_idle(browser)
    card = browser.find_element(By.CSS_SELECTOR, "article.msg.unsent")
    assert "A very long question #overflow" in card.text
    card.find_element(By.CSS_SELECTOR, "button[data-action=reuse]").click()
    assert browser.find_element(By.ID, "composer-input").get_attribute("value") == "A very long question #overflow"


def test_issue_16_keyboard_esc_stops_up_edits_ctrl_shift_o_opens_a_new_chat_and_question_mark_lists_them(
        browser, asgi_server, user, conversation):
    sign_in(browser, asgi_server, user)
    _open(browser, asgi_server, conversation)
    _send(browser, "#slow " + " ".join(f"w{i}" for i in range(80)))
    wait(browser).until(lambda d: _streamed_length(d) > 10)
    browser.find_element(By.TAG_NAME, "body").send_keys(Keys.ESCAPE)
    wait(browser).until(lambda d: d.find_elements(By.CSS_SELECTOR, "article.msg.stopped.reason-cancelled"))
    _wait_idle(browser)
    assert Node.objects.get(conversation=conversation).failure_reason == "cancelled"

    box = browser.find_element(By.ID, "composer-input")
    box.click()
    box.send_keys(Keys.ARROW_UP)
    area = wait(browser).until(lambda d: d.find_element(By.CSS_SELECTOR, "article.msg.user form.edit textarea"))
    assert browser.switch_to.active_element == area and area.get_attribute("value").startswith("#slow w0")
    area.send_keys(Keys.ESCAPE)

    browser.find_element(By.TAG_NAME, "body").send_keys("?")
    sheet = wait(browser).until(lambda d: d.find_element(By.ID, "shortcuts"))
    wait(browser).until(lambda d: sheet.is_displayed())
    assert "Stop the answer" in sheet.text and "New chat" in sheet.text
    screenshot(browser, "chat-shortcuts")
    sheet.find_element(By.CSS_SELECTOR, "button").click()

    browser.find_element(By.TAG_NAME, "body").send_keys(Keys.CONTROL, Keys.SHIFT, "o")
    wait(browser).until(lambda d: d.current_url.rstrip("/").split("/")[-1] != str(conversation.pk))
    _wait_idle(browser)
    new = Conversation.objects.exclude(pk=conversation.pk).get(owner=user)
    assert browser.current_url.endswith(f"/chat/{new.pk}/")
    assert browser.switch_to.active_element.get_attribute("id") == "composer-input", "a new chat focuses the composer"
    services.conversation_delete(conversation=new)


def test_issue_16_a_failure_is_a_plain_sentence_with_the_details_behind_a_disclosure_and_compare_shows_partials(
        browser, asgi_server, user, conversation):
    """The status line and the card say "The model provider failed. Retry?"; the provider's words are behind
    "Details". A stopped answer's partial text shows on the compare page as on the chat page."""
    sign_in(browser, asgi_server, user)
    _open(browser, asgi_server, conversation)
    _send(browser, "#fail")
    card = wait(browser).until(lambda d: d.find_element(By.CSS_SELECTOR, "article.msg.error.reason-provider_error"))
    _wait_idle(browser)
    status = browser.find_element(By.ID, "composer-status")
    assert status.text.startswith("The model provider failed. Retry?") and "litellm" not in status.text
    assert card.text.startswith("The model provider failed. Retry?") and "litellm" not in card.text
    card.find_element(By.CSS_SELECTOR, "details.raw summary").click()
    assert "#fail asked for a provider error" in card.find_element(By.CSS_SELECTOR, "details.raw").text

    _send(browser, "#slow " + " ".join(f"w{i}" for i in range(80)))
    wait(browser).until(lambda d: _streamed_length(d) > 20)
    browser.find_element(By.ID, "stop").click()
    stopped = wait(browser).until(lambda d: d.find_element(By.CSS_SELECTOR, "article.msg.stopped.reason-cancelled"))
    _wait_idle(browser)
    partial_on_chat = stopped.find_element(By.CSS_SELECTOR, ".body.partial").text
    browser.find_element(By.CSS_SELECTOR, "article.msg.user button[data-action=edit]")  # the stopped question
    edits = browser.find_elements(By.CSS_SELECTOR, "article.msg.user button[data-action=edit]")
    edits[-1].click()
    area = browser.find_element(By.CSS_SELECTOR, "article.msg.user form.edit textarea")
    area.clear()
    area.send_keys("Shorter, please." + Keys.ENTER)
    _wait_for_answer_count(browser, 1)
    browser.find_element(By.CSS_SELECTOR, "a.compare").click()
    columns = wait(browser).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".column"))
    stopped_column = next(c for c in columns if c.find_elements(By.CSS_SELECTOR, ".reason-cancelled"))
    assert stopped_column.find_element(By.CSS_SELECTOR, ".body.partial").text == partial_on_chat
    assert "Stopped." in stopped_column.text


def test_issue_16_markdown_renders_while_the_answer_streams_sanitised_as_the_finished_answer(
        browser, asgi_server, user, conversation):
    """While `#slow` streams an answer holding **bold**, a Python code block and an <img onerror>, the bubble shows
    <strong>, highlighted code with its language's name, and the image only as text, before the answer ends;
    the finished answer renders the same."""
    sign_in(browser, asgi_server, user)
    _open(browser, asgi_server, conversation)
    question = ("#slow **bold** <img src=x onerror=alert(1)>\n```python\ndef f():\n    return 1\n```\n"
                + " ".join(f"w{i}" for i in range(40)))
    lines = question.replace("\n", Keys.SHIFT + Keys.ENTER + Keys.SHIFT)
    browser.find_element(By.ID, "composer-input").send_keys(lines)
    browser.find_element(By.ID, "send").click()
    streaming = ".msg.streaming .body"
    wait(browser).until(lambda d: d.execute_script(
        f"return !!document.querySelector('{streaming} .rendered strong') "
        f"&& !!document.querySelector('{streaming} pre code.language-python span.k')"))
    label = browser.execute_script(f"return document.querySelector('{streaming} .code-language').textContent")
    assert label == "python"
    assert browser.execute_script(f"return document.querySelectorAll('{streaming} img').length") == 0
    assert "<img src=x onerror=alert(1)>" in browser.find_element(By.CSS_SELECTOR, streaming).text
    screenshot(browser, "chat-streaming-markdown")
    _wait_for_answer_count(browser, 1)
    answer = browser.find_element(By.CSS_SELECTOR, "article.msg.assistant .body")
    assert answer.find_elements(By.CSS_SELECTOR, "strong") and answer.find_elements(By.CSS_SELECTOR, "span.k")
    assert not answer.find_elements(By.CSS_SELECTOR, "img")


def _background(browser) -> str:
    return browser.execute_script("return getComputedStyle(document.documentElement).backgroundColor")


def test_issue_16_dark_mode_follows_the_system_and_a_persons_choice_is_kept(browser, asgi_server, user, conversation):
    """With the system set dark (prefers-color-scheme, emulated) the pages are dark; the ◐ button switches to
    light in place, and the choice is the person's: kept after a reload, whatever the system says."""
    from conversations.models import Preferences

    ask(conversation, "Show me code:\n```python\nprint(1)\n```")
    sign_in(browser, asgi_server, user)
    browser.execute_cdp_cmd("Emulation.setEmulatedMedia",
                            {"features": [{"name": "prefers-color-scheme", "value": "dark"}]})
    _open(browser, asgi_server, conversation)
    dark = _background(browser)
    assert dark == "rgb(21, 23, 26)", dark
    screenshot(browser, "dark-chat")
    browser.find_element(By.CSS_SELECTOR, ".theme-toggle button").click()  # the system is dark: ◐ offers dark
    wait(browser).until(lambda d: Preferences.objects.filter(user=user, theme="dark").exists())
    browser.find_element(By.CSS_SELECTOR, ".theme-toggle button").click()
    wait(browser).until(lambda d: _background(d) == "rgb(251, 251, 250)")
    assert Preferences.objects.get(user=user).theme == "light"
    browser.refresh()
    _wait_idle(browser)
    assert _background(browser) == "rgb(251, 251, 250)", "the person's choice, not the system's"
    browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})


def test_issue_16_a_new_chats_title_appears_without_a_reload(browser, asgi_server, user):
    """R4: the worker names a new chat after its first answer; the title box, the window's title and the sidebar
    show the name without a reload."""
    from conversations.jobs import worker

    conversation = services.conversation_create(owner=user, title="")
    sign_in(browser, asgi_server, user)
    _open(browser, asgi_server, conversation)
    browser.execute_script("window.notReloaded = true")
    _send(browser, "Quarterly revenue in Seoul")
    _wait_for_answer_count(browser, 1)
    worker.run_due()  # the worker's title job, as scripts/start runs it beside the server
    conversation.refresh_from_db()
    assert conversation.title
    wait(browser).until(lambda d: d.find_element(By.ID, "title-input").get_attribute("value") == conversation.title)
    assert browser.title == f"{conversation.title} · Arbor"
    assert browser.find_element(By.CSS_SELECTOR, "#sidebar a[aria-current=page]").text == conversation.title
    assert browser.execute_script("return window.notReloaded === true")
