"""The /ui page in a real browser: headless Debian Chromium driven by Playwright, against a real
``engine-advisor serve`` on loopback. Each check compares what the page shows with the REST
API's own answer. Screenshots go to a temporary directory (printed on failure)."""

from __future__ import annotations

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

    # the predictions table: one row per prediction, the numbers the API gave
    rows = page.locator("#predictions tbody tr")
    assert rows.count() == len(rec["predictions"])
    for i, p in enumerate(rec["predictions"]):
        row = rows.nth(i)
        assert row.get_attribute("data-engine") == p["engine"]
        assert row.get_attribute("data-dcp") == str(p["dcp_size"])
        shown = float(row.locator("td[data-key=total_s]").get_attribute("data-value"))
        assert math.isclose(shown, p["total_s"], rel_tol=1e-9)
        flags = row.locator("td[data-key=memory_flags]").inner_text()
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
