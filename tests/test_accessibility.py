"""Issue 16: axe-core (vendored, tests/support/vendor/) reports no serious or critical violation on any page, in
the light and the dark theme, at desktop and phone width; each page has one <h1>.

Screenshots of the dark pages at 375 px go to var/screenshots/ (dark-phone-<page>.png).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conversations.test_phone_width import pages, phone  # noqa: F401 - the pages fixture
from tests.support.browser import screenshot, sign_in, wait

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

AXE = (Path(__file__).parent / "support" / "vendor" / "axe.min.js").read_text()
RUN_AXE = """
const done = arguments[arguments.length - 1];
axe.run(document, {resultTypes: ['violations']}).then(
  (result) => done(result.violations.filter(v => ['serious', 'critical'].includes(v.impact)).map(v => ({
    id: v.id, impact: v.impact, help: v.help,
    nodes: v.nodes.slice(0, 3).map(n => n.target.join(' ') + ' :: ' + n.failureSummary.replace(/\\s+/g, ' '))}))),
  (error) => done([{id: 'axe-error', help: String(error)}]));
"""


def _violations(browser) -> list[dict]:
    browser.execute_script(AXE)
    return browser.execute_async_script(RUN_AXE)


def _scheme(browser, scheme: str) -> None:
    browser.execute_cdp_cmd("Emulation.setEmulatedMedia",
                            {"features": [{"name": "prefers-color-scheme", "value": scheme}]})


def _check_page(browser, name: str, shot: str | None) -> list[dict]:
    wait(browser).until(lambda d: d.execute_script("return document.readyState") == "complete")
    if name == "chat":  # with the map open too
        browser.find_element("css selector", ".map-toggle").click()
        wait(browser).until(lambda d: d.find_elements("css selector", ".map-mark"))
    if shot:
        screenshot(browser, shot)
    headings = browser.execute_script("return document.querySelectorAll('h1').length")
    problems = _violations(browser)
    if headings != 1:
        problems.append({"id": "one-h1", "help": f"{headings} <h1> on the page"})
    return problems


def _report(found: dict[str, list[dict]]) -> str:
    """Each violation and where, once, so the report stays readable."""
    by_problem: dict[str, set[str]] = {}
    for where, problems in found.items():
        for problem in problems:
            for node in problem.get("nodes") or [problem["help"]]:
                by_problem.setdefault(f"{problem['id']}: {node}", set()).add(where)
    return json.dumps({k: sorted(v) for k, v in by_problem.items()}, indent=1)[:8000]


@pytest.mark.slow
def test_issue_16_axe_finds_no_serious_or_critical_violation_on_any_page(browser, asgi_server, user, pages):  # noqa: F811
    browser.set_script_timeout(60)
    sign_in(browser, asgi_server, user)
    found = {}
    for scheme in ("light", "dark"):
        _scheme(browser, scheme)
        for width in (None, 375):
            if width:
                phone(browser, width)
            else:
                browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
            for name, url in pages.items():
                browser.get(asgi_server.url + url)
                shot = f"dark-phone-{name}" if scheme == "dark" and width else None
                if problems := _check_page(browser, name, shot):
                    found[f"{name} {scheme} {width or 'desktop'}"] = problems
    browser.delete_all_cookies()
    _scheme(browser, "light")
    for url in ("/", "/accounts/login/"):
        browser.get(asgi_server.url + url)
        if problems := _violations(browser):
            found[url] = problems
    assert not found, _report(found)
