"""The chat pages as a person uses them: headless Chromium against Daphne, WebSockets and arbor/echo.

Browser and server: tests/support/browser.py. Screenshots of the main states go to var/screenshots/
(or $ARBOR_SCREENSHOTS): chat-empty, chat-streaming, chat-branch-arrows, chat-approval,
chat-what-the-model-saw, chat-compare, chat-palette, chat-phone, chat-phone-menu.
"""

from __future__ import annotations

import json
import time

import pytest
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as ec

from conversations import services
from conversations.jobs import worker
from conversations.models import Node, ToolApproval
from conversations.turns.detached import run_here
from conversations.turns.start import turn_ask
from tests.support.browser import WAIT, screenshot, sign_in, wait

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]


def _open(browser, server, conversation) -> None:
    browser.get(f"{server.url}/chat/{conversation.pk}/")
    _wait_idle(browser)


def _wait_idle(browser) -> None:
    """The socket is open and no turn runs: Send is shown, Stop is not."""
    wait(browser).until(lambda d: d.execute_script(
        "const s = document.getElementById('send'); "
        "return !!s && !s.hidden && !s.disabled && document.getElementById('chat').dataset.connected === '1'"))


def _send(browser, text: str) -> None:
    box = browser.find_element(By.ID, "composer-input")
    box.send_keys(text)
    box.send_keys(Keys.ENTER)


def _answers(browser) -> list[str]:
    answers = browser.find_elements(By.CSS_SELECTOR, "#message-list article.msg.assistant:not(.streaming)")
    return [e.find_element(By.CSS_SELECTOR, ".body").text for e in answers]


def _wait_for_answer_count(browser, count: int) -> None:
    wait(browser).until(lambda d: len(_answers(d)) >= count
                                       and not d.find_elements(By.CSS_SELECTOR, ".msg.streaming"))
    _wait_idle(browser)


def test_sign_in_send_and_see_tokens_arrive_in_several_steps(browser, asgi_server, user, conversation):
    """Issue 3: a person signs in through the form; Enter sends; the answer streams over the WebSocket in
    several steps, then is redrawn from the server's record (T3)."""
    browser.get(asgi_server.url + "/chat/")
    browser.find_element(By.ID, "id_username").send_keys("ada")
    browser.find_element(By.ID, "id_password").send_keys("pw-ada-12345" + Keys.ENTER)
    wait(browser).until(ec.presence_of_element_located((By.ID, "composer-input")))
    _wait_idle(browser)
    screenshot(browser, "chat-empty")

    words = " ".join(f"w{i}" for i in range(20))
    _send(browser, f"#slow {words}")
    seen: list[str] = []
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        text = browser.execute_script(
            "const b = document.querySelector('.msg.streaming .body'); return b ? b.textContent : null")
        if text and text not in seen:
            seen.append(text)
            if len(seen) == 3:
                screenshot(browser, "chat-streaming")
        if text is None and seen:
            break
        time.sleep(0.05)
    assert len(seen) >= 3, f"the answer should arrive in several steps, saw {seen!r}"
    # Rendered as Markdown while it streams (issue 16): compared as the words a person reads.
    read = [" ".join(text.split()) for text in seen]
    assert all(later.startswith(earlier) for earlier, later in zip(read, read[1:], strict=False))
    _wait_for_answer_count(browser, 1)
    (answer,) = _answers(browser)
    assert answer.startswith(f"echo: #slow {words}")
    conversation.refresh_from_db()
    assert conversation.head.status == "succeeded"


def test_edit_shows_arrows_and_switching_back_finds_the_old_answer_whole(browser, asgi_server, user, conversation):
    """T7, T8: ✎ turns the question into a textarea; saving runs a new branch; 2/2 arrows appear; ◀ shows
    the old branch with its answer intact. Regenerate (↻) adds a second answer to that question: its ◀ ▶ sit on
    the answer (issue 26), apart from the question's versions, and switch between the two answers in place."""
    sign_in(browser, asgi_server, user)
    _open(browser, asgi_server, conversation)
    _send(browser, "How many customers are there?")
    _wait_for_answer_count(browser, 1)
    (old_answer,) = _answers(browser)

    browser.find_element(By.CSS_SELECTOR, "article.msg.user button[data-action=edit]").click()
    area = browser.find_element(By.CSS_SELECTOR, "article.msg.user form.edit textarea")
    area.clear()
    area.send_keys("How many customers are in Korea?" + Keys.ENTER)
    _wait_for_answer_count(browser, 1)
    (new_answer,) = _answers(browser)
    assert new_answer.startswith("echo: How many customers are in Korea?\nseen: user:How many customers are in")
    assert browser.find_element(By.CSS_SELECTOR, ".branch-index").text == "2/2"
    screenshot(browser, "chat-branch-arrows")

    browser.find_element(By.CSS_SELECTOR, "button[aria-label='Previous version of this question']").click()
    wait(browser).until(
        lambda d: d.find_element(By.CSS_SELECTOR, ".branch-index").text == "1/2")
    _wait_idle(browser)
    assert _answers(browser) == [old_answer]
    assert browser.find_element(By.CSS_SELECTOR, "article.msg.user .body").text == "How many customers are there?"

    browser.find_element(By.CSS_SELECTOR, "button[data-action=regenerate]").click()
    _wait_for_answer_count(browser, 1)
    answer_index = "article.msg.assistant .branch-index"
    wait(browser).until(lambda d: d.find_elements(By.CSS_SELECTOR, answer_index)
                        and d.find_element(By.CSS_SELECTOR, answer_index).text == "2/2")
    assert _answers(browser) == [old_answer], "a regenerate asks the same question again"
    assert browser.find_element(By.CSS_SELECTOR, "article.msg.user .branch-index").text == "1/2", \
        "the question still has two versions: the regeneration is not one of them"
    regenerated = browser.find_element(By.CSS_SELECTOR, "article.msg.assistant").get_attribute("data-node")
    screenshot(browser, "chat-regenerated-answer-arrows")

    browser.find_element(By.CSS_SELECTOR, "button[aria-label='Previous answer to this question']").click()
    wait(browser).until(lambda d: d.find_element(By.CSS_SELECTOR, answer_index).text == "1/2")
    _wait_idle(browser)
    assert browser.find_element(By.CSS_SELECTOR, "article.msg.assistant").get_attribute("data-node") != regenerated
    assert browser.switch_to.active_element.get_attribute("aria-label") == "Next answer to this question", \
        "focus stays on the answer's arrows"
    assert browser.find_element(By.CSS_SELECTOR, "article.msg.user .branch-index").text == "1/2"

    browser.find_element(By.CSS_SELECTOR, "a.compare").click()
    columns = wait(browser).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, ".columns .column"))
    assert len(columns) == 2
    screenshot(browser, "chat-compare")


def test_stop_mid_answer_keeps_the_node_and_the_conversation_goes_on(browser, asgi_server, user, conversation):
    """Stop cancels the generation: the node is kept failed/cancelled, its partial text shown but never
    sent again (T5), and the next question runs at once."""
    sign_in(browser, asgi_server, user)
    _open(browser, asgi_server, conversation)
    _send(browser, "#slow " + " ".join(f"w{i}" for i in range(80)))
    wait(browser).until(lambda d: d.execute_script(
        "const b = document.querySelector('.msg.streaming .body'); return b && b.textContent.length > 10"))
    browser.find_element(By.ID, "stop").click()
    # Read inside the wait: the list is redrawn from the server's record as the turn ends (a stale element).
    stopped = wait(browser).until(
        lambda d: d.find_element(By.CSS_SELECTOR, "article.msg.stopped.reason-cancelled").text)
    assert "Stopped." in stopped and "echo: #slow" in stopped
    _wait_idle(browser)
    node = Node.objects.get(conversation=conversation)
    assert (node.status, node.failure_reason) == ("failed", "cancelled")

    _send(browser, "And now?")
    _wait_for_answer_count(browser, 1)
    (answer,) = _answers(browser)
    assert answer.startswith("echo: And now?\nseen: user:#slow w0")
    assert "assistant:" not in answer, "the stopped partial answer is not sent again"


def test_approve_one_email_and_refuse_another(browser, asgi_server, user, conversation):
    """F3: a send_email call waits with Approve and Refuse; approving runs it once, refusing never does."""
    sign_in(browser, asgi_server, user)
    _open(browser, asgi_server, conversation)
    mail = {"to": "ops@example.com", "subject": "Report", "body": "Sales are up."}
    _send(browser, f"#tool send_email {json.dumps(mail)}")
    approve = wait(browser).until(
        ec.element_to_be_clickable((By.CSS_SELECTOR, "button[data-action=approve][data-approve=true]")))
    assert "waiting for your approval" in browser.find_element(By.CSS_SELECTOR, "details.msg.tool").text
    screenshot(browser, "chat-approval")
    approve.click()
    _wait_for_answer_count(browser, 1)
    tool = browser.find_element(By.CSS_SELECTOR, "details.msg.tool")
    assert "done" in tool.text
    (approval,) = ToolApproval.objects.all()
    assert approval.approved and approval.result and not approval.result["is_error"]

    _send(browser, f"#tool send_email {json.dumps({**mail, 'subject': 'Second'})}")
    refuse = wait(browser).until(
        ec.element_to_be_clickable((By.CSS_SELECTOR, "button[data-action=approve][data-approve=false]")))
    refuse.click()
    _wait_for_answer_count(browser, 2)
    assert "refused" in browser.find_elements(By.CSS_SELECTOR, "details.msg.tool")[-1].text
    refused = ToolApproval.objects.exclude(pk=approval.pk).get()
    assert not refused.approved and refused.result["is_error"]


def test_model_html_shows_as_text_and_what_the_model_saw(browser, asgi_server, user, conversation):
    """An answer holding <img onerror> and <script> renders as text (sanitised Markdown); the panel shows the
    exact context of the call that produced the answer (T5)."""
    services.conversation_update(conversation=conversation, instructions="Answer briefly.")
    sign_in(browser, asgi_server, user)
    _open(browser, asgi_server, conversation)
    hostile = "<img src=x onerror=alert(1)> and <script>window.pwned = 1</script>"
    _send(browser, hostile)
    _wait_for_answer_count(browser, 1)
    (answer,) = _answers(browser)
    assert hostile in answer
    assert not browser.find_elements(By.CSS_SELECTOR, "#message-list img, #message-list script")
    assert browser.execute_script("return window.pwned === undefined")
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018 - reading it is the check

    browser.find_element(By.CSS_SELECTOR, "article.msg.assistant button[data-action=seen]").click()
    panel = wait(browser).until(ec.visibility_of_element_located((By.ID, "seen")))
    roles = [h.text.lower() for h in panel.find_elements(By.CSS_SELECTOR, ".seen-message h3")]
    assert roles == ["system", "user"]
    texts = [p.text for p in panel.find_elements(By.CSS_SELECTOR, ".seen-message pre")]
    assert texts == ["Answer briefly.", hostile]
    screenshot(browser, "chat-what-the-model-saw")


@pytest.mark.slow
def test_another_users_conversation_is_not_found_over_http_and_websocket(browser, asgi_server, user, other_user):
    """Access: anyone else's conversation is a 404 page and a socket closed with 4404."""
    theirs = services.conversation_create(owner=other_user, title="private")
    sign_in(browser, asgi_server, user)
    browser.get(f"{asgi_server.url}/chat/{theirs.pk}/")
    assert "Not Found" in browser.page_source
    code = browser.execute_async_script("""
        const done = arguments[arguments.length - 1];
        const socket = new WebSocket(`ws://${location.host}/ws/conversations/${arguments[0]}/`);
        socket.onclose = (event) => done(event.code);
        setTimeout(() => done('timeout'), 10000);
    """, theirs.pk)
    assert code == 4404


def test_palette_jumps_to_a_conversation_and_the_page_works_at_phone_width(browser, asgi_server, user, conversation):
    """Ctrl-K opens the palette; typing filters; Enter jumps. At phone width the composer and a menu button show."""
    other = services.conversation_create(owner=user, title="Quarterly sales")
    sign_in(browser, asgi_server, user)
    _open(browser, asgi_server, conversation)
    browser.find_element(By.TAG_NAME, "body").send_keys(Keys.CONTROL, "k")
    search = wait(browser).until(ec.visibility_of_element_located((By.ID, "palette-input")))
    search.send_keys("quarterly")
    options = browser.find_elements(By.CSS_SELECTOR, "#palette-list li[role=option]")
    labels = [o.text.rsplit(" ", 1)[0] for o in options]
    assert labels == ["Quarterly sales", "Search messages for “quarterly”", "Similar messages to “quarterly”"], \
        "a match, then search in messages: words, then meaning"
    screenshot(browser, "chat-palette")
    search.send_keys(Keys.ENTER)
    wait(browser).until(ec.url_contains(f"/chat/{other.pk}/"))

    browser.set_window_size(390, 844)
    _wait_idle(browser)
    assert browser.find_element(By.ID, "composer-input").is_displayed()
    assert not browser.find_element(By.ID, "sidebar").is_displayed()
    screenshot(browser, "chat-phone")
    toggle = browser.find_element(By.CSS_SELECTOR, ".sidebar-toggle")
    toggle.click()
    assert browser.find_element(By.ID, "sidebar").is_displayed()
    assert toggle.get_attribute("aria-expanded") == "true"
    screenshot(browser, "chat-phone-menu")


def test_issue_18_the_palette_finds_similar_messages_the_words_miss(browser, asgi_server, user, conversation):
    """Ctrl-K, "Similar messages to …": the search page opens at its similar messages, which list a misspelt
    paraphrase no word matches (arbor/echo-embed, embedded by the worker)."""
    notes = services.conversation_create(owner=user, title="Account notes")
    run_here(turn_ask(user=user, conversation_id=notes.pk, content="Kancelling a zubscription takes effect next month"))
    worker.run_due()
    sign_in(browser, asgi_server, user)
    _open(browser, asgi_server, conversation)
    browser.find_element(By.TAG_NAME, "body").send_keys(Keys.CONTROL, "k")
    search = wait(browser).until(ec.visibility_of_element_located((By.ID, "palette-input")))
    search.send_keys("cancel subscription")
    search.send_keys(Keys.ARROW_DOWN)  # no title or command matches: past "Search messages for …"
    active = browser.find_element(By.CSS_SELECTOR, "#palette-list li[aria-selected=true]")
    assert active.text.startswith("Similar messages to “cancel subscription”"), active.text
    search.send_keys(Keys.ENTER)
    wait(browser).until(ec.url_contains("#similar"))
    words = browser.find_element(By.ID, "word-matches").text
    similar = browser.find_element(By.ID, "similar-messages")
    assert "No message has these words." in words
    assert "Kancelling a zubscription takes effect" in similar.text and "Account notes" in similar.text
    screenshot(browser, "search-similar")


def _streaming_text(browser) -> str | None:
    return browser.execute_script(
        "const b = document.querySelector('.msg.streaming .body'); return b ? b.textContent : null")


def test_issue_12_a_reload_mid_answer_picks_it_up_and_a_second_window_sees_it_live(browser, asgi_server, user,
                                                                                   conversation):
    """Issue 12: reloading the page in the middle of a `#slow` answer shows it continuing from where it was
    (replayed, then live), with no word twice or missing; a second window on the same conversation sees it
    stream live, and its controls know a turn runs."""
    sign_in(browser, asgi_server, user)
    _open(browser, asgi_server, conversation)
    words = " ".join(f"w{i}" for i in range(50))
    _send(browser, f"#slow {words}")
    wait(browser).until(lambda d: len(_streaming_text(d) or "") > 20)
    browser.refresh()
    wait(browser).until(lambda d: len(_streaming_text(d) or "") > 40)
    after_reload = _streaming_text(browser)
    assert after_reload.startswith("echo: #slow w0 w1"), "the answer so far, from its start"
    assert browser.find_element(By.ID, "stop").is_displayed(), "the reloaded page knows a turn runs"

    first = browser.current_window_handle
    browser.switch_to.new_window("window")
    browser.get(f"{asgi_server.url}/chat/{conversation.pk}/")
    wait(browser).until(lambda d: len(_streaming_text(d) or "") > len(after_reload))
    assert browser.find_element(By.ID, "stop").is_displayed() and not browser.find_element(By.ID, "send").is_displayed()
    screenshot(browser, "chat-second-window-live")
    _wait_for_answer_count(browser, 1)
    (second_view,) = _answers(browser)
    browser.switch_to.window(first)
    _wait_for_answer_count(browser, 1)
    (first_view,) = _answers(browser)
    assert first_view == second_view and first_view.startswith(f"echo: #slow {words}")
    conversation.refresh_from_db()
    assert conversation.head.status == "succeeded"
