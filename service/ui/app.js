// The what-if page. Talks only to the public REST API; the workload lives in the URL query.

import {$, $$, copy} from "./dom.js";
import {addClass, clearErrors, fromQuery, input, state, syncSource, updateUrl} from "./form.js";
import {runModel} from "./model.js";
import {runPlan} from "./plan.js";
import {download, runRecommend} from "./recommend.js";

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
  $("#copy-launch").addEventListener("click", (ev) => copy($("#launch").textContent, ev.target, $("#launch")));
  $("#share").addEventListener("click", (ev) => { updateUrl(); copy(location.href, ev.target, null); });
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

init();
