// The tree map: the conversation's whole tree, one mark a turn (GET /api/conversations/{id}/tree/). Each branch
// gets a lane of its own, siblings side by side on one row; the head's path is highlighted. A click on a mark, or
// Enter on it, asks the chat page to switch there (the one head-switching service); arrow keys walk the tree.
// The current branch can be named and starred (PATCH /api/nodes/{id}/). Drawn with one SVG path for every line
// and one button a mark, so a 2,000-turn tree is a few thousand elements.
"use strict";

(() => {
  const chat = document.getElementById("chat");
  const panel = document.getElementById("tree-map");
  if (!chat || !panel) return;

  const toggle = document.querySelector("[aria-controls=tree-map].map-toggle");
  const canvas = panel.querySelector(".map-canvas");
  const status = panel.querySelector(".map-status");
  const labelForm = panel.querySelector("form.map-label");
  const labelInput = labelForm.querySelector("input[name=label]");
  const starButton = panel.querySelector("button.map-star");
  const csrfToken = document.querySelector("input[name=csrfmiddlewaretoken]")?.value || "";
  const storeKey = "arbor.map-open";
  const STEP_X = 26;
  const STEP_Y = 26;
  const SVG = "http://www.w3.org/2000/svg";

  let marks = new Map();   // id -> mark, with children, x, y
  let headMark = null;
  let loaded = false;

  function describe(mark) {
    const parts = [mark.snippet];
    if (mark.label) parts.push(`branch “${mark.label}”`);
    if (mark.starred) parts.push("starred");
    if (mark.kind === "compaction") parts.push("compaction");
    if (mark.kind === "playbook") parts.push("playbook draft");
    if (mark.failure_reason === "cancelled") parts.push("stopped");
    else if (mark.status === "failed") parts.push("failed");
    if (mark.id === headMark) parts.push("current");
    else if (mark.on_path) parts.push("on the current branch");
    return parts.join(", ");
  }

  function layout(nodes) {
    // Rows are depths. The head's path runs straight down one lane (a parent's first child is its child on the
    // path, else its oldest); every other child starts a lane of its own to the right, the leftmost lane free
    // for all the rows its line of first children takes, so a long chat with many edits stays narrow.
    // Marks come parent first (id order), so one pass down and one back up need no recursion.
    marks = new Map(nodes.map((mark) => [mark.id, { ...mark, children: [] }]));
    const all = [...marks.values()];
    for (const mark of all) {
      const parent = mark.parent != null ? marks.get(mark.parent) : null;
      mark.y = parent ? parent.y + 1 : 0;
      if (parent) parent.children.push(mark);
    }
    for (const mark of all) {
      mark.children.sort((a, b) => (b.on_path - a.on_path) || (a.id - b.id));
    }
    for (let i = all.length - 1; i >= 0; i -= 1) {
      all[i].chainEnd = all[i].children.length ? all[i].children[0].chainEnd : all[i].y;
    }
    const busyUntil = [];  // a lane's last row taken
    let rows = 0;
    for (const mark of all) {
      const parent = mark.parent != null ? marks.get(mark.parent) : null;
      if (parent && parent.children[0] === mark) {
        mark.x = parent.x;
      } else {
        let lane = parent ? parent.x + 1 : 0;
        while (busyUntil[lane] !== undefined && busyUntil[lane] >= mark.y) lane += 1;
        mark.x = lane;
        busyUntil[lane] = mark.chainEnd;
      }
      rows = Math.max(rows, mark.y + 1);
    }
    return { lanes: Math.max(busyUntil.length, 1), rows: Math.max(rows, 1) };
  }

  function draw(size) {
    const width = size.lanes * STEP_X + 24;
    const height = size.rows * STEP_Y + 24;
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("width", width);
    svg.setAttribute("height", height);
    svg.setAttribute("aria-hidden", "true");
    let lines = "";
    let pathLines = "";
    for (const mark of marks.values()) {
      const parent = mark.parent != null ? marks.get(mark.parent) : null;
      if (!parent) continue;
      const line = `M${px(parent.x)} ${py(parent.y)}L${px(mark.x)} ${py(mark.y)}`;
      if (mark.on_path && parent.on_path) pathLines += line;
      else lines += line;
    }
    for (const [d, name] of [[lines, "map-line"], [pathLines, "map-line on-path"]]) {
      const path = document.createElementNS(SVG, "path");
      path.setAttribute("d", d);
      path.setAttribute("class", name);
      svg.append(path);
    }
    const list = document.createElement("div");
    list.className = "map-marks";
    list.setAttribute("role", "group");
    list.setAttribute("aria-label", "Turns of this conversation");
    const fragment = document.createDocumentFragment();
    for (const mark of marks.values()) {
      const button = document.createElement("button");
      button.type = "button";
      button.className = markClass(mark);
      button.style.left = `${px(mark.x) - 8}px`;
      button.style.top = `${py(mark.y) - 8}px`;
      button.dataset.mark = mark.id;
      button.tabIndex = mark.id === headMark ? 0 : -1;
      button.title = describe(mark);
      button.setAttribute("aria-label", describe(mark));
      if (mark.id === headMark) button.setAttribute("aria-current", "true");
      if (mark.label) {
        const tag = document.createElement("span");
        tag.className = "map-tag";
        tag.textContent = mark.label;
        button.append(tag);
      }
      fragment.append(button);
    }
    list.append(fragment);
    list.style.width = `${width}px`;
    list.style.height = `${height}px`;
    canvas.replaceChildren(svg, list);
  }

  const px = (x) => 16 + x * STEP_X;
  const py = (y) => 16 + y * STEP_Y;

  function markClass(mark) {
    const names = ["map-mark", `kind-${mark.kind}`];
    if (mark.on_path) names.push("on-path");
    if (mark.id === headMark) names.push("is-head");
    if (mark.failure_reason === "cancelled") names.push("stopped");
    else if (mark.status === "failed") names.push("failed");
    if (mark.starred) names.push("starred");
    return names.join(" ");
  }

  function showCurrent() {
    const mark = marks.get(headMark);
    labelForm.hidden = !mark;
    starButton.hidden = !mark;
    if (!mark) return;
    labelInput.value = mark.label;
    starButton.setAttribute("aria-pressed", mark.starred ? "true" : "false");
    starButton.textContent = mark.starred ? "★ Starred" : "☆ Star";
  }

  function labelsBelow() {
    // Each mark's branch names: the labels of the named marks at or below it, newest first (walked up from each
    // named mark; a conversation has few).
    const below = new Map();
    const named = [...marks.values()].filter((m) => m.label).sort((a, b) => b.id - a.id);
    for (const name of named) {
      for (let m = name; m; m = m.parent != null ? marks.get(m.parent) : null) {
        if (!below.has(m.id)) below.set(m.id, name.label);
      }
    }
    return below;
  }

  function annotateArrows() {
    // The chat's ◀ / ▶ name the branch they lead to, and a fork shows the name of the branch on screen.
    const below = labelsBelow();
    for (const form of document.querySelectorAll("#message-list form.branch")) {
      form.querySelector(".branch-label")?.remove();
      for (const button of form.querySelectorAll("button[name=node]")) {
        const base = button.dataset.baseLabel || button.getAttribute("aria-label");
        button.dataset.baseLabel = base;
        const name = below.get(Number(button.value));
        button.setAttribute("aria-label", name ? `${base}: “${name}”` : base);
        button.title = name ? `“${name}”` : "";
      }
      const article = form.closest("article");
      const here = below.get(Number(article?.dataset.turn || article?.dataset.node));
      if (here) {
        const tag = Object.assign(document.createElement("span"), { className: "branch-label", textContent: here });
        form.querySelector(".branch-index").after(tag);
      }
    }
  }

  async function load() {
    status.textContent = "Loading the map…";
    const response = await fetch(chat.dataset.treeUrl, { headers: { Accept: "application/json" } });
    if (!response.ok) {
      status.textContent = "The map could not be loaded.";
      return;
    }
    const tree = await response.json();
    headMark = tree.head;
    if (panel.hidden) {  // only the arrows' names were wanted
      layout(tree.nodes);
      annotateArrows();
      return;
    }
    // A redraw replaces the marks: a person walking the map with the keyboard keeps focus on the mark they were
    // on (a switch redraws it; issue 26), or on the head when that mark is gone.
    const focused = canvas.contains(document.activeElement) ? document.activeElement.dataset.mark : null;
    const started = performance.now();
    draw(layout(tree.nodes));
    if (focused) {
      const again = canvas.querySelector(`button[data-mark="${CSS.escape(focused)}"]`)
        || canvas.querySelector("[tabindex='0']");
      canvas.querySelector("[tabindex='0']")?.setAttribute("tabindex", "-1");
      again?.setAttribute("tabindex", "0");
      again?.focus();
    }
    annotateArrows();
    panel.dataset.drawMs = String(Math.round(performance.now() - started));
    status.textContent = `${tree.nodes.length} turn${tree.nodes.length === 1 ? "" : "s"}`;
    loaded = true;
    showCurrent();
    canvas.querySelector(".is-head")?.scrollIntoView({ block: "center", inline: "center" });
  }

  function setOpen(open, { focus = false } = {}) {
    panel.hidden = !open;
    toggle.setAttribute("aria-expanded", open ? "true" : "false");
    document.body.classList.toggle("map-open", open);
    try { localStorage.setItem(storeKey, open ? "1" : ""); } catch (error) { /* not kept */ }
    if (open) {
      load().then(() => { if (focus) canvas.querySelector("[tabindex='0']")?.focus(); });
    } else if (focus) {
      toggle.focus();
    }
  }

  async function switchTo(id) {
    const done = await new Promise((resolve) => {
      chat.dispatchEvent(new CustomEvent("arbor:switch", { detail: { node: id, done: resolve } }));
    });
    if (done && matchMedia("(max-width: 700px)").matches) setOpen(false);  // the phone's sheet makes room again
  }

  function neighbour(mark, key) {
    const parent = mark.parent != null ? marks.get(mark.parent) : null;
    const siblings = parent ? parent.children : [...marks.values()].filter((m) => m.parent == null);
    const index = siblings.indexOf(mark);
    if (key === "ArrowUp") return parent;
    if (key === "ArrowDown") return mark.children.find((m) => m.on_path) || mark.children[0];
    if (key === "ArrowLeft") return siblings[index - 1];
    if (key === "ArrowRight") return siblings[index + 1];
    if (key === "Home") return marks.values().next().value;
    if (key === "End") return marks.get(headMark);
    return null;
  }

  canvas.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-mark]");
    if (button) switchTo(Number(button.dataset.mark));
  });

  canvas.addEventListener("keydown", (event) => {
    const button = event.target.closest("button[data-mark]");
    if (!button) return;
    const next = neighbour(marks.get(Number(button.dataset.mark)), event.key);
    if (next === null) return;
    event.preventDefault();
    if (!next) return;
    const target = canvas.querySelector(`button[data-mark="${next.id}"]`);
    button.tabIndex = -1;
    target.tabIndex = 0;
    target.focus();
  });

  async function mark(fields) {
    const current = marks.get(headMark);
    if (!current) return false;
    const response = await fetch(`/api/nodes/${current.id}/`, {
      method: "PATCH", body: JSON.stringify(fields),
      headers: { "Content-Type": "application/json", "X-CSRFToken": csrfToken, Accept: "application/json" },
    });
    if (!response.ok) {
      const problem = await response.json().catch(() => ({}));
      status.textContent = problem.error?.message || "That could not be saved.";
      return false;
    }
    chat.dataset.labelled = "1";
    await load();
    return true;
  }

  labelForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (await mark({ label: labelInput.value.trim() })) status.textContent = "Branch named.";
  });
  starButton.addEventListener("click", async () => {
    const current = marks.get(headMark);
    if (current && await mark({ starred: !current.starred })) {
      status.textContent = current.starred ? "Star removed." : "Starred: the conversation opens on this branch.";
    }
  });

  toggle.addEventListener("click", () => setOpen(panel.hidden, { focus: true }));
  panel.querySelector(".map-close").addEventListener("click", () => setOpen(false, { focus: true }));
  panel.addEventListener("keydown", (event) => {
    if (event.key === "Escape") {
      event.stopPropagation();
      setOpen(false, { focus: true });
    }
  });
  chat.addEventListener("arbor:redrawn", () => {
    if ((!panel.hidden && loaded) || chat.dataset.labelled === "1") load();
  });

  // A mark hovered or focused says what it is in the panel's status line, as its tooltip does.
  for (const kind of ["mouseover", "focusin"]) {
    canvas.addEventListener(kind, (event) => {
      const button = event.target.closest("button[data-mark]");
      if (button) status.textContent = describe(marks.get(Number(button.dataset.mark)));
    });
  }

  let keptOpen = false;
  try { keptOpen = localStorage.getItem(storeKey) === "1"; } catch (error) { /* not kept */ }
  if (keptOpen && !matchMedia("(max-width: 700px)").matches) setOpen(true);
  else if (chat.dataset.labelled === "1") load();
})();
