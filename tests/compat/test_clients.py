"""The engines' own benchmark clients against ``engine-advisor sim``, their result files through
``calibrate import``, compared with ``calibrate run`` on the same simulator.

``vllm bench serve`` (vLLM) and ``python -m sglang.bench_serving`` (SGLang) run from the
virtual environments ``tests/compat/build_clients.sh`` builds (``$EA_COMPAT_DIR``, default
``/tmp/ea-compat``); without them these tests skip. Every client and the simulator use the same
small tokenizer (``data/tokenizer``), so prompt counts agree. Each case: 8 requests of 2,048
prompt and 32 output tokens, all in flight at once, against a simulator at time scale 1 (real
time: the loopback overheads stay far below the measured times), then the same point with
``calibrate run``: TTFT (the batch's last first token), mean TPOT and total time agree within
3 %.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from simproc import SimProcess

from calibration.importers import Defaults, import_files
from model.dataset import read_csv

pytestmark = [pytest.mark.compat, pytest.mark.timeout(600)]

COMPAT = Path(os.environ.get("EA_COMPAT_DIR", "/tmp/ea-compat"))
VLLM_BIN = COMPAT / "vllm" / "bin" / "vllm"
SGLANG_PY = COMPAT / "sglang" / "bin" / "python"
TOKENIZER = Path(__file__).parent / "data" / "tokenizer"
MODEL = "compat-model"
CONTEXT, OUTPUT, BATCH = 2048, 32, 8
KV = 70272
TOLERANCE = 0.03
SIM = ["--time-scale", "1", "--model-name", MODEL, "--tokenizer",
       str(TOKENIZER / "tokenizer.json"), "--disable-prefix-caching", "--max-model-len", "16384"]
CLIENT_ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
              "TOKENIZERS_PARALLELISM": "false"}

@pytest.fixture(scope="module", params=["vllm", "sglang"])
def sim(request, tmp_path_factory):
    with SimProcess("--engine", request.param, *SIM, timeout=120) as s:
        s.engine = request.param
        s.reference = _calibrate_run(s, tmp_path_factory.mktemp(f"ref-{request.param}"))
        yield s


def _calibrate_run(s: SimProcess, out: Path):
    from cli.main import main

    code = main(["calibrate", "run", "--engine", s.engine, "--url", s.url, "--contexts",
                 str(CONTEXT), "--batch-sizes", str(BATCH), "--output-tokens", str(OUTPUT),
                 "--kv-bytes-per-token", str(KV), "--out", str(out), "--no-progress"])
    assert code == 0
    (row,) = read_csv(out / "dataset.csv")
    return row


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=540, cwd=cwd,
                       env=CLIENT_ENV)
    assert r.returncode == 0, f"{' '.join(argv)}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def _vllm_client(s: SimProcess, backend: str, tmp: Path) -> Path:
    out = tmp / "vllm-result.jsonl"
    _run([str(VLLM_BIN), "bench", "serve", "--backend", backend, "--base-url", s.url,
          "--endpoint", "/v1/chat/completions" if backend == "openai-chat" else
          "/v1/completions", "--model", MODEL, "--tokenizer", str(TOKENIZER),
          "--dataset-name", "random", "--random-input-len", str(CONTEXT),
          "--random-output-len", str(OUTPUT), "--random-range-ratio", "0",
          "--num-prompts", str(BATCH), "--max-concurrency", str(BATCH), "--ignore-eos",
          "--save-result", "--save-detailed", "--append-result", "--result-dir", str(tmp),
          "--result-filename", out.name, "--metadata", "version=sim-compat", "--disable-tqdm"],
         tmp)
    return out


def _sglang_client(s: SimProcess, backend: str, tmp: Path) -> Path:
    out = tmp / "sglang-result.jsonl"
    extra = ["--flush-cache"] if backend == "sglang" else []
    _run([str(SGLANG_PY), "-m", "sglang.bench_serving", "--backend", backend,
          "--base-url", s.url, "--model", MODEL, "--tokenizer", str(TOKENIZER),
          "--dataset-name", "random-ids", "--tokenize-prompt", "--random-input-len",
          str(CONTEXT), "--random-output-len", str(OUTPUT), "--random-range-ratio", "1",
          "--num-prompts", str(BATCH), "--max-concurrency", str(BATCH), "--output-file",
          str(out), "--output-details", "--disable-tqdm", *extra], tmp)
    return out


CASES = [("vllm", "vllm", "vllm"), ("vllm", "openai", "sglang"),
         ("sglang", "sglang", "sglang"), ("sglang", "sglang-oai", "sglang"),
         ("sglang", "vllm", "vllm")]


@pytest.mark.parametrize("client, backend, flavour", CASES,
                         ids=[f"{c}-client-{b}-on-{f}" for c, b, f in CASES])
def test_client_file_imports_and_agrees_with_calibrate_run(sim, client, backend, flavour,
                                                           tmp_path):
    if sim.engine != flavour:
        pytest.skip(f"this case runs against the {flavour} simulator")
    if client == "vllm":
        if not VLLM_BIN.exists():
            pytest.skip(f"no vLLM client at {VLLM_BIN} (run tests/compat/build_clients.sh)")
        path, fmt = _vllm_client(sim, backend, tmp_path), "vllm-bench"
    else:
        if not SGLANG_PY.exists():
            pytest.skip(f"no SGLang client at {SGLANG_PY} (run tests/compat/build_clients.sh)")
        path, fmt = _sglang_client(sim, backend, tmp_path), "sglang-bench"
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
