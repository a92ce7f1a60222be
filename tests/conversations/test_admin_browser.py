"""One headless-Chromium check of the staff tree explorer: a branched tree with a compaction node, screenshotted.

The browser and where screenshots go: tests/support/browser.py. This one saves admin-tree.png.
"""

from __future__ import annotations

import pytest
from django.urls import reverse
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from conversations import services
from conversations.models import Node
from conversations.turns.detached import run_here
from conversations.turns.start import turn_edit
from tests.conversations.helpers import ask, head
from tests.support.browser import screenshot

PASSWORD = "pw-browser-12345"


pytestmark = pytest.mark.browser


def _branched_tree_with_compaction(conversation):
    """q1 → q2 → q3, an edit of q2 (a second branch), then a compaction of that head and one turn after it."""
    ask(conversation, "How did revenue change by region last quarter?")
    ask(conversation, "Which region grew fastest?")
    second = head(conversation)
    ask(conversation, "And which one shrank?")
    run_here(turn_edit(user=conversation.owner, conversation_id=conversation.pk, node_id=second.pk,
                    content="Which region grew fastest, in percent?"))
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

    browser.set_window_size(1400, max(1000, browser.execute_script("return document.body.scrollHeight") + 40))
    screenshot(browser, "admin-tree")

    # "Move head here" submits the page's one form (one CSRF token): the head moves back to the compacted node
    browser.find_element(By.CSS_SELECTOR, f"#node-{compacted.pk} button[name=node]").click()
    WebDriverWait(browser, 20).until(ec.text_to_be_present_in_element(
        (By.CSS_SELECTOR, "ul.messagelist"), f"The head moved to node #{compacted.pk}"))
    conversation.refresh_from_db()
    assert conversation.head_id == compacted.pk
