// The chat page. Turns run on the server, reached over one WebSocket; this script only sends what
// the person did and shows what comes back. When a turn ends, the message list is redrawn from the
// server's record (its bubbles, branches and sanitised Markdown), so the page never keeps a second
// copy of the conversation.
"use strict";

(() => {
  const chat = document.getElementById("chat");
  if (!chat) return;

  const box = document.getElementById("messages");
  const input = document.getElementById("composer-input");
  const composer = document.getElementById("composer");
  const sendButton = document.getElementById("send");
  const stopButton = document.getElementById("stop");
  const status = document.getElementById("composer-status");
  const seenDialog = document.getElementById("seen-dialog");
  const seenBody = document.getElementById("seen-body");
  const list = () => document.getElementById("message-list");
  const jumpButton = document.getElementById("jump-latest");
  const draftKey = `arbor.draft.${chat.dataset.conversation}`;

  let socket = null;
  let running = false;   // T9: while a turn runs, nothing that moves the head is offered
  let streaming = null;  // the answer bubble tokens go into
  let gone = false;      // the server closed the socket for good (not ours, or deleted)

  const sentences = JSON.parse(document.getElementById("failure-sentences").textContent);

  function say(text, detail = "") {
    // A plain sentence; a provider's own words, when there are any, behind a "Details" disclosure.
    status.textContent = text || "";
    if (detail && detail !== text) {
      const more = document.createElement("details");
      more.className = "raw";
      const summary = document.createElement("summary");
      summary.textContent = "Details";
      const words = document.createElement("span");
      words.textContent = detail;
      more.append(summary, words);
      status.append(" ", more);
    }
  }

  function plainError(event) {
    // A failed call's reason (T1) has a sentence of its own; a refusal's message is Arbor's and already plain.
    if (event.code in sentences) return [sentences[event.code], event.message];
    return [event.message || sentences.server_error, ""];
  }

  // --- where the view is -------------------------------------------------------------------------------
  // The view follows the newest message (a streaming answer, a finished one, an error and its Retry) while the
  // person is at the bottom; once they scroll up it stays where they are and "Jump to latest" appears.

  let pinned = true;
  let pinnedTop = 0;  // scrollTop when the view was last known to be at the bottom

  function atBottom() {
    return box.scrollHeight - box.scrollTop - box.clientHeight < 80;
  }

  function notePlace() {
    pinned = atBottom();
    if (pinned) pinnedTop = box.scrollTop;
  }

  function toLatest() {
    box.scrollTop = box.scrollHeight;
    notePlace();
    jumpButton.hidden = true;
  }

  function stillPinned() {
    // A scroll up whose "scroll" event has not fired yet (a token or a redraw can come first) still counts: the
    // view is above where it was last at the bottom, and no longer there.
    if (pinned && box.scrollTop < pinnedTop - 1 && !atBottom()) pinned = false;
    return pinned;
  }

  function follow() {
    if (stillPinned()) toLatest();
    else jumpButton.hidden = false;
  }

  box.addEventListener("scroll", () => {
    notePlace();
    if (pinned) jumpButton.hidden = true;
  }, { passive: true });
  jumpButton.addEventListener("click", () => { toLatest(); input.focus(); });

  // --- the person's typed text -----------------------------------------------------------------------------
  // Kept per conversation in this browser until the server has taken it: a reload, a refused send or a dropped
  // connection never loses it.

  function saveDraft() {
    try {
      if (input.value) localStorage.setItem(draftKey, input.value);
      else localStorage.removeItem(draftKey);
    } catch (error) { /* storage off or full: the text is still in the composer */ }
  }

  function giveBack(text) {
    if (!text) return;
    input.value = input.value ? `${text}\n${input.value}` : text;
    saveDraft();
  }

  function setRunning(on) {
    running = on;
    chat.classList.toggle("running", on);
    box.setAttribute("aria-busy", on ? "true" : "false");
    stopButton.hidden = !on;
    sendButton.hidden = on;
    for (const control of document.querySelectorAll("[data-turn-control]")) {
      if (on && !control.disabled) {
        control.disabled = true;
        control.dataset.heldByTurn = "1";
      } else if (!on && control.dataset.heldByTurn) {
        control.disabled = false;
        delete control.dataset.heldByTurn;
      }
    }
  }

  // --- the socket ------------------------------------------------------------------------------------

  let dropped = false;  // the socket closed and is being opened again

  function connect() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    socket = new WebSocket(`${scheme}//${location.host}${chat.dataset.wsPath}`);
    socket.addEventListener("open", () => {
      chat.dataset.connected = "1";
      if (dropped) {
        // Back after a drop (a restart, a network change): show what the server has now, and keep looking while
        // a turn runs or was cut off, so a cut answer appears with its Retry without a reload (issue 26).
        dropped = false;
        if (unanswered !== null) {
          // The message sent just before the drop got no answer: send it again with its id. If the server took
          // it, this shows that turn; if not, it starts now.
          socket.send(JSON.stringify(unanswered));
          say("Reconnected; sending your message again…");
          return;
        }
        finish("Reconnected.");
      }
    });
    socket.addEventListener("message", (message) => onEvent(JSON.parse(message.data)));
    socket.addEventListener("close", (event) => {
      chat.dataset.connected = "0";
      if (event.code === 4404) {
        gone = true;
        setRunning(true);
        say("This conversation is not available any more.");
        return;
      }
      if (event.code === 4401) {
        signedOut();
        return;
      }
      dropped = true;
      if (running) finish("The connection dropped; the answer goes on and shows here again once reconnected.");
      setTimeout(connect, 1000);
    });
  }

  function signedOut() {
    // The session ended (signed out in another tab, issue 26): nothing more can be sent from this page, and it
    // does not reconnect. What was typed is back in the box (the refusal gave it back); the bubbles the page drew
    // for a question the server never took go.
    gone = true;
    streaming = null;
    for (const drawn of list().querySelectorAll("article.msg:not([data-node])")) drawn.remove();
    setRunning(false);
    for (const control of document.querySelectorAll("[data-turn-control], #send")) control.disabled = true;
    say("You are signed out: sign in again to go on.");
    const link = Object.assign(document.createElement("a"), { textContent: "Sign in",
      href: `/accounts/login/?next=${encodeURIComponent(location.pathname)}` });
    status.append(" ", link);
  }

  let unsent = null;  // the question just sent, until the server shows it took it
  // The turn message just sent, with its id, until the server answers it: sent again after a reconnect, and the
  // server starts nothing for an id it has seen (issue 31), so a drop never loses a question nor doubles one.
  let unanswered = null;

  function messageId() {
    return globalThis.crypto?.randomUUID?.() ?? `${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`;
  }

  function send(message) {
    if (gone || !socket || socket.readyState !== WebSocket.OPEN) {
      say("Not connected yet; try again in a moment.");
      return false;
    }
    if (message.type !== "stop") {
      message = { ...message, id: messageId() };
      unanswered = message;
    }
    socket.send(JSON.stringify(message));
    return true;
  }

  function onEvent(event) {
    if (unanswered !== null && event.type !== "joined") unanswered = null;
    if (unsent !== null && event.type === "error" && event.node == null) {
      giveBack(unsent);  // refused before anything was written (an approval waits, another tab's turn): kept
      unsent = null;
    } else if (unsent !== null && event.type !== "joined") {
      unsent = null;  // the turn started: the question is the server's now, and its files
      globalThis.arborAttachments?.clear();
      saveDraft();
    }
    if (event.answers?.length > 1) endedSideBySide = event;  // shown again once the list is redrawn
    switch (event.type) {
      case "joined":
        // A turn that runs elsewhere (another tab, before a reload): its answer so far, then live.
        for (const stale of list().querySelectorAll(".msg.streaming, .side-by-side")) stale.remove();
        streaming = null;
        sides = null;
        setRunning(true);
        say("Answering…");
        break;
      case "token": {
        if (!running) setRunning(true);
        // Several models asked at once (issue 33): each token names its model, and goes to that model's column.
        if (!event.model && !streaming) streaming = appendBubble("assistant streaming", "");
        const bubble = event.model ? sideBubble(event) : streaming;
        grow(bubble, event.text);
        bubble.dataset.frames = String(Number(bubble.dataset.frames || 0) + 1);
        follow();
        say("Answering…");
        break;
      }
      case "tool_call":
        say(`Calling ${event.name}…`);
        streaming = null;  // the next round's tokens get a bubble of their own
        break;
      case "tool_result":
        say(`${event.name} ${event.is_error ? "failed" : "answered"}.`);
        break;
      case "approval_required":
        finish("A tool call waits for your approval.");
        break;
      case "approval_recorded":
        finish("Recorded. Decide the other calls to go on.");
        break;
      case "done":
        finish("");
        break;
      case "stopped":
        finish("Stopped.");
        break;
      case "ended":
        finish("");
        break;
      case "error":
        finish(...plainError(event));
        break;
      default:
        break;
    }
  }

  // --- turns -------------------------------------------------------------------------------------------

  function startTurn(message, question) {
    if (running || !send(message)) return false;
    unsent = question;  // until the server takes it: a refusal gives the text back to the input
    setRunning(true);
    say("Waiting for the model…");
    if (question !== undefined) appendBubble("user", question);
    streaming = appendBubble("assistant streaming", "");
    toLatest();  // the person just acted: show them the answer coming
    return true;
  }

  function bubbleElement(kind, text) {
    const article = document.createElement("article");
    article.className = `msg ${kind}`;
    const body = document.createElement("div");
    body.className = "body plain";
    body.textContent = text;  // text, never HTML: the server sends the rendered version at the end
    article.append(body);
    return article;
  }

  function appendBubble(kind, text) {
    const article = bubbleElement(kind, text);
    list().querySelector(".empty-chat")?.remove();
    list().append(article);
    follow();  // a new round's bubble: followed only if the person is at the bottom
    return article;
  }

  // --- several models at once (issue 33) ---------------------------------------------------------------------
  // Each model's branch streams into a column of its own; once the turn has ended, the columns stay under the
  // redrawn list with a way to go on from any of the answers (a switch, T8: the answers are sibling nodes).

  const alsoAsk = document.getElementById("also-ask");
  let sides = null;  // while a turn of several models streams: {panel, columns: model -> {column, bubble, node}}
  let endedSideBySide = null;  // the ending of such a turn, until its answers are shown

  function answering() {
    return Boolean(streaming || sides);  // an answer (or several side by side) streams into the list
  }

  function chosenModels() {
    // This conversation's model (when ticked) first, since the first goes on by default; none for it alone.
    const ticked = [...(alsoAsk?.querySelectorAll("input[type=checkbox]:checked") ?? [])];
    ticked.sort((a, b) => Number(b.hasAttribute("data-default")) - Number(a.hasAttribute("data-default")));
    return ticked.length === 1 && ticked[0].hasAttribute("data-default") ? [] : ticked.map((box) => box.value);
  }

  function tooManyModels(models) {
    // The server's own limit, said before anything is sent (the typed text stays in the box).
    const most = Number(alsoAsk?.dataset.most || 0);
    if (!most || models.length <= most) return false;
    say(`Ask at most ${most} models at once: untick ${models.length - most}.`);
    return true;
  }

  function countTicked() {
    // The ticks stay when the list is folded away: its title says how many will be asked.
    const ticked = alsoAsk.querySelectorAll("input[type=checkbox]:checked").length;
    alsoAsk.querySelector(".ticked").textContent = ticked > 1 ? ` (${ticked} ticked)` : "";
  }

  if (alsoAsk) {
    alsoAsk.addEventListener("change", countTicked);
    countTicked();
  }

  function sidePanel(label) {
    const panel = document.createElement("div");
    panel.className = "side-by-side";
    panel.setAttribute("role", "group");
    panel.setAttribute("aria-label", label);
    list().append(panel);
    return panel;
  }

  function sideColumn(panel, model) {
    const column = document.createElement("section");
    column.className = "side";
    column.dataset.model = model;
    const title = document.createElement("h3");
    title.textContent = model;
    column.append(title);
    panel.append(column);
    return column;
  }

  function sideBubble(event) {
    if (!sides) {
      streaming?.remove();  // the one answer's placeholder: this turn answers in columns
      streaming = null;
      sides = { panel: sidePanel("Answers side by side, as they come"), columns: new Map() };
    }
    let side = sides.columns.get(event.model);
    if (!side) {
      side = { column: sideColumn(sides.panel, event.model), bubble: null, node: null };
      sides.columns.set(event.model, side);
    }
    if (side.node !== event.node) {  // a model's next round (after its tools ran) is a bubble of its own
      side.bubble = bubbleElement("side-answer streaming", "");  // not an `assistant`: the list's answers are those
      side.column.append(side.bubble);
      side.node = event.node;
    }
    return side.bubble;
  }

  function showAnswers(ending) {
    const panel = sidePanel("The models' answers side by side");
    for (const answer of ending.answers) {
      const column = sideColumn(panel, answer.model);
      const text = answer.answer ?? (answer.error ? `Failed: ${answer.error.message}` : "A tool call waits for approval.");
      column.append(bubbleElement(answer.answer == null ? "side-answer failed" : "side-answer", text));
      if (answer.node == null) continue;
      const chosen = answer.node === (ending.head ?? ending.node);  // waiting for an approval: its node
      column.classList.toggle("chosen", chosen);
      const use = document.createElement("button");
      use.type = "button";
      use.dataset.turnControl = "";
      use.textContent = chosen ? "Going on from this answer" : "Go on from this answer";
      use.setAttribute("aria-pressed", String(chosen));
      use.addEventListener("click", async () => {
        if (!chosen && await switchBranch(answer.node)) say(`Going on from ${answer.model}'s answer.`);
      });
      column.append(use);
    }
    follow();
  }

  // --- an answer as it streams --------------------------------------------------------------------------------
  // Its text so far is rendered by the server's own Markdown renderer and sanitiser (the finished answer's), a few
  // times a second; what came after the last rendering shows as plain text until the next one.

  const csrfToken = document.querySelector("input[name=csrfmiddlewaretoken]")?.value || "";
  const streamed = new WeakMap();  // bubble -> {text, rendered (length), busy, timer}

  function grow(bubble, text) {
    const state = streamed.get(bubble) || { text: "", rendered: 0, busy: false, timer: null };
    streamed.set(bubble, state);
    state.text += text;
    showTail(bubble, state);
    if (!state.busy && !state.timer && state.rendered !== -1) state.timer = setTimeout(() => renderSoFar(bubble), 250);
  }

  function showTail(bubble, state) {
    const body = bubble.querySelector(".body");
    let tail = body.querySelector(".tail");
    if (!tail) {
      body.replaceChildren(Object.assign(document.createElement("div"), { className: "rendered" }),
                           Object.assign(document.createElement("span"), { className: "tail" }));
      tail = body.querySelector(".tail");
    }
    tail.textContent = state.text.slice(Math.max(0, state.rendered));
  }

  async function renderSoFar(bubble) {
    const state = streamed.get(bubble);
    state.timer = null;
    if (!bubble.isConnected) return;
    state.busy = true;
    const text = state.text;
    const started = performance.now();
    try {
      const response = await fetch(chat.dataset.renderUrl, { method: "POST", body: text,
        headers: { "X-CSRFToken": csrfToken, "Content-Type": "text/plain; charset=utf-8" } });
      if (response.status === 413 || response.redirected) {  // too long to render live: plain text from here on
        state.rendered = -1;
        bubble.querySelector(".body .rendered")?.replaceChildren();
        showTail(bubble, state);
        return;
      }
      if (!response.ok || !bubble.isConnected) return;
      const html = await response.text();
      const body = bubble.querySelector(".body");
      body.classList.replace("plain", "markdown");
      body.querySelector(".rendered").innerHTML = html;  // sanitised by the server, as a finished answer is
      state.rendered = text.length;
      enhance(body);
      showTail(bubble, state);
      follow();
    } catch (error) {
      /* the next tokens try again */
    } finally {
      state.busy = false;
      // Twice as long as the last rendering took, at least 250 ms: a long answer is rendered less often.
      const pause = Math.max(250, 2 * (performance.now() - started));
      if (state.rendered !== -1 && state.text.length > state.rendered && bubble.isConnected && !state.timer) {
        state.timer = setTimeout(() => renderSoFar(bubble), pause);
      }
    }
  }

  function dropFrom(element) {
    // A new branch replaces what the screen shows from this point on; the old one stays on the server.
    while (element.nextElementSibling) element.nextElementSibling.remove();
    element.remove();
  }

  let redraws = 0;  // the latest redraw asked for wins: an older one answering late is dropped

  async function redraw({ unlessStreaming = false } = {}) {
    const mine = ++redraws;
    const response = await fetch(chat.dataset.messagesUrl, { headers: { "X-Fragment": "1" } });
    if (!response.ok || response.redirected) throw new Error(`${response.status}`);  // signed out: not a list
    const html = await response.text();
    if (mine !== redraws) return list().dataset.turnRunning === "1";
    if (unlessStreaming && answering()) return true;  // a joined answer streams in meanwhile: keep it
    showList(html);
    return list().dataset.turnRunning === "1";
  }

  function showList(html, anchor = null) {
    // Redrawn from the server's record. At the bottom the view stays at the bottom (the finished answer, an
    // error and its Retry in view); scrolled up, it stays where it was, or keeps `anchor` where it stood.
    const wasPinned = stillPinned();
    const where = anchor ? anchorPlace(anchor) : null;
    const top = box.scrollTop;
    box.innerHTML = html;
    enhance(box);
    watchEarlier();
    const again = where && list().querySelector(where.selector);
    if (again) box.scrollTop += again.getBoundingClientRect().top - box.getBoundingClientRect().top - where.offset;
    else if (wasPinned) toLatest();
    else box.scrollTop = top;
    notePlace();
    jumpButton.hidden = pinned || !running;
    chat.dispatchEvent(new CustomEvent("arbor:redrawn"));
  }

  // --- earlier messages ------------------------------------------------------------------------------------
  // A long conversation opens on its latest part (issue 13). Scrolling up to the top, or the link there, loads
  // the page before it: one page per request, put in above without moving what the person is reading.

  let loadingEarlier = false;

  async function loadEarlier(marker) {
    if (loadingEarlier || !marker.isConnected) return;
    loadingEarlier = true;
    marker.setAttribute("aria-busy", "true");
    try {
      const response = await fetch(marker.dataset.earlier, { headers: { "X-Fragment": "1" } });
      if (!response.ok || response.redirected) throw new Error(`${response.status}`);
      const page = document.createElement("template");
      page.innerHTML = await response.text();
      if (!marker.isConnected) return;  // the list was redrawn meanwhile: its own link loads from there
      const inserted = [...page.content.children];
      const fromBottom = box.scrollHeight - box.scrollTop;
      marker.replaceWith(page.content);
      box.scrollTop = box.scrollHeight - fromBottom;
      for (const element of inserted) {
        enhance(element);
        if (running) {
          for (const control of element.querySelectorAll("[data-turn-control]:not([disabled])")) {
            control.disabled = true;
            control.dataset.heldByTurn = "1";
          }
        }
      }
    } catch (error) {
      marker.removeAttribute("aria-busy");
      say("The earlier messages could not be loaded; try the link again.");
      return;
    } finally {
      loadingEarlier = false;
    }
    watchEarlier();
  }

  const earlierWatch = "IntersectionObserver" in window
    ? new IntersectionObserver((entries) => {
      for (const entry of entries) if (entry.isIntersecting) loadEarlier(entry.target);
    }, { root: box, rootMargin: "300px 0px 0px 0px" })
    : null;

  function watchEarlier() {
    if (!earlierWatch) return;
    earlierWatch.disconnect();
    const marker = list().querySelector("[data-earlier]");
    if (marker) earlierWatch.observe(marker);
  }

  async function finish(message, detail = "") {
    streaming = null;
    sides = null;
    const sideBySide = endedSideBySide;
    endedSideBySide = null;
    let stillRunning = false;
    try {
      stillRunning = await redraw();
    } catch (error) {
      message = `${message} (The page could not reload the messages: reload it.)`.trim();
    }
    if (gone) return;  // signed out or gone meanwhile: the page says so, and stays so
    setRunning(false);
    if (sideBySide) showAnswers(sideBySide);
    if (stillRunning) waitForOtherTurn();
    say(message, detail);
    offerOverflowedQuestion();
    if (!stillRunning) input.focus();
    watchTitle();
  }

  // --- a new chat's title -------------------------------------------------------------------------------------
  // The worker names a new conversation after its first answer (a side call, R4); the page picks the name up
  // without a reload: the title box, the window's title and the sidebar.

  const titleInput = document.getElementById("title-input");
  let titleWatch = null;

  function watchTitle() {
    if (titleWatch || titleInput.value || document.activeElement === titleInput) return;
    let tries = 0;
    titleWatch = setInterval(async () => {
      tries += 1;
      if (tries > 40 || titleInput.value || document.activeElement === titleInput) {
        clearInterval(titleWatch);
        titleWatch = null;
        return;
      }
      try {
        const response = await fetch(chat.dataset.apiUrl, { headers: { Accept: "application/json" } });
        const title = response.ok ? (await response.json()).title : "";
        if (!title || titleInput.value || document.activeElement === titleInput) return;
        titleInput.value = title;
        document.title = `${title} · Arbor`;
        const entry = document.querySelector("#sidebar a[aria-current=page]");
        if (entry) entry.textContent = title;
      } catch (error) { /* the next look may find it */ }
    }, 1500);
  }

  let askedHere = null;  // the last question sent from this page

  function offerOverflowedQuestion() {
    // F2: a question too long for the model's input is kept off the path; it comes back to the composer to
    // be shortened (the card shows it too, marked as not sent).
    const card = list().querySelector(".msg.error[data-question]");
    if (card && askedHere !== null && card.dataset.question === askedHere && !input.value) giveBack(askedHere);
    askedHere = null;
  }

  async function waitForOtherTurn() {
    // A turn runs on this conversation (another tab, the API, or ours before a reload): the socket joins
    // it and streams its answer here. Until it does, the page redraws now and then, so a turn that ends
    // meanwhile shows too.
    setRunning(true);
    say("A turn is running on this conversation; its answer follows here.");
    while (running && !answering()) {
      await new Promise((resolve) => setTimeout(resolve, 2000));
      if (answering()) return;
      let stillRunning = false;
      try {
        stillRunning = await redraw({ unlessStreaming: true });
      } catch (error) {
        stillRunning = false;
      }
      if (answering()) return;
      if (!stillRunning) {
        setRunning(false);
        say("");
      }
    }
  }

  // --- what the person does -----------------------------------------------------------------------------

  composer.addEventListener("submit", (event) => {
    event.preventDefault();
    const content = input.value;
    if (!content.trim() || running) return;
    const files = globalThis.arborAttachments?.ids() ?? [];
    if (files === null) {
      say("A file is still uploading; send when it is done.");
      return;
    }
    const models = chosenModels();
    if (tooManyModels(models)) return;
    const message = { type: "ask", content, ...(files.length ? { files } : {}), ...(models.length ? { models } : {}) };
    if (startTurn(message, content)) {
      askedHere = content;
      input.value = "";  // the draft stays stored until the server takes the question
    }
  });

  input.addEventListener("input", saveDraft);
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      composer.requestSubmit();
    } else if (event.key === "ArrowUp" && !input.value && !running) {
      const edits = list().querySelectorAll("article.msg.user button[data-action=edit]");
      if (edits.length) {
        event.preventDefault();
        edits[edits.length - 1].click();  // the last question, as in other chat apps
      }
    }
  });

  document.addEventListener("keydown", (event) => {
    // Esc stops the answer, from the page or the message box; not while an input method composes a word, nor
    // from another field (the search box clears itself with Esc).
    const field = event.target.closest?.("input, textarea, select, [contenteditable]");
    if (event.isComposing || (field && field !== input)) return;
    if (event.key === "Escape" && running && !stopButton.hidden && !document.querySelector("dialog[open]")) {
      event.preventDefault();
      stopButton.click();
    }
  });

  stopButton.addEventListener("click", () => {
    if (send({ type: "stop" })) say("Stopping…");
  });

  async function switchBranch(node, anchor = null) {
    // T8, through the one head-switching service on the server: the list is redrawn in place (no reload), with
    // `anchor` (the message whose arrow was pressed, and where it is found after the switch) kept where it
    // stood. True when it switched.
    if (running) return false;
    const body = new FormData();
    body.append("node", node);
    body.append("csrfmiddlewaretoken", csrfToken);
    const response = await fetch(chat.dataset.switchUrl, { method: "POST", body, headers: { "X-Fragment": "1" } });
    if (response.redirected) {
      say("You are signed out: reload the page to sign in again.");
      return false;
    }
    if (!response.ok) {
      const plain = (response.headers.get("Content-Type") || "").startsWith("text/plain");
      say((plain && await response.text()) || "That version could not be shown.");
      return false;
    }
    ++redraws;  // a redraw asked for before the switch must not land after it
    showList(await response.text(), anchor);
    if (!anchor) {
      const question = list().querySelector(`article.msg.user[data-node="${node}"]`);
      if (question) question.scrollIntoView({ block: "start" });
      else toLatest();
    }
    return true;
  }

  box.addEventListener("submit", async (event) => {
    // ◀ / ▶ switch versions in place; focus stays on the arrow. The question's step through its edits, the
    // answer's through the regenerations of that question (both name the turn to switch to).
    const form = event.target.closest("form.branch");
    const button = event.submitter;
    if (!form || !button) return;
    event.preventDefault();
    if (running || button.disabled) return;
    const label = button.getAttribute("aria-label");
    const place = form.classList.contains("regenerations") ? turnAnswer : turnQuestion;
    if (!await switchBranch(button.value, { article: form.closest("article"), selector: place(button.value) })) return;
    const target = list().querySelector(place(button.value));
    const same = target?.querySelector(`button[aria-label="${CSS.escape(label)}"]:not([disabled])`);
    (same || target?.querySelector(".branch button:not([disabled])") || input).focus();
  });

  function turnQuestion(node) {
    return `article.msg.user[data-node="${CSS.escape(String(node))}"]`;
  }

  function turnAnswer(node) {
    return `article.msg.assistant[data-turn="${CSS.escape(String(node))}"]`;
  }

  // The tree map (treemap.js) asks for a switch with an event; every redraw tells it to look again.
  chat.addEventListener("arbor:switch", async (event) => {
    const switched = await switchBranch(event.detail.node);
    event.detail.done?.(switched);
  });

  function anchorPlace({ article, selector }) {
    return { selector, offset: article.getBoundingClientRect().top - box.getBoundingClientRect().top };
  }

  box.addEventListener("click", (event) => {
    const reuse = event.target.closest("button[data-action=reuse]");
    if (reuse) {
      const text = reuse.closest("[data-question]").dataset.question;
      if (!input.value.includes(text)) giveBack(text);
      input.focus();
      return;
    }
    const earlier = event.target.closest("[data-earlier] a");
    if (earlier) {
      event.preventDefault();
      loadEarlier(earlier.closest("[data-earlier]"));
      return;
    }
    const button = event.target.closest("button[data-action]");
    if (!button || button.disabled) return;
    const action = actions[button.dataset.action];
    if (action) action(button);
  });

  const actions = {
    edit(button) {
      if (running) return;
      const article = button.closest("article");
      if (article.querySelector("form.edit")) return;
      const body = article.querySelector(".body");
      const form = document.createElement("form");
      form.className = "edit";
      const label = document.createElement("label");
      label.className = "visually-hidden";
      label.textContent = "Edit your question";
      const area = document.createElement("textarea");
      area.value = body.textContent;
      area.rows = Math.min(12, Math.max(2, area.value.split("\n").length));
      area.id = `edit-${button.dataset.node}`;
      label.htmlFor = area.id;
      const save = document.createElement("button");
      save.type = "submit";
      save.className = "primary";
      save.textContent = "Save and send";
      const cancel = document.createElement("button");
      cancel.type = "button";
      cancel.textContent = "Cancel";
      form.append(label, area, save, cancel);
      body.hidden = true;
      body.after(form);
      area.focus();
      cancel.addEventListener("click", () => { form.remove(); body.hidden = false; button.focus(); });
      area.addEventListener("keydown", (keyEvent) => {
        if (keyEvent.key === "Enter" && !keyEvent.shiftKey && !keyEvent.isComposing) {
          keyEvent.preventDefault();
          form.requestSubmit();
        } else if (keyEvent.key === "Escape") {
          cancel.click();
        }
      });
      form.addEventListener("submit", (submitEvent) => {
        submitEvent.preventDefault();
        const content = area.value;
        if (!content.trim() || running) return;
        const models = chosenModels();  // an edited question may be asked of several models too (issue 33)
        if (tooManyModels(models) || !send({ type: "edit", node: Number(button.dataset.node), content, ...(models.length ? { models } : {}) })) return;
        unsent = content;  // a refused edit gives its text to the composer rather than losing it
        dropFrom(article);
        setRunning(true);
        say("Waiting for the model…");
        appendBubble("user", content);
        streaming = appendBubble("assistant streaming", "");
        toLatest();
      });
    },

    regenerate(button) {
      const question = list().querySelector(`article.msg.user[data-node="${button.dataset.node}"]`);
      if (running || !send({ type: "regenerate", node: Number(button.dataset.node) })) return;
      if (question) {
        while (question.nextElementSibling) question.nextElementSibling.remove();
      }
      setRunning(true);
      say("Waiting for the model…");
      streaming = appendBubble("assistant streaming", "");
      toLatest();
    },

    retry() {
      startTurn({ type: "retry" });
    },

    approve(button) {
      startTurn({ type: "approve", tool_call_id: button.dataset.call, approve: button.dataset.approve === "true" });
    },

    async seen(button) {
      seenBody.textContent = "Loading…";
      seenDialog.showModal();
      const response = await fetch(button.dataset.url, { headers: { "X-Fragment": "1" } });
      seenBody.innerHTML = response.ok ? await response.text() : "";
      if (!response.ok) seenBody.textContent = "Could not load what the model saw.";
    },

    copy(button) {
      const body = button.closest("article").querySelector(".body").cloneNode(true);
      for (const extra of body.querySelectorAll(".copy-code, .code-language")) extra.remove();
      copyText(body.textContent.trim(), button);
    },
  };

  function copyText(text, button) {
    const done = () => { button.textContent = "Copied"; setTimeout(() => { button.textContent = button.dataset.label; }, 1500); };
    button.dataset.label = button.dataset.label || button.textContent;
    if (navigator.clipboard) {
      navigator.clipboard.writeText(text).then(done, () => say("The browser did not allow copying."));
    }
  }

  function enhance(root) {
    // Code blocks get their language's name (highlighted on the server) and a copy button.
    for (const pre of root.querySelectorAll(".markdown pre")) {
      if (pre.querySelector(".copy-code")) continue;
      const language = [...(pre.querySelector("code")?.classList || [])].find((name) => name.startsWith("language-"));
      if (language) {
        const label = document.createElement("span");
        label.className = "code-language";
        label.textContent = language.slice("language-".length);
        pre.prepend(label);
      }
      const button = document.createElement("button");
      button.type = "button";
      button.className = "copy-code";
      button.textContent = "Copy code";
      button.setAttribute("aria-label", "Copy this code");
      button.addEventListener("click", () => copyText(pre.querySelector("code")?.innerText || pre.innerText, button));
      pre.prepend(button);
    }
  }

  enhance(box);
  toLatest();  // the latest message first; earlier ones load on scrolling up
  watchEarlier();
  try {
    // A draft the server already took (the page closed before it said so) is the last question on screen.
    const draft = localStorage.getItem(draftKey) || "";
    const questions = list().querySelectorAll("article.msg.user .body");
    const sent = questions.length && questions[questions.length - 1].textContent === draft;
    if (sent) localStorage.removeItem(draftKey);
    else if (!input.value) input.value = draft;
  } catch (error) { /* storage off: nothing was kept */ }
  if (chat.dataset.fresh === "1" || input.value) input.focus();
  connect();
  if (list().dataset.turnRunning === "1") waitForOtherTurn();
})();
