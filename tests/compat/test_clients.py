"""The engines' own benchmark clients against ``engine-advisor sim``, their result files through
``calibrate import``, compared with ``calibrate run`` on the same simulator.

``vllm bench serve`` (vLLM) and ``python -m sglang.bench_serving`` (SGLang) run from the
virtual environments ``tests/compat/build_clients.sh`` builds (``$EA_COMPAT_DIR``, default
``/tmp/ea-compat``); without them (or with half of one) these tests skip. Every client and the
simulator use the same small tokenizer (``data/tokenizer``), so prompt counts agree.

Each case: 8 requests of 2,048 prompt and 32 output tokens, all in flight at once, then the
same point with ``calibrate run``: TTFT (first send -> the batch's last first token), mean and
median TPOT and total time agree within 3 %. Like with like:

- the served model is the ``kimi-k3`` preset, so the cost model's physical terms apply: a
  prefill of 8 x 2,048 tokens takes ~0.41 s (vLLM flavour; 0.45 s SGLang), a decode step 11 ms
  (74 ms), at time scale 2 twice that in wall time: far above what a request costs the
  simulator and the client on a busy machine (``/sim/info`` ``time_resolution``; the test
  checks ``calibrate run`` measured above ten times that overhead per request in flight);
- both send all 8 at once; the simulator's HTTP layer hands them to the engine one by one
  (several ms each to parse and tokenize), so an admit window (400 ms, shorter than the scaled
  prefill) gathers them into one prefill timed from the first one's receipt: the admitted
  group and its start do not depend on how fast each client sends or the simulator parses;
- SGLang's client sends one warm-up request first (vLLM's sends none: its ready check is off
  by default); it finishes before the batch, which starts on an idle engine as
  ``calibrate run``'s does;
- the simulator counts the prompt tokens the file records (checked on its ``/metrics``):
  SGLang's text backends read ``data/prompts.json``, whose text re-encodes exactly.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import subprocess
from pathlib import Path

import httpx
import pytest
from proc import Proc, start_all

from engine_advisor.calibration.sweep.honesty import overhead_warnings, resolution_of
from engine_advisor.calibration.sweep.importers import Defaults, import_files
from engine_advisor.model.fit.dataset import read_csv

pytestmark = [pytest.mark.compat, pytest.mark.timeout(600)]

HERE = Path(__file__).parent
COMPAT = Path(os.environ.get("EA_COMPAT_DIR", "/tmp/ea-compat"))
VLLM_BIN = COMPAT / "vllm" / "bin" / "vllm"
SGLANG_PY = COMPAT / "sglang" / "bin" / "python"
CLIENTS = {"vllm": ("vllm==0.33.0", "vllm-client.txt"),
           "sglang": ("sglang==0.5.23", "sglang-client.txt")}
TOKENIZER = HERE / "data" / "tokenizer"
PROMPTS = HERE / "data" / "prompts.json"     # make_tokenizer.py writes it
MODEL = "kimi-k3"      # a preset: weights and FLOPs known, so prefill and decode are physical
CONTEXT, OUTPUT, BATCH = 2048, 32, 8
KV = 27648             # kimi-k3's KV bytes per token (the simulator's default)
TOLERANCE = 0.03
SCALE = "4"            # wall = simulated x 4: TTFT ~1.6 s, a decode step 44 ms (vLLM flavour)
WINDOW_MS = 800        # below the scaled prefill, so it adds no time (sim/engine.py)
SIM = ["--time-scale", SCALE, "--model-name", MODEL, "--tokenizer",
       str(TOKENIZER / "tokenizer.json"), "--disable-prefix-caching", "--max-model-len", "16384",
       "--admit-window-ms", str(WINDOW_MS)]
RESULTS: list[dict] = []          # for docs/clients.md (EA_COMPAT_RESULTS=FILE writes them)
CLIENT_ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
              "TOKENIZERS_PARALLELISM": "false"}


def missing_client(name: str) -> str | None:
    """Why the ``name`` client cannot run (None: it can). An environment counts only once
    build_clients.sh finished it: its ``.built`` holds the hash of the package list it was
    built from (a build cut short, or from another list, would fail instead of skip)."""
    main, listing = CLIENTS[name]
    built = COMPAT / name / ".built"
    want = hashlib.sha256(f"{main}\n".encode() + (HERE / listing).read_bytes()).hexdigest()
    if not built.is_file():
        return f"no finished {name} client under {COMPAT} (run tests/compat/build_clients.sh)"
    if built.read_text().strip() != want:
        return (f"the {name} client under {COMPAT} was built from another package list "
                "(run tests/compat/build_clients.sh again)")
    return None


@pytest.fixture(scope="module")
def sim(request, tmp_path_factory):
    (s,) = start_all(Proc("sim", "--engine", request.param, *SIM), timeout=120)
    try:
        s.engine = request.param
        s.reference, s.reference_tpots = _calibrate_run(
            s, tmp_path_factory.mktemp(f"ref-{request.param}"))
        # what is compared is simulated time, not request handling: the measured TTFT and TPOT
        # are above ten times the simulator's overhead per request in flight, and the admit
        # window closes before the prefill ends
        res = resolution_of(httpx.get(s.url + "/sim/info", timeout=30).json())
        assert res and overhead_warnings(s.reference, res) == [], (res, s.reference)
        assert s.reference.ttft_s > WINDOW_MS / 1e3 * 1.2, s.reference
        yield s
    finally:
        s.stop()


def _calibrate_run(s: Proc, out: Path):
    from engine_advisor.cli.main import main

    code = main(["calibrate", "run", "--engine", s.engine, "--url", s.url, "--contexts",
                 str(CONTEXT), "--batch-sizes", str(BATCH), "--output-tokens", str(OUTPUT),
                 "--kv-bytes-per-token", str(KV), "--prompt", "text", "--out", str(out),
                 "--no-progress"])
    assert code == 0
    (row,) = read_csv(out / "dataset.csv")
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    return row, [x["tpot_s"] for x in samples if x["ok"]]


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=540, cwd=cwd,
                       env=CLIENT_ENV)
    assert r.returncode == 0, f"{' '.join(argv)}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def _vllm_client(s: Proc, backend: str, tmp: Path) -> Path:
    out = tmp / "vllm-result.jsonl"
    r = _run([str(VLLM_BIN), "bench", "serve", "--backend", backend, "--base-url", s.url,
          "--endpoint", "/v1/chat/completions" if backend == "openai-chat" else
          "/v1/completions", "--model", MODEL, "--tokenizer", str(TOKENIZER),
          "--dataset-name", "random", "--random-input-len", str(CONTEXT),
          "--random-output-len", str(OUTPUT), "--random-range-ratio", "0",
          "--num-prompts", str(BATCH), "--max-concurrency", str(BATCH), "--ignore-eos",
          "--save-result", "--save-detailed", "--append-result", "--result-dir", str(tmp),
          "--result-filename", out.name, "--metadata", "version=sim-compat", "--disable-tqdm"],
         tmp)
    assert "tokenizer mismatch" not in r.stdout + r.stderr      # same tokenizer, same counts
    return out


def _sglang_client(s: Proc, backend: str, tmp: Path) -> Path:
    out = tmp / "sglang-result.jsonl"
    if backend == "sglang":     # native /generate: token ids (--tokenize-prompt), exact counts
        data = ["--dataset-name", "random-ids", "--tokenize-prompt", "--flush-cache"]
    else:   # text: prompts of one-token words, which re-encode to the count the file records
        data = ["--dataset-name", "random", "--dataset-path", str(PROMPTS)]
    _run([str(SGLANG_PY), "-m", "sglang.bench_serving", "--backend", backend,
          "--base-url", s.url, "--model", MODEL, "--tokenizer", str(TOKENIZER), *data,
          "--random-input-len", str(CONTEXT), "--random-output-len", str(OUTPUT),
          "--random-range-ratio", "1", "--num-prompts", str(BATCH), "--max-concurrency",
          str(BATCH), "--output-file", str(out), "--output-details", "--disable-tqdm"], tmp)
    return out


def _prompt_tokens(s: Proc) -> int:
    """The simulator's count of prompt tokens it prefilled, from its /metrics."""
    text = httpx.get(s.url + "/metrics", timeout=30).text
    for line in text.splitlines():
        if line.startswith(f"{s.engine}:prompt_tokens_total"):
            return round(float(line.rsplit(" ", 1)[1]))
    raise AssertionError(f"no {s.engine}:prompt_tokens_total in /metrics")


CASES = [("vllm", "vllm", "vllm"), ("vllm", "openai", "sglang"),
         ("sglang", "sglang", "sglang"), ("sglang", "sglang-oai", "sglang"),
         ("sglang", "vllm", "vllm")]


def _case(client: str, backend: str, flavour: str):
    why = missing_client(client)
    return pytest.param(client, backend, flavour,
                        marks=pytest.mark.skipif(why is not None, reason=why or ""),
                        id=f"{client}-client-{backend}-on-{flavour}")


@pytest.mark.flaky(reruns=2)  # wall-clock timing on shared CPUs
@pytest.mark.parametrize("client, backend, sim", [_case(*c) for c in CASES], indirect=["sim"])
def test_client_file_imports_and_agrees_with_calibrate_run(sim, client, backend, tmp_path):
    flavour = sim.engine
    before = _prompt_tokens(sim)
    if client == "vllm":
        path, fmt = _vllm_client(sim, backend, tmp_path), "vllm-bench"
    else:
        path, fmt = _sglang_client(sim, backend, tmp_path), "sglang-bench"
    # the simulator prefilled what the file records: the batch (and SGLang's one warm-up
    # request; vLLM 0.33's ready check with a test prompt is off by default), CONTEXT tokens each
    warmups = 1 if client == "sglang" else 0
    assert _prompt_tokens(sim) - before == (BATCH + warmups) * CONTEXT
    raw = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert len(raw) == 1 and raw[0]["completed"] == BATCH
    assert all(not e for e in raw[0].get("errors") or [])
    (row,) = import_files([str(path)], fmt, Defaults(kv_bytes_per_token=KV,
                                                     engine=flavour))
    ref = sim.reference
    assert (row.context_tokens, row.output_tokens, row.batch_size) == (CONTEXT, OUTPUT, BATCH)
    if client == "sglang":      # server_info of the SGLang flavour fills the row
        info = raw[0]["server_info"]
        if flavour == "sglang":
            assert info["dcp_size"] == row.dcp_size and row.engine_version == info["version"]
    else:
        assert row.engine_version == "sim-compat"      # --metadata version=...
    for name in ("ttft_s", "tpot_s", "total_s"):
        got, want = getattr(row, name), getattr(ref, name)
        assert got == pytest.approx(want, rel=TOLERANCE), (name, got, want)
    # and the decode speed alone: the median request's TPOT
    got, want = _median_tpot(raw[0]), statistics.median(sim.reference_tpots)
    assert got == pytest.approx(want, rel=TOLERANCE), ("median TPOT", got, want)
    RESULTS.append({"client": client, "backend": backend, "simulator": flavour,
                    "ttft_s": row.ttft_s, "ref_ttft_s": ref.ttft_s, "total_s": row.total_s,
                    "ref_total_s": ref.total_s, "median_tpot_s": got, "ref_median_tpot_s": want,
                    "mean_tpot_s": row.tpot_s, "ref_mean_tpot_s": ref.tpot_s})
    out = os.environ.get("EA_COMPAT_RESULTS")
    if out:
        Path(out).write_text(json.dumps(RESULTS, indent=1) + "\n")


def _median_tpot(obj: dict) -> float:
    return statistics.median(sum(gaps) / (n - 1) for gaps, n in zip(obj["itls"],
                                                                    obj["output_lens"],
                                                                    strict=True))
