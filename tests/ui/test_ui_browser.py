"""The /ui page in a real browser: headless Debian Chromium driven by Playwright, against a real
``engine-advisor serve`` on loopback. Each check compares what the page shows with the REST
API's own answer. Screenshots go to a temporary directory (printed on failure)."""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
from pathlib import Path
from urllib.parse import urlencode

import httpx
import pytest
import yaml
from proc import Proc

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed")
expect = sync_api.expect
# (the page's Content-Security-Policy forbids eval: wait with locators, not wait_for_function)
CHROMIUM = os.environ.get("ENGINE_ADVISOR_CHROMIUM") or shutil.which("chromium") \
    or "/usr/bin/chromium"
if not Path(CHROMIUM).exists():
    pytest.skip("Debian's chromium is not installed", allow_module_level=True)

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
DESKTOP = {"width": 1280, "height": 800}
WIDE = {"width": 1400, "height": 900}
FULL_HD = {"width": 1920, "height": 1080}
PHONE = {"width": 390, "height": 844}
WORKLOAD = {"context_tokens": 204800, "output_tokens": 2048, "batch_size": 64,
            "preset": "kimi-k3", "gpu": "B300", "num_gpus": 8}
WAIT_MS = 60_000  # the page's answers take a few API calls; the machine may be busy
expect.set_options(timeout=WAIT_MS)


@pytest.fixture(scope="module")
def server():
    s = Proc("serve", "--log-level", "warning", ready="/readyz").start().wait_ready()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ui-screenshots")
    print(f"screenshots: {d}")
    return d


class Page:
    """A browser page that records requests leaving the origin and script errors."""

    def __init__(self, browser, server, viewport):
        self.ctx = browser.new_context(viewport=viewport, accept_downloads=True)
        self.page = self.ctx.new_page()
        self.origin = server.url
        self.foreign: list[str] = []
        self.errors: list[str] = []
        self.page.on("request", self._request)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("console", self._console)
        self.closed = False

    def _console(self, msg) -> None:
        # the browser logs each 4xx answer as an error; those are the API's answers under test
        if msg.type == "error" and "Failed to load resource" not in msg.text:
            self.errors.append(msg.text)

    def _request(self, req) -> None:
        if not req.url.startswith((self.origin + "/", "blob:", "data:")):
            self.foreign.append(req.url)

    def open(self, query: str = "", ready: str | None = None):
        self.page.goto(f"{self.origin}/ui" + (f"?{query}" if query else ""))
        if ready:
            self.wait_ready(ready)
        return self.page

    def wait_ready(self, what: str) -> None:
        self.page.wait_for_selector(f"body[data-ready={what}]", timeout=WAIT_MS)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.ctx.close()
        assert self.foreign == [], f"requests outside the service: {self.foreign}"
        assert self.errors == [], f"script errors: {self.errors}"


@pytest.fixture
def open_page(browser, server):
    pages = []

    def make(viewport=DESKTOP) -> Page:
        pages.append(Page(browser, server, viewport))
        return pages[-1]

    yield make
    for p in pages:
        p.close()


def text(page, selector: str) -> str:
    return page.locator(selector).inner_text().strip()


def test_shared_link_renders_the_answer(server, open_page, shots):
    pg = open_page()
    page = pg.open(urlencode(WORKLOAD), ready="recommend")
    page.wait_for_selector("#chart circle.point")
    rec = httpx.post(server.url + "/v1/recommend", json=WORKLOAD, timeout=30).json()
    cross = httpx.post(server.url + "/v1/crossover", timeout=30, json={
        **{k: v for k, v in WORKLOAD.items() if k != "context_tokens"},
        "context_range": [6400, 3276800], "points": [204800]}).json()
    page.screenshot(path=str(shots / "recommend-1280x800.png"), full_page=True)

    # the answer
    assert text(page, "#answer [data-field=engine] .card-value") == rec["engine"]
    assert text(page, "#answer [data-field=dcp_size] .card-value") == str(rec["dcp_size"])
    assert text(page, "#answer [data-field=mem_fraction] .card-value") == \
        f"{rec['mem_fraction']:.2f}"
    assert rec["mem_fraction_flag"] in text(page, "#answer [data-field=mem_fraction]")
    assert text(page, "#answer [data-field=confidence] .card-value") == rec["confidence"]
    assert text(page, "#answer [data-field=kv_capacity_tokens] .card-value") == \
        f"{rec['kv_capacity_tokens']:,} tokens"
    assert text(page, "#launch") == " ".join(rec["launch_command"])
    pg.ctx.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.url)
    page.click("#copy-launch")
    expect(page.locator("#copy-launch")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == " ".join(rec["launch_command"])
    assert page.locator("#reasons li").all_inner_texts() == rec["reasons"]
    # the chosen configuration's memory flags (Kimi-K3's KDA state: SGLang's pool sized to the
    # batch) and how many run at once with them
    chosen = next(p for p in rec["predictions"]
                  if (p["engine"], p["dcp_size"]) == (rec["engine"], rec["dcp_size"]))
    assert chosen["memory_flags"]
    assert text(page, "#answer [data-field=memory_flags] .card-value") == \
        " ".join(chosen["memory_flags"])
    assert f"{chosen['running_sequences']} of 64 sequences at once" in text(
        page, "#answer [data-field=memory_flags]")

    # the predictions table: one row per prediction, the numbers the API gave; under each row
    # its details (memory flags, state slots, ...), shown on demand
    rows = page.locator("#predictions tr.pred")
    assert rows.count() == len(rec["predictions"])
    groups = page.locator("#predictions tbody")
    details = groups.first.locator("tr.details")
    assert details.is_hidden()
    groups.first.locator("button[aria-controls]").click()
    assert details.is_visible()
    assert groups.first.locator("button[aria-controls]").get_attribute("aria-expanded") == "true"
    for i, p in enumerate(rec["predictions"]):
        row = rows.nth(i)
        assert row.get_attribute("data-engine") == p["engine"]
        assert row.get_attribute("data-dcp") == str(p["dcp_size"])
        shown = float(row.locator("td[data-key=total_s]").get_attribute("data-value"))
        assert math.isclose(shown, p["total_s"], rel_tol=1e-9)
        flags = groups.nth(i).locator("dd[data-key=memory_flags]").text_content()
        assert flags == (" ".join(p["memory_flags"]) or "defaults")
        running = row.locator("td[data-key=running_sequences]").inner_text()
        assert running.startswith(f"{p['running_sequences']:,}")
        status = row.locator("td[data-key=status]").inner_text()
        word = ("calibrated" if p["calibrated"] and not p["extrapolated"] else
                "extrapolated" if p["calibrated"] else
                "transferred" if p["transferred"] else "uncalibrated")
        assert status.strip().removesuffix("recommended").strip() == word, status
        assert ("recommended" in status) == ((p["engine"], p["dcp_size"]) ==
                                             (rec["engine"], rec["dcp_size"]))

    # the chart: one line per curve of /v1/crossover; at the query's context the recommended
    # configuration's point is the API's total; the query and the crossover are marked
    series = page.locator("#chart g.series")
    assert series.count() == len(cross["curves"])
    best = page.locator(f"#chart g.series[data-engine={rec['engine']}]"
                        f"[data-dcp='{rec['dcp_size']}'] circle[data-context='204800']")
    predicted = next(p for p in rec["predictions"]
                     if (p["engine"], p["dcp_size"]) == (rec["engine"], rec["dcp_size"]))
    assert math.isclose(float(best.get_attribute("data-total")), predicted["total_s"],
                        rel_tol=1e-6)
    assert page.locator("#chart path.band").count() >= 1  # intervals shaded
    assert page.locator("#chart .marker-query[data-context='204800']").count() == 1
    if cross["crossover_context_tokens"] is not None:
        marker = page.locator("#chart .marker-crossover").first
        assert int(marker.get_attribute("data-context")) == pytest.approx(
            cross["crossover_context_tokens"], rel=0.1)
    pg.close()


# ---------------------------------------------------------------- geometry and eligibility
def boxes(page, selector: str) -> list[dict]:
    """Each element's text and its box on the screen (a turned element: the box around it)."""
    return page.evaluate("""(sel) => Array.from(document.querySelectorAll(sel)).map((e) => {
        const r = e.getBoundingClientRect();
        return {text: e.textContent, left: r.left, right: r.right, top: r.top,
                bottom: r.bottom};
    })""", selector)


def overlap(a: dict, b: dict) -> bool:
    return (a["left"] < b["right"] and b["left"] < a["right"]
            and a["top"] < b["bottom"] and b["top"] < a["bottom"])


def inside(a: dict, box: dict, slack: float = 0.5) -> bool:
    return (a["left"] >= box["left"] - slack and a["right"] <= box["right"] + slack
            and a["top"] >= box["top"] - slack and a["bottom"] <= box["bottom"] + slack)


def by_width(v: dict) -> str:
    return f"{v['width']}px"


@pytest.mark.parametrize("viewport", [WIDE, FULL_HD, PHONE], ids=by_width)
def test_chart_axis_titles_clear_of_tick_labels(open_page, shots, viewport):
    """Neither axis title runs into a tick label (the time axis' title once lay over its
    labels: "500000" is wider than the fixed margin left for it), and no text leaves the
    chart."""
    pg = open_page(viewport)
    page = pg.open(urlencode(WORKLOAD), ready="recommend")
    page.wait_for_selector("#chart circle.point")
    page.locator("#chart").screenshot(path=str(shots / f"chart-{by_width(viewport)}.png"))
    titles = boxes(page, "#chart svg text.title")
    ticks = boxes(page, "#chart svg text.tick")
    assert len(titles) == 2 and len(ticks) >= 6
    # the time axis' title is the turned one (taller than wide); its longest label is wide
    ytitle = [t for t in titles if t["bottom"] - t["top"] > t["right"] - t["left"]]
    assert len(ytitle) == 1 and "total time" in ytitle[0]["text"]
    assert max(len(k["text"]) for k in ticks) >= 6          # "500000": the case that overlapped
    hits = [(t["text"], k["text"]) for t in titles for k in ticks if overlap(t, k)]
    assert hits == [], f"axis title over tick labels: {hits}"
    svg = boxes(page, "#chart svg")[0]
    assert [t["text"] for t in titles + ticks if not inside(t, svg)] == []
    # the time axis' labels stand between its title and the plot's frame
    frame = boxes(page, "#chart svg rect.frame")[0]
    left_labels = [k for k in ticks if k["right"] <= frame["left"] + 0.5]
    assert left_labels and all(ytitle[0]["right"] < k["left"] for k in left_labels)
    pg.close()


def wrap_geometry(page) -> dict:
    """The predictions table's box (its parent) and what of the table lies outside it."""
    return page.evaluate("""() => {
        const table = document.querySelector('#predictions'), wrap = table.parentElement;
        const w = wrap.getBoundingClientRect();
        const out = Array.from(table.querySelectorAll('th, td'))
            .filter((c) => c.getClientRects().length)
            .filter((c) => { const r = c.getBoundingClientRect();
                             return r.right > w.right + 0.5 || r.left < w.left - 0.5; })
            .map((c) => c.dataset.key || c.className || c.tagName);
        const main = document.querySelector('main').getBoundingClientRect();
        return {scroll: wrap.scrollWidth, client: wrap.clientWidth, outside: out,
                table_right: table.getBoundingClientRect().right, wrap_right: w.right,
                main_right: main.right, page: document.documentElement.scrollWidth,
                window: document.documentElement.clientWidth,
                overflow: getComputedStyle(wrap).overflowX, tabindex: wrap.tabIndex};
    }""")


@pytest.mark.parametrize("viewport", [WIDE, FULL_HD], ids=by_width)
def test_predictions_table_fits_beside_the_form(open_page, shots, viewport):
    """From 1,400 px up the whole table is in view inside its box: no column cut off on the
    right, nothing to scroll to, with every row's details open too."""
    pg = open_page(viewport)
    page = pg.open(urlencode(WORKLOAD), ready="recommend")
    page.locator("#predictions").scroll_into_view_if_needed()
    page.screenshot(path=str(shots / f"predictions-{by_width(viewport)}.png"))
    g = wrap_geometry(page)
    assert g["page"] <= g["window"], g
    assert g["wrap_right"] <= g["main_right"] + 0.5, g
    assert g["scroll"] <= g["client"], f"the table is wider than its box: {g}"
    assert g["table_right"] <= g["wrap_right"] + 0.5 and g["outside"] == [], g
    toggles = page.locator("#predictions button[aria-controls]")
    assert toggles.count() == page.locator("#predictions tr.pred").count()
    for i in range(toggles.count()):
        toggles.nth(i).click()
    expect(page.locator("#predictions tr.details:visible")).to_have_count(toggles.count())
    page.locator("#predictions").screenshot(
        path=str(shots / f"predictions-details-{by_width(viewport)}.png"))
    g = wrap_geometry(page)
    assert g["scroll"] <= g["client"] and g["outside"] == [], g
    pg.close()


def test_predictions_table_scrolls_in_its_box_on_a_phone(open_page):
    """Narrower than the table, its box scrolls sideways (from the keyboard too) and the page
    does not: what is right of the box is reached by scrolling, never cut off."""
    pg = open_page(PHONE)
    page = pg.open(urlencode(WORKLOAD), ready="recommend")
    g = wrap_geometry(page)
    assert g["page"] <= g["window"], g
    assert g["scroll"] > g["client"] and g["overflow"] in ("auto", "scroll"), g
    assert g["tabindex"] >= 0, "the scrolling box cannot take the keyboard focus"
    wrap = page.locator("#predictions-wrap")
    assert wrap.get_attribute("role") == "region" and wrap.get_attribute("aria-label")
    wrap.focus()
    for _ in range(3):
        page.keyboard.press("ArrowRight")
    expect(wrap).not_to_have_js_property("scrollLeft", 0)
    page.evaluate("document.querySelector('#predictions-wrap').scrollLeft = 1e6")
    box = boxes(page, "#predictions-wrap")[0]
    last = boxes(page, "#predictions thead th:last-child")[0]
    assert last["right"] <= box["right"] + 0.5
    pg.close()


@functools.cache
def default_model():
    from engine_advisor.model.fit.default import default_model
    return default_model()


def model_decision(workload: dict):
    """The model's own answer, in this process: its version, whether each configuration may
    be recommended, and the one the speed-up compares with (None: none)."""
    from engine_advisor.model.decision.choose import decide
    from engine_advisor.model.queries import query_for
    from engine_advisor.model.workload import Workload
    model = default_model()
    w = Workload(**workload)
    q = query_for(model, w)
    evals = q.evaluate(w)
    d = decide(q, w, evals)
    eligible = {(e.config.engine, e.config.dcp_size): e.eligible for e in evals}
    rival = (d.rival.config.engine, d.rival.config.dcp_size) if d.rival else None
    return model.version, eligible, rival


ELIGIBILITY_CASES = {
    # vLLM dcp 2, 4 and 8 beat vLLM dcp 1 but lack calibration data on B300 x 8: the speed-up
    # is over vLLM dcp 1 and the table says why the faster three were not chosen
    "calibrated-only": WORKLOAD,
    "allow-extrapolation": {**WORKLOAD, "allow_extrapolation": True},
    # dcp 1 holds no sequence of 3M tokens (the API's exclusions give why); nothing to compare
    "3M-context": {**WORKLOAD, "context_tokens": 3_000_000},
}


@pytest.mark.parametrize("case", ELIGIBILITY_CASES)
def test_eligible_rows_and_the_speedup_baseline(server, open_page, shots, case):
    """The table marks which configurations the recommendation could choose and says why
    the others could not, as the API's predictions say (``eligible``, ``ineligible_reason``);
    the speed-up card names the configuration the API's ``speedup_over`` names, which is
    eligible, is marked in the table, and gives the API's speed-up. The API's fields are the
    model's own decision."""
    workload = ELIGIBILITY_CASES[case]
    rec = httpx.post(server.url + "/v1/recommend", json=workload, timeout=30).json()
    version, eligible, rival = model_decision(workload)
    assert rec["model_version"] == version   # the server answers from the same default model
    preds = {(p["engine"], p["dcp_size"]): p for p in rec["predictions"]}
    assert {k: p["eligible"] for k, p in preds.items()} == eligible
    over = rec["speedup_over"]
    assert (None if over is None else (over["engine"], over["dcp_size"])) == rival
    pg = open_page(WIDE)
    # (the page's links write a set checkbox as "true")
    page = pg.open(urlencode({k: str(v).lower() if isinstance(v, bool) else v
                              for k, v in workload.items()}), ready="recommend")
    assert page.is_checked("#f-allow_extrapolation") == bool(workload.get("allow_extrapolation"))
    page.screenshot(path=str(shots / f"eligibility-{case}.png"), full_page=True)
    excluded = {(x["engine"], x.get("dcp_size")): x["reason"] for x in rec["excluded"]}
    rows = page.locator("#predictions tr[data-engine]")
    assert rows.count() == len(rec["predictions"])
    ineligible = 0
    for i, p in enumerate(rec["predictions"]):
        key = (p["engine"], p["dcp_size"])
        row = rows.nth(i)
        assert (row.get_attribute("data-engine"), row.get_attribute("data-dcp")) == \
            (key[0], str(key[1]))
        assert row.get_attribute("data-eligible") == str(p["eligible"]).lower(), key
        cell = row.locator("td[data-key=eligible]").inner_text()
        assert ("ineligible" in (row.get_attribute("class") or "")) == (not p["eligible"])
        if p["eligible"]:
            assert p["ineligible_reason"] is None
            assert cell.startswith("yes"), (key, cell)
            continue
        ineligible += 1
        assert cell.startswith("no"), (key, cell)
        assert p["ineligible_reason"] in cell, (key, cell)
        if key in excluded:                 # holds no sequence: the API's exclusion says so
            assert p["ineligible_reason"] == excluded[key]
        else:                               # no calibration data for this hardware
            assert not (p["calibrated"] or p["transferred"])
            assert f"not calibrated on {workload['gpu']} x {workload['num_gpus']}" in cell
    caption = page.locator("#predictions caption").inner_text()
    assert (f"{ineligible} of {len(rec['predictions'])} may not be recommended" in caption
            if ineligible else "Each may be recommended" in caption)

    card = page.locator("#answer [data-field=speedup]")
    said = card.inner_text()
    marked = page.locator("#predictions tr[data-engine]:has(.badge.rival)")
    if over is None:
        assert rec["speedup"] is None
        assert text(page, "#answer [data-field=speedup] .card-value") == "–"
        assert "no other eligible configuration" in said and marked.count() == 0
        pg.close()
        return
    engine, dcp = over["engine"], over["dcp_size"]
    assert preds[(engine, dcp)]["eligible"]
    assert (card.get_attribute("data-engine"), card.get_attribute("data-dcp")) == \
        (engine, str(dcp))
    assert f"vs {engine} dcp {dcp}" in said
    assert ("of another engine" in said) == (engine != rec["engine"])
    best = preds[(rec["engine"], rec["dcp_size"])]
    assert math.isclose(preds[(engine, dcp)]["total_s"] / best["total_s"], rec["speedup"],
                        rel_tol=1e-9)
    assert text(page, "#answer [data-field=speedup] .card-value") == f"{rec['speedup']:.2f}×"
    # the compared configuration is marked in the table, and it alone
    assert marked.count() == 1
    assert (marked.get_attribute("data-engine"), marked.get_attribute("data-dcp")) == \
        (engine, str(dcp))
    assert marked.get_attribute("data-eligible") == "true"
    # faster configurations of that engine that were not eligible: named by the card, and
    # marked not eligible in the table
    faster = [k for k, p in preds.items() if not p["eligible"] and k[0] == engine
              and p["total_s"] < preds[(engine, dcp)]["total_s"]]
    if case == "calibrated-only":
        assert faster, "the case the issue is about: a faster vLLM configuration not eligible"
    if faster:
        assert "Faster but not eligible" in said
        for k in faster[:3]:
            assert f"{k[0]} dcp {k[1]}" in said
            row = page.locator(f"#predictions tr[data-engine={k[0]}][data-dcp='{k[1]}']")
            assert row.get_attribute("data-eligible") == "false"
    else:
        assert "not eligible" not in said
    pg.close()


def test_bad_value_shows_the_error_next_to_its_field(server, open_page, shots):
    pg = open_page()
    page = pg.open(urlencode({**WORKLOAD, "context_tokens": 0}), ready="recommend")
    api = httpx.post(server.url + "/v1/recommend", json={**WORKLOAD, "context_tokens": 0},
                     timeout=30).json()["error"]
    assert api["param"] == "context_tokens"
    err = page.locator("#err-f-context_tokens")
    assert err.is_visible() and err.inner_text() == api["message"]
    assert page.get_attribute("#f-context_tokens", "aria-invalid") == "true"
    assert "err-f-context_tokens" in page.get_attribute("#f-context_tokens", "aria-describedby")
    assert page.evaluate("document.activeElement.id") == "f-context_tokens"
    assert page.locator("#rec-result").is_hidden()

    # fixed from the keyboard: the error goes, the answer comes
    page.fill("#f-context_tokens", "65536")
    page.press("#f-context_tokens", "Enter")
    page.wait_for_selector("#rec-result:not([hidden])", timeout=WAIT_MS)
    assert err.is_hidden()
    assert "context_tokens=65536" in page.url

    # a nested field (inside the Requirements section, opened from the keyboard)
    page.focus("details > summary")
    page.keyboard.press("Enter")
    page.fill("#f-prefix_reuse_share", "2")
    page.click("#submit")
    nested = page.locator("#err-f-prefix_reuse_share")
    nested.wait_for(state="visible", timeout=WAIT_MS)
    assert "requirements.prefix_reuse_share" in nested.inner_text()
    page.screenshot(path=str(shots / "field-error.png"))

    # a link with a preset the page does not list: the API's message, at the preset field
    page = pg.open(urlencode({**WORKLOAD, "preset": "no-such-model"}), ready="recommend")
    preset = page.locator("#err-f-preset")
    preset.wait_for(state="visible", timeout=WAIT_MS)
    assert "unknown preset 'no-such-model'" in preset.inner_text()
    pg.close()


def test_planning_gives_nodes(server, open_page, shots):
    pg = open_page()
    page = pg.open(urlencode({k: v for k, v in WORKLOAD.items()
                              if k not in ("context_tokens", "output_tokens", "batch_size")}),
                   ready="form")
    # switch views from the keyboard: arrow keys move along the tabs
    page.focus("#tab-recommend")
    page.keyboard.press("ArrowRight")
    assert page.evaluate("document.activeElement.id") == "tab-plan"
    assert page.locator("#view-plan").is_visible()
    with page.expect_request("**/v1/plan") as sent:
        page.click("#submit")
    pg.wait_ready("plan")
    body = json.loads(sent.value.post_data)
    want = httpx.post(server.url + "/v1/plan", json=body, timeout=60).json()
    assert want["total_nodes"] > 0
    assert text(page, "[data-field=total_nodes] .card-value") == f"{want['total_nodes']:,}"
    assert text(page, "[data-field=total_gpus] .card-value") == f"{want['total_gpus']:,}"
    rows = page.locator("#plan-table tbody tr")
    assert rows.count() == len(want["classes"])
    for i, c in enumerate(want["classes"]):
        row = rows.nth(i)
        assert row.locator("td[data-key=engine]").inner_text() == c["engine"]
        assert row.locator("td[data-key=nodes]").inner_text() == f"{c['nodes']:,}"
    page.screenshot(path=str(shots / "plan-1280x800.png"), full_page=True)

    # the plan's link renders the same plan at once
    link = page.url
    assert "view=plan" in link and "classes=" in link
    again = open_page()
    page2 = again.page
    page2.goto(link)
    again.wait_ready("plan")
    assert text(page2, "[data-field=total_nodes] .card-value") == f"{want['total_nodes']:,}"
    again.close()
    pg.close()


def test_model_view(server, open_page):
    pg = open_page()
    page = pg.open("view=model", ready="model")
    info = httpx.get(server.url + "/v1/model", timeout=30).json()
    assert text(page, "#model-result [data-field=model_version]") == info["model_version"]
    assert text(page, "#model-result [data-field=source]") == info["source"]
    ranges = page.locator("#model-calibrated_ranges tbody tr")
    assert ranges.count() == len(info["calibrated_ranges"])
    assert page.locator("#model-fit_metrics tbody tr").count() == len(info["fit_metrics"])
    pg.close()


def test_download_deployment_file(server, open_page):
    pg = open_page()
    page = pg.open(urlencode(WORKLOAD), ready="recommend")
    page.fill("#f-image_tag", "v0.11.0")
    with page.expect_download() as dl:
        page.click("[data-deploy=k8s]")
    got = Path(dl.value.path()).read_text(encoding="utf-8")
    want = httpx.post(server.url + "/v1/deploy", params={"format": "k8s", "image_tag": "v0.11.0"},
                      json=WORKLOAD, timeout=30)
    assert want.status_code == 200 and got == want.text
    assert [d["kind"] for d in yaml.safe_load_all(got)] == ["Deployment", "Service"]
    # a bad tag: the API's error appears at the tag field, nothing is downloaded
    page.fill("#f-image_tag", "bad tag")
    page.click("[data-deploy=compose]")
    err = page.locator("#err-f-image_tag")
    err.wait_for(state="visible", timeout=WAIT_MS)
    assert "image_tag" in err.inner_text()
    pg.close()


def test_phone_width_labels_and_keyboard(server, open_page, shots):
    pg = open_page(PHONE)
    page = pg.open(urlencode(WORKLOAD), ready="recommend")
    page.wait_for_selector("#chart circle.point")
    page.screenshot(path=str(shots / "recommend-390x844.png"), full_page=True)
    # nothing wider than the screen: no sideways scrolling of the page (tables scroll inside)
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    # the chart is drawn at the phone's width, so its text keeps a readable size
    width = page.evaluate("document.querySelector('#chart svg').getBoundingClientRect().width")
    view = page.evaluate("document.querySelector('#chart svg').viewBox.baseVal.width")
    assert abs(width - view) < 2
    # turned to landscape: the chart is drawn again at the new width
    page.set_viewport_size({"width": 844, "height": 390})
    expect(page.locator("#chart svg")).not_to_have_attribute("viewBox", f"0 0 {view:g} 300")
    assert page.locator("#chart circle.point").count() > 0
    # every form control has a label
    unlabeled = page.evaluate("""Array.from(document.querySelectorAll('input, select, textarea'))
        .filter((e) => e.type !== 'hidden' && !e.labels.length && !e.getAttribute('aria-label'))
        .map((e) => e.id || e.name)""")
    assert unlabeled == []
    # Tab reaches the context field, and each focused control shows a focus ring
    page.focus("#f-num_gpus")
    seen = []
    for _ in range(8):
        page.keyboard.press("Tab")
        seen.append(page.evaluate("document.activeElement.id"))
        if seen[-1] == "f-context_tokens":
            break
    assert "f-context_tokens" in seen, seen
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline not in ("", "none")
    pg.close()


def test_hf_config_pasted_or_uploaded(server, open_page, tmp_path):
    from engine_advisor.model.arch.presets import preset_config
    cfg = {k: v for k, v in preset_config("kimi-k3").items() if k != "_source"}
    workload = {k: v for k, v in WORKLOAD.items() if k != "preset"}
    pg = open_page()
    page = pg.open(urlencode({**workload, "source": "hf_config"}), ready="recommend")
    # no config yet: the page says so at the config field, without calling the API
    assert "config.json" in page.locator("#err-f-hf_config").inner_text()
    f = tmp_path / "config.json"
    f.write_text(json.dumps(cfg), encoding="utf-8")
    page.set_input_files("#f-hf_file", str(f))
    expect(page.locator("#f-hf_config")).not_to_have_value("")
    with page.expect_request("**/v1/recommend") as sent:
        page.click("#submit")
    page.wait_for_selector("#rec-result:not([hidden])", timeout=WAIT_MS)
    assert json.loads(sent.value.post_data)["hf_config"] == cfg
    rec = httpx.post(server.url + "/v1/recommend", json={**workload, "hf_config": cfg},
                     timeout=30).json()
    assert text(page, "#answer [data-field=engine] .card-value") == rec["engine"]
    # a config the API cannot use: its message, under the config field
    page.fill("#f-hf_config", json.dumps({"num_hidden_layers": 61}))
    page.click("#submit")
    err = page.locator("#err-f-hf_config")
    err.wait_for(state="visible", timeout=WAIT_MS)
    api = httpx.post(server.url + "/v1/recommend", timeout=30,
                     json={**workload, "hf_config": {"num_hidden_layers": 61}}).json()["error"]
    assert api["param"].startswith("hf_config") and err.inner_text() == api["message"]
    page.fill("#f-hf_config", "{not json")
    page.click("#submit")
    expect(page.locator("#err-f-hf_config")).to_contain_text("not valid JSON")
    pg.close()
