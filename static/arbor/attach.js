// The composer's files (issue 29): an attach button, dropping files on the page and pasting an image each
// upload at once to /api/files/ (with progress), then wait as a preview with a remove button until the question
// goes. chat.js asks `arborAttachments.ids()` when it sends, and `clear()` once the server has the question;
// a refused question keeps its files, as it keeps its text.
"use strict";

(() => {
  const tray = document.getElementById("attachments");
  const picker = document.getElementById("attach-input");
  const button = document.getElementById("attach");
  const composer = document.getElementById("composer");
  if (!tray || !picker || !button || !composer) return;
  const csrfToken = document.querySelector("input[name=csrfmiddlewaretoken]")?.value || "";
  const files = [];  // {id, name, status, element}

  function card(name) {
    const element = document.createElement("li");
    element.className = "attachment uploading";
    const label = document.createElement("span");
    label.className = "attachment-name";
    label.textContent = name;
    const progress = document.createElement("progress");
    progress.max = 100;
    progress.value = 0;
    progress.setAttribute("aria-label", `Uploading ${name}`);
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "attachment-remove";
    remove.textContent = "×";
    remove.setAttribute("aria-label", `Remove ${name}`);
    element.append(label, progress, remove);
    tray.append(element);
    tray.hidden = false;
    return { element, label, progress, remove };
  }

  function forget(entry) {
    const index = files.indexOf(entry);
    if (index >= 0) files.splice(index, 1);
    entry.element.remove();
    tray.hidden = files.length === 0;
  }

  function preview(entry, file) {
    if (!file.type.startsWith("image/")) return;
    const image = document.createElement("img");
    image.alt = "";
    image.className = "attachment-preview";
    image.src = URL.createObjectURL(file);
    image.addEventListener("load", () => URL.revokeObjectURL(image.src), { once: true });
    entry.element.prepend(image);
  }

  function upload(file) {
    const parts = card(file.name || "pasted image");
    const entry = { id: null, name: file.name, status: "uploading", element: parts.element };
    files.push(entry);
    preview(entry, file);
    const request = new XMLHttpRequest();
    parts.remove.addEventListener("click", () => {
      if (entry.status === "uploading") request.abort();
      if (entry.id !== null) {  // uploaded and never sent: it goes from the person's files too
        fetch(`/api/files/${entry.id}/`, { method: "DELETE", headers: { "X-CSRFToken": csrfToken } });
      }
      forget(entry);
    });
    request.upload.addEventListener("progress", (event) => {
      if (event.lengthComputable) parts.progress.value = Math.round((event.loaded / event.total) * 100);
    });
    request.addEventListener("load", () => {
      let body = {};
      try { body = JSON.parse(request.responseText); } catch (error) { /* not JSON: said below */ }
      if (request.status === 201) {
        entry.id = body.id;
        entry.status = body.status;
        parts.element.classList.remove("uploading");
        parts.progress.remove();
        parts.element.dataset.file = String(body.id);
      } else {
        entry.status = "failed";
        parts.element.classList.add("failed");
        parts.progress.remove();
        parts.label.textContent = `${file.name}: ${body.error?.message || "could not be uploaded"}`;
      }
    });
    request.addEventListener("error", () => {
      entry.status = "failed";
      parts.label.textContent = `${file.name}: the upload failed; remove it and try again`;
    });
    request.open("POST", "/api/files/");
    request.setRequestHeader("X-CSRFToken", csrfToken);
    const form = new FormData();
    form.append("file", file, file.name || "pasted.png");
    request.send(form);
  }

  button.addEventListener("click", () => picker.click());
  picker.addEventListener("change", () => {
    for (const file of picker.files) upload(file);
    picker.value = "";
  });
  document.addEventListener("dragover", (event) => {
    if (event.dataTransfer?.types.includes("Files")) event.preventDefault();
  });
  document.addEventListener("drop", (event) => {
    if (!event.dataTransfer?.files.length) return;
    event.preventDefault();
    for (const file of event.dataTransfer.files) upload(file);
  });
  document.getElementById("composer-input")?.addEventListener("paste", (event) => {
    const pasted = [...(event.clipboardData?.files || [])];
    if (!pasted.length) return;  // text pastes as text
    event.preventDefault();
    for (const file of pasted) upload(file);
  });

  globalThis.arborAttachments = {
    // The uploaded files' ids; null while one is still uploading (the question waits for it).
    ids() {
      if (files.some((entry) => entry.status === "uploading")) return null;
      return files.filter((entry) => entry.id !== null && entry.status !== "failed").map((entry) => entry.id);
    },
    clear() {
      for (const entry of [...files]) forget(entry);
    },
  };
})();
