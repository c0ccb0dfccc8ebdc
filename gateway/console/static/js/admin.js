// Admin: load, reload and unload models through the repository API (POST /v2/repository/models/{name}/load
// and /unload) with the admin key typed into this page. The key stays in memory (api.js), never in the URL or
// in storage; without it, or with a wrong one, the server refuses and the refusal is shown here.

import { ApiError, hasAdminKey, request, setAdminKey } from "./api.js";
import { stateBadge } from "./overview.js";
import { $, el } from "./ui.js";

export class Admin {
  constructor(refresh) {
    this.refresh = refresh; // re-reads the overview (states) now
    this.busy = new Map(); // model -> the state it is moving to
    $("#admin-key-form").addEventListener("submit", (e) => {
      e.preventDefault();
      const input = $("#admin-key");
      setAdminKey(input.value.trim());
      input.value = "";
      this.keyState();
    });
    $("#admin-forget").addEventListener("click", () => { setAdminKey(""); this.keyState(); });
  }

  keyState() {
    $("#admin-key-state").textContent = hasAdminKey() ?
      "Admin key entered; it is sent with the admin calls only (load, reload, unload, named keys), and kept in this page's memory only." :
      "No admin key entered: the page keeps it in memory only, never in its address or storage.";
  }

  render(data) {
    const s = data.server;
    const note = $("#admin-mode-note");
    let text = "";
    if (!s.admin_enabled) text = "The repository API is off on this server: start it with an admin key (--admin-key-file or SWITCHYARD_ADMIN_KEY).";
    else if (s.model_control_mode !== "explicit") text = `Model control mode is '${s.model_control_mode}': the server refuses load and unload (start it with --model-control-mode=explicit).`;
    note.textContent = text;
    note.hidden = !text;
    const focused = document.activeElement && document.activeElement.closest("#admin-table [data-action]");
    const refocus = focused && [focused.closest("tr").dataset.model, focused.dataset.action];
    $("#admin-table tbody").replaceChildren(...data.models.map((m) => {
      const busy = this.busy.get(m.name);
      const button = (action, label) => el("button", {
        type: "button", class: `button small${action === "unload" ? " danger" : ""}`, "data-action": action,
        "aria-label": `${label} ${m.name}`, disabled: Boolean(busy), onclick: () => this.act(action, m.name),
      }, label);
      const loaded = m.state === "ready";
      return el("tr", { "data-model": m.name, "data-state": m.state },
        el("td", {}, el("strong", { text: m.name })),
        el("td", {}, stateBadge(busy || m.state)),
        el("td", { class: "reason", text: m.reason || m.config_error || "" }),
        el("td", {}, el("div", { class: "actions" },
          loaded ? button("load", "Reload") : button("load", "Load"),
          button("unload", "Unload"))));
    }));
    if (refocus) {
      const again = $(`#admin-table tr[data-model="${CSS.escape(refocus[0])}"] [data-action="${refocus[1]}"]`);
      if (again) again.focus();
    }
  }

  log(ok, text) {
    const time = new Date().toLocaleTimeString("en-GB");
    const item = el("li", { class: ok ? "result-ok" : "result-error" },
      el("span", { class: ok ? "ok" : "bad", text: ok ? "OK" : "Refused" }), ` ${time} · ${text}`);
    $("#admin-log").prepend(item);
  }

  async act(action, name) {
    const verb = action === "unload" ? "unload" : "load";
    this.busy.set(name, verb === "unload" ? "unloading" : "loading");
    this.refresh();
    const started = performance.now();
    try {
      await request(`/v2/repository/models/${encodeURIComponent(name)}/${verb}`, { method: "POST", body: {}, admin: true });
      this.log(true, `${verb} ${name} (${((performance.now() - started) / 1000).toFixed(1)} s)`);
    } catch (err) {
      const status = err instanceof ApiError ? `${err.status} ` : "";
      const hint = err.status === 401 || err.status === 403 ? " (this needs the server's admin key, entered above)" : "";
      this.log(false, `${verb} ${name}: ${status}${err.message}${hint}`);
    } finally {
      this.busy.delete(name);
      this.refresh();
    }
  }
}
