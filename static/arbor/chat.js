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

  let socket = null;
  let running = false;   // T9: while a turn runs, nothing that moves the head is offered
  let streaming = null;  // the answer bubble tokens go into
  let gone = false;      // the server closed the socket for good (not ours, or deleted)

  function say(text) {
    status.textContent = text || "";
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

  function connect() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    socket = new WebSocket(`${scheme}//${location.host}${chat.dataset.wsPath}`);
    socket.addEventListener("open", () => { chat.dataset.connected = "1"; });
    socket.addEventListener("message", (message) => onEvent(JSON.parse(message.data)));
    socket.addEventListener("close", (event) => {
      chat.dataset.connected = "0";
      if (event.code === 4404) {
        gone = true;
        setRunning(true);
        say("This conversation is not available any more.");
        return;
      }
      if (running) finish("The connection dropped; the answer goes on and shows here again once reconnected.");
      setTimeout(connect, 1000);
    });
  }

  let unsent = null;  // the question just sent, until the server answers it

  function send(message) {
    if (gone || !socket || socket.readyState !== WebSocket.OPEN) {
      say("Not connected yet; try again in a moment.");
      return false;
    }
    socket.send(JSON.stringify(message));
    return true;
  }

  function onEvent(event) {
    if (event.type === "error" && event.node == null && unsent && !input.value) {
      input.value = unsent;  // refused before anything was written (busy, too many turns): nothing is lost
    }
    unsent = null;
    switch (event.type) {
      case "joined":
        // A turn that runs elsewhere (another tab, before a reload): its answer so far, then live.
        for (const stale of list().querySelectorAll(".msg.streaming")) stale.remove();
        streaming = null;
        setRunning(true);
        say("Answering…");
        break;
      case "token":
        if (!running) setRunning(true);
        if (!streaming) streaming = appendBubble("assistant streaming", "");
        streaming.querySelector(".body").textContent += event.text;
        streaming.dataset.frames = String(Number(streaming.dataset.frames || 0) + 1);
        say("Answering…");
        break;
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
        finish(event.message || "Something went wrong.");
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
    return true;
  }

  function appendBubble(kind, text) {
    const article = document.createElement("article");
    article.className = `msg ${kind}`;
    const body = document.createElement("div");
    body.className = "body plain";
    body.textContent = text;  // text, never HTML: the server sends the rendered version at the end
    article.append(body);
    list().querySelector(".empty-chat")?.remove();
    list().append(article);
    article.scrollIntoView({ block: "end" });
    return article;
  }

  function dropFrom(element) {
    // A new branch replaces what the screen shows from this point on; the old one stays on the server.
    while (element.nextElementSibling) element.nextElementSibling.remove();
    element.remove();
  }

  async function redraw({ unlessStreaming = false } = {}) {
    const response = await fetch(chat.dataset.messagesUrl, { headers: { "X-Fragment": "1" } });
    if (!response.ok) throw new Error(`${response.status}`);
    const html = await response.text();
    if (unlessStreaming && streaming) return true;  // a joined answer streams in meanwhile: keep it
    box.innerHTML = html;
    enhance(box);
    watchEarlier();
    return list().dataset.turnRunning === "1";
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

  async function finish(message) {
    streaming = null;
    let stillRunning = false;
    try {
      stillRunning = await redraw();
    } catch (error) {
      message = `${message} (The page could not reload the messages: reload it.)`.trim();
    }
    setRunning(false);
    if (stillRunning) waitForOtherTurn();
    say(message);
    if (!stillRunning) input.focus();
  }

  async function waitForOtherTurn() {
    // A turn runs on this conversation (another tab, the API, or ours before a reload): the socket joins
    // it and streams its answer here. Until it does, the page redraws now and then, so a turn that ends
    // meanwhile shows too.
    setRunning(true);
    say("A turn is running on this conversation; its answer follows here.");
    while (running && !streaming) {
      await new Promise((resolve) => setTimeout(resolve, 2000));
      if (streaming) return;
      let stillRunning = false;
      try {
        stillRunning = await redraw({ unlessStreaming: true });
      } catch (error) {
        stillRunning = false;
      }
      if (streaming) return;
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
    if (startTurn({ type: "ask", content }, content)) input.value = "";  // kept if it could not be sent
  });

  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      composer.requestSubmit();
    }
  });

  stopButton.addEventListener("click", () => {
    if (send({ type: "stop" })) say("Stopping…");
  });

  box.addEventListener("click", (event) => {
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
        if (!send({ type: "edit", node: Number(button.dataset.node), content })) return;
        dropFrom(article);
        setRunning(true);
        say("Waiting for the model…");
        appendBubble("user", content);
        streaming = appendBubble("assistant streaming", "");
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
      for (const extra of body.querySelectorAll(".copy-code")) extra.remove();
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
    // Code blocks get a copy button.
    for (const pre of root.querySelectorAll(".markdown pre")) {
      if (pre.querySelector(".copy-code")) continue;
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
  box.scrollTop = box.scrollHeight;  // the latest message first; earlier ones load on scrolling up
  watchEarlier();
  connect();
  if (list().dataset.turnRunning === "1") waitForOtherTurn();
})();
