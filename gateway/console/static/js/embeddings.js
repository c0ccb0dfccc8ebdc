// Playground embeddings: POST /v1/embeddings with one text per line; shows each vector's size, norm and first
// values, and the cosine similarity of every pair of texts.

import { ApiError, postJSON } from "./api.js";
import { $, el, fillSelect } from "./ui.js";

function cosine(a, b) {
  let dot = 0, na = 0, nb = 0;
  for (let i = 0; i < a.length; i++) { dot += a[i] * b[i]; na += a[i] * a[i]; nb += b[i] * b[i]; }
  return dot / (Math.sqrt(na) * Math.sqrt(nb) || 1);
}

export class Embeddings {
  constructor() {
    $("#embed-form").addEventListener("submit", (e) => { e.preventDefault(); this.run(); });
  }

  setModels(names) { fillSelect($("#embed-model"), names, "no embedding model loaded"); }

  async run() {
    const out = $("#embed-result");
    const texts = $("#embed-input").value.split("\n").map((t) => t.trim()).filter(Boolean);
    if (!texts.length) { out.replaceChildren(el("p", { class: "note", text: "Enter at least one text." })); return; }
    out.replaceChildren(el("p", { class: "muted", text: "Embedding…" }));
    const started = performance.now();
    try {
      const r = await postJSON("/v1/embeddings", { model: $("#embed-model").value, input: texts });
      const ms = Math.round(performance.now() - started);
      const vectors = r.data.map((d) => d.embedding);
      const table = el("table", { class: "data-table" },
        el("caption", { class: "sr-only", text: "Embeddings" }),
        el("thead", {}, el("tr", {}, ...["Text", "Dimensions", "Norm", "First values"].map((h) => el("th", { scope: "col", text: h })))),
        el("tbody", {}, ...vectors.map((v, i) => el("tr", {},
          el("td", { text: texts[i] }), el("td", { text: String(v.length) }),
          el("td", { text: Math.sqrt(v.reduce((a, x) => a + x * x, 0)).toFixed(4) }),
          el("td", { class: "vector", text: `[${v.slice(0, 6).map((x) => x.toFixed(4)).join(", ")}, …]` })))));
      const parts = [el("p", { class: "muted", text: `${r.usage.prompt_tokens} tokens · ${ms} ms` }), el("div", { class: "table-wrap" }, table)];
      if (vectors.length > 1) {
        const sim = el("table", { class: "data-table" },
          el("caption", { class: "sr-only", text: "Cosine similarity between texts" }),
          el("thead", {}, el("tr", {}, el("th", { scope: "col", text: "Cosine similarity" }), ...texts.map((_, j) => el("th", { scope: "col", text: `#${j + 1}` })))),
          el("tbody", {}, ...vectors.map((a, i) => el("tr", {}, el("th", { scope: "row", text: `#${i + 1} ${texts[i].slice(0, 40)}` }),
            ...vectors.map((b) => el("td", { text: cosine(a, b).toFixed(3) }))))));
        parts.push(el("h2", { class: "h3", text: "Similarity" }), el("div", { class: "table-wrap" }, sim));
      }
      out.replaceChildren(...parts);
    } catch (err) {
      out.replaceChildren(el("p", { class: "message error", text: err instanceof ApiError ? `${err.status}: ${err.message}` : String(err.message || err) }));
    }
  }
}
