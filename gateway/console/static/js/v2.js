// Playground v2 infer: reads a tensor model's metadata (GET /v2/models/{name}) and config (for optional
// inputs), builds a form with one field per input (shape and data), shows the request it will send, and posts it
// to /v2/models/{name}/infer.

import { ApiError, getJSON, postJSON } from "./api.js";
import { $, el, fillSelect } from "./ui.js";

const NUMERIC = /^(FP|INT|UINT|BF)/;

function exampleShape(shape) { return shape.map((d) => (d < 0 ? 1 : d)); }
function size(shape) { return shape.reduce((a, d) => a * d, 1); }
function exampleData(datatype, shape) {
  const n = size(shape);
  if (datatype === "BYTES") return Array.from({ length: n }, () => "0.3, 0.4");
  if (datatype === "BOOL") return Array.from({ length: n }, () => false);
  return Array.from({ length: n }, (_, i) => (datatype.startsWith("FP") || datatype === "BF16" ? Number((0.1 * (i + 1)).toFixed(2)) : i + 1));
}

export class V2Infer {
  constructor() {
    this.select = $("#v2-model");
    this.meta = null;
    this.select.addEventListener("change", () => this.describe());
    $("#v2-form").addEventListener("submit", (e) => { e.preventDefault(); this.run(); });
    $("#v2-inputs").addEventListener("input", () => this.preview());
  }

  setModels(names) { fillSelect(this.select, names, "no tensor model loaded"); }

  async describe() {
    const name = this.select.value;
    const box = $("#v2-inputs");
    this.meta = null;
    if (!name) { box.replaceChildren(); this.preview(); return; }
    try {
      const base = `/v2/models/${encodeURIComponent(name)}`;
      const [meta, config] = await Promise.all([getJSON(base), getJSON(`${base}/config`).catch(() => ({}))]);
      if (this.select.value !== name) return;
      this.meta = meta;
      const optional = new Set((config.input || []).filter((i) => i.optional).map((i) => i.name));
      let included = 0;
      box.replaceChildren(...meta.inputs.map((input, k) => {
        const shape = exampleShape(input.shape);
        const on = !optional.has(input.name) || (included === 0 && meta.inputs.slice(k + 1).every((i) => optional.has(i.name)));
        if (on) included++;
        const id = `v2-in-${k}`;
        return el("fieldset", { "data-input": input.name, "data-datatype": input.datatype },
          el("legend", { text: `${input.name} · ${input.datatype} · shape [${input.shape.join(", ")}]` }),
          el("label", { class: "check" }, el("input", { type: "checkbox", class: "v2-include", checked: on }), optional.has(input.name) ? "Send this optional input" : "Send this input"),
          el("label", { for: `${id}-shape` }, "Shape (comma-separated)"),
          el("input", { id: `${id}-shape`, class: "v2-shape", type: "text", value: shape.join(", ") }),
          el("label", { for: `${id}-data` }, `Data, flat JSON array (${NUMERIC.test(input.datatype) ? "numbers" : input.datatype === "BYTES" ? "strings" : "values"})`),
          el("textarea", { id: `${id}-data`, class: "v2-data", rows: "2", text: JSON.stringify(exampleData(input.datatype, shape)) }));
      }));
    } catch (err) {
      box.replaceChildren(el("p", { class: "message error", text: `${err.status || ""} ${err.message}` }));
    }
    this.preview();
  }

  build() {
    const inputs = [];
    for (const fs of $("#v2-inputs").querySelectorAll("fieldset")) {
      if (!fs.querySelector(".v2-include").checked) continue;
      const shape = fs.querySelector(".v2-shape").value.split(",").map((s) => s.trim()).filter(Boolean).map(Number);
      let data;
      try { data = JSON.parse(fs.querySelector(".v2-data").value); } catch { throw new Error(`${fs.dataset.input}: data is not valid JSON`); }
      inputs.push({ name: fs.dataset.input, shape, datatype: fs.dataset.datatype, data });
    }
    return { inputs };
  }

  preview() {
    let text;
    try { text = this.meta ? JSON.stringify(this.build(), null, 2) : ""; } catch (err) { text = err.message; }
    $("#v2-request").textContent = text;
  }

  async run() {
    const out = $("#v2-response");
    if (!this.meta) return;
    let body;
    try { body = this.build(); } catch (err) { out.textContent = err.message; return; }
    out.textContent = "Running…";
    const started = performance.now();
    try {
      const r = await postJSON(`/v2/models/${encodeURIComponent(this.meta.name)}/infer`, body);
      out.textContent = `// ${Math.round(performance.now() - started)} ms\n${JSON.stringify(r, null, 2)}`;
    } catch (err) {
      out.textContent = err instanceof ApiError ? `${err.status}: ${err.message}` : String(err.message || err);
    }
  }
}
