// Live metrics: polls /ui/api/stats (a snapshot of what /metrics exports) and charts rates and windowed
// percentiles computed from the difference between two snapshots, as Prometheus' rate() and
// histogram_quantile() would. Polling stops while the page is hidden, so a background tab costs the server nothing.

import { getJSON } from "./api.js";
import { LineChart } from "./charts.js";
import { $, fillSelect, fmtNumber, fmtPercent, fmtSeconds } from "./ui.js";

const rate = (v) => fmtNumber(v, v < 1 ? 2 : v < 10 ? 1 : 0);
const WINDOW_S = 30; // rates and percentiles over the last 30 s
const HISTORY_S = 300; // what the charts show
const NOTE = "Rates and percentiles over the last 30 s, from the numbers /metrics exports.";

/** Prometheus' histogram_quantile over bucket counts (cumulative, last = +Inf) with upper bounds `le`. */
export function quantile(q, le, cumulative) {
  const total = cumulative[cumulative.length - 1];
  if (!(total > 0)) return null;
  const rank = q * total;
  let i = cumulative.findIndex((c) => c >= rank);
  if (i < 0) i = cumulative.length - 1;
  if (i >= le.length) return le[le.length - 1]; // in the +Inf bucket: the highest finite bound
  const lower = i === 0 ? 0 : le[i - 1];
  const below = i === 0 ? 0 : cumulative[i - 1];
  const inBucket = cumulative[i] - below;
  return inBucket > 0 ? lower + ((le[i] - lower) * (rank - below)) / inBucket : le[i];
}

function delta(now, then) { return now.map((c, i) => c - (then ? then[i] : 0)); }

export class LiveMetrics {
  constructor() {
    this.snapshots = []; // [{time, llms: {name: stats}, tensors: {name: stats}}]
    this.model = $("#metrics-model");
    this.interval = $("#metrics-interval");
    this.timer = null;
    this.inFlight = false;
    const pct = (label, color, dash) => ({ label, color, dash });
    this.charts = {
      tokens: new LineChart($("#chart-tokens"), { title: "Output tokens per second", series: [pct("tok/s", "--c1")], format: rate }),
      requests: new LineChart($("#chart-requests"), { title: "Requests", series: [pct("running", "--c1"), pct("waiting", "--c2", [5, 3])], format: (v) => fmtNumber(v, 0), integer: true }),
      ttft: new LineChart($("#chart-ttft"), { title: "Time to first token", series: [pct("p50", "--c1"), pct("p95", "--c2", [5, 3]), pct("p99", "--c3", [2, 3])], format: fmtSeconds }),
      itl: new LineChart($("#chart-itl"), { title: "Inter-token latency", series: [pct("p50", "--c1"), pct("p95", "--c2", [5, 3]), pct("p99", "--c3", [2, 3])], format: fmtSeconds }),
      kv: new LineChart($("#chart-kv"), { title: "KV-cache usage", series: [pct("used", "--c4")], format: fmtPercent, fixedMax: 1 }),
      prefix: new LineChart($("#chart-prefix"), { title: "Prefix-cache hit rate", series: [pct("hit rate", "--c3")], format: fmtPercent, fixedMax: 1 }),
      tensor: new LineChart($("#chart-tensor"), { title: "Tensor-model inferences per second", series: [pct("all tensor models", "--c2")], format: rate }),
    };
    for (const c of Object.values(this.charts)) c.windowSeconds = HISTORY_S;
    this.model.addEventListener("change", () => this.replot());
    this.interval.addEventListener("change", () => this.schedule(0));
    document.addEventListener("visibilitychange", () => this.schedule(0));
    window.addEventListener("resize", () => this.redraw());
  }

  setModels(llmNames) { fillSelect(this.model, llmNames, "no LLM loaded"); }

  start() { this.schedule(0); }

  schedule(delay) {
    clearTimeout(this.timer);
    const every = Number(this.interval.value);
    if (!every || document.hidden) return;
    this.timer = setTimeout(() => this.poll(), delay);
  }

  async poll() {
    if (this.inFlight) return;
    this.inFlight = true;
    try {
      const snap = await getJSON("/ui/api/stats");
      const entry = {
        time: snap.time,
        llms: Object.fromEntries(snap.llms.map((m) => [m.name, m])),
        tensors: snap.tensors,
      };
      this.snapshots.push(entry);
      while (this.snapshots.length > 2 && this.snapshots[0].time < entry.time - HISTORY_S - WINDOW_S) this.snapshots.shift();
      this.plot(this.snapshots.length - 1);
      $("#metrics-note").textContent = NOTE;
    } catch (err) {
      $("#metrics-note").textContent = `Could not read the server's numbers: ${err.message}`;
    } finally {
      this.inFlight = false;
      this.schedule(Number(this.interval.value));
    }
  }

  /** The snapshot about WINDOW_S before snapshot i (or the oldest one after it, if the history is shorter). */
  before(i) {
    const t = this.snapshots[i].time - WINDOW_S;
    let j = i - 1;
    while (j > 0 && this.snapshots[j - 1].time >= t) j--;
    return j >= 0 ? this.snapshots[j] : null;
  }

  plot(i) {
    const now = this.snapshots[i];
    const prev = i > 0 ? this.snapshots[i - 1] : null;
    const win = i > 0 ? this.before(i) : null;
    const name = this.model.value;
    const m = now.llms[name];
    const t = now.time;
    const c = this.charts;
    const tensorRate = () => {
      if (!prev) return null;
      const sum = (s) => s.tensors.reduce((a, x) => a + x.inferences, 0);
      return (sum(now) - sum(prev)) / (now.time - prev.time);
    };
    c.tensor.push(t, [tensorRate()]);
    if (!m) { for (const k of ["tokens", "requests", "ttft", "itl", "kv", "prefix"]) c[k].push(t, c[k].series.map(() => null)); return; }
    const p = prev && prev.llms[name];
    const w = win && win.llms[name];
    c.tokens.push(t, [p ? Math.max(0, m.generation_tokens - p.generation_tokens) / (now.time - prev.time) : null]);
    c.requests.push(t, [m.running, m.waiting]);
    c.kv.push(t, [m.kv_usage]);
    const queries = w ? m.prefix_cache_queries - w.prefix_cache_queries : 0;
    c.prefix.push(t, [queries > 0 ? (m.prefix_cache_hits - w.prefix_cache_hits) / queries : null]);
    for (const [key, hist] of [["ttft", "ttft"], ["itl", "itl"]]) {
      const counts = w ? delta(m[hist].cumulative, w[hist].cumulative) : null;
      c[key].push(t, [0.5, 0.95, 0.99].map((q) => (counts ? quantile(q, m[hist].le, counts) : null)));
    }
  }

  replot() {
    for (const chart of Object.values(this.charts)) chart.points = [];
    for (let i = 0; i < this.snapshots.length; i++) this.plot(i);
    for (const chart of Object.values(this.charts)) chart.update();
  }

  redraw() { for (const chart of Object.values(this.charts)) chart.draw(); }
}
