"""Issue 32 in the pages, as a person uses them (headless Chromium against Daphne in its own process): a server
staff add in the admin reaches the running server at once, the settings page lists its tools, and an MCP
tool with effects waits in the chat with its exact arguments until the person clicks Approve (X3, F3, D4)."""

from __future__ import annotations

import json
import time

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec

from conversations.models import ToolApproval, ToolServer
from conversations.tools.mcp.servers import announce_change
from tests.conversations.mcp.conftest import NOTES
from tests.conversations.test_chat_browser import _open, _send, _wait_for_answer_count
from tests.support.browser import sign_in, wait

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]


@pytest.fixture
def notes_in_the_admin():
    """The fixture server as staff add it in the admin; taken away after, as the admin does (the live server
    keeps running for the other browser tests)."""
    ToolServer.objects.create(name="notes", command=NOTES["command"])
    announce_change()  # as the admin's save does: every process, the server's too, reads the servers again
    yield
    ToolServer.objects.all().delete()
    announce_change()


@pytest.mark.usefixtures("notes_in_the_admin")
def test_x3_an_mcp_action_waits_for_the_persons_click_in_the_chat(browser, asgi_server, user, conversation):
    sign_in(browser, asgi_server, user)
    deadline = time.monotonic() + 30
    while True:  # the news reaches the server process at once; its page is read until it shows it
        browser.get(f"{asgi_server.url}/settings/")
        if "notes__write_note" in browser.page_source or time.monotonic() > deadline:
            break
        time.sleep(1)
    row = browser.find_element(By.XPATH, "//tr[td/code[text()='notes__write_note']]")
    assert "asks you" in row.text and "notes" in row.text
    assert "at once" in browser.find_element(By.XPATH, "//tr[td/code[text()='notes__lookup']]").text

    _open(browser, asgi_server, conversation)
    _send(browser, "#tool notes__write_note " + json.dumps({"text": "from the page"}))
    approve = wait(browser).until(
        ec.element_to_be_clickable((By.CSS_SELECTOR, "button[data-action=approve][data-approve=true]")))
    card = browser.find_element(By.CSS_SELECTOR, "details.msg.tool")
    assert "waiting for your approval" in card.text and "notes__write_note" in card.text
    assert "from the page" in card.get_attribute("textContent"), "the exact arguments that will run"
    assert not ToolApproval.objects.exists(), "nothing ran before the click"
    approve.click()
    _wait_for_answer_count(browser, 1)
    (approval,) = ToolApproval.objects.all()
    assert approval.approved and approval.result["content"].startswith("noted #")
    assert "done" in browser.find_element(By.CSS_SELECTOR, "details.msg.tool").text
