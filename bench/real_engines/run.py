#!/usr/bin/env python3
"""Measure real vLLM and SGLang on one GPU with dummy weights: the shipped H200 datasets.

Runs on the GPU machine with the machine's own python3 and only the standard library; the
engines and engine-advisor's dependencies come from wheel sets installed into their own folders
(``install``). It serves each (engine, preset) in turn, alone on the GPU, from a folder written
by ``engine-advisor calibrate model-dir`` (random weights: ``--load-format dummy``), sweeps it
with ``engine-advisor calibrate run --url --preset P --load-format dummy --engine-log LOG`` over
a sparse grid (one run folder per context; each sweep warms the engine up before timing and
records the engine's facts and the JIT compiles its log shows), saves its start-up log,
``/metrics`` and server info, and stops it.

    python3 bench/real_engines/run.py install PARTS_DIR      # cat parts | tar x; pip --target
    python3 bench/real_engines/run.py unpack PARTS_DIR ZSTANDARD_WHEEL   # or: installed folders
    setsid python3 bench/real_engines/run.py all --res /tmp/res > /tmp/res/driver.log 2>&1 &
    # several GPUs (issue 27): deepseek-v2-lite at TP 8, DCP 1, 2, 4, 8, both engines
    setsid python3 bench/real_engines/run.py all --tp 8 --res /tmp/res > /tmp/res/driver.log 2>&1 &
    python3 bench/real_engines/run.py wait --res /tmp/res --seconds 540   # poll; archive

``--engine-cmd`` replaces the engine commands (tests/calibration/test_real_engines_driver.py
runs this script against ``engine-advisor sim``). docs/real-engines.md says how to do the same on
a node where ``pip install vllm`` works. The folders of 2026-12-01 in bench/data/h200-real/ were
measured before the sweep recorded decode steps and facts itself: rebuild_real.py re-derives
them.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import tarfile
import time
import urllib.request

REPO = pathlib.Path(__file__).resolve().parents[2]
SITES = {"vllm": "/tmp/vl", "sglang": "/tmp/sg"}
PRESETS = {"deepseek-v2-lite": {"kv": 31104, "max_len": 135168},
           "llama-3.1-8b": {"kv": 131072, "max_len": 131072},
           "qwen3-32b": {"kv": 262144, "max_len": 40960},
           "qwen3-30b-a3b": {"kv": 98304, "max_len": 40960},
           "mixtral-8x7b": {"kv": 131072, "max_len": 32768},
           # hybrids (issue 42): Gated DeltaNet and Mamba2 layers beside full attention
           "qwen3-next-80b-a3b-fp8": {"kv": 24576, "max_len": 262144, "hybrid": True},
           "nemotron-3-nano-30b-a3b": {"kv": 6144, "max_len": 262144, "hybrid": True}}
ORDER = [("sglang", "deepseek-v2-lite"), ("vllm", "deepseek-v2-lite"),
         ("sglang", "llama-3.1-8b"), ("vllm", "llama-3.1-8b")]
FRACTION = 0.90
OUTPUT_TOKENS = 128
# context -> batch sizes: 1K-128K x 1-64, every batch's KV within both models' capacity at 0.90,
# about 3M prompt tokens per engine and model (two minutes on an H200)
GRID = {1024: [1, 8, 32, 64], 4096: [1, 16, 64], 16384: [1, 8, 32], 32768: [1, 16],
        65536: [1, 8], 130000: [1, 4]}
# hybrids: 1K-256K x 1-64, a batch above the running-sequence limit of both engines (vLLM
# launched with --max-num-seqs HYBRID_MAX_SEQS, SGLang's limit from its state pool) and, where
# it costs minutes not tens of minutes, one whose KV does not fit either engine (Qwen3-Next:
# 80 x 32K), so that admission and queueing are measured
HYBRID_GRID = {1024: [1, 16, 64, 192], 16384: [1, 16], 65536: [1, 8], 131072: [1],
               260000: [1]}
HYBRID_GRIDS = {"qwen3-next-80b-a3b-fp8": {**HYBRID_GRID, 32768: [80]}}
# vLLM 0.26.0 ran out of memory capturing CUDA graphs for a hybrid at its default max_num_seqs
HYBRID_MAX_SEQS = 128
# issue 27 (DCP on several GPUs): deepseek-v2-lite at TP = the GPUs, each DCP size up to it
DCP_GRID = {8192: [1, 8, 32, 64], 32768: [1, 8, 32, 64], 131072: [1, 8, 32, 64]}
COMMANDS = {
    "vllm": "python3 -m vllm.entrypoints.cli.main serve {dir} --load-format dummy "
            "--served-model-name {preset} --gpu-memory-utilization {fraction} "
            "--max-model-len {max_len} --host 127.0.0.1 --port {port} "
            "--tensor-parallel-size {tp} --decode-context-parallel-size {dcp}",
    "sglang": "python3 -m sglang.launch_server --model-path {dir} --load-format dummy --tp {tp} "
              "--mem-fraction-static {fraction} --context-length {max_len} "
              "--served-model-name {preset} --host 127.0.0.1 --port {port} --enable-metrics "
              "--cuda-graph-max-bs 64{dcp_flag}",
}
EXTRA_FLAGS = {("vllm", True): f" --max-num-seqs {HYBRID_MAX_SEQS}"}    # (engine, hybrid)
# (engine, preset) -> environment. FP8 block weights: vLLM without its DeepGEMM warm-up, which
# compiled over a thousand kernel shapes past the start-up timeout (it then runs its CUTLASS
# block-FP8 GEMM on Hopper). SGLang keeps DeepGEMM, its default block-FP8 GEMM on Hopper (with
# SGLANG_ENABLE_JIT_DEEPGEMM=0 it ran its Triton kernel at an untuned default configuration),
# compiling at first use the shapes it meets instead of every M up to 16K at start-up; its
# CUDA-graph captures (decode batches 1-64, prefill passes up to 8,192 tokens) meet every
# shape the sweep runs
ENGINE_ENV = {("vllm", "qwen3-next-80b-a3b-fp8"): {"VLLM_USE_DEEP_GEMM": "0"},
              ("sglang", "qwen3-next-80b-a3b-fp8"): {"SGLANG_JIT_DEEPGEMM_PRECOMPILE": "0",
                                                     "SGLANG_JIT_DEEPGEMM_FAST_WARMUP": "1",
                                                     "SGLANG_JIT_DEEPGEMM_COMPILE_WORKERS": "16"}}
# NVLink multicast stays off on shared hosts (it can take the host's GPUs out of service)
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}


def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, flush=True)


def install(parts: pathlib.Path) -> None:
    """Join the parts, unpack the wheels, install each engine's set into its own folder."""
    tmp = pathlib.Path("/tmp/wheels")
    tmp.mkdir(exist_ok=True)
    with open("/tmp/w.tar", "wb") as out:
        for p in sorted(parts.glob("part*")):
            out.write(p.read_bytes())
    with tarfile.open("/tmp/w.tar") as t:
        t.extractall(tmp, filter="data")
    procs = []
    for engine, site in SITES.items():       # both sets at once
        names = (tmp / f"{engine}.txt").read_text().split()
        log(f"installing {len(names)} wheels for {engine} into {site}")
        procs.append(subprocess.Popen([sys.executable, "-m", "pip", "install", "-q",
                                       "--no-index", "--no-deps", "--no-compile",
                                       "--no-cache-dir", "--target", site,
                                       *[str(tmp / n) for n in names]]))
    if any(p.wait() for p in procs):
        raise SystemExit("pip install failed")
    log("installed")


def unpack(parts: pathlib.Path, wheel: pathlib.Path) -> None:
    """Join the parts of a zstd-compressed tar of installed folders (``vl/`` and or ``sg/``,
    each ``pip install --target`` made where pip works) and unpack it into /tmp. The machine has
    no ``zstd`` program: the ``zstandard`` wheel decompresses (a window of up to 2 GiB, for
    archives compressed with ``--long``)."""
    site = pathlib.Path("/tmp/zs")
    if not (site / "zstandard").exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        "--target", str(site), str(wheel)], check=True)
    sys.path.insert(0, str(site))
    import zstandard

    class Joined:                       # the parts as one stream, without a joined copy
        def __init__(self, files):
            self.files = iter(files)
            self.f = None

        def read(self, n=-1):
            while True:
                if self.f is None:
                    nxt = next(self.files, None)
                    if nxt is None:
                        return b""
                    self.f = open(nxt, "rb")
                data = self.f.read(n)
                if data:
                    return data
                self.f.close()
                self.f = None

    files = sorted(parts.glob("part*"))
    log(f"unpacking {len(files)} parts of {parts}")
    reader = zstandard.ZstdDecompressor(max_window_size=2 ** 31).stream_reader(Joined(files))
    with tarfile.open(fileobj=reader, mode="r|") as t:
        t.extractall("/tmp", filter="data")
    log("unpacked")


def get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""
    except (OSError, ValueError):
        return 0, b""


def ea(*args: str) -> list[str]:
    """An engine-advisor command (run with ``ea_env``: the vLLM set's dependencies)."""
    return [sys.executable, "-m", "engine_advisor.cli.main", *args]


def ea_env() -> dict[str, str]:
    """engine-advisor's dependencies from the engines' sets: vLLM's, else SGLang's (both hold
    pydantic, fastapi and orjson; the machine has numpy, numba and httpx)."""
    sites = [s for s in (SITES["vllm"], SITES["sglang"]) if os.path.isdir(s)] or [SITES["vllm"]]
    sys.path.insert(0, str(REPO / "bench"))
    from checkout import import_path  # the checkout's folders as engine_advisor.*, uninstalled

    return {**os.environ, "PYTHONPATH": ":".join([import_path(REPO), sites[0]]),
            "PYTHONUNBUFFERED": "1"}


def start(engine: str, preset: str, res: pathlib.Path, port: int, cmd: str | None,
          startup_timeout: float, tp: int = 1, dcp: int = 1,
          env_extra: dict[str, str] | None = None) -> tuple[subprocess.Popen, str, str, dict]:
    """Serve ``preset`` on ``engine`` from a dummy-weight model folder and wait until it is
    healthy: (process, base URL, tag, facts so far). The start-up log goes to
    ``res/logs/TAG.log``; the caller stops the process (``stop``)."""
    facts = PRESETS[preset]
    tag = f"{engine}-{preset}" + (f"-tp{tp}-dcp{dcp}" if tp > 1 or dcp > 1 else "")
    folder = res / "models" / preset
    if not (folder / "config.json").exists():
        subprocess.run(ea("calibrate", "model-dir", "--preset", preset, "--out",
                          str(folder), "--max-model-len", str(facts["max_len"])),
                       env=ea_env(), check=True, cwd=REPO)
    template = cmd or COMMANDS[engine] + EXTRA_FLAGS.get((engine, bool(facts.get("hybrid"))), "")
    argv = shlex.split(template.format(
        dir=folder, preset=preset, fraction=FRACTION, max_len=facts["max_len"], port=port,
        engine=engine, kv=facts["kv"], tp=tp, dcp=dcp,
        dcp_flag=f" --dcp-size {dcp}" if dcp > 1 else ""))
    env = {**os.environ, **NCCL_ENV, **ENGINE_ENV.get((engine, preset), {}), **(env_extra or {}),
           "PYTHONPATH": site_path(SITES[engine]), "PYTHONUNBUFFERED": "1"}
    logs = res / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log(f"{tag}: starting {shlex.join(argv)}")
    t0 = time.monotonic()
    with open(logs / f"{tag}.log", "wb") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, cwd="/tmp")
    base = f"http://127.0.0.1:{port}"
    facts_out: dict = {"engine": engine, "preset": preset, "command": argv,
                       "env": ENGINE_ENV.get((engine, preset), {}), "fraction": FRACTION}
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{tag}: exited with {proc.returncode} while starting")
            if get(base + "/health")[0] == 200 and get(base + "/v1/models")[0] == 200:
                break
            if time.monotonic() - t0 > startup_timeout:
                raise RuntimeError(f"{tag}: not healthy after {startup_timeout:g} s")
            time.sleep(2)
    except BaseException:
        facts_out["stopped"] = stop(proc)
        (logs / f"{tag}.facts.json").write_text(json.dumps(facts_out, indent=1))
        raise
    facts_out["startup_s"] = round(time.monotonic() - t0, 1)
    log(f"{tag}: healthy after {facts_out['startup_s']} s")
    return proc, base, tag, facts_out


def serve_one(engine: str, preset: str, res: pathlib.Path, port: int, cmd: str | None,
              startup_timeout: float, grid: dict[int, list[int]], tp: int = 1,
              dcp: int = 1, gpu: str = "H200") -> None:
    if PRESETS[preset].get("hybrid") and grid is GRID:
        grid = dict(sorted(HYBRID_GRIDS.get(preset, HYBRID_GRID).items()))
    proc, base, tag, facts_out = start(engine, preset, res, port, cmd, startup_timeout, tp, dcp)
    logs = res / "logs"
    try:
        for path in ("/get_server_info", "/server_info", "/version"):
            code, body = get(base + path)
            if code == 200:
                (res / "logs" / f"{tag}.info.json").write_bytes(body)
                break
        for ctx, batches in grid.items():
            out = res / "runs" / tag / f"ctx{ctx}"
            args = ["calibrate", "run", "--engine", engine, "--url", base, "--model", preset,
                    "--prompt", "token-ids", "--contexts", str(ctx), "--batch-sizes",
                    ",".join(map(str, batches)), "--output-tokens", str(OUTPUT_TOKENS),
                    "--gpu", gpu, "--num-gpus", str(tp), "--dcp-size", str(dcp),
                    "--mem-fraction", str(FRACTION),
                    "--preset", preset, "--load-format", "dummy",
                    "--engine-log", str(logs / f"{tag}.log"), "--out", str(out),
                    "--no-progress", "--request-timeout", "400"]
            r = subprocess.run(ea(*args), env=ea_env(), cwd=REPO, capture_output=True,
                               text=True)
            (out / "stdout.txt").write_text(r.stdout + r.stderr)
            log(f"{tag}: ctx {ctx} exit {r.returncode}: {r.stdout.strip().splitlines()[-1:]}")
        code, body = get(base + "/metrics")
        (res / "logs" / f"{tag}.metrics.txt").write_bytes(body)
    finally:
        facts_out["stopped"] = stop(proc)
        (res / "logs" / f"{tag}.facts.json").write_text(json.dumps(facts_out, indent=1))
        log(f"{tag}: stopped")


def site_path(site: str) -> str:
    """PYTHONPATH for a ``pip --target`` folder, with what its ``.pth`` files add: Python reads
    them only in a site directory, not on PYTHONPATH (nvidia-cutlass-dsl puts its ``cutlass``
    package on the path that way; without it vLLM's Gated DeltaNet prefill kernel is
    "unavailable")."""
    if not os.path.isdir(site) or not any(pathlib.Path(site).glob("*.pth")):
        return site
    code = ("import site, sys; before = list(sys.path); site.addsitedir(sys.argv[1]); "
            "print(':'.join([sys.argv[1]] + [p for p in sys.path if p not in before]))")
    r = subprocess.run([sys.executable, "-c", code, site], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": site})
    return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else site


def stop(proc: subprocess.Popen) -> int | None:
    """SIGTERM the engine's process group (by its PID), SIGKILL after 30 s, then wait until the
    GPU's memory is free again."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)     # children left behind
    except ProcessLookupError:
        pass
    for _ in range(60):
        try:
            r = subprocess.run(["nvidia-smi", "--query-gpu=memory.used",
                                "--format=csv,noheader,nounits"], capture_output=True, text=True)
        except FileNotFoundError:       # no GPU here (the test against the simulator)
            break
        if r.returncode != 0 or int((r.stdout.split() or ["0"])[0]) < 2000:
            break
        time.sleep(1)
    return proc.returncode


def run_all(res: pathlib.Path, only: list[str], cmd: str | None, port: int,
            startup_timeout: float, grid: dict[int, list[int]], tp: int = 1,
            dcp_sizes: list[int] | None = None, gpu: str = "H200") -> None:
    """Every (engine, preset) of ORDER (``tp`` > 1: deepseek-v2-lite at each DCP size)."""
    res.mkdir(parents=True, exist_ok=True)
    plan = ([(e, p, 1) for e, p in ORDER] if tp == 1 and not dcp_sizes else
            [(e, "deepseek-v2-lite", d) for d in (dcp_sizes or [1]) for e in ("vllm", "sglang")])
    if only and tp == 1 and not dcp_sizes:      # any ENGINE-PRESET of SITES x PRESETS
        plan = [(*tag.split("-", 1), 1) for tag in only]
    for engine, preset, dcp in plan:
        tag = f"{engine}-{preset}"
        if only and tag not in only:
            continue
        if engine not in SITES or preset not in PRESETS:
            log(f"{tag}: unknown (engines {sorted(SITES)}, presets {sorted(PRESETS)})")
            continue
        try:
            serve_one(engine, preset, res, port, cmd, startup_timeout, grid, tp, dcp, gpu)
        except Exception as exc:  # noqa: BLE001 - one engine's failure must not stop the rest
            log(f"{tag} dcp {dcp}: FAILED {type(exc).__name__}: {exc}")
        archive(res)
    (res / "DONE").write_text("done\n")
    log("all done")


def archive(res: pathlib.Path) -> pathlib.Path:
    """Everything measured so far in one file (the GPU machine returns a few files only)."""
    path = res.parent / "res.tgz"
    with tarfile.open(path, "w:gz") as t:
        for sub in ("runs", "logs", "profiles"):
            if (res / sub).exists():
                t.add(res / sub, arcname=sub)
        if (res / "driver.log").exists():
            t.add(res / "driver.log", arcname="driver.log")
    return path


def wait(res: pathlib.Path, seconds: float) -> None:
    """Poll until DONE or ``seconds`` pass; copy the archive to $OUT."""
    t_end = time.monotonic() + seconds
    seen = 0
    while time.monotonic() < t_end and not (res / "DONE").exists():
        text = (res / "driver.log").read_text() if (res / "driver.log").exists() else ""
        lines = text.splitlines()
        for line in lines[seen:]:
            print(line, flush=True)
        seen = len(lines)
        time.sleep(5)
    text = (res / "driver.log").read_text() if (res / "driver.log").exists() else ""
    for line in text.splitlines()[seen:]:
        print(line)
    out = os.environ.get("OUT")
    if out:
        import shutil
        shutil.copy(archive(res), pathlib.Path(out) / "res.tgz")
    print("DONE" if (res / "DONE").exists() else "still running")


def parse_grid(text: str) -> dict[int, list[int]]:
    out = {}
    for part in text.split(";"):
        ctx, _, batches = part.partition(":")
        out[int(ctx)] = [int(b) for b in batches.split(",")]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("install")
    p.add_argument("parts", type=pathlib.Path)
    p = sub.add_parser("unpack")
    p.add_argument("parts", type=pathlib.Path)
    p.add_argument("wheel", type=pathlib.Path, help="the zstandard wheel (cp312)")
    p = sub.add_parser("all")
    p.add_argument("--res", type=pathlib.Path, default=pathlib.Path("/tmp/res"))
    p.add_argument("--only", nargs="*", default=[],
                   help="ENGINE-PRESET tags to run, in this order (any engine and preset of "
                        "SITES and PRESETS, e.g. vllm-qwen3-32b)")
    p.add_argument("--engine-cmd", help="command template replacing both engines' commands")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--startup-timeout", type=float, default=420.0)
    p.add_argument("--grid", type=parse_grid, default=None,
                   help="CTX:B,B;CTX:B,... replacing the default grid")
    p.add_argument("--tp", type=int, default=1,
                   help="GPUs = TP size; above 1 the DCP plan of issue 27 (deepseek-v2-lite, "
                        "each --dcp-sizes, contexts 8K-128K x batches 1-64)")
    p.add_argument("--dcp-sizes", type=lambda t: [int(x) for x in t.split(",")], default=None,
                   help="DCP sizes to serve (default with --tp N: 1, 2, ... N)")
    p.add_argument("--gpu", default="H200", help="the GPU type the rows record")
    p = sub.add_parser("wait")
    p.add_argument("--res", type=pathlib.Path, default=pathlib.Path("/tmp/res"))
    p.add_argument("--seconds", type=float, default=540.0)
    a = ap.parse_args()
    if a.cmd == "install":
        install(a.parts)
    elif a.cmd == "unpack":
        unpack(a.parts, a.wheel)
    elif a.cmd == "all":
        dcps = a.dcp_sizes or ([d for d in (1, 2, 4, 8) if d <= a.tp and a.tp % d == 0]
                               if a.tp > 1 else None)
        grid = a.grid or (DCP_GRID if a.tp > 1 else GRID)
        run_all(a.res, a.only, a.engine_cmd, a.port, a.startup_timeout, grid, a.tp, dcps,
                a.gpu)
    else:
        wait(a.res, a.seconds)


if __name__ == "__main__":
    main()
