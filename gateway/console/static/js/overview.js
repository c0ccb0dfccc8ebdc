// Overview: the server's facts and every model folder of the repository with its state.

import { $, el, fmtNumber } from "./ui.js";

export function stateBadge(state) {
  return el("span", { class: `badge ${state}`, text: state });
}

function cpuText(cpu) {
  // cpu.budget is the CPU budget the server plans with, when the server reports one (see overview.cpu_budget).
  if (cpu.budget !== null && cpu.budget !== undefined) return `${fmtNumber(cpu.budget, 1)} CPUs (${cpu.visible} visible)`;
  return `${cpu.visible} CPUs visible${cpu.host && cpu.host !== cpu.visible ? ` of ${cpu.host}` : ""}`;
}

// Residency (docs/model-management.md): counted memory and when an idle model unloads, or that it loads on request.
function lifecycleText(m) {
  if (m.state !== "ready") return m.on_request && m.state !== "loading" ? "loads on request" : "";
  const parts = [];
  if (m.resident_bytes) parts.push(`${fmtNumber(m.resident_bytes / 2 ** 20, 0)} MiB`);
  if (m.pinned) parts.push("pinned");
  else if (m.busy) parts.push("in use");
  else if (m.expires_in_s !== null && m.expires_in_s !== undefined) parts.push(`unloads in ${Math.round(m.expires_in_s)} s if idle`);
  return parts.join(" · ");
}

export function renderOverview(data) {
  const s = data.server;
  $("#server-version").textContent = `v${s.version}`;
  $("#fact-version").textContent = `${s.name} ${s.version}`;
  $("#fact-ready").textContent = s.ready ? "serving" : "loading models";
  $("#fact-cpu").textContent = cpuText(s.cpu);
  $("#fact-control").textContent = s.model_control_mode;
  $("#fact-auth").textContent = `${s.auth_required ? "API key required" : "open inference"} · admin API ${s.admin_enabled ? "on" : "off"}`;
  const ready = data.models.filter((m) => m.state === "ready").length;
  $("#server-status").textContent = `${s.ready ? "Serving" : "Starting"} · ${ready} of ${data.models.length} models ready`;

  const rows = data.models.map((m) => {
    const state = el("td", {}, stateBadge(m.state));
    const reason = m.reason || m.config_error;
    if (reason) state.append(el("div", { class: "reason", text: reason }));
    const life = lifecycleText(m);
    if (life) state.append(el("div", { class: "muted small", text: life }));
    const name = el("td", {}, el("strong", { text: m.name }));
    if (m.served_name && m.served_name !== m.name) name.append(el("div", { class: "muted small", text: `served as ${m.served_name}` }));
    return el("tr", { "data-model": m.name, "data-state": m.state },
      name, state,
      el("td", { text: m.backend || "–" }),
      el("td", { text: m.kind === "llm" ? "LLM" : m.kind ? (m.embeddings ? "tensor (embeddings)" : "tensor") : "–" }),
      el("td", { text: (m.versions || []).join(", ") || "–" }),
      el("td", { text: m.dtype || "–" }),
      el("td", { text: m.max_model_len ? `${m.max_model_len.toLocaleString("en-US")} tokens` : "–" }),
      el("td", { text: m.in_flight === undefined ? "–" : String(m.in_flight) }));
  });
  $("#models-table tbody").replaceChildren(...(rows.length ? rows :
    [el("tr", {}, el("td", { colspan: "8", class: "muted", text: "The repository holds no model." }))]));
}
