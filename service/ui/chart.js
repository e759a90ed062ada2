// A small SVG line chart for the what-if page: lines with shaded intervals, log axes,
// vertical markers. No dependencies; draws into a container element.

const NS = "http://www.w3.org/2000/svg";
const PALETTE = ["#1f6feb", "#d1242f", "#1a7f37", "#9a6700", "#8250df", "#bf3989",
                 "#0a7b83", "#57606a"];

function el(name, attrs, parent) {
  const node = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (parent) parent.appendChild(node);
  return node;
}

function scale(lo, hi, a, b, log) {
  const f = log ? Math.log : (v) => v;
  const l = f(lo), h = f(hi);
  const span = h - l || 1;
  return (v) => a + (f(v) - l) / span * (b - a);
}

// Tick values: powers of 2 (tokens) or 1-2-5 decades (log), or "nice" steps (linear).
function ticks(lo, hi, log, base2) {
  const out = [];
  if (log && base2) {
    for (let e = Math.ceil(Math.log2(lo)); e <= Math.floor(Math.log2(hi)); e++) out.push(2 ** e);
    while (out.length > 8) { for (let i = out.length - 2; i >= 0; i -= 2) out.splice(i, 1); }
    return out;
  }
  if (log) {
    for (let e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e++) {
      for (const m of [1, 2, 5]) {
        const v = m * 10 ** e;
        if (v >= lo && v <= hi) out.push(v);
      }
    }
    return out;
  }
  const raw = (hi - lo) / 5;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
  for (let v = Math.ceil(lo / step) * step; v <= hi + 1e-9; v += step) out.push(v);
  return out;
}

export function tokens(v) {
  if (v >= 1048576 && v % 1048576 === 0) return v / 1048576 + "M";
  if (v >= 1024) return Math.round(v / 1024) + "K";
  return String(Math.round(v));
}

function seconds(v) {
  return v >= 100 ? Math.round(v).toString() : v >= 1 ? (+v.toPrecision(2)).toString()
    : (+v.toPrecision(1)).toString();
}

// Widths of ``labels`` as text of ``cls`` in ``svg``: measured, or where the SVG is not laid
// out (a hidden view), 0.62 em per character of the 12 px tick font (a digit is ~0.55 em).
function textWidths(svg, labels, cls) {
  const probe = el("g", {class: "grid", "aria-hidden": "true"}, svg);
  const out = labels.map((t) => {
    const node = el("text", {x: 0, y: 0, class: cls}, probe);
    node.textContent = t;
    let w = 0;
    try { w = node.getBBox().width; } catch (_) { w = 0; }
    return w > 0 ? w : t.length * 12 * 0.62;
  });
  probe.remove();
  return out;
}

// spec: {series: [{label, points: [{x, y, lo?, hi?}], dashed?, data?}],
//        markers: [{x, label, kind: "query" | "crossover"}], xTitle, yTitle}
export function draw(container, spec) {
  container.textContent = "";
  // drawn at the container's own width, so text keeps its size on a phone
  const W = Math.max(300, Math.min(960, container.clientWidth || 720));
  const H = W < 560 ? 300 : 400, m = {l: 56, r: 12, t: 16, b: 52};   // m.l: set below
  const svg = el("svg", {viewBox: `0 0 ${W} ${H}`, class: "chart-svg",
                         preserveAspectRatio: "xMidYMid meet"}, container);
  const xs = [], ys = [];
  for (const s of spec.series) {
    for (const p of s.points) {
      xs.push(p.x); ys.push(p.y);
      if (p.lo != null) ys.push(p.lo);
      if (p.hi != null) ys.push(p.hi);
    }
  }
  for (const mk of spec.markers || []) xs.push(mk.x);
  const pos = ys.filter((v) => v > 0);
  if (!xs.length || !pos.length) {
    el("text", {x: W / 2, y: H / 2, "text-anchor": "middle"}, svg).textContent = "no data";
    return {logY: false};
  }
  const xlo = Math.min(...xs), xhi = Math.max(...xs);
  let ylo = Math.min(...pos), yhi = Math.max(...pos);
  const logY = yhi / ylo > 20;   // log time axis only where the range calls for it
  if (!logY) { ylo = 0; yhi *= 1.05; } else { ylo /= 1.2; yhi *= 1.2; }
  const yTicks = ticks(Math.max(ylo, logY ? ylo : 0), yhi, logY, false);
  // the left margin holds the time axis' title and its tick labels side by side: measured in
  // the page's own font (estimated where the chart is not laid out yet), so a long label
  // ("500000") never runs under the title
  const tickW = Math.max(0, ...textWidths(svg, yTicks.map(seconds), "tick"));
  const TITLE_X = 4, TITLE_H = 18, GAP = 8, TICK_PAD = 6;
  m.l = Math.ceil(TITLE_X + TITLE_H + GAP + tickW + TICK_PAD);
  const X = scale(xlo, xhi, m.l, W - m.r, true);
  const Y = scale(ylo, yhi, H - m.b, m.t, logY);

  const grid = el("g", {class: "grid"}, svg);
  for (const t of ticks(xlo, xhi, true, true)) {
    el("line", {x1: X(t), x2: X(t), y1: m.t, y2: H - m.b}, grid);
    el("text", {x: X(t), y: H - m.b + 16, "text-anchor": "middle", class: "tick tick-x"},
       grid).textContent = tokens(t);
  }
  for (const t of yTicks) {
    el("line", {x1: m.l, x2: W - m.r, y1: Y(t), y2: Y(t)}, grid);
    el("text", {x: m.l - TICK_PAD, y: Y(t) + 4, "text-anchor": "end", class: "tick tick-y"},
       grid).textContent = seconds(t);
  }
  el("rect", {x: m.l, y: m.t, width: W - m.l - m.r, height: H - m.t - m.b, class: "frame"},
     svg);
  el("text", {x: (m.l + W - m.r) / 2, y: H - 10, "text-anchor": "middle",
              class: "title title-x"}, svg).textContent = spec.xTitle || "";
  // turned a quarter left about (TITLE_X, mid): with a "hanging" baseline (the glyphs' top
  // edge) the glyphs lie between x = TITLE_X and TITLE_X + TITLE_H, clear of the tick labels
  const mid = (m.t + H - m.b) / 2;
  el("text", {x: TITLE_X, y: mid, "text-anchor": "middle", "dominant-baseline": "hanging",
              class: "title title-y", transform: `rotate(-90 ${TITLE_X} ${mid})`},
     svg).textContent = (spec.yTitle || "") + (logY ? " (log)" : "");

  spec.series.forEach((s, i) => {
    const color = PALETTE[i % PALETTE.length];
    const g = el("g", {class: "series", "data-label": s.label, ...(s.data || {})}, svg);
    const band = s.points.filter((p) => p.lo != null && p.hi != null && p.lo > 0);
    if (band.length > 1) {
      const d = band.map((p, k) => `${k ? "L" : "M"}${X(p.x)},${Y(p.hi)}`).join("") +
        band.slice().reverse().map((p) => `L${X(p.x)},${Y(p.lo)}`).join("") + "Z";
      el("path", {d, fill: color, "fill-opacity": 0.15, stroke: "none", class: "band"}, g);
    }
    const pts = s.points.filter((p) => p.y > 0);
    el("path", {d: pts.map((p, k) => `${k ? "L" : "M"}${X(p.x)},${Y(p.y)}`).join(""),
                fill: "none", stroke: color, "stroke-width": s.bold ? 3 : 2,
                "stroke-dasharray": s.dashed ? "6 4" : "none", class: "line"}, g);
    for (const p of pts) {
      const c = el("circle", {cx: X(p.x), cy: Y(p.y), r: 3, fill: color, class: "point",
                              "data-context": p.x, "data-total": p.y}, g);
      el("title", {}, c).textContent = `${s.label}: ${p.y.toFixed(1)} s at ${tokens(p.x)}` +
        (p.lo != null ? ` (90 %: ${p.lo.toFixed(1)} to ${p.hi.toFixed(1)} s)` : "");
    }
  });

  (spec.markers || []).forEach((mk, i) => {
    const g = el("g", {class: `marker marker-${mk.kind}`, "data-context": mk.x}, svg);
    el("line", {x1: X(mk.x), x2: X(mk.x), y1: m.t, y2: H - m.b,
                "stroke-dasharray": mk.kind === "query" ? "none" : "4 3"}, g);
    const right = X(mk.x) < W - 150;
    el("text", {x: X(mk.x) + (right ? 4 : -4), y: m.t + 14 + 14 * i,
                "text-anchor": right ? "start" : "end"}, g).textContent = mk.label;
  });

  const legend = document.createElement("ul");
  legend.className = "legend";
  spec.series.forEach((s, i) => {
    const li = document.createElement("li");
    const sw = document.createElement("span");
    sw.className = "swatch" + (s.dashed ? " dashed" : "");
    sw.style.borderColor = PALETTE[i % PALETTE.length];
    li.append(sw, document.createTextNode(s.label));
    legend.appendChild(li);
  });
  container.appendChild(legend);
  return {logY};
}
