// A small time-series line chart drawn on a canvas: fixed height (set in CSS, so nothing moves when data
// arrives), theme colours read from CSS custom properties, gaps where a value is unknown (null), and a text
// summary of the latest values in the canvas' aria-label and in the card's <output> for people who cannot see it.

function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 4, 6, 8, 10]) if (v <= m * p) return m * p; // quarters stay round
  return 10 * p;
}

export class LineChart {
  /**
   * @param figure  the <figure> holding a <canvas>, an <output class="chart-now"> and a <ul class="legend">
   * @param series  [{label, color: "--c1"}]
   * @param format  value -> text (axis labels and the latest values)
   * @param fixedMax  a fixed top of the y axis (e.g. 1 for ratios), or null to fit the data
   */
  constructor(figure, { series, format, fixedMax = null, windowSeconds = 300, title, integer = false }) {
    this.figure = figure;
    this.canvas = figure.querySelector("canvas");
    this.now = figure.querySelector(".chart-now");
    this.legend = figure.querySelector(".legend");
    this.series = series;
    this.format = format;
    this.fixedMax = fixedMax;
    this.windowSeconds = windowSeconds;
    this.title = title;
    this.integer = integer; // counts: the axis top is a multiple of 4, so every grid line is a whole number
    this.points = []; // [{t: seconds, v: [values per series]}]
    this.drawLegend();
  }

  drawLegend() {
    const style = getComputedStyle(this.figure);
    this.legend.replaceChildren(...this.series.map((s) => {
      const li = document.createElement("li");
      const sw = document.createElement("span");
      sw.className = "swatch";
      sw.style.background = style.getPropertyValue(s.color).trim();
      li.append(sw, s.label);
      return li;
    }));
  }

  clear() { this.points = []; this.update(); }

  push(t, values) {
    this.points.push({ t, v: values });
    const cutoff = t - this.windowSeconds;
    while (this.points.length && this.points[0].t < cutoff) this.points.shift();
    this.update();
  }

  update() {
    const last = this.points[this.points.length - 1];
    const known = last ? last.v.map((v, i) => (v === null ? null : `${this.series[i].label} ${this.format(v)}`)).filter(Boolean) : [];
    const text = known.length ? known.join(" · ") : "–";
    this.now.textContent = text;
    this.canvas.setAttribute("aria-label", `${this.title}: ${known.length ? text : "no data yet"}`);
    this.figure.dataset.points = String(this.points.filter((p) => p.v.some((v) => v !== null)).length);
    this.figure.dataset.last = last && last.v[0] !== null ? String(last.v[0]) : "";
    this.draw();
  }

  draw() {
    const canvas = this.canvas;
    const width = canvas.clientWidth;
    const height = canvas.clientHeight;
    if (!width || !height) return; // hidden tab: drawn when shown
    const dpr = window.devicePixelRatio || 1;
    if (canvas.width !== Math.round(width * dpr) || canvas.height !== Math.round(height * dpr)) {
      canvas.width = Math.round(width * dpr);
      canvas.height = Math.round(height * dpr);
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, width, height);
    const style = getComputedStyle(this.figure);
    const color = (name) => style.getPropertyValue(name).trim();

    let max = this.fixedMax;
    if (max === null) {
      let m = 0;
      for (const p of this.points) for (const v of p.v) if (v !== null && v > m) m = v;
      max = this.integer ? Math.max(4, Math.ceil(m / 4) * 4) : niceMax(m);
    }
    ctx.font = `11px ${style.fontFamily}`;
    const labels = [0, 0.25, 0.5, 0.75, 1].map((f) => this.format(max * f));
    const left = Math.ceil(Math.max(...labels.map((l) => ctx.measureText(l).width))) + 8;
    const top = 6, bottom = 16, right = 4;
    const plotW = width - left - right, plotH = height - top - bottom;

    ctx.strokeStyle = color("--grid");
    ctx.fillStyle = color("--axis");
    ctx.lineWidth = 1;
    ctx.textBaseline = "middle";
    ctx.textAlign = "right";
    labels.forEach((label, i) => {
      const y = Math.round(top + plotH - (plotH * i) / 4) + 0.5;
      ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(left + plotW, y); ctx.stroke();
      ctx.fillText(label, left - 6, y);
    });
    const end = this.points.length ? this.points[this.points.length - 1].t : 0;
    const start = end - this.windowSeconds;
    ctx.textBaseline = "alphabetic";
    ctx.textAlign = "left";
    ctx.fillText(`-${Math.round(this.windowSeconds / 60)} min`, left, height - 3);
    ctx.textAlign = "right";
    ctx.fillText("now", left + plotW, height - 3);

    const x = (t) => left + ((t - start) / this.windowSeconds) * plotW;
    const y = (v) => top + plotH - (Math.min(v, max) / max) * plotH;
    ctx.lineWidth = 2;
    ctx.lineJoin = "round";
    this.series.forEach((s, i) => {
      ctx.strokeStyle = color(s.color);
      ctx.setLineDash(s.dash || []);
      ctx.beginPath();
      let drawing = false, lone = null;
      for (const p of this.points) {
        const v = p.v[i];
        if (v === null || v === undefined) { drawing = false; continue; }
        if (!drawing) { ctx.moveTo(x(p.t), y(v)); drawing = true; lone = p; } else { ctx.lineTo(x(p.t), y(v)); lone = null; }
      }
      ctx.stroke();
      if (lone) { // a single point between gaps: a dot
        ctx.fillStyle = color(s.color);
        ctx.beginPath(); ctx.arc(x(lone.t), y(lone.v[i]), 2.5, 0, 2 * Math.PI); ctx.fill();
      }
    });
    ctx.setLineDash([]);
  }
}
