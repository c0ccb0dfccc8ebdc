// Named API keys (docs/keys.md): list, create, rotate and revoke them through /admin/keys, with each key's usage
// from /admin/usage, using the admin key typed into the Admin tab. A new or rotated key's secret is shown once,
// in this page only; it is never stored.

import { ApiError, getJSON, hasAdminKey, onKeysChanged, request } from "./api.js";
import { $, el } from "./ui.js";

function numberOrUndefined(input) {
  const text = input.value.trim();
  return text === "" ? undefined : Number(text);
}

function limits(key) {
  const parts = [];
  if (key.rpm !== null) parts.push(`${key.rpm} req/min`);
  if (key.tpm !== null) parts.push(`${key.tpm} tok/min`);
  if (key.budget_tokens !== null) parts.push(`${key.budget_tokens} tok/${key.budget_period}`);
  if (key.budget_cost !== null) parts.push(`${key.budget_cost} cost/${key.budget_period}`);
  if (key.priority) parts.push(`priority ${key.priority}`);
  return parts.join(", ") || "server defaults";
}

export class Keys {
  constructor(log) {
    this.log = log; // (ok, text): the Admin tab's results list
    $("#keys-form").addEventListener("submit", (e) => { e.preventDefault(); this.create(); });
    $("#keys-refresh").addEventListener("click", () => this.refresh());
    onKeysChanged(() => this.refresh());
  }

  async refresh() {
    const body = $("#keys-table tbody");
    if (!hasAdminKey()) {
      body.replaceChildren(el("tr", {}, el("td", { colspan: "6", class: "muted", text: "Enter the admin key above to list the keys." })));
      return;
    }
    try {
      const [keys, usage] = await Promise.all([
        getJSON("/admin/keys", { admin: true }), getJSON("/admin/usage", { admin: true })]);
      const used = new Map();
      for (const row of usage.data) {
        const u = used.get(row.key_id) || { requests: 0, tokens: 0 };
        u.requests += row.requests;
        u.tokens += row.total_tokens;
        used.set(row.key_id, u);
      }
      body.replaceChildren(...keys.data.map((k) => this.row(k, used.get(k.id) || { requests: 0, tokens: 0 })));
    } catch (err) {
      const status = err instanceof ApiError ? `${err.status} ` : "";
      body.replaceChildren(el("tr", {}, el("td", { colspan: "6", class: "reason", text: `Keys: ${status}${err.message}` })));
    }
  }

  row(key, used) {
    const live = key.status === "active";
    const button = (action, label, danger) => el("button", {
      type: "button", class: `button small${danger ? " danger" : ""}`, "aria-label": `${label} ${key.name}`,
      disabled: !live, onclick: () => this.act(action, key),
    }, label);
    const team = key.metadata && key.metadata.team ? ` · ${key.metadata.team}` : "";
    return el("tr", { "data-key": key.id },
      el("td", {}, el("strong", { text: key.name }), el("div", { class: "muted small", text: `${key.prefix}… · ${key.id}${team}` })),
      el("td", { text: key.status }),
      el("td", { text: key.models.length ? key.models.join(", ") : "all" }),
      el("td", { text: limits(key) }),
      el("td", { text: `${used.requests} requests, ${used.tokens} tokens` }),
      el("td", {}, el("div", { class: "actions" }, button("rotate", "Rotate"), button("revoke", "Revoke", true))));
  }

  showSecret(key, secret) {
    const note = $("#keys-secret");
    note.replaceChildren(`Secret of ${key.name} (shown once, copy it now): `, el("code", { text: secret }));
    note.hidden = false;
  }

  async create() {
    const body = { name: $("#keys-name").value.trim() };
    const models = $("#keys-models").value.split(",").map((m) => m.trim()).filter(Boolean);
    if (models.length) body.models = models;
    for (const [field, id] of [["rpm", "#keys-rpm"], ["tpm", "#keys-tpm"], ["budget_tokens", "#keys-budget"]]) {
      const value = numberOrUndefined($(id));
      if (value !== undefined) body[field] = value;
    }
    const team = $("#keys-team").value.trim();
    if (team) body.metadata = { team };
    try {
      const key = await (await request("/admin/keys", { method: "POST", body, admin: true })).json();
      this.showSecret(key, key.secret);
      this.log(true, `created key ${key.name} (${key.id})`);
      $("#keys-form").reset();
    } catch (err) {
      this.log(false, `create key: ${err instanceof ApiError ? `${err.status} ` : ""}${err.message}`);
    }
    this.refresh();
  }

  async act(action, key) {
    const path = `/admin/keys/${encodeURIComponent(key.id)}${action === "rotate" ? "/rotate" : ""}`;
    try {
      const answer = await (await request(path, { method: action === "rotate" ? "POST" : "DELETE", admin: true })).json();
      if (answer.secret) this.showSecret(answer, answer.secret);
      this.log(true, `${action}d key ${key.name}`);
    } catch (err) {
      this.log(false, `${action} ${key.name}: ${err instanceof ApiError ? `${err.status} ` : ""}${err.message}`);
    }
    this.refresh();
  }
}
