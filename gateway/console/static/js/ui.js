// Small DOM helpers shared by the console's modules: element building, tabs (WAI-ARIA tabs pattern), formatting.

/** Build an element: el("td", {class: "x", text: "y"}, child, ...). Text is always set as text, never HTML. */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "text") node.textContent = v;
    else if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

export const $ = (sel, root = document) => root.querySelector(sel);
export const $$ = (sel, root = document) => [...root.querySelectorAll(sel)];

/** Tabs: click or arrow keys select; the selected tab's panel is shown. onChange(tabId) after each change. */
export function setupTabs(tablist, onChange = () => {}) {
  const tabs = () => $$('[role="tab"]', tablist).filter((t) => !t.hidden);
  function select(tab, focus = false) {
    for (const t of $$('[role="tab"]', tablist)) {
      const on = t === tab;
      t.setAttribute("aria-selected", String(on));
      t.tabIndex = on ? 0 : -1;
      const panel = document.getElementById(t.getAttribute("aria-controls"));
      if (panel) panel.hidden = !on;
    }
    if (focus) tab.focus();
    onChange(tab.id);
  }
  tablist.addEventListener("click", (e) => {
    const tab = e.target.closest('[role="tab"]');
    if (tab) select(tab);
  });
  tablist.addEventListener("keydown", (e) => {
    const list = tabs();
    const i = list.indexOf(document.activeElement);
    if (i < 0) return;
    let next = null;
    if (e.key === "ArrowRight") next = list[(i + 1) % list.length];
    else if (e.key === "ArrowLeft") next = list[(i - 1 + list.length) % list.length];
    else if (e.key === "Home") next = list[0];
    else if (e.key === "End") next = list[list.length - 1];
    if (next) { e.preventDefault(); select(next, true); }
  });
  return { select: (id) => select(document.getElementById(id)) };
}

export function fmtNumber(v, digits = 1) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  if (Math.abs(v) >= 1000) return Math.round(v).toLocaleString("en-US");
  return v.toFixed(digits);
}

export function fmtSeconds(s) {
  if (s === null || s === undefined || Number.isNaN(s)) return "–";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  return `${s.toFixed(2)} s`;
}

export function fmtPercent(r) {
  if (r === null || r === undefined || Number.isNaN(r)) return "–";
  return `${(r * 100).toFixed(r < 0.1 ? 1 : 0)}%`;
}

/** Replace a <select>'s options with `names`, keeping the current choice when it is still there. */
export function fillSelect(select, names, empty = "no model") {
  const current = select.value;
  const same = names.length ? select.options.length === names.length && names.every((n, i) => select.options[i].value === n)
    : select.options.length === 1 && select.options[0].value === "";
  if (same) return;
  select.replaceChildren(...(names.length ? names.map((n) => el("option", { value: n, text: n })) :
    [el("option", { value: "", text: empty })]));
  if (names.includes(current)) select.value = current;
  select.dispatchEvent(new Event("change"));
}
