"""Issue 16: every page at phone width (360, 375 and 414 px CSS, set through the DevTools protocol as a phone's
viewport: a headless window cannot be narrower than 500 px), with no horizontal scroll, and every action reachable.

Screenshots (var/screenshots/): phone-<page>.png at 375 px, phone-chat-menu.png, phone-sidebar-menu.png.
"""

from __future__ import annotations

import json

import pytest
from selenium.webdriver.common.by import By

from conversations import services
from conversations.models import Node
from conversations.turns.detached import run_here
from conversations.turns.start import turn_edit
from playbooks import services as playbook_services
from tests.conversations.helpers import ask
from tests.playbooks.helpers import sales_conversation
from tests.support.browser import screenshot, sign_in, wait

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

WIDTHS = (360, 375, 414)


def phone(browser, width: int = 375, height: int = 740) -> None:
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": width, "height": height, "deviceScaleFactor": 2, "mobile": True})


def _overflow(browser) -> dict:
    """How far the page is wider than the viewport, and the elements sticking out past its right edge."""
    return browser.execute_script("""
        const width = document.documentElement.clientWidth;
        const out = [...document.querySelectorAll('body *')].filter(e => {
            const r = e.getBoundingClientRect();
            return r.width && r.height && r.right > width + 1 && getComputedStyle(e).visibility !== 'hidden';
        }).slice(0, 8).map(e => `${e.tagName.toLowerCase()}.${e.className}#${e.id} right=${
            Math.round(e.getBoundingClientRect().right)}`);
        return {extra: document.documentElement.scrollWidth - width, out};
    """)


def _in_view(browser, element) -> bool:
    return browser.execute_script("""
        const r = arguments[0].getBoundingClientRect();
        return r.width > 0 && r.height > 0 && r.left >= 0 && r.right <= document.documentElement.clientWidth + 1
            && r.top >= 0 && r.bottom <= innerHeight + 1;""", element)


@pytest.fixture
def pages(user, conversation):
    """One of each page, with what stretches a page: a long word, a long code line, a tool's JSON, a failure."""
    long_word = "https://example.com/" + "a-very-long-path-segment/" * 8
    ask(conversation, f"Read {long_word} please, and this:\n```python\nprint('{'x' * 200}')\n```")
    ask(conversation, '#tool sql_query {"sql": "select count(*) as n from customers where name like \'%' + 'z' * 80
        + '%\'"}')
    ask(conversation, "#fail")
    first = Node.objects.filter(conversation=conversation).order_by("id").first()
    run_here(turn_edit(user=user, conversation_id=conversation.pk, node_id=first.pk,
                       content="An edited first question"))
    sales = services.conversation_create(owner=user, title="Sales")
    sales_conversation(sales)
    playbook = playbook_services.playbook_convert(user=user, conversation_id=sales.pk)
    run = playbook_services.playbook_run(user=user, playbook_id=playbook.pk, values={"month": "2026-09"})
    second = Node.objects.filter(conversation=conversation, parent=None).order_by("id")
    project = services.project_create(owner=user, name="Launch plans for the autumn season", instructions="Be brief.")
    services.conversation_update(conversation=sales, project=project)
    return {
        "projects": "/projects/",
        "project": f"/projects/{project.pk}/",
        "chat": f"/chat/{conversation.pk}/",
        "compare": f"/chat/{conversation.pk}/compare/?a={second[0].pk}&b={second[1].pk}",
        "seen": f"/chat/nodes/{first.pk}/seen/",
        "import": "/chat/import/",
        "settings": "/settings/",
        "search": "/search/?q=question",
        "playbooks": "/playbooks/",
        "playbook": f"/playbooks/{playbook.pk}/",
        "playbook-run-form": f"/playbooks/{playbook.pk}/run/",
        "playbook-run": f"/playbooks/{playbook.pk}/runs/{run.run.pk}/",
    }


def test_issue_16_every_page_fits_a_phone_with_no_horizontal_scroll(browser, asgi_server, user, pages):
    sign_in(browser, asgi_server, user)
    problems = {}
    for width in WIDTHS:
        phone(browser, width)
        for name, url in pages.items():
            browser.get(asgi_server.url + url)
            wait(browser).until(lambda d: d.execute_script("return document.readyState") == "complete")
            found = _overflow(browser)
            if found["extra"] > 0:
                problems[f"{name}@{width}"] = found
            if width == 375:
                screenshot(browser, f"phone-{name}")
    browser.delete_all_cookies()
    for width in WIDTHS:
        phone(browser, width)
        for name, url in {"home": "/", "login": "/accounts/login/"}.items():
            browser.get(asgi_server.url + url)
            found = _overflow(browser)
            if found["extra"] > 0:
                problems[f"{name}@{width}"] = found
    assert not problems, json.dumps(problems, indent=1)


def test_issue_16_at_375_px_send_and_every_action_are_reachable_and_the_header_is_one_row(
        browser, asgi_server, user, pages):
    sign_in(browser, asgi_server, user)
    phone(browser)
    browser.get(asgi_server.url + pages["chat"])
    send = wait(browser).until(lambda d: d.find_element(By.ID, "send"))
    assert _in_view(browser, send), "Send is on screen"
    header = browser.find_element(By.CSS_SELECTOR, ".chat-header")
    assert header.size["height"] <= 64, f"the chat header is one row, not {header.size['height']} px"

    browser.find_element(By.CSS_SELECTOR, ".chat-menu-toggle").click()
    for name in ("Compact", "Convert to playbook", "Clear", "Delete"):
        button = browser.find_element(By.XPATH, f"//div[@id='chat-tools']//button[normalize-space()='{name}']")
        assert _in_view(browser, button), f"{name} is reachable"
    assert _in_view(browser, browser.find_element(By.ID, "model-select"))
    assert _in_view(browser, browser.find_element(By.CSS_SELECTOR, "#chat-tools .export summary"))
    screenshot(browser, "phone-chat-menu")
    browser.find_element(By.CSS_SELECTOR, ".chat-menu-toggle").click()

    small = [(b.get_attribute("aria-label") or b.text, b.size) for b in
             browser.find_elements(By.CSS_SELECTOR, ".msg .controls button") if b.is_displayed()
             and (b.size["height"] < 44 or b.size["width"] < 44)]
    assert not small, f"issue 26: every message control is a 44 px touch target: {small[:5]}"

    browser.find_element(By.CSS_SELECTOR, ".sidebar-toggle").click()
    for tag, name in (("a", "Playbooks"), ("a", "Settings"), ("button", "Log out")):
        link = browser.find_element(By.XPATH, f"//nav[@id='sidebar']//{tag}[normalize-space()='{name}']")
        assert _in_view(browser, link), f"{name} is in the ☰ menu"
    assert _in_view(browser, browser.find_element(By.CSS_SELECTOR, "#sidebar .new-chat"))
    screenshot(browser, "phone-sidebar-menu")
