// The workload form: its values, the URL query that keeps them, errors next to their field.

import {$, $$, h} from "./dom.js";

// Workload fields kept in the URL query and sent to the API, by kind.
const FIELDS = {context_tokens: "int", output_tokens: "int", batch_size: "int",
                num_gpus: "int", gpu: "str", preset: "str", kv_cache_dtype: "str",
                model: "str", engines: "list", allow_extrapolation: "bool"};
const REQUIREMENTS = {hardware_vendor: "str", quantization: "str",
                      speculative_method: "str", prefix_reuse_share: "num",
                      pipeline_parallel: "bool", lora: "bool", dp_attention: "bool"};
const PLAN_FIELDS = {max_tpot_ms: "num", max_ttft_ms: "num", max_e2e_s: "num",
                     headroom: "num", max_concurrency: "int"};

export const state = {view: "recommend", workload: null};

export function input(name) { return $(`#workload [name="${name}"]`); }

function read(name, kind) {
  const node = input(name);
  if (!node) return undefined;
  if (kind === "bool") return node.checked ? true : undefined;
  const raw = node.value.trim();
  if (raw === "") return undefined;
  if (kind === "str") return raw;
  if (kind === "list") return raw.split(",");
  const num = Number(raw);
  return Number.isFinite(num) ? num : raw;   // the API names what is wrong with a non-number
}

function write(name, kind, value) {
  const node = input(name);
  if (!node) return;
  if (kind === "bool") {
    node.checked = value === "true" || value === "1";
    return;
  }
  // a value the list lacks (an old or mistyped link) is kept, so the API can say what is wrong
  if (node.tagName === "SELECT" && !Array.from(node.options).some((o) => o.value === value)) {
    node.append(h("option", {value, text: value}));
  }
  node.value = value;
}

export function source() { return $("#workload [name=source]:checked").value; }

function modelFields() {
  const out = {};
  if (source() === "preset") {
    out.preset = read("preset", "str");
  } else {
    const text = input("hf_config").value.trim();
    if (text) {
      try {
        out.hf_config = JSON.parse(text);
      } catch (err) {
        throw {param: "hf_config", message: `hf_config: not valid JSON (${err.message})`};
      }
    } else {
      throw {param: "hf_config", message: "hf_config: paste or upload the model's config.json"};
    }
  }
  for (const k of ["kv_cache_dtype", "model", "gpu", "engines", "allow_extrapolation"]) {
    const v = read(k, FIELDS[k]);
    if (v !== undefined) out[k] = v;
  }
  const req = {};
  for (const [k, kind] of Object.entries(REQUIREMENTS)) {
    const v = read(k, kind);
    if (v !== undefined && !(k === "prefix_reuse_share" && v === 0)) req[k] = v;
  }
  if (Object.keys(req).length) out.requirements = req;
  return out;
}

export function workload() {
  const out = modelFields();
  for (const k of ["context_tokens", "output_tokens", "batch_size", "num_gpus"]) {
    const v = read(k, FIELDS[k]);
    if (v !== undefined) out[k] = v;
  }
  return out;
}

export function planRequest() {
  const out = modelFields();
  const gpus = read("num_gpus", "int");
  if (gpus !== undefined) out.gpus_per_node = gpus;
  out.classes = $$("#classes .class-row").map((row) => {
    const c = {};
    for (const [k, kind] of [["name", "str"], ["context_tokens", "int"],
                             ["output_tokens", "int"], ["requests_per_second", "num"]]) {
      const raw = $(`[data-key=${k}]`, row).value.trim();
      if (raw === "") continue;
      const num = Number(raw);
      c[k] = kind === "str" ? raw : Number.isFinite(num) ? num : raw;
    }
    return c;
  });
  const slo = {};
  const tpot = read("max_tpot_ms", "num");
  if (tpot !== undefined) slo.max_tpot_s = typeof tpot === "number" ? tpot / 1000 : tpot;
  const ttft = read("max_ttft_ms", "num");
  if (ttft !== undefined) slo.max_ttft_s = typeof ttft === "number" ? ttft / 1000 : ttft;
  const e2e = read("max_e2e_s", "num");
  if (e2e !== undefined) slo.max_e2e_s = e2e;
  out.slo = slo;
  for (const k of ["headroom", "max_concurrency"]) {
    const v = read(k, PLAN_FIELDS[k]);
    if (v !== undefined) out[k] = v;
  }
  return out;
}

function toQuery() {
  const q = new URLSearchParams();
  if (state.view !== "recommend") q.set("view", state.view);
  if (source() === "hf_config") q.set("source", "hf_config");
  for (const [k, kind] of Object.entries({...FIELDS, ...REQUIREMENTS})) {
    if (source() === "hf_config" && k === "preset") continue;
    if (state.view === "plan" && ["context_tokens", "output_tokens", "batch_size"].includes(k)) continue;
    const node = input(k);
    if (!node) continue;
    if (kind === "bool") { if (node.checked) q.set(k, "true"); continue; }
    const v = node.value.trim();
    if (v !== "" && !(k === "prefix_reuse_share" && Number(v) === 0)) q.set(k, v);
  }
  if (state.view === "plan") {
    for (const k of Object.keys(PLAN_FIELDS)) {
      const v = input(k).value.trim();
      if (v !== "") q.set(k, v);
    }
    q.set("classes", $$("#classes .class-row").map((row) =>
      ["context_tokens", "output_tokens", "requests_per_second", "name"]
        .map((k) => $(`[data-key=${k}]`, row).value.trim().replace(/[,:]/g, " ")).join(":"))
      .join(","));
  }
  return q;
}

export function fromQuery(q) {
  if (q.get("source") === "hf_config") {
    $("#workload [name=source][value=hf_config]").checked = true;
  }
  for (const [k, kind] of Object.entries({...FIELDS, ...REQUIREMENTS, ...PLAN_FIELDS})) {
    if (q.has(k)) write(k, kind, q.get(k));
  }
  if (q.has("classes")) {
    $("#classes").textContent = "";
    for (const item of q.get("classes").split(",").filter(Boolean)) {
      const [context_tokens, output_tokens, requests_per_second, name] = item.split(":");
      addClass({context_tokens, output_tokens, requests_per_second, name});
    }
  }
  syncSource();
}

export function updateUrl() {
  const q = toQuery().toString();
  history.replaceState(null, "", location.pathname + (q ? "?" + q : ""));
}

export function syncSource() {
  const s = source();
  for (const node of $$("[data-source]")) node.hidden = node.dataset.source !== s;
}

export function clearErrors() {
  for (const p of $$(".field-error")) { p.hidden = true; p.textContent = ""; }
  for (const n of $$("[aria-invalid]")) n.removeAttribute("aria-invalid");
  $("#form-error").hidden = true;
}

function params(node) { return (node.dataset.param || "").split(" ").filter(Boolean); }

// The input that an API error's ``param`` names: exact, else its nearest parent path,
// else the first input below it ('slo' -> slo.max_tpot_s).
function fieldFor(param) {
  const nodes = $$("[data-param]").filter((n) => !n.closest("[hidden]"));
  let path = param;
  while (path) {
    const hit = nodes.find((n) => params(n).includes(path));
    if (hit) return hit;
    path = path.includes(".") ? path.slice(0, path.lastIndexOf(".")) : "";
  }
  return nodes.find((n) => params(n).some((p) => p.startsWith(param + "."))) || null;
}

function errorSlot(node) {
  if (!node.id) return null;
  let slot = document.getElementById("err-" + node.id);
  if (!slot) {
    slot = h("p", {class: "field-error", id: "err-" + node.id, hidden: true});
    const anchor = node.closest("label") || node;
    anchor.after(slot);
    node.setAttribute("aria-describedby",
                      ((node.getAttribute("aria-describedby") || "") + " " + slot.id).trim());
  }
  return slot;
}

export function showError(err) {
  const param = err.param;
  const node = param ? fieldFor(param) : null;
  const slot = node && errorSlot(node);
  if (slot) {
    slot.textContent = err.message;
    slot.hidden = false;
    slot.dataset.param = param;
    node.setAttribute("aria-invalid", "true");
    const details = node.closest("details");
    if (details) details.open = true;
    node.focus();
  } else {
    const box = $("#form-error");
    box.textContent = err.message;
    box.hidden = false;
  }
}

let classCount = 0;
export function addClass(values = {}) {
  const i = classCount++;
  const row = h("fieldset", {class: "class-row"});
  const n = () => $$("#classes .class-row").indexOf(row);
  const field = (key, text, attrs) => {
    const id = `c${i}-${key}`;
    const inp = h("input", {id, "data-key": key, ...attrs});
    if (values[key] !== undefined) inp.value = values[key];
    return h("div", {class: "field"}, h("label", {for: id, text}), inp);
  };
  const legend = h("legend", {});
  const remove = h("button", {type: "button", class: "link", text: "Remove"});
  remove.addEventListener("click", () => { row.remove(); renumber(); });
  row.append(legend,
    h("div", {class: "grid2"},
      field("name", "Name", {type: "text", autocomplete: "off"}),
      field("context_tokens", "Context tokens", {type: "number", inputmode: "numeric"}),
      field("output_tokens", "Output tokens", {type: "number", inputmode: "numeric"}),
      field("requests_per_second", "Requests per second", {type: "number", inputmode: "decimal", step: "any"})),
    remove);
  $("#classes").appendChild(row);
  row.renumber = () => {
    legend.textContent = `Class ${n() + 1}`;
    remove.setAttribute("aria-label", `Remove class ${n() + 1}`);
    for (const inp of $$("input[data-key]", row)) inp.dataset.param = `classes.${n()}.${inp.dataset.key}`;
  };
  renumber();
  return row;
}
function renumber() { for (const r of $$("#classes .class-row")) r.renumber(); }
