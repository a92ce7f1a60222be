"""Issue 29 as a person attaches files: the 📎 button, a pasted image and a dropped file upload at once and wait
as previews (one removed again), the question goes with them, arbor/echo's answer shows what the call got, and
the question's bubble names its files; at 375 px the attach button is there too. Headless Chromium against
Daphne (tests/support/browser.py)."""

from __future__ import annotations

import base64
import tempfile
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from conversations.jobs import worker
from files.models import StoredFile
from tests.files.test_files import png
from tests.support.browser import sign_in, wait

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

# Build a File in the page from base64 bytes and hand it over as the clipboard or a drop would.
_HAND_OVER = """
const [how, name, type, data] = arguments;
const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
const transfer = new DataTransfer();
transfer.items.add(new File([bytes], name, { type }));
if (how === "paste") {
  document.getElementById("composer-input").dispatchEvent(
    new ClipboardEvent("paste", { clipboardData: transfer, bubbles: true, cancelable: true }));
} else {
  document.body.dispatchEvent(new DragEvent("drop", { dataTransfer: transfer, bubbles: true, cancelable: true }));
}
"""


def _uploaded(browser, count: int) -> list[str]:
    """Wait until `count` attachments are uploaded; their file ids."""
    wait(browser).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#attachments li[data-file]")) == count
                        and not d.find_elements(By.CSS_SELECTOR, "#attachments li.uploading"))
    return [e.get_attribute("data-file") for e in browser.find_elements(By.CSS_SELECTOR, "#attachments li")]


def test_issue_29_attach_paste_and_drop_files_then_ask_about_them(browser, asgi_server, user, conversation,
                                                                   settings):
    settings.STORAGES = {**settings.STORAGES, "default": {  # where the server keeps them: the worker reads there
        "BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": asgi_server.files_dir}}}
    sign_in(browser, asgi_server, user)
    browser.get(f"{asgi_server.url}/chat/{conversation.pk}/")
    wait(browser).until(lambda d: d.execute_script("return document.getElementById('chat').dataset.connected"))

    notes = Path(tempfile.mkdtemp()) / "notes.txt"
    notes.write_text("The launch is on Friday.")
    browser.find_element(By.ID, "attach-input").send_keys(str(notes))  # what the 📎 button's picker gives
    _uploaded(browser, 1)
    browser.execute_script(_HAND_OVER, "paste", "dot.png", "image/png", base64.b64encode(png()).decode())
    _uploaded(browser, 2)
    browser.execute_script(_HAND_OVER, "drop", "extra.md", "text/markdown", base64.b64encode(b"# Extra").decode())
    _uploaded(browser, 3)
    assert browser.find_element(By.CSS_SELECTOR, "#attachments img.attachment-preview"), "the image shows"
    browser.find_element(By.CSS_SELECTOR, "#attachments li:last-child .attachment-remove").click()
    ids = _uploaded(browser, 2)
    wait(browser).until(lambda d: not StoredFile.objects.filter(name="extra.md").exists())  # removed: deleted
    worker.run_due()  # R4: the text file is read
    assert set(StoredFile.objects.values_list("status", flat=True)) == {"ready"}

    box = browser.find_element(By.ID, "composer-input")
    box.send_keys("What is in these?" + Keys.ENTER)
    wait(browser).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#message-list article.msg.assistant .body")
                        and not d.find_elements(By.CSS_SELECTOR, ".msg.streaming"))
    text = browser.find_element(By.CSS_SELECTOR, "#message-list article.msg.assistant .body").text
    assert "[file notes.txt: The launch is on Friday.]" in text and "[image dot.png]" in text
    assert "extra.md" not in text, "a removed file does not go"
    names = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#message-list article.msg.user .files li")]
    assert names == ["📄 notes.txt", "🖼 dot.png"]
    assert not browser.find_elements(By.CSS_SELECTOR, "#attachments li"), "the tray empties once the question went"
    assert sorted(ids) == sorted(str(pk) for pk in StoredFile.objects.values_list("pk", flat=True))

    browser.set_window_size(375, 800)
    try:
        attach = browser.find_element(By.ID, "attach")
        assert attach.is_displayed() and attach.rect["x"] + attach.rect["width"] <= 375
    finally:
        browser.set_window_size(1280, 900)
