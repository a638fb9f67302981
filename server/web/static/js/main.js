// The page's entry: the key prompt when the server asks for one, the tabs, and each view's start.

import { ApiError, apiKey, getJson, setApiKey } from "./api.js";
import { $ } from "./dom.js";
import { startChat } from "./chat.js";
import { EngineView } from "./engine_view.js";
import { BatchesView } from "./batches.js";

const views = {};

function showKeyPrompt(message) {
  $("app").hidden = true;
  $("key-prompt").hidden = false;
  $("key-error").textContent = message;
  $("key-input").focus();
}

function selectTab(tab) {
  for (const other of document.querySelectorAll('[role="tab"]')) {
    const selected = other === tab;
    other.setAttribute("aria-selected", String(selected));
    other.tabIndex = selected ? 0 : -1;
    $(other.getAttribute("aria-controls")).hidden = !selected;
  }
  // Live views poll or stream only while they are shown.
  for (const [id, view] of Object.entries(views)) {
    if (id === tab.id) view.show();
    else view.hide();
  }
}

function setupTabs() {
  const tabs = [...document.querySelectorAll('[role="tab"]')];
  tabs.forEach((tab, i) => {
    tab.addEventListener("click", () => selectTab(tab));
    tab.addEventListener("keydown", (event) => {
      const step = { ArrowRight: 1, ArrowLeft: -1 }[event.key];
      if (!step) return;
      const next = tabs[(i + step + tabs.length) % tabs.length];
      next.focus();
      selectTab(next);
    });
  });
}

async function start() {
  let models;
  try {
    models = await getJson("/v1/models");
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) {
      showKeyPrompt(apiKey() ? "That key was not accepted." : "");
      return;
    }
    if (err instanceof ApiError && err.status === 503) {
      $("model-name").textContent = err.message;
      setTimeout(start, 2000);
      return;
    }
    throw err;
  }
  $("key-prompt").hidden = true;
  $("app").hidden = false;
  $("forget-key").hidden = !apiKey();
  const model = models.data[0].id;
  $("model-name").textContent = model;
  await startChat(model);
  views["tab-engine"] = new EngineView();
  views["tab-batches"] = new BatchesView();
  selectTab(document.querySelector('[aria-selected="true"]'));
}

setupTabs();
$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  setApiKey($("key-input").value.trim());
  start();
});
$("forget-key").addEventListener("click", () => {
  setApiKey(null);
  location.reload();
});
start();
