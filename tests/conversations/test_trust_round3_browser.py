"""Issue 26's browser findings (10-13), as a person meets them in headless Chromium against Daphne and arbor/echo:
a second tab sees a quick turn, search's "Open its branch" with a star, a tab signed out elsewhere, and a page that
lives through a server restart. The services-level tests of the same fixes are in test_consumers.py, test_pages.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from conversations import services
from conversations.bench.processes import database_url, free_port
from conversations.jobs import worker
from conversations.models import Conversation, Node
from conversations.turns import recovery
from conversations.turns.detached import run_here
from conversations.turns.start import turn_edit
from tests.conversations.helpers import ask, head
from tests.conversations.test_chat_browser import _answers, _open, _send, _wait_for_answer_count, _wait_idle
from tests.support.browser import AsgiServer, screenshot, sign_in, wait
from tests.support.servers import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]


def _questions(browser) -> list[str]:
    return browser.execute_script(
        "return [...document.querySelectorAll('#message-list article.msg.user .body')].map(e => e.textContent)"
    )


def _status(browser) -> str:
    return browser.find_element(By.ID, "composer-status").text


def _connected(browser) -> str:
    return browser.execute_script("return document.getElementById('chat').dataset.connected")


# --- 10: a second tab sees a quick turn ----------------------------------------------------------------------


def test_issue_26_10_quick_turns_in_one_tab_show_in_another_open_tab_without_reload(
    browser, asgi_server, user, conversation
):
    """Issue 26 (10): a quick turn made in one tab (arbor/echo answers at once) often started and ended between two
    looks of the server's run watch (every 0.5 s) and never showed in a second open tab of the same conversation
    (6 of 6 missed). The watch now reports runs started since its last look: the other tab shows each question and
    its answer as it is made, without a reload."""
    sign_in(browser, asgi_server, user)
    _open(browser, asgi_server, conversation)
    tab_a = browser.current_window_handle
    browser.switch_to.new_window("tab")
    tab_b = browser.current_window_handle
    _open(browser, asgi_server, conversation)
    browser.execute_script("window.notReloaded = true")
    assert _questions(browser) == []

    asked: list[str] = []
    for question in ("hello", "hello again", "and once more"):
        browser.switch_to.window(tab_a)
        _send(browser, question)
        asked.append(question)
        _wait_for_answer_count(browser, len(asked))
        answers_in_a = _answers(browser)
        assert answers_in_a[-1].startswith(f"echo: {question}")

        browser.switch_to.window(tab_b)  # before the next question: each turn shows on its own
        wait(browser).until(lambda d: _questions(d) == asked and len(_answers(d)) == len(asked))
        _wait_idle(browser)
        assert _answers(browser) == answers_in_a
    assert browser.execute_script("return window.notReloaded === true"), "shown in place, not by a reload"
    assert Node.objects.filter(conversation=conversation).count() == 3, "three turns, each shown in both tabs"


# --- 11: search's "Open its branch" with a star ----------------------------------------------------------------


def test_issue_26_11_t8_search_open_its_branch_shows_the_hits_branch_even_with_a_star(
    browser, asgi_server, user, conversation
):
    """Issue 26 (11), T8: on the search page, "Open its branch" of a hit on another branch opened the starred branch
    whenever the conversation had a star (the switch's redirect came with the search page as Referer, and a page
    opened afresh opens on its star). It now shows the hit's branch; opened afresh later, the star again."""
    ask(conversation, "tell me about zebras")
    starred = head(conversation)
    services.branch_mark(node=starred, starred=True)
    run_here(
        turn_edit(user=user, conversation_id=conversation.pk, node_id=starred.pk, content="tell me about pelicans")
    )
    found = head(conversation)
    services.head_switch(conversation=conversation, node_id=starred.pk)
    worker.run_due()  # the worker indexes both branches' bubbles (R4)

    sign_in(browser, asgi_server, user)
    _open(browser, asgi_server, conversation)
    assert _questions(browser) == ["tell me about zebras"], "opened afresh: the starred branch"
    browser.get(f"{asgi_server.url}/search/")
    box = browser.find_element(By.ID, "search-page-input")
    box.send_keys("pelicans" + Keys.ENTER)
    hits = wait(browser).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#word-matches li.hit"))
    questions = [h for h in hits if "tell me about pelicans" in h.text and "your question" in h.text]
    assert len(questions) == 1, [h.text for h in hits]
    (hit,) = questions
    assert "on another branch" in hit.text
    hit.find_element(By.XPATH, ".//button[normalize-space()='Open its branch']").click()

    wait(browser).until(lambda d: d.current_url.rstrip("/").endswith(f"/chat/{conversation.pk}"))
    _wait_idle(browser)
    assert _questions(browser) == ["tell me about pelicans"], "the hit's branch, not the starred one"
    (answer,) = _answers(browser)
    assert answer.startswith("echo: tell me about pelicans")
    assert head(conversation).pk == found.pk
    screenshot(browser, "search-open-its-branch-with-star")

    browser.get(f"{asgi_server.url}/chat/")  # then opened afresh from elsewhere: the star again
    browser.get(f"{asgi_server.url}/chat/{conversation.pk}/")
    _wait_idle(browser)
    assert _questions(browser) == ["tell me about zebras"]
    assert head(conversation).pk == starred.pk


# --- 12: a tab signed out elsewhere ----------------------------------------------------------------------------


def _sign_out_in_another_tab(browser, server, conversation) -> None:
    """Open a second tab of the same browser (the same session cookie), press Log out there, come back."""
    chat_tab = browser.current_window_handle
    browser.switch_to.new_window("tab")
    browser.get(f"{server.url}/chat/{conversation.pk}/")
    browser.find_element(By.CSS_SELECTOR, "header nav.account button[type=submit]").click()
    wait(browser).until(lambda d: "/accounts/login/" in d.current_url)
    browser.switch_to.window(chat_tab)


def _watch_status(browser) -> None:
    """Note when the status line under the composer last changed (window.statusChangedAt, page time in ms)."""
    browser.execute_script("""
        const status = document.getElementById('composer-status');
        window.statusChangedAt = performance.now();
        new MutationObserver(() => { window.statusChangedAt = performance.now(); })
          .observe(status, {childList: true, subtree: true, characterData: true});""")


def _status_settled(browser, quiet_ms: int = 2500) -> bool:
    return browser.execute_script("return performance.now() - window.statusChangedAt > arguments[0]", quiet_ms)


def test_issue_26_12_a_tab_signed_out_in_another_tab_cannot_send(browser, asgi_server, user, conversation):
    """Issue 26 (12): after signing out in one tab, an already open chat tab could still send, and the model call
    was recorded. The socket reads its session again on every message: the question sent from the open tab is
    refused and nothing is written; the typed text is kept in the box (a refused send never loses it)."""
    sign_in(browser, asgi_server, user)
    _open(browser, asgi_server, conversation)
    _sign_out_in_another_tab(browser, asgi_server, conversation)
    assert _connected(browser) == "1", "the open tab's socket is still up: only its next message finds out"

    _send(browser, "still there?")
    wait(browser).until(lambda d: _connected(d) == "0")  # the server refused it and closed the socket
    wait(browser).until(lambda d: d.find_element(By.ID, "composer-input").get_attribute("value") == "still there?")
    assert Node.objects.filter(conversation=conversation).count() == 0, "nothing recorded"
    assert not Conversation.objects.get(pk=conversation.pk).turn_running


def test_issue_26_12_a_tab_signed_out_in_another_tab_says_so(browser, asgi_server, user, conversation):
    """Issue 26 (12): the open tab whose question was refused because the person signed out in another tab tells
    them they are signed out (the server's `signed_out`, closing with 4401), and keeps saying so once the page has
    settled: not "the answer goes on", "not available any more" or "Reconnected"."""
    sign_in(browser, asgi_server, user)
    _open(browser, asgi_server, conversation)
    _sign_out_in_another_tab(browser, asgi_server, conversation)
    _watch_status(browser)
    _send(browser, "still there?")
    wait(browser).until(lambda d: _connected(d) == "0")
    wait(browser).until(lambda d: _status_settled(d))
    screenshot(browser, "chat-signed-out-elsewhere")
    status = _status(browser)
    assert "signed out" in status.lower(), status
    assert Node.objects.filter(conversation=conversation).count() == 0
    assert not browser.find_elements(By.CSS_SELECTOR, "#message-list article.msg"), "no bubble of the refused question"
    assert browser.find_element(By.ID, "send").get_attribute("disabled") is not None
    assert browser.find_element(By.ID, "composer-input").get_attribute("value") == "still there?", "the text is kept"


# --- 13: a server restart ----------------------------------------------------------------------------------------

# A server whose Django is loaded once, in a process of its own that forks each Daphne it runs: a restart on the
# same port costs a fork, not a cold start of several seconds. Commands on stdin, answers on stdout.
_RESTARTABLE = r"""
import os, signal, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
from config.asgi import application
from daphne.testing import DaphneProcess
from django.db import connections

connections.close_all()  # nothing the forks would share
port, child = int(sys.argv[1]), None
for command in sys.stdin:
    command = command.strip()
    if child is not None and command in ("start", "kill"):
        if child.is_alive():
            os.kill(child.pid, signal.SIGKILL)  # as a crash or kill -9 would: no shutdown of its own
        child.join(10)
        child = None
    if command == "start":
        child = DaphneProcess("127.0.0.1", lambda: application, port=port)
        child.daemon = True
        child.start()
        print("arbor-server", "up" if child.ready.wait(30) else "failed", flush=True)
    elif command == "kill":
        print("arbor-server", "down", flush=True)
    elif command == "quit":
        break
if child is not None:  # told to quit, or the test process went away (stdin closed)
    if child.is_alive():
        os.kill(child.pid, signal.SIGKILL)
    child.join(10)
"""


class _RestartableServer:
    """The project's ASGI app under Daphne on a fixed port, on the test database: `start`, `kill` (SIGKILL, so a
    turn under way is cut where it is), `start` again on the same port."""

    def __init__(self, **env: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.errors = tempfile.TemporaryFile()  # noqa: SIM115 - kept open while the server runs, closed in close()
        self.process = subprocess.Popen(
            [sys.executable, "-c", _RESTARTABLE, str(self.port)],
            cwd=ROOT,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.errors,
            env={
                **os.environ,
                "DATABASE_URL": database_url(),
                "DJANGO_DEBUG": "0",
                "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
                **env,
            },
        )

    def _ask(self, command: str, answer: str) -> None:
        self.process.stdin.write(f"{command}\n")
        self.process.stdin.flush()
        for line in self.process.stdout:
            if line.startswith("arbor-server "):
                if line.split()[1] == answer:
                    return
                break
        self.errors.seek(0)
        raise AssertionError(f"the server did not {command}: {self.errors.read().decode()[-3000:]}")

    def start(self) -> None:
        self._ask("start", "up")

    def kill(self) -> None:
        self._ask("kill", "down")

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.process.communicate("quit\n", timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.errors.close()


def _saved_partial(conversation) -> str:
    node = Node.objects.filter(conversation=conversation, status="pending").first()
    return "".join(item.get("text", "") for item in node.received) if node else ""


def _running(browser) -> bool:
    return browser.execute_script("return document.getElementById('chat').classList.contains('running')")


def test_issue_26_13_after_a_restart_the_open_page_reconnects_and_shows_the_cut_answer_with_retry(
    browser, user, conversation
):
    """Issue 26 (13): the server process is killed mid-answer (as a crash or a restart does) and its call stays
    pending; while the server is down, the worker's sweep marks the call interrupted once its lease has run out. The
    server starts again on the same port: the open page reconnects by itself and redraws from the server at once,
    so the cut answer shows with the text it had and Retry, without a reload. The page used to reconnect silently
    and stay on "the answer goes on and shows here again once reconnected", showing nothing of what changed."""
    server = _RestartableServer(
        ARBOR_TURN_LOCK_SECONDS="1",
        ARBOR_TURN_HEARTBEAT_SECONDS="0.3",
        ARBOR_PARTIAL_SAVE_SECONDS="0.2",
        ARBOR_ECHO_WORD_SECONDS="0.05",
    )
    try:
        server.start()
        site = AsgiServer(url=server.url)
        sign_in(browser, site, user)
        _open(browser, site, conversation)
        browser.execute_script("window.notReloaded = true")
        _send(browser, "#slow " + " ".join(f"w{i}" for i in range(300)))
        wait(browser).until(lambda d: "w5" in _saved_partial(conversation))  # saved on the pending node as it streams

        server.kill()
        wait(browser).until(lambda d: _connected(d) == "0")
        cut = Node.objects.get(conversation=conversation)
        assert cut.status == "pending"
        wait(browser).until(lambda d: recovery.sweep() == [cut.pk])  # the worker, once the dead turn's lease is out
        cut.refresh_from_db()
        assert (cut.status, cut.failure_reason) == ("failed", "interrupted")
        assert not browser.find_elements(By.CSS_SELECTOR, "#message-list .msg.reason-interrupted"), "not shown yet"

        server.start()
        wait(browser).until(lambda d: _connected(d) == "1")
        wait(browser).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#message-list .msg.reason-interrupted"))
        wait(browser).until(lambda d: not _running(d))
        card = browser.find_element(
            By.CSS_SELECTOR, f"#message-list article.msg.error.reason-interrupted[data-node='{cut.pk}']"
        )
        assert card.find_element(By.CSS_SELECTOR, ".body.partial").text.startswith("echo: #slow w0 w1 w2 w3 w4 w5")
        assert "The server stopped while this answer was being written" in card.text
        assert card.find_element(By.CSS_SELECTOR, "button[data-action=retry]").is_displayed()
        assert "goes on" not in _status(browser), _status(browser)
        assert not browser.find_elements(By.CSS_SELECTOR, "#message-list .msg.streaming")
        assert browser.execute_script("return window.notReloaded === true"), "shown without a reload"
        screenshot(browser, "chat-after-restart-retry")
    finally:
        server.close()
