// The console's entry point: theme, API-key dialog, tabs, and the overview poll that feeds every tab's model
// lists. Data polls pause while the page is hidden.

import { getJSON, hasApiKey, onKeysChanged, setApiKey, setKeyPrompt } from "./api.js";
import { Admin } from "./admin.js";
import { Chat } from "./chat.js";
import { Embeddings } from "./embeddings.js";
import { Keys } from "./keys.js";
import { LiveMetrics } from "./metrics.js";
import { renderOverview } from "./overview.js";
import { Rerank } from "./rerank.js";
import { $, setupTabs } from "./ui.js";
import { V2Infer } from "./v2.js";

const THEME = "switchyard-console-theme";
const OVERVIEW_EVERY_MS = 5000;

// ---------------------------------------------------------------- theme
function applyTheme(theme) {
  document.documentElement.dataset.theme = theme;
  const button = $("#theme-button");
  button.textContent = theme === "dark" ? "Light theme" : "Dark theme";
  button.setAttribute("aria-pressed", String(theme === "dark"));
}
applyTheme(localStorage.getItem(THEME) || (matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light"));

// ---------------------------------------------------------------- API key dialog
const dialog = $("#key-dialog");
function keyDialog(message) {
  return new Promise((resolve) => {
    $("#key-dialog-message").textContent = message;
    $("#key-dialog-input").value = "";
    dialog.returnValue = "";
    dialog.addEventListener("close", () => {
      const value = $("#key-dialog-input").value.trim();
      if (dialog.returnValue === "save" && value) { setApiKey(value, $("#key-dialog-remember").checked); resolve(true); }
      else { if (dialog.returnValue === "clear") setApiKey(""); resolve(false); }
    }, { once: true });
    dialog.showModal();
    $("#key-dialog-input").focus();
  });
}
setKeyPrompt(keyDialog);
function keyButton() { $("#key-button").textContent = hasApiKey() ? "API key: set" : "API key: none"; }
onKeysChanged(keyButton);
keyButton();

// ---------------------------------------------------------------- sections
const metrics = new LiveMetrics();
const chat = new Chat();
const embeddings = new Embeddings();
const rerank = new Rerank();
const v2 = new V2Infer();
let overviewTimer = null;
const admin = new Admin(() => refreshOverview(true));
const namedKeys = new Keys((ok, text) => admin.log(ok, text));
namedKeys.refresh();

setupTabs(document.querySelector('[data-tabs="main"]'), (id) => { if (id === "tab-metrics") metrics.redraw(); });
setupTabs(document.querySelector('[data-tabs="playground"]'));

$("#theme-button").addEventListener("click", () => {
  const next = document.documentElement.dataset.theme === "dark" ? "light" : "dark";
  localStorage.setItem(THEME, next);
  applyTheme(next);
  for (const chart of Object.values(metrics.charts)) chart.drawLegend();
  metrics.redraw();
});
$("#key-button").addEventListener("click", async () => {
  if (await keyDialog("The page sends this key with every call it makes to the API.")) refreshOverview(true);
});

// ---------------------------------------------------------------- overview poll
let polling = false;
async function refreshOverview(soon = false) {
  clearTimeout(overviewTimer);
  if (polling) { overviewTimer = setTimeout(() => refreshOverview(), 300); return; }
  polling = true;
  try {
    const data = await getJSON("/ui/api/overview");
    renderOverview(data);
    admin.render(data);
    const ready = data.models.filter((m) => m.state === "ready" || m.on_request); // on request: loads when asked
    const names = (pred) => ready.filter(pred).map((m) => m.served_name || m.name);
    metrics.setModels(names((m) => m.kind === "llm"));
    chat.setModels(names((m) => m.kind === "llm"));
    embeddings.setModels(names((m) => m.embeddings));
    rerank.setModels(names(() => true)); // whichever kind the rerank route serves
    rerank.setAvailable(Boolean(data.server.features.rerank));
    v2.setModels(names((m) => m.kind === "tensor"));
  } catch (err) {
    $("#server-status").textContent = err.status === 401 ? "An API key is needed: use the API key button." :
      `Cannot reach the server: ${err.message}`;
  } finally {
    polling = false;
    const busy = admin.busy.size > 0;
    if (!document.hidden) overviewTimer = setTimeout(() => refreshOverview(), busy || soon ? 1000 : OVERVIEW_EVERY_MS);
  }
}
document.addEventListener("visibilitychange", () => { if (!document.hidden) refreshOverview(); });

refreshOverview().then(() => metrics.start());
