// What every signed-in page shares: the Ctrl-K / Cmd-K palette, the keyboard shortcuts and their ? sheet, the
// sidebar toggle at phone width, the theme button, and a confirmation before a form that destroys something.
"use strict";

(() => {
  const palette = document.getElementById("palette");
  const paletteInput = document.getElementById("palette-input");
  const paletteList = document.getElementById("palette-list");
  const data = document.getElementById("palette-data");
  let entries = [];
  let shown = [];
  let active = 0;

  function collectEntries() {
    const commands = [];
    for (const element of document.querySelectorAll("[data-palette-action]")) {
      const run = () => (element.matches("input, textarea, select") ? element.focus() : element.click());
      commands.push({ label: element.dataset.paletteAction, kind: "command", run });
    }
    commands.push({ label: "Settings", kind: "command", run: () => { location.href = "/settings/"; } });
    const conversations = JSON.parse(data ? data.textContent : "[]").map((item) => (
      { label: item.title, kind: "conversation", run: () => { location.href = item.url; } }
    ));
    return [...commands, ...conversations];
  }

  function render() {
    const typed = paletteInput.value.trim();
    const query = typed.toLowerCase();
    shown = entries.filter((entry) => entry.label.toLowerCase().includes(query)).slice(0, 50);
    if (typed) {
      const url = `/search/?q=${encodeURIComponent(typed)}`;
      shown.push({ label: `Search messages for “${typed}”`, kind: "command", run: () => { location.href = url; } });
      shown.push({ label: `Similar messages to “${typed}”`, kind: "command",
                   run: () => { location.href = `${url}#similar`; } });
    }
    active = Math.min(active, Math.max(0, shown.length - 1));
    paletteList.replaceChildren(...shown.map((entry, index) => {
      const option = document.createElement("li");
      option.id = `palette-option-${index}`;
      option.setAttribute("role", "option");
      option.setAttribute("aria-selected", index === active ? "true" : "false");
      option.textContent = entry.label;
      const kind = document.createElement("span");
      kind.className = "muted";
      kind.textContent = entry.kind === "command" ? " command" : " conversation";
      option.append(kind);
      option.addEventListener("click", () => runEntry(index));
      return option;
    }));
    if (shown.length === 0) {
      const none = document.createElement("li");
      none.className = "muted";
      none.textContent = "Nothing matches.";
      paletteList.append(none);
    }
    paletteInput.setAttribute("aria-activedescendant", shown.length ? `palette-option-${active}` : "");
  }

  function runEntry(index) {
    const entry = shown[index];
    if (!entry) return;
    palette.close();
    entry.run();
  }

  function openPalette() {
    if (!palette || palette.open) return;
    entries = collectEntries();
    paletteInput.value = "";
    active = 0;
    render();
    palette.showModal();
    paletteInput.focus();
  }

  const shortcuts = document.getElementById("shortcuts");
  const typing = (element) => element && (element.isContentEditable || element.matches("input, textarea, select"));

  document.addEventListener("keydown", (event) => {
    const key = event.key.toLowerCase();
    if ((event.ctrlKey || event.metaKey) && !event.shiftKey && key === "k") {
      event.preventDefault();
      openPalette();
    } else if ((event.ctrlKey || event.metaKey) && event.shiftKey && key === "o") {
      event.preventDefault();
      document.querySelector("form button.new-chat")?.closest("form").requestSubmit();
    } else if (event.key === "?" && !typing(event.target) && shortcuts && !document.querySelector("dialog[open]")) {
      event.preventDefault();
      shortcuts.showModal();
    }
  });
  document.querySelector(".palette-open")?.addEventListener("click", openPalette);

  paletteInput?.addEventListener("input", () => { active = 0; render(); });
  paletteInput?.addEventListener("keydown", (event) => {
    if (event.key === "ArrowDown" || event.key === "ArrowUp") {
      event.preventDefault();
      const step = event.key === "ArrowDown" ? 1 : -1;
      active = (active + step + shown.length) % Math.max(1, shown.length);
      render();
      document.getElementById(`palette-option-${active}`)?.scrollIntoView({ block: "nearest" });
    } else if (event.key === "Enter") {
      event.preventDefault();
      runEntry(active);
    }
  });
  palette?.addEventListener("click", (event) => { if (event.target === palette) palette.close(); });

  // A menu that collapses at phone width: its button toggles it open.
  for (const button of document.querySelectorAll("[data-menu-for]")) {
    const menu = document.getElementById(button.dataset.menuFor);
    button.addEventListener("click", () => {
      const open = menu.classList.toggle("open");
      button.setAttribute("aria-expanded", open ? "true" : "false");
    });
  }

  const toggle = document.querySelector(".sidebar-toggle");
  toggle?.addEventListener("click", () => {
    const open = document.body.classList.toggle("sidebar-open");
    toggle.setAttribute("aria-expanded", open ? "true" : "false");
  });

  // The sidebar's filter (chats, playbook runs, API calls) applies as soon as it is picked; without a script its
  // Show button sends it.
  const shows = document.querySelector("form.sidebar-shows");
  if (shows) {
    shows.querySelector(".sidebar-shows-go").hidden = true;
    shows.querySelector("select").addEventListener("change", () => shows.requestSubmit());
  }

  // The theme button switches in place (kept per person on the server), without reloading the page.
  const themeForm = document.querySelector("form.theme-toggle");
  themeForm?.addEventListener("submit", async (event) => {
    event.preventDefault();
    const button = themeForm.querySelector("button[name=theme]");
    const chosen = button.value;
    const response = await fetch(themeForm.action, { method: "POST", body: new FormData(themeForm, button),
                                                     headers: { "X-Fragment": "1" } });
    if (!response.ok) return;
    document.documentElement.dataset.theme = chosen;
    button.value = chosen === "dark" ? "light" : "dark";
    button.setAttribute("aria-label", chosen === "dark" ? "Use the light theme" : "Use the dark theme");
  });

  for (const form of document.querySelectorAll("form[data-confirm]")) {
    form.addEventListener("submit", (event) => {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    });
  }
})();
