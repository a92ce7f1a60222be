"""One headless-Chromium check of the staff tree explorer: a branched tree with a compaction node, screenshotted.

Needs Debian's chromium and chromium-driver (/usr/bin/chromium, /usr/bin/chromedriver). Without them the test is
skipped, except under CI (env CI set), where it fails: .ci/run installs them. The screenshot goes to
$ARBOR_SCREENSHOTS (default var/screenshots, outside git) as admin-tree.png, for a person to look at.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from django.urls import reverse
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from conversations import services, turns
from conversations.models import Node
from tests.conversations.helpers import ask, head

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
SCREENSHOTS = Path(os.environ.get("ARBOR_SCREENSHOTS") or Path(__file__).resolve().parents[2] / "var" / "screenshots")
PASSWORD = "pw-browser-12345"


def _browser_missing() -> str | None:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if not missing:
        return None
    return f"{' and '.join(missing)} missing: install Debian's chromium and chromium-driver to run this check"


@pytest.fixture
def browser():
    reason = _browser_missing()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI is set: .ci/run installs them, so this is an error)")
        pytest.skip(reason)
    with tempfile.TemporaryDirectory(prefix="arbor-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--window-size=1400,1000",
                    f"--user-data-dir={profile}"):
            options.add_argument(arg)
        driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
        driver.set_page_load_timeout(60)
        try:
            yield driver
        finally:
            driver.quit()


def _branched_tree_with_compaction(conversation):
    """q1 → q2 → q3, an edit of q2 (a second branch), then a compaction of that head and one turn after it."""
    ask(conversation, "How did revenue change by region last quarter?")
    ask(conversation, "Which region grew fastest?")
    second = head(conversation)
    ask(conversation, "And which one shrank?")
    turns.turn_edit(user=conversation.owner, conversation_id=conversation.pk, node_id=second.pk,
                    content="Which region grew fastest, in percent?").run()
    compacted = head(conversation)
    compaction = Node.objects.create(kind="compaction", status="succeeded", compacted_from=compacted,
                                     conversation=conversation,
                                     sent=[{"type": "system", "text": "Summary: revenue by region, by quarter."}])
    services.head_move(conversation=conversation, to=compaction.pk)
    ask(conversation, "Summarise that in one line.")
    conversation.refresh_from_db()
    return compacted, compaction


@pytest.mark.django_db(transaction=True)
def test_tree_page_in_headless_chromium(browser, live_server, conversation, django_user_model):
    compacted, compaction = _branched_tree_with_compaction(conversation)
    django_user_model.objects.create_superuser(username="browser-admin", password=PASSWORD)

    browser.get(live_server.url + reverse("admin:login"))
    browser.find_element(By.NAME, "username").send_keys("browser-admin")
    browser.find_element(By.NAME, "password").send_keys(PASSWORD)
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    WebDriverWait(browser, 20).until(ec.presence_of_element_located((By.ID, "user-tools")))

    browser.get(live_server.url + reverse("admin:conversations_conversation_change", args=[conversation.pk]))
    table = WebDriverWait(browser, 20).until(ec.visibility_of_element_located((By.ID, "arbor-tree")))
    rows = table.find_elements(By.CSS_SELECTOR, "tbody tr")
    assert len(rows) == Node.objects.filter(conversation=conversation).count()

    marker = browser.find_element(By.CSS_SELECTOR, f"#node-{conversation.head_id} .arbor-badge.head")
    assert marker.is_displayed() and marker.text == "HEAD"
    original = browser.find_element(By.CSS_SELECTOR, f"#node-{compaction.pk} a.compacted-from")
    assert original.is_displayed() and original.text == f"original #{compacted.pk}"
    into = browser.find_element(By.CSS_SELECTOR, f"#node-{compacted.pk} a.compacted-into")
    assert into.is_displayed() and into.text == f"compacted into #{compaction.pk}"
    # the branch: the edited question's node sits one level in, under the fork
    assert browser.find_elements(By.XPATH, "//table[@id='arbor-tree']//td[contains(., '↳')]")

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOTS / "admin-tree.png"
    browser.set_window_size(1400, max(1000, browser.execute_script("return document.body.scrollHeight") + 40))
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 0

    # "Move head here" submits the page's one form (one CSRF token): the head moves back to the compacted node
    browser.find_element(By.CSS_SELECTOR, f"#node-{compacted.pk} button[name=node]").click()
    WebDriverWait(browser, 20).until(ec.text_to_be_present_in_element(
        (By.CSS_SELECTOR, "ul.messagelist"), f"The head moved to node #{compacted.pk}"))
    conversation.refresh_from_db()
    assert conversation.head_id == compacted.pk
