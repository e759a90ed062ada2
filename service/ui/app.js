// The what-if page. Talks only to the public REST API; the workload lives in the URL query.
"use strict";

(function () {
  const $ = (sel, root = document) => root.querySelector(sel);
  const $$ = (sel, root = document) => Array.from(root.querySelectorAll(sel));

  // Workload fields kept in the URL query and sent to the API, by kind.
  const FIELDS = {context_tokens: "int", output_tokens: "int", batch_size: "int",
                  num_gpus: "int", gpu: "str", preset: "str", kv_cache_dtype: "str",
                  model: "str", allow_extrapolation: "bool"};
  const REQUIREMENTS = {hardware_vendor: "str", quantization: "str",
                        speculative_method: "str", prefix_reuse_share: "num",
                        pipeline_parallel: "bool", lora: "bool", dp_attention: "bool"};
  const PLAN_FIELDS = {max_tpot_ms: "num", max_e2e_s: "num", headroom: "num",
                       max_concurrency: "int"};
  const CHART_POINTS = 17;
  const MAX_CONTEXT = 16777216;

  const state = {view: "recommend", workload: null};

  // ---------- formatting ----------
  const int = (v) => Number(v).toLocaleString("en-US");
  const secs = (v) => (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toPrecision(3));
  const label = (key) => key.replace(/_/g, " ");
  function anyValue(v) {
    if (v === null || v === undefined) return "–";
    if (typeof v === "boolean") return v ? "yes" : "no";
    if (typeof v === "number") return Number.isInteger(v) ? int(v) : (+v.toPrecision(4)).toString();
    if (Array.isArray(v) && v.every((x) => typeof x !== "object")) return v.map(anyValue).join(", ");
    if (typeof v === "object") return JSON.stringify(v);
    return String(v);
  }
  function h(tag, attrs, ...children) {
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

  // ---------- form <-> values ----------
  function input(name) { return $(`#workload [name="${name}"]`); }

  function read(name, kind) {
    const node = input(name);
    if (!node) return undefined;
    if (kind === "bool") return node.checked ? true : undefined;
    const raw = node.value.trim();
    if (raw === "") return undefined;
    if (kind === "str") return raw;
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

  function source() { return $("#workload [name=source]:checked").value; }

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
    for (const k of ["kv_cache_dtype", "model", "gpu", "allow_extrapolation"]) {
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

  function workload() {
    const out = modelFields();
    for (const k of ["context_tokens", "output_tokens", "batch_size", "num_gpus"]) {
      const v = read(k, FIELDS[k]);
      if (v !== undefined) out[k] = v;
    }
    return out;
  }

  function planRequest() {
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
    const e2e = read("max_e2e_s", "num");
    if (e2e !== undefined) slo.max_e2e_s = e2e;
    out.slo = slo;
    for (const k of ["headroom", "max_concurrency"]) {
      const v = read(k, PLAN_FIELDS[k]);
      if (v !== undefined) out[k] = v;
    }
    return out;
  }

  // ---------- the URL query ----------
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

  function fromQuery(q) {
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

  function updateUrl() {
    const q = toQuery().toString();
    history.replaceState(null, "", location.pathname + (q ? "?" + q : ""));
  }

  // ---------- errors next to their field ----------
  function clearErrors() {
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

  function showError(err) {
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

  async function api(method, path, body) {
    const init = {method, headers: {Accept: "application/json"}};
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let resp;
    try {
      resp = await fetch(path, init);
    } catch (e) {
      throw {message: `cannot reach the service (${e.message})`};
    }
    if (!resp.ok) {
      let e = {message: `${path}: HTTP ${resp.status}`};
      try { e = (await resp.json()).error || e; } catch (_) { /* not JSON */ }
      throw e;
    }
    return resp;
  }
  const json = async (method, path, body) => (await api(method, path, body)).json();

  // ---------- recommend ----------
  function card(title, value, field, extra) {
    return h("div", {class: "card", "data-field": field},
             h("div", {class: "card-title", text: title}),
             h("div", {class: "card-value", text: value}),
             extra ? h("div", {class: "card-extra", text: extra}) : null);
  }

  const KNOWN_REC = new Set(["engine", "dcp_size", "mem_fraction", "mem_fraction_flag",
    "predictions", "speedup", "confidence", "crossover_context_tokens", "kv_capacity_tokens",
    "fits_in_memory", "launch_command", "reasons", "excluded", "model_version"]);

  function renderAnswer(rec, w) {
    const fits = rec.fits_in_memory;
    $("#answer").replaceChildren(
      card("Engine", rec.engine, "engine"),
      card("DCP size", String(rec.dcp_size), "dcp_size"),
      card("Memory fraction", rec.mem_fraction.toFixed(2), "mem_fraction", rec.mem_fraction_flag),
      card("Confidence", rec.confidence, "confidence"),
      card("Speed-up", rec.speedup == null ? "–" : rec.speedup.toFixed(2) + "×", "speedup",
           "over the next-best engine"),
      card("KV capacity", int(rec.kv_capacity_tokens) + " tokens", "kv_capacity_tokens",
           fits ? `the batch fits (${int(w.batch_size * (w.context_tokens + w.output_tokens))} needed)`
                : `the batch does not fit: ${int(w.batch_size * (w.context_tokens + w.output_tokens))} needed`),
      card("Crossover", rec.crossover_context_tokens == null ? "none"
           : int(rec.crossover_context_tokens) + " tokens", "crossover_context_tokens",
           "context where the best engine changes"));
    $("#answer [data-field=kv_capacity_tokens]").classList.toggle("bad", !fits);
    $("#reasons").replaceChildren(...rec.reasons.map((r) => h("li", {text: r})));
    $("#launch").textContent = rec.launch_command.join(" ");
    const excluded = rec.excluded || [];
    $("#excluded-wrap").hidden = !excluded.length;
    $("#excluded").replaceChildren(...excluded.map((x) => h("li", {},
      h("b", {text: x.engine + (x.dcp_size ? ` dcp ${x.dcp_size}` : "")}), ": " + x.reason)));
    const more = Object.entries(rec).filter(([k]) => !KNOWN_REC.has(k));
    more.push(["model_version", rec.model_version]);
    $("#more-wrap").hidden = false;
    $("#more").replaceChildren(...more.flatMap(([k, v]) =>
      [h("dt", {text: label(k)}), h("dd", {"data-field": k, text: anyValue(v)})]));
  }

  // Known prediction columns first (in this order), then whatever else the API returns.
  const PRED_COLS = [
    ["engine", "engine", (p) => p.engine],
    ["dcp_size", "DCP", (p) => p.dcp_size],
    ["total_s", "total s", (p) => secs(p.total_s)],
    ["interval_s", "90 % interval s", (p) => `${secs(p.interval_s[0])} – ${secs(p.interval_s[1])}`],
    ["prefill_s", "prefill s", (p) => secs(p.prefill_s)],
    ["decode_s", "decode s", (p) => secs(p.decode_s)],
    ["tpot_s", "TPOT ms", (p) => (p.tpot_s * 1000).toFixed(1)],
    ["mem_fraction", "mem fraction", (p) => p.mem_fraction.toFixed(2)],
    ["kv_capacity_tokens", "KV capacity tokens", (p) => int(p.kv_capacity_tokens)],
    ["fits_in_memory", "batch fits", (p) => (p.fits_in_memory ? "yes" : "no")],
    ["kv_read_source", "KV read model", (p) => p.kv_read_source],
  ];
  const STATUS_KEYS = new Set(["calibrated", "extrapolated"]);

  function status(p) {
    if (p.calibrated === false) return ["uncalibrated", "badge warn"];
    if (p.extrapolated) return ["extrapolated", "badge warn"];
    return ["calibrated", "badge ok"];
  }

  function renderPredictions(rec) {
    const preds = rec.predictions;
    const isBest = (p) => p.engine === rec.engine && p.dcp_size === rec.dcp_size;
    const statusCol = ["status", "status", (p) => {
      const [st, cls] = status(p);
      return [h("span", {class: cls, text: st}),
              isBest(p) ? h("span", {class: "badge best", text: "recommended"}) : null];
    }];
    const known = new Set([...PRED_COLS.map((c) => c[0]), ...STATUS_KEYS]);
    const extra = [...new Set(preds.flatMap((p) => Object.keys(p)))].filter((k) => !known.has(k));
    const cols = PRED_COLS.filter(([k]) => preds.some((p) => k in p));
    cols.splice(2, 0, statusCol);
    cols.push(...extra.map((k) => [k, label(k), (p) => anyValue(p[k])]));
    const head = h("tr", {}, ...cols.map(([k, t]) => h("th", {scope: "col", "data-key": k, text: t})));
    const rows = preds.map((p) => h("tr",
      {class: isBest(p) ? "best" : "", "data-engine": p.engine, "data-dcp": p.dcp_size},
      ...cols.map(([k, , f]) => h("td", {"data-key": k,
        "data-value": typeof p[k] === "object" ? JSON.stringify(p[k]) : p[k]},
        k in p || k === "status" ? f(p) : "–"))));
    $("#predictions").replaceChildren(
      h("caption", {text: "Every configuration considered; 90 % prediction intervals."}),
      h("thead", {}, head), h("tbody", {}, ...rows));
  }

  function chartRange(ctx) {
    const lo = Math.max(1, Math.round(ctx / 32)), hi = Math.min(MAX_CONTEXT, ctx * 16);
    const pts = new Set([ctx]);
    for (let i = 0; i < CHART_POINTS; i++) {
      pts.add(Math.round(lo * (hi / lo) ** (i / (CHART_POINTS - 1))));
    }
    return {range: [lo, hi], points: [...pts].sort((a, b) => a - b)};
  }

  async function renderChart(rec, w) {
    const {range, points} = chartRange(w.context_tokens);
    const sweep = {...w};
    delete sweep.context_tokens;
    const caption = $("#chart-caption");
    caption.textContent = "Loading the curves…";
    let cross, batch;
    try {
      [cross, batch] = await Promise.all([
        json("POST", "/v1/crossover", {...sweep, context_range: range, points}),
        json("POST", "/v1/recommend/batch",
             {workloads: points.map((c) => ({...w, context_tokens: c}))}),
      ]);
    } catch (e) {
      $("#chart").textContent = "";
      caption.textContent = "No chart: " + e.message;
      return;
    }
    const byPoint = batch.results.map((r) => (r.recommendation ? r.recommendation.predictions : []));
    const series = cross.curves.map((c) => {
      const best = c.engine === rec.engine && c.dcp_size === rec.dcp_size;
      return {
        label: `${c.engine} dcp ${c.dcp_size}` + (c.calibrated ? "" : " (uncalibrated)"),
        dashed: !c.calibrated, bold: best,
        data: {"data-engine": c.engine, "data-dcp": c.dcp_size},
        points: cross.points.map((x, i) => {
          const p = byPoint[i].find((q) => q.engine === c.engine && q.dcp_size === c.dcp_size);
          return {x, y: c.total_s[i], lo: p ? p.interval_s[0] : null, hi: p ? p.interval_s[1] : null};
        }),
      };
    });
    const markers = [{x: w.context_tokens, kind: "query",
                      label: `your context ${EAChart.tokens(w.context_tokens)}`}];
    for (const x of cross.engine_crossovers) {
      markers.push({x: x.context_tokens, kind: "crossover",
                    label: `${x.before.engine} → ${x.after.engine} at ${EAChart.tokens(x.context_tokens)}`});
    }
    const {logY} = EAChart.draw($("#chart"), {series, markers, xTitle: "context tokens per sequence (log)",
                                              yTitle: "total time s"});
    caption.textContent = `Predicted wall time of the whole batch (${int(w.batch_size)} × ` +
      `${int(w.output_tokens)} output tokens) per configuration; shaded: 90 % interval; ` +
      `dashed lines: uncalibrated; vertical lines: your context and where the best engine changes. ` +
      `Context axis logarithmic${logY ? ", time axis logarithmic" : ""}.` +
      (cross.curves.length < rec.predictions.length
        ? " Only the configurations the model may recommend are drawn (allow extrapolation to see all)." : "");
  }

  async function runRecommend() {
    clearErrors();
    let w;
    try { w = workload(); } catch (e) { showError(e); document.body.dataset.ready = "recommend"; return; }
    updateUrl();
    $("#submit").disabled = true;
    try {
      const rec = await json("POST", "/v1/recommend", w);
      state.workload = w;
      $("#rec-empty").hidden = true;
      $("#rec-result").hidden = false;
      renderAnswer(rec, w);
      renderPredictions(rec);
      await renderChart(rec, w);
    } catch (e) {
      showError(e);
    } finally {
      $("#submit").disabled = false;
      document.body.dataset.ready = "recommend";
    }
  }

  async function download(format) {
    clearErrors();
    if (!state.workload) return;
    const q = new URLSearchParams({format});
    const tag = $("#f-image_tag").value.trim();
    if (tag) q.set("image_tag", tag);
    try {
      const resp = await api("POST", "/v1/deploy?" + q, state.workload);
      const text = await resp.text();
      const disp = resp.headers.get("Content-Disposition") || "";
      const name = (disp.match(/filename="([^"]+)"/) || [])[1] || `${format}.yaml`;
      const a = h("a", {href: URL.createObjectURL(new Blob([text], {type: "application/yaml"})),
                        download: name});
      document.body.appendChild(a);
      a.click();
      a.remove();
    } catch (e) {
      showError(e);
    }
  }

  async function copy(text, button) {
    try {
      await navigator.clipboard.writeText(text);
    } catch (_) {   // no clipboard permission: select the text for Ctrl+C instead
      const range = document.createRange();
      range.selectNodeContents($("#launch"));
      getSelection().removeAllRanges();
      getSelection().addRange(range);
    }
    const old = button.textContent;
    button.textContent = "Copied";
    setTimeout(() => { button.textContent = old; }, 1500);
  }

  // ---------- plan ----------
  let classCount = 0;
  function addClass(values = {}) {
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

  const PLAN_COLS = [
    ["name", "class", (c) => c.name || `#${c.index + 1}`],
    ["engine", "engine", (c) => c.engine],
    ["dcp_size", "DCP", (c) => c.dcp_size],
    ["nodes", "nodes", (c) => int(c.nodes)],
    ["instances", "instances", (c) => int(c.instances)],
    ["concurrency", "concurrency", (c) => int(c.concurrency)],
    ["limited_by", "limited by", (c) => label(c.limited_by)],
    ["predicted_tpot_s", "TPOT ms", (c) => (c.predicted_tpot_s * 1000).toFixed(1)],
    ["predicted_e2e_s", "E2E s", (c) => secs(c.predicted_e2e_s)],
    ["e2e_interval_s", "E2E 90 % s", (c) => `${secs(c.e2e_interval_s[0])} – ${secs(c.e2e_interval_s[1])}`],
    ["context_tokens", "context", (c) => int(c.context_tokens)],
    ["output_tokens", "output", (c) => int(c.output_tokens)],
    ["requests_per_second", "req/s", (c) => anyValue(c.requests_per_second)],
    ["mem_fraction", "mem fraction", (c) => c.mem_fraction.toFixed(2)],
    ["utilisation", "utilisation", (c) => (c.utilisation * 100).toFixed(0) + " %"],
  ];


  // shown elsewhere (status, launch commands) or not a table cell
  const PLAN_SKIP = new Set(["index", "calibrated", "extrapolated", "mem_fraction_flag",
                             "launch_command", "alternatives"]);

  function renderPlan(res) {
    const out = $("#plan-result");
    const known = new Set([...PLAN_COLS.map((c) => c[0]), ...PLAN_SKIP]);
    const extra = [...new Set(res.classes.flatMap((c) => Object.keys(c)))]
      .filter((k) => !known.has(k));
    const cols = [...PLAN_COLS, ...extra.map((k) => [k, label(k), (c) => anyValue(c[k])])];
    const rows = res.classes.map((c) => h("tr", {"data-index": c.index},
      ...cols.map(([k, , f]) => h("td", {"data-key": k,
        "data-value": typeof c[k] === "object" ? JSON.stringify(c[k]) : c[k]}, k in c ? f(c) : "–")),
      h("td", {}, h("span", {class: status(c)[1], text: status(c)[0]}))));
    out.replaceChildren(...[
      h("div", {class: "cards"},
        card("Nodes", int(res.total_nodes), "total_nodes", `${int(res.gpus_per_node)} GPUs each`),
        card("GPUs", int(res.total_gpus), "total_gpus"),
        card("Headroom", res.headroom.toFixed(2), "headroom", "target average utilisation")),
      h("h2", {text: "Per traffic class"}),
      h("div", {class: "table-wrap"}, h("table", {id: "plan-table"},
        h("thead", {}, h("tr", {}, ...cols.map(([k, t]) => h("th", {scope: "col", "data-key": k, text: t})),
                         h("th", {scope: "col", text: "status"}))),
        h("tbody", {}, ...rows))),
      res.unserved.length ? h("div", {}, h("h2", {text: "Not served"}),
        h("ul", {id: "unserved"}, ...res.unserved.map((u) =>
          h("li", {}, h("b", {text: u.name || `class ${u.index + 1}`}), ": " + u.reason)))) : null,
      h("h2", {text: "Launch commands"}),
      ...res.classes.map((c) => h("pre", {tabindex: 0, text: c.launch_command.join(" ")})),
      h("details", {}, h("summary", {text: "Assumptions"}),
        h("ul", {}, ...res.assumptions.map((a) => h("li", {text: a}))))].filter(Boolean));
    out.hidden = false;
    $("#plan-empty").hidden = true;
  }

  async function runPlan() {
    clearErrors();
    let body;
    try { body = planRequest(); } catch (e) { showError(e); document.body.dataset.ready = "plan"; return; }
    updateUrl();
    $("#submit").disabled = true;
    try {
      renderPlan(await json("POST", "/v1/plan", body));
    } catch (e) {
      showError(e);
    } finally {
      $("#submit").disabled = false;
      document.body.dataset.ready = "plan";
    }
  }

  // ---------- model ----------
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

  async function runModel() {
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

  // ---------- views, tabs, wiring ----------
  function setView(view, focus, keepUrl) {
    state.view = view;
    for (const tab of $$("[role=tab]")) {
      const on = tab.dataset.view === view;
      tab.setAttribute("aria-selected", on ? "true" : "false");
      tab.tabIndex = on ? 0 : -1;
      if (on && focus) tab.focus();
    }
    for (const panel of $$("[role=tabpanel]")) panel.hidden = panel.id !== "view-" + view;
    for (const fs of $$("[data-only]")) fs.hidden = fs.dataset.only !== view;
    $("#workload").hidden = view === "model";
    document.body.dataset.view = view;
    $("#submit").textContent = view === "plan" ? "Plan" : "Recommend";
    if (!$("#classes").children.length) {
      addClass({name: "chat", context_tokens: 8192, output_tokens: 512, requests_per_second: 5});
      addClass({name: "long-doc", context_tokens: 204800, output_tokens: 2048, requests_per_second: 0.2});
    }
    clearErrors();
    if (!keepUrl) updateUrl();
    if (view === "model") runModel();
  }

  function syncSource() {
    const s = source();
    for (const node of $$("[data-source]")) node.hidden = node.dataset.source !== s;
  }

  function init() {
    const q = new URLSearchParams(location.search);
    fromQuery(q);
    $("#workload").addEventListener("submit", (ev) => {
      ev.preventDefault();
      (state.view === "plan" ? runPlan : runRecommend)();
    });
    for (const r of $$("#workload [name=source]")) r.addEventListener("change", syncSource);
    $("#f-hf_file").addEventListener("change", async (ev) => {
      const file = ev.target.files[0];
      if (file) input("hf_config").value = await file.text();
    });
    $("#add-class").addEventListener("click", () => $("input", addClass()).focus());
    $("#copy-launch").addEventListener("click", (ev) => copy($("#launch").textContent, ev.target));
    $("#share").addEventListener("click", (ev) => { updateUrl(); copy(location.href, ev.target); });
    for (const b of $$("[data-deploy]")) b.addEventListener("click", () => download(b.dataset.deploy));
    const tabs = $$("[role=tab]");
    tabs.forEach((tab, i) => {
      tab.addEventListener("click", () => setView(tab.dataset.view, false));
      tab.addEventListener("keydown", (ev) => {
        const step = {ArrowRight: 1, ArrowLeft: -1}[ev.key];
        if (step) { ev.preventDefault(); setView(tabs[(i + step + tabs.length) % tabs.length].dataset.view, true); }
        if (ev.key === "Home") { ev.preventDefault(); setView(tabs[0].dataset.view, true); }
        if (ev.key === "End") { ev.preventDefault(); setView(tabs[tabs.length - 1].dataset.view, true); }
      });
    });
    const view = ["plan", "model"].includes(q.get("view")) ? q.get("view") : "recommend";
    setView(view, false, true);
    const fromLink = (view === "recommend" && q.has("context_tokens")) ||
      (view === "plan" && q.has("classes"));
    if (fromLink && matchMedia("(max-width: 860px)").matches) $("#main").focus();
    if (view === "recommend" && q.has("context_tokens")) runRecommend();
    else if (view === "plan" && q.has("classes")) runPlan();
    else if (view !== "model") document.body.dataset.ready = "form";
  }

  document.addEventListener("DOMContentLoaded", init);
})();
