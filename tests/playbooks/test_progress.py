"""Issue 16: converting to a playbook, saving a version and running one report their progress as they go (each
try, the draft or answer as it is written, each tool call), and the pages stream it to a person's browser."""

from __future__ import annotations

import pytest
from selenium.webdriver.common.by import By

from playbooks import services
from playbooks.models import Playbook, PlaybookRun
from tests.playbooks.helpers import sales_conversation
from tests.support.browser import screenshot, sign_in, wait

pytestmark = pytest.mark.django_db


def test_issue_16_p1_a_conversion_reports_each_try_its_draft_and_why_a_draft_was_refused(conversation):
    sales_conversation(conversation, "#draft-invalid 1")
    events: list[dict] = []
    playbook = services.playbook_convert(user=conversation.owner, conversation_id=conversation.pk,
                                         progress=events.append)
    kinds = [e["type"] for e in events]
    assert [e["number"] for e in events if e["type"] == "try"] == [1, 2]
    invalid = kinds.index("invalid")
    assert "token" in kinds[:invalid] and "token" in kinds[invalid:], "each draft streams as it is written"
    assert events[invalid]["errors"]
    second_draft = "".join(e["text"] for e in events[invalid:] if e["type"] == "token")
    assert playbook.definition["name"] in second_draft


def test_issue_16_r1_a_run_reports_the_turns_events_as_they_come(conversation):
    sales_conversation(conversation)
    playbook = services.playbook_convert(user=conversation.owner, conversation_id=conversation.pk)
    events: list[dict] = []
    result = services.playbook_run(user=conversation.owner, playbook_id=playbook.pk, values={"month": "2026-09"},
                                   progress=events.append)
    kinds = [e["type"] for e in events]
    assert result.status == "done" and kinds[-1] == "done", "the turn's own events"
    assert "tool_call" in kinds and "tool_result" in kinds and "token" in kinds
    assert kinds.index("tool_result") < kinds.index("token") < kinds.index("done")
    assert "".join(e["text"] for e in events if e["type"] == "token").strip() == result.answer.strip()


# What the progress panel showed, kept in sessionStorage so it outlives the page's move to the result.
WATCH = """
sessionStorage.setItem('seen', '[]');
const PARTS = '.progress-panel .progress-step, .progress-panel .progress-text';
new MutationObserver((records) => {
  // Every value each part held, in order: the records keep each text node a step wrote, so steps that come in
  // one burst (a fast model) are all seen, not only the last one the callback would find.
  const seen = JSON.parse(sessionStorage.getItem('seen'));
  const note = (text) => { if (text && seen[seen.length - 1] !== text) seen.push(text); };
  for (const record of records) {
    if (record.type === 'characterData') {
      if (record.target.parentElement?.matches(PARTS)) note(record.target.data);
      continue;
    }
    for (const node of record.addedNodes) {
      if (node.nodeType === Node.TEXT_NODE && record.target.matches?.(PARTS)) note(node.data);
      else if (node.nodeType === Node.ELEMENT_NODE) {
        const parts = [node, ...node.querySelectorAll(PARTS)].filter((e) => e.matches(PARTS));
        for (const part of parts) note(part.textContent);
      }
    }
  }
  sessionStorage.setItem('seen', JSON.stringify(seen));
}).observe(document.body, {subtree: true, childList: true, characterData: true});
"""


def _seen(browser) -> list[str]:
    return browser.execute_script("return JSON.parse(sessionStorage.getItem('seen') || '[]')")


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_issue_16_the_pages_show_a_conversion_and_a_run_as_they_go(browser, asgi_server, user, conversation):
    """Convert from the chat: the draft streams in a panel (each try), then the playbook's page opens; run it:
    the answer streams, then the run's page opens. The edit conversation links back and saves from the chat."""
    sales_conversation(conversation, "#draft-invalid 1")
    sign_in(browser, asgi_server, user)
    browser.get(f"{asgi_server.url}/chat/{conversation.pk}/")
    browser.execute_script(WATCH)
    browser.find_element(By.XPATH, "//button[normalize-space()='Convert to playbook']").click()
    wait(browser).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".playbook-page h1"))
    playbook = Playbook.objects.get()
    assert browser.current_url.endswith(f"/playbooks/{playbook.pk}/")
    seen = _seen(browser)
    assert "Drafting the playbook: try 1 of 3…" in seen and "Drafting the playbook: try 2 of 3…" in seen
    assert any("Not valid yet:" in text for text in seen), "why the first draft was refused"
    assert any(playbook.name in text for text in seen), "the draft as it was written"

    browser.get(f"{asgi_server.url}/playbooks/{playbook.pk}/run/")
    browser.execute_script(WATCH)
    browser.find_element(By.XPATH, "//button[normalize-space()='Run']").click()
    wait(browser).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".run-messages .msg.assistant"))
    run = PlaybookRun.objects.get()
    assert browser.current_url.endswith(f"/playbooks/{playbook.pk}/runs/{run.pk}/")
    seen = _seen(browser)
    assert "Calling sql_query…" in seen and any(text.startswith("echo: Run the") for text in seen)

    browser.get(f"{asgi_server.url}/playbooks/{playbook.pk}/")
    browser.find_element(By.XPATH, "//button[normalize-space()='Open edit conversation']").click()
    banner = wait(browser).until(lambda d: d.find_element(By.CSS_SELECTOR, ".editing-playbook"))
    assert playbook.name in banner.text
    assert banner.find_element(By.LINK_TEXT, playbook.name).get_attribute("href").endswith(
        f"/playbooks/{playbook.pk}/")
    screenshot(browser, "playbook-edit-conversation")
    banner.find_element(By.XPATH, ".//button[normalize-space()='Save as a new version']").click()
    wait(browser).until(lambda d: d.current_url.endswith(f"/playbooks/{playbook.pk}/"))
    assert playbook.versions.count() == 2
