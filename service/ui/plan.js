// The capacity-planning view (POST /v1/plan).

import {json} from "./api.js";
import {$, anyValue, card, h, int, label, secs, status} from "./dom.js";
import {clearErrors, planRequest, showError, updateUrl} from "./form.js";

const PLAN_COLS = [
  ["name", "class", (c) => c.name || `#${c.index + 1}`],
  ["engine", "engine", (c) => c.engine],
  ["dcp_size", "DCP", (c) => c.dcp_size],
  ["nodes", "nodes", (c) => int(c.nodes)],
  ["instances", "instances", (c) => int(c.instances)],
  ["concurrency", "concurrency", (c) => int(c.concurrency)],
  ["limited_by", "limited by", (c) => label(c.limited_by)],
  ["predicted_tpot_s", "TPOT ms", (c) => (c.predicted_tpot_s * 1000).toFixed(1)],
  ["predicted_ttft_s", "TTFT ms", (c) => c.predicted_ttft_s === null ? "unbounded" : (c.predicted_ttft_s * 1000).toFixed(0)],
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

export async function runPlan() {
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
