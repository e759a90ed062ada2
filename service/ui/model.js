// The loaded model's view (GET /v1/model).

import {json} from "./api.js";
import {$, anyValue, h, label} from "./dom.js";

// [low, high] pairs (calibrated ranges) read as a range
const cell = (v) => (Array.isArray(v) && v.length === 2 && v.every((x) => typeof x === "number")
  ? `${anyValue(v[0])} – ${anyValue(v[1])}` : anyValue(v));

function dictTable(id, caption, data) {
  const rows = Object.entries(data || {});
  if (!rows.length) return h("p", {text: caption + ": none"});
  const keys = [...new Set(rows.flatMap(([, v]) => (v && typeof v === "object" && !Array.isArray(v) ? Object.keys(v) : [])))];
  if (!keys.length) {
    return h("table", {id}, h("caption", {text: caption}),
      h("tbody", {}, ...rows.map(([k, v]) => h("tr", {}, h("th", {scope: "row", text: k}), h("td", {text: anyValue(v)})))));
  }
  return h("div", {class: "table-wrap"}, h("table", {id}, h("caption", {text: caption}),
    h("thead", {}, h("tr", {}, h("th", {scope: "col", text: ""}), ...keys.map((k) => h("th", {scope: "col", text: label(k)})))),
    h("tbody", {}, ...rows.map(([k, v]) => h("tr", {}, h("th", {scope: "row", text: k}),
      ...keys.map((c) => h("td", {text: cell(v[c])})))))));
}

const TABLES = {fit_metrics: "Fit metrics per engine", calibrated_ranges: "Calibrated ranges",
                calibrated_points: "Calibration points per engine",
                memory_fractions: "Memory fractions"};

export async function runModel() {
  const out = $("#model-result");
  try {
    const info = await json("GET", "/v1/model");
    const scalars = Object.entries(info).filter(([k, v]) => !(k in TABLES) &&
      (typeof v !== "object" || v === null || Array.isArray(v)));
    out.replaceChildren(
      h("h2", {text: "Loaded model"}),
      h("dl", {class: "kv"}, ...scalars.flatMap(([k, v]) =>
        [h("dt", {text: label(k)}), h("dd", {"data-field": k, text: anyValue(v)})])),
      ...Object.entries(TABLES).map(([k, t]) => dictTable("model-" + k, t, info[k])),
      ...Object.entries(info).filter(([k, v]) => !(k in TABLES) && v && typeof v === "object" &&
        !Array.isArray(v)).map(([k, v]) => dictTable("model-" + k, label(k), v)));
  } catch (e) {
    out.replaceChildren(h("p", {class: "form-error", role: "alert", text: e.message}));
  }
  document.body.dataset.ready = "model";
}
