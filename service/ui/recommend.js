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
  "predictions", "speedup", "confidence", "crossover_context_tokens", "kv_capacity_tokens",
  "fits_in_memory", "launch_command", "reasons", "excluded", "model_version"]);

// The chosen configuration's memory knobs, when its prediction sets any (hybrid models'
// state and KV split, a running-request limit): what they are and how many run at once.
function memoryCard(rec, w) {
  const best = rec.predictions.find((p) => p.engine === rec.engine && p.dcp_size === rec.dcp_size);
  if (!best?.memory_flags?.length) return [];
  return [card("Memory flags", best.memory_flags.join(" "), "memory_flags",
               `${int(best.running_sequences)} of ${int(w.batch_size ?? 1)} sequences at once`)];
}

function renderAnswer(rec, w) {
  const fits = rec.fits_in_memory;
  const needed = int((w.batch_size ?? 1) * (w.context_tokens + w.output_tokens));
  $("#answer").replaceChildren(
    card("Engine", rec.engine, "engine"),
    card("DCP size", String(rec.dcp_size), "dcp_size"),
    card("Memory fraction", rec.mem_fraction.toFixed(2), "mem_fraction", rec.mem_fraction_flag),
    card("Confidence", rec.confidence, "confidence"),
    card("Speed-up", rec.speedup == null ? "–" : rec.speedup.toFixed(2) + "×", "speedup",
         "over the next-best engine"),
    card("KV capacity", int(rec.kv_capacity_tokens) + " tokens", "kv_capacity_tokens",
         fits ? `the batch fits (${needed} needed)` : `the batch does not fit: ${needed} needed`),
    ...memoryCard(rec, w),
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
  ["running_sequences", "running at once", (p) => int(p.running_sequences)
    + (p.running_limit && p.running_limit !== "none" ? ` (${LIMITS[p.running_limit]})` : "")],
  ["state_slots", "state slots", (p) => (p.state_slots == null ? "–" : int(p.state_slots))],
  ["memory_flags", "memory flags", (p) => (p.memory_flags?.length ? p.memory_flags.join(" ")
    : "defaults")],
  ["kv_read_source", "KV read model", (p) => p.kv_read_source],
];
const STATUS_KEYS = new Set(["calibrated", "extrapolated", "transferred", "running_limit"]);
// what binds the sequences running at once (a prediction's running_limit)
const LIMITS = {kv: "KV cache", state: "state slots", max_running: "running limit"};

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
