"""Issue 16's tree map at 2,000 turns: `python manage.py bench_tree_map`.

Builds one conversation of `--turns` turns (a chain where every 10th question is an edit of the one before: a
branch every 10 turns), then, interleaved and rotated, `--repeat` times:

- the server: `tree_map()` (what GET /api/conversations/{id}/tree/ returns) for it, wall time;
- the browser: headless Chromium opening the map on a page with the chat's CSS and static/arbor/treemap.js, its
  data served from memory (no network in the figure), from the click on "Map" until two animation frames after
  the marks are drawn (layout and paint included).

Prints median and p95 of each in ms against the target (the browser's 300 ms), and deletes what it built.
Needs Debian's chromium and chromium-driver for the browser half (without them it says so and measures the
server only).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from conversations import items as it
from conversations import services
from conversations.jobs.recount import recount
from conversations.models import Bubble, Conversation, Node
from conversations.transfer.plan import _allocate_ids
from conversations.tree_map import tree_map

TITLE = "arbor-bench-tree-map"
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
STATIC = Path(settings.BASE_DIR) / "static" / "arbor"

# The chat page's parts treemap.js reads, with its data served by a stand-in for fetch.
HARNESS = """<!doctype html><html><head><meta charset="utf-8">
<link rel="stylesheet" href="{static}/chat.css"></head><body>
<div class="chat" id="chat" data-tree-url="/tree" data-labelled="0" style="height: 900px">
 <header class="chat-header"><button type="button" class="map-toggle" aria-controls="tree-map">Map</button></header>
 <section id="messages" class="messages"><div id="message-list"></div></section>
 <aside id="tree-map" class="tree-map" hidden><div class="map-head"><h2>Map</h2><p class="map-status"></p>
  <button type="button" class="map-close">Close</button></div><div class="map-canvas"></div>
  <div class="map-current"><form class="map-label"><input name="label"></form>
  <button type="button" class="map-star">Star</button></div></aside>
 <form id="composer" class="composer"></form>
</div>
<script>
window.TREE = null;
window.fetch = async () => new Response(JSON.stringify(window.TREE), {{status: 200}});
</script>
<script src="{static}/treemap.js"></script></body></html>"""

OPEN_AND_WAIT = """
const done = arguments[arguments.length - 1];
window.TREE = arguments[0];
const panel = document.getElementById('tree-map');
const started = performance.now();
document.querySelector('.map-toggle').click();
const drawn = () => new Promise((resolve) => {
  const look = () => panel.querySelectorAll('.map-mark').length === window.TREE.nodes.length
      ? requestAnimationFrame(() => requestAnimationFrame(resolve)) : setTimeout(look, 1);
  look();
});
drawn().then(() => {
  const took = performance.now() - started;
  document.querySelector('.map-close').click();
  done(took);
});
"""


def build(owner, turns: int) -> Conversation:
    conversation = services.conversation_create(owner=owner, title=TITLE)
    ids = _allocate_ids(turns)
    nodes, bubbles, tip, above = [], [], None, None
    for k in range(turns):
        edit = k % 10 == 5 and above is not None
        node = Node(id=next(ids), parent_id=above if edit else tip, conversation=conversation,
                    status=Node.Status.SUCCEEDED, sent=[it.user(f"question {k}: how did revenue change last month?")],
                    received=[it.text(f"answer {k}")], provider="arbor", model="arbor/echo")
        nodes.append(node)
        bubbles += [Bubble(conversation=conversation, node_id=node.id, role="user", content=f"question {k}"),
                    Bubble(conversation=conversation, node_id=node.id, role="assistant", content=f"answer {k}")]
        if not edit:
            above = tip
        tip = node.id
    Node.objects.bulk_create(nodes, batch_size=1000)
    Bubble.objects.bulk_create(bubbles, batch_size=2000)
    recount(conversation, model="arbor/echo")
    services.head_move(conversation=conversation, to=tip)
    conversation.refresh_from_db()
    return conversation


def _browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--window-size=1400,1000",
                "--allow-file-access-from-files"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    driver.set_script_timeout(120)
    return driver


def _summary(values: list[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"median {statistics.median(values):7.1f} ms   p95 {p95:7.1f} ms   (n={len(values)})"


class Command(BaseCommand):
    help = "Benchmark the tree map (issue 16): the server's tree and the browser's drawing at 2,000 turns."

    def add_arguments(self, parser):
        parser.add_argument("--turns", type=int, default=2000)
        parser.add_argument("--repeat", type=int, default=15)

    def handle(self, *args, turns: int, repeat: int, **options):
        owner, _ = get_user_model().objects.get_or_create(username="arbor-bench-tree-map")
        conversation = build(owner, turns)
        browser = _browser() if CHROMIUM.exists() and CHROMEDRIVER.exists() else None
        samples: dict[str, list[float]] = {"server": [], "browser": []}
        try:
            tree = tree_map(conversation)
            with tempfile.TemporaryDirectory(prefix="arbor-bench-map-") as folder:
                page = Path(folder) / "map.html"
                page.write_text(HARNESS.format(static=STATIC.as_uri()))
                if browser:
                    browser.get(page.as_uri())
                    browser.execute_async_script(OPEN_AND_WAIT, tree)  # warm-up

                def server() -> None:
                    began = time.perf_counter()
                    tree_map(conversation)
                    samples["server"].append((time.perf_counter() - began) * 1000)

                def drawing() -> None:
                    if browser:
                        samples["browser"].append(browser.execute_async_script(OPEN_AND_WAIT, tree))

                cases = [server, drawing]
                for round_number in range(repeat):
                    shift = round_number % len(cases)
                    for case in cases[shift:] + cases[:shift]:
                        case()
        finally:
            if browser:
                browser.quit()
            services.conversation_delete(conversation=conversation)
        marks = len(tree["nodes"])
        size = len(json.dumps(tree))
        self.stdout.write(f"== tree map, {turns} turns ({marks} marks, {size // 1024} KiB of JSON), "
                          f"{repeat} rounds interleaved and rotated")
        self.stdout.write(f"server tree_map():            {_summary(samples['server'])}")
        if samples["browser"]:
            verdict = "met" if statistics.median(samples["browser"]) <= 300 else "missed"
            self.stdout.write(f"browser open and draw:        {_summary(samples['browser'])}   target 300 ms "
                              f"[{verdict}]")
        else:
            self.stdout.write("browser open and draw:        not measured (no /usr/bin/chromium and chromedriver)")
