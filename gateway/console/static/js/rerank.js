// Playground rerank: POST /v1/rerank (Cohere's and vLLM's shape: {model, query, documents} -> results with
// index and relevance_score). The tab appears only when the server has that route (overview features.rerank).

import { ApiError, postJSON } from "./api.js";
import { $, el, fillSelect } from "./ui.js";

export class Rerank {
  constructor() {
    $("#rerank-form").addEventListener("submit", (e) => { e.preventDefault(); this.run(); });
  }

  setAvailable(on) {
    const tab = $("#tab-rerank");
    tab.hidden = !on;
    if (!on && tab.getAttribute("aria-selected") === "true") $("#tab-chat").click();
  }

  setModels(names) { fillSelect($("#rerank-model"), names, "no model loaded"); }

  async run() {
    const out = $("#rerank-result");
    const documents = $("#rerank-docs").value.split("\n").map((t) => t.trim()).filter(Boolean);
    out.replaceChildren(el("p", { class: "muted", text: "Ranking…" }));
    try {
      const r = await postJSON("/v1/rerank", { model: $("#rerank-model").value, query: $("#rerank-query").value, documents });
      const results = [...(r.results || r.data || [])].sort((a, b) => b.relevance_score - a.relevance_score);
      out.replaceChildren(el("div", { class: "table-wrap" }, el("table", { class: "data-table" },
        el("caption", { class: "sr-only", text: "Documents by relevance" }),
        el("thead", {}, el("tr", {}, ...["Rank", "Score", "Document"].map((h) => el("th", { scope: "col", text: h })))),
        el("tbody", {}, ...results.map((x, i) => el("tr", {},
          el("td", { text: String(i + 1) }), el("td", { text: Number(x.relevance_score).toFixed(4) }),
          el("td", { text: (x.document && (x.document.text || x.document)) || documents[x.index] || "" })))))));
    } catch (err) {
      out.replaceChildren(el("p", { class: "message error", text: err instanceof ApiError ? `${err.status}: ${err.message}` : String(err.message || err) }));
    }
  }
}
