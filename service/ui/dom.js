// DOM helpers and value formatting shared by the page's views.

export const $ = (sel, root = document) => root.querySelector(sel);
export const $$ = (sel, root = document) => Array.from(root.querySelectorAll(sel));

export const int = (v) => Number(v).toLocaleString("en-US");
export const secs = (v) => (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toPrecision(3));
export const label = (key) => key.replace(/_/g, " ");
export function anyValue(v) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "boolean") return v ? "yes" : "no";
  if (typeof v === "number") return Number.isInteger(v) ? int(v) : (+v.toPrecision(4)).toString();
  if (Array.isArray(v) && v.every((x) => typeof x !== "object")) return v.map(anyValue).join(", ");
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}
export function h(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c !== null && c !== undefined) node.append(c instanceof Node ? c : String(c));
  }
  return node;
}

export function card(title, value, field, extra) {
  return h("div", {class: "card", "data-field": field},
           h("div", {class: "card-title", text: title}),
           h("div", {class: "card-value", text: value}),
           extra ? h("div", {class: "card-extra", text: extra}) : null);
}

// the CLI table's words (cli/recommend.py format_table)
export function status(p) {
  if (p.calibrated === false) {
    return [p.transferred ? "transferred" : "uncalibrated", "badge warn"];
  }
  if (p.extrapolated) return ["extrapolated", "badge warn"];
  return ["calibrated", "badge ok"];
}

// Copy to the clipboard; without permission, select ``select`` (a node, or null) for Ctrl+C.
export async function copy(text, button, select) {
  let said = "Copied";
  try {
    await navigator.clipboard.writeText(text);
  } catch (_) {
    said = "Copy failed";
    if (select) {
      const range = document.createRange();
      range.selectNodeContents(select);
      getSelection().removeAllRanges();
      getSelection().addRange(range);
      said = "Press Ctrl+C";
    }
  }
  const old = button.textContent;
  button.textContent = said;
  setTimeout(() => { button.textContent = old; }, 1500);
}
