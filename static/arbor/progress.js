// A long write watched as it goes: a form marked data-progress (convert to a playbook, save a version, run one)
// is sent with `Accept: application/x-ndjson`, and the server streams what happens (config.web.progress_response):
// each try, the draft or the answer as it is written, each tool call, then where to go. The work goes on on the
// server if the connection drops; only the watching stops. Without this script the forms post as plain forms.
"use strict";

(() => {
  function panelFor(form) {
    const panel = document.createElement("section");
    panel.className = "progress-panel msg assistant";
    panel.setAttribute("role", "status");
    panel.setAttribute("aria-live", "polite");
    panel.setAttribute("aria-label", form.dataset.progressLabel || "Progress");
    const heading = Object.assign(document.createElement("p"), { className: "progress-step" });
    const text = Object.assign(document.createElement("div"), { className: "body plain progress-text" });
    panel.append(heading, text);
    const into = form.dataset.progress ? document.querySelector(form.dataset.progress) : null;
    if (into) into.append(panel);
    else form.after(panel);
    panel.scrollIntoView({ block: "end" });
    return {
      step(words) {
        heading.textContent = words;
      },
      write(words) {
        text.textContent += words;
        panel.scrollIntoView({ block: "end" });
      },
      newBlock() {
        if (text.textContent) text.textContent += "\n\n";
      },
      remove() {
        panel.remove();
      },
    };
  }

  function show(panel, event) {
    switch (event.type) {
      case "try":
        panel.newBlock();
        panel.step(`Drafting the playbook: try ${event.number} of ${event.of}…`);
        break;
      case "invalid":
        panel.write(`\n\nNot valid yet: ${event.errors.join("; ")}`);
        break;
      case "token":
        panel.write(event.text);
        break;
      case "tool_call":
        panel.step(`Calling ${event.name}…`);
        panel.newBlock();
        break;
      case "tool_result":
        panel.step(`${event.name} ${event.is_error ? "failed" : "answered"}; the model goes on…`);
        panel.newBlock();
        break;
      case "approval_required":
        panel.step("A tool waits for your approval in the run's conversation.");
        break;
      case "done":
        panel.step("Answered.");
        break;
      case "error":
        panel.step(`The run failed: ${event.message || "the model provider failed"}.`);
        break;
      default:
        break;
    }
  }

  async function watch(form, submitter) {
    const panel = panelFor(form);
    panel.step(form.dataset.progressStart || "Working…");
    let response;
    try {
      response = await fetch(form.action || location.href, {
        method: "POST", body: new FormData(form, submitter), headers: { Accept: "application/x-ndjson" },
      });
    } catch (error) {
      panel.step("The connection dropped. What was started goes on on the server; reload to see it.");
      return;
    }
    if (!(response.headers.get("Content-Type") || "").includes("application/x-ndjson")) {
      panel.remove();
      form.dataset.plain = "1";  // refused before anything began: the plain post shows why, as a page does
      HTMLFormElement.prototype.submit.call(form);
      return;
    }
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffered = "";
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffered += value;
        let end;
        while ((end = buffered.indexOf("\n")) >= 0) {
          const event = JSON.parse(buffered.slice(0, end));
          buffered = buffered.slice(end + 1);
          if (event.type === "result") {
            panel.step("Done.");
            location.href = event.url;
            return;
          }
          if (event.type === "refused") {
            panel.step(event.message);
            if (submitter) submitter.disabled = false;
            return;
          }
          show(panel, event);
        }
      }
    } catch (error) {
      panel.step("The connection dropped. What was started goes on on the server; reload to see it.");
      return;
    }
    panel.step("The connection ended early. What was started goes on on the server; reload to see it.");
  }

  document.addEventListener("submit", (event) => {
    const form = event.target.closest("form[data-progress]");
    if (!form || form.dataset.plain || event.defaultPrevented) return;
    event.preventDefault();
    const submitter = event.submitter;
    if (submitter) submitter.disabled = true;
    watch(form, submitter);
  });
})();
