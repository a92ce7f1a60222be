"""Headless Chromium and a real ASGI server (Daphne, WebSockets included) for end-to-end page tests.

Needs Debian's chromium and chromium-driver (/usr/bin/chromium, /usr/bin/chromedriver). Without them the
browser tests are skipped, except under CI (env CI set), where they fail: .ci/run installs them.
Screenshots go to $ARBOR_SCREENSHOTS (default var/screenshots, outside git) for a person to look at.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from daphne.testing import DaphneProcess
from django.conf import settings
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
SCREENSHOTS = Path(os.environ.get("ARBOR_SCREENSHOTS") or Path(__file__).resolve().parents[2] / "var" / "screenshots")


def _browser_missing() -> str | None:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if not missing:
        return None
    return f"{' and '.join(missing)} missing: install Debian's chromium and chromium-driver to run this check"


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
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


WAIT = 30


def wait(driver: webdriver.Chrome) -> WebDriverWait:
    """A wait that looks again when the page redraws an element between finding it and reading it."""
    return WebDriverWait(driver, WAIT, ignored_exceptions=(StaleElementReferenceException,))


def screenshot(driver: webdriver.Chrome, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOTS / f"{name}.png"
    assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 0
    return shot


# What the live server offers: two offline models, so its pages offer asking several at once (issue 33)
SERVER_MODELS = ["arbor/echo", "arbor/echo-2"]


@dataclass(frozen=True)
class AsgiServer:
    url: str
    files_dir: str = ""  # where the server keeps uploaded files (issue 29): a test's worker reads them there


def sign_in(browser: webdriver.Chrome, server: AsgiServer, user) -> None:
    """Give the browser a session for `user` (the sign-in form itself is tested once, in the chat tests)."""
    from django.test import Client

    client = Client()
    client.force_login(user)
    browser.get(server.url + "/accounts/login/")
    browser.add_cookie({"name": "sessionid", "value": client.cookies["sessionid"].value, "path": "/"})


def _application(overrides: dict):
    """Build the app in the server process, on the test database (runs there, after a spawn)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.conf import settings

    for name, value in overrides.items():
        setattr(settings, name, value)
    from config.asgi import application

    return application


class _SpawnedDaphne(DaphneProcess):
    """Daphne in a fresh interpreter. A fork would copy this process's thread pools without their threads
    (asgiref's executors, after an async test), and the server would hang on its first database call."""

    _start_method = "spawn"
    _Popen = staticmethod(multiprocessing.context.SpawnProcess._Popen)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        spawn = multiprocessing.get_context("spawn")  # what it shares with the child must be made for a spawn
        self.port = spawn.Value("i", 0)
        self.ready = spawn.Event()
        self.errors = spawn.Queue()


@pytest.fixture(scope="session")
def asgi_server(django_db_setup) -> Iterator[AsgiServer]:
    """The project's ASGI application under Daphne in its own process, on the test database.

    Session-scoped: one server for every browser test. Tests that use it need `transaction=True`, so what
    they write is committed where the server can read it.
    """
    with serving() as server:
        yield server


@contextlib.contextmanager
def serving(**more: object) -> Iterator[AsgiServer]:
    """A server as `asgi_server` starts it, with more settings of its own (a module's fixture: issue 32's MCP
    servers, which the shared server must not offer to every other test)."""
    database = {**settings.DATABASES["default"]}
    files_dir = tempfile.mkdtemp(prefix="arbor-browser-files-")
    storages = {**settings.STORAGES, "default": {"BACKEND": "django.core.files.storage.FileSystemStorage",
                                                 "OPTIONS": {"location": files_dir}}}
    overrides = {"DATABASES": {"default": database}, "ALLOWED_HOSTS": ["127.0.0.1", "localhost"],
                 "ARBOR_MODELS": SERVER_MODELS,
                 "STORAGES": storages, **more}
    process = _SpawnedDaphne(host="127.0.0.1", get_application=functools.partial(_application, overrides))
    process.daemon = True
    process.start()
    if not process.ready.wait(120):
        error = "" if process.errors.empty() else process.errors.get(False)[1]
        process.terminate()
        raise RuntimeError(f"Daphne did not start: {error}")
    try:
        yield AsgiServer(url=f"http://127.0.0.1:{process.port.value}", files_dir=files_dir)
    finally:
        process.terminate()
        process.join(10)
