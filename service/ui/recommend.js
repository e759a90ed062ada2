// The recommend view: the answer, the predictions table, the time-vs-context chart, downloads.

import {api, json} from "./api.js";
import {draw, tokens} from "./chart.js";
import {$, anyValue, card, h, int, label, secs, status} from "./dom.js";
import {clearErrors, showError, state, updateUrl, workload} from "./form.js";

const CHART_POINTS = 17;
const MAX_CONTEXT = 16777216;

let lastChart = null;   // redrawn at the new width when the window is resized
let resizeTimer = 0;
addEventListener("resize", () => {
  clearTimeout(resizeTimer);
  resizeTimer = setTimeout(() => { if (lastChart) draw($("#chart"), lastChart); }, 150);
});

const KNOWN_REC = new Set(["engine", "dcp_size", "mem_fraction", "mem_fraction_flag",
  "mem_flag_value", "config_file",
  "predictions", "speedup", "speedup_over", "confidence", "crossover_context_tokens",
  "kv_capacity_tokens", "fits_in_memory", "launch_command", "reasons", "excluded",
  "model_version"]);

const same = (a, b) => a.engine === b.engine && a.dcp_size === b.dcp_size;
const name = (p) => `${p.engine} dcp ${p.dcp_size}`;

// The chosen configuration's memory knobs, when its prediction sets any (hybrid models'
// state and KV split, a running-request limit): what they are and how many run at once.
function memoryCard(rec, w) {
  const best = rec.predictions.find((p) => same(p, rec));
  if (!best?.memory_flags?.length) return [];
  return [card("Memory flags", best.memory_flags.join(" "), "memory_flags",
               `${int(best.running_sequences)} of ${int(w.batch_size ?? 1)} sequences at once`)];
}

// Which predictions the recommendation could choose from, and why the others could not, and
// the configuration its speed-up is over: as the API says them (each prediction's eligible and
// ineligible_reason, the answer's speedup_over), never worked out here.
function eligibility(rec) {
  const over = rec.speedup_over;
  const rival = over ? rec.predictions.find((p) => same(p, over)) ?? null : null;
  return {rival, isEligible: (p) => p.eligible !== false, why: (p) => p.ineligible_reason};
}

function speedupCard(rec, elig) {
  const {rival, isEligible} = elig;
  if (rec.speedup == null) {
    return card("Speed-up", "–", "speedup", "no other eligible configuration to compare with");
  }
  if (!rival) {
    return card("Speed-up", rec.speedup.toFixed(2) + "×", "speedup",
                "over the next-best eligible configuration");
  }
  const across = rival.engine !== rec.engine;
  // faster than the compared one but not eligible (of another engine, where it is of one)
  const skipped = rec.predictions.filter((p) => !isEligible(p) && p.total_s < rival.total_s
                                         && (!across || p.engine !== rec.engine));
  const node = card("Speed-up", rec.speedup.toFixed(2) + "×", "speedup",
    `vs ${name(rival)} (${secs(rival.total_s)} s), `
    + (across ? "the fastest eligible configuration of another engine"
       : "the next-fastest eligible configuration") + (skipped.length
      ? `. Faster but not eligible: ${skipped.slice(0, 3).map(name).join(", ")}`
        + (skipped.length > 3 ? ` and ${skipped.length - 3} more` : "") + " (see Predictions)"
      : ""));
  node.dataset.engine = rival.engine;
  node.dataset.dcp = rival.dcp_size;
  return node;
}

// the memory flag, with its own value where it is not a share of the whole GPU (TensorRT-LLM's
// share of the memory free after weights and activations)
function memoryFlag(rec) {
  const v = rec.mem_flag_value;
  return v == null || Math.abs(v - rec.mem_fraction) < 0.005 ? rec.mem_fraction_flag
    : `${rec.mem_fraction_flag} ${v.toFixed(2)} (of the free memory)`;
}

function renderAnswer(rec, w, elig) {
  const fits = rec.fits_in_memory;
  const needed = int((w.batch_size ?? 1) * (w.context_tokens + w.output_tokens));
  $("#answer").replaceChildren(
    card("Engine", rec.engine, "engine"),
    card("DCP size", String(rec.dcp_size), "dcp_size"),
    card("Memory fraction", rec.mem_fraction.toFixed(2), "mem_fraction", memoryFlag(rec)),
    card("Confidence", rec.confidence, "confidence"),
    speedupCard(rec, elig),
    card("KV capacity", int(rec.kv_capacity_tokens) + " tokens", "kv_capacity_tokens",
         fits ? `the batch fits (${needed} needed)` : `the batch does not fit: ${needed} needed`),
    ...memoryCard(rec, w),
    card("Crossover", rec.crossover_context_tokens == null ? "none"
         : int(rec.crossover_context_tokens) + " tokens", "crossover_context_tokens",
         "context where the best engine changes"));
  $("#answer [data-field=kv_capacity_tokens]").classList.toggle("bad", !fits);
  $("#reasons").replaceChildren(...rec.reasons.map((r) => h("li", {text: r})));
  // an engine's configuration file (TensorRT-LLM's --config YAML) under its command
  const file = rec.config_file;
  $("#launch").textContent = rec.launch_command.join(" ")
    + (file ? `\n\n# ${file.path}\n${file.content}` : "");
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

// Known prediction fields in this order: the table's columns, then the ones each row shows
// under it on demand (its "details"), then whatever else the API returns (details too). Kept
// to columns that fit a 1,400 px window beside the form; narrower, the table scrolls in its box.
const PRED_COLS = [
  ["engine", "engine", (p) => p.engine],
  ["dcp_size", "DCP", (p) => p.dcp_size],
  ["total_s", "total s", (p) => secs(p.total_s)],
  ["interval_s", "90 % interval s", (p) => `${secs(p.interval_s[0])} – ${secs(p.interval_s[1])}`],
  ["prefill_s", "prefill s", (p) => secs(p.prefill_s)],
  ["decode_s", "decode s", (p) => secs(p.decode_s)],
  ["tpot_s", "TPOT ms", (p) => (p.tpot_s * 1000).toFixed(1)],
  ["kv_capacity_tokens", "KV capacity tokens", (p) => int(p.kv_capacity_tokens)],
  ["running_sequences", "running at once", (p) => (p.running_limit && p.running_limit !== "none"
    ? [int(p.running_sequences) + " ", h("span", {class: "limit",
                                                  text: `(${LIMITS[p.running_limit]})`})]
    : int(p.running_sequences))],
];
const DETAIL_COLS = [
  ["memory_flags", "memory flags", (p) => (p.memory_flags?.length ? p.memory_flags.join(" ")
    : "defaults")],
  ["fits_in_memory", "batch fits", (p) => (p.fits_in_memory ? "yes" : "no")],
  ["mem_fraction", "mem fraction", (p) => p.mem_fraction.toFixed(2)],
  ["state_slots", "state slots", (p) => (p.state_slots == null ? "–" : int(p.state_slots))],
  ["kv_read_source", "KV read model", (p) => p.kv_read_source],
  ["step_terms_s", "decode step ms", (p) => stepTerms(p.step_terms_s)],
];
const STATUS_KEYS = new Set(["calibrated", "extrapolated", "transferred", "running_limit"]);
// shown by the eligible column
const ELIGIBLE_KEYS = ["eligible", "ineligible_reason"];
// what binds the sequences running at once (a prediction's running_limit)
const LIMITS = {kv: "KV cache", state: "state slots", max_running: "running limit"};

// a decode step's terms (step_terms_s), largest first
function stepTerms(terms) {
  const ms = Object.entries(terms || {}).filter(([, v]) => v > 0).sort((a, b) => b[1] - a[1]);
  return ms.length ? ms.map(([k, v]) => `${label(k)} ${(v * 1000).toFixed(1)}`).join(", ") : "–";
}

const dataValue = (v) => (typeof v === "object" ? JSON.stringify(v) : v);

function renderPredictions(rec, elig) {
  const preds = rec.predictions;
  const isBest = (p) => same(p, rec);
  const statusCol = ["status", "status", (p) => {
    const [st, cls] = status(p);
    return [h("span", {class: cls, text: st}),
            isBest(p) ? h("span", {class: "badge best", text: "recommended"}) : null];
  }];
  // may the recommendation choose it, and if not, why; the speed-up card's configuration
  const eligibleCol = ["eligible", "eligible", (p) => (elig.isEligible(p)
    ? ["yes", p === elig.rival ? h("span", {class: "badge rival", text: "speed-up baseline"}) : null]
    : [h("span", {class: "badge no", text: "no"}),
       h("span", {class: "why", text: elig.why(p)})])];
  const known = new Set([...PRED_COLS, ...DETAIL_COLS].map((c) => c[0])
    .concat([...STATUS_KEYS], ELIGIBLE_KEYS));
  const extra = [...new Set(preds.flatMap((p) => Object.keys(p)))].filter((k) => !known.has(k));
  const cols = PRED_COLS.filter(([k]) => preds.some((p) => k in p));
  cols.splice(2, 0, statusCol, eligibleCol);
  const details = DETAIL_COLS.filter(([k]) => preds.some((p) => k in p));
  details.push(...extra.map((k) => [k, label(k), (p) => anyValue(p[k])]));
  const head = h("tr", {}, ...cols.map(([k, t]) => h("th", {scope: "col", "data-key": k, text: t})));
  // one body per configuration: its row, and under it its details (hidden until the button
  // under the engine's name shows them)
  const bodies = preds.map((p, i) => {
    const id = `pred-details-${i}`;
    const more = h("button", {type: "button", class: "link details-toggle",
                              "aria-expanded": "false", "aria-controls": id, text: "details"});
    const row = h("tr", {class: ["pred", isBest(p) ? "best" : "",
                                 elig.isEligible(p) ? "" : "ineligible"].join(" ").trim(),
                         "data-engine": p.engine, "data-dcp": p.dcp_size,
                         "data-eligible": String(elig.isEligible(p))},
      ...cols.map(([k, , f]) => h("td", {"data-key": k, "data-value": dataValue(p[k])},
        k in p || k === "status" || k === "eligible" ? f(p) : "–", k === "engine" ? more : null)));
    const sub = h("tr", {class: "details", id, hidden: true},
      h("td", {colspan: cols.length}, h("dl", {}, ...details.flatMap(([k, t, f]) =>
        [h("dt", {text: t}), h("dd", {"data-key": k, "data-value": dataValue(p[k])},
                                     k in p ? f(p) : "–")]))));
    more.addEventListener("click", () => {
      sub.hidden = !sub.hidden;
      more.setAttribute("aria-expanded", String(!sub.hidden));
    });
    return h("tbody", {"data-engine": p.engine, "data-dcp": p.dcp_size}, row, sub);
  });
  const shut = preds.filter((p) => !elig.isEligible(p)).length;
  $("#predictions").replaceChildren(
    h("caption", {text: "Every configuration considered, fastest first; 90 % prediction "
      + "intervals; details: memory flags, state slots, the decode step's terms. "
      + (shut ? `${shut} of ${preds.length} may not be recommended: the eligible column says why.`
         : "Each may be recommended.")}),
    h("thead", {}, head), ...bodies);
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
                    label: `your context ${tokens(w.context_tokens)}`}];
  for (const x of cross.engine_crossovers) {
    markers.push({x: x.context_tokens, kind: "crossover",
                  label: `${x.before.engine} → ${x.after.engine} at ${tokens(x.context_tokens)}`});
  }
  lastChart = {series, markers, xTitle: "context tokens per sequence (log)",
               yTitle: "total time s"};
  const {logY} = draw($("#chart"), lastChart);
  caption.textContent = `Predicted wall time of the whole batch (${int(w.batch_size ?? 1)} × ` +
    `${int(w.output_tokens)} output tokens) per configuration; shaded: 90 % interval; ` +
    `dashed lines: uncalibrated; vertical lines: your context and where the best engine changes. ` +
    `Context axis logarithmic${logY ? ", time axis logarithmic" : ""}.` +
    (cross.curves.length < rec.predictions.length
      ? " Only the configurations the model may recommend are drawn (allow extrapolation to see all)." : "");
}

export async function runRecommend() {
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
    const elig = eligibility(rec);
    renderAnswer(rec, w, elig);
    renderPredictions(rec, elig);
    await renderChart(rec, w);
  } catch (e) {
    showError(e);
  } finally {
    $("#submit").disabled = false;
    document.body.dataset.ready = "recommend";
  }
}

export async function download(format) {
  clearErrors();
  if (!state.workload) return;
  const q = new URLSearchParams({format});
  for (const k of ["image", "image_tag"]) {
    const v = $(`#f-${k}`).value.trim();
    if (v) q.set(k, v);
  }
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
