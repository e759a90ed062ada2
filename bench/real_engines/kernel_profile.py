#!/usr/bin/env python3
"""Where a real engine's prefill time goes, kernel by kernel: the evidence behind a cost term.

Runs on the GPU machine beside ``run.py`` (same engine sets, same dummy-weight model folders,
standard library only). For each ``ENGINE-PRESET`` it serves the model, warms it up with
multi-chunk prompts (so that no JIT compile or autotune lands in a profile), then, for each
point ``CTX:BATCH``, sends ``BATCH`` distinct prompts of ``CTX`` token ids at once with one output
token under the engine's own torch profiler (SGLang's ``/start_profile``, vLLM's
``--profiler-config``), and writes ``res/profiles/TAG/ctxCTXxBATCH.csv``: every CUDA kernel's name,
calls and total microseconds, plus the client's time for the batch and the kernels' span.

    python3 bench/real_engines/kernel_profile.py --only sglang-nemotron-3-nano-30b-a3b \\
        --points "16384:1;1024:16" --res /tmp/res > /tmp/res/driver.log 2>&1
    python3 bench/real_engines/run.py wait --res /tmp/res        # archive to $OUT

``bench/real_engines/kernels.py`` (here, not on the GPU machine) sorts the kernels into the cost
model's terms.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import pathlib
import random
import sys
import threading
import time
import urllib.request
from collections import defaultdict

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from run import (  # noqa: E402
    COMMANDS,
    EXTRA_FLAGS,
    PRESETS,
    SITES,
    archive,
    log,
    parse_grid,
    start,
    stop,
)

# braces doubled: the command is a template (run.py's placeholders); DIR is the traces' folder
VLLM_PROFILER = (" --profiler-config '{{\"profiler\": \"torch\", \"torch_profiler_dir\": "
                 "\"DIR\", \"torch_profiler_with_stack\": false, \"ignore_frontend\": true}}'")


def post(url: str, body: dict | None = None, timeout: float = 600.0) -> bytes:
    data = json.dumps(body or {}).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read()


def prompts(n: int, ctx: int, vocab: int, seed: int) -> list[list[int]]:
    """``n`` prompts of ``ctx`` token ids that share no prefix (no cache hit)."""
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab - 100) for _ in range(ctx)] for _ in range(n)]


def batch(base: str, preset: str, ids: list[list[int]], output: int = 1) -> float:
    """Send every prompt at once (``output`` tokens each, end-of-sequence ignored); seconds
    until the last answer."""
    errors: list[BaseException] = []

    def one(p: list[int]) -> None:
        try:
            post(base + "/v1/completions", {"model": preset, "prompt": p, "max_tokens": output,
                                            "temperature": 0.0, "ignore_eos": True})
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(p,)) for p in ids]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{len(errors)} of {len(ids)} requests failed: {errors[0]}")
    return time.perf_counter() - t0


def new_traces(folder: pathlib.Path, after: float, timeout: float = 180.0) -> list[pathlib.Path]:
    """The trace files written after ``after``, once their sizes stop changing."""
    t_end = time.monotonic() + timeout
    last: dict = {}
    while time.monotonic() < t_end:
        sizes = {p: p.stat().st_size for p in folder.rglob("*.json*")
                 if p.stat().st_mtime >= after}
        if sizes and sizes == last and all(sizes.values()):
            return sorted(sizes)
        last = sizes
        time.sleep(3)
    raise RuntimeError(f"no trace in {folder} after {timeout:g} s")


def summarise(traces: list[pathlib.Path]) -> tuple[list[tuple[str, int, float]], float]:
    """(name, calls, total µs) of every GPU kernel, memcpy and memset in ``traces``, most time
    first; and the span from the first kernel's start to the last one's end, µs."""
    events = []
    for trace in traces:
        opener = gzip.open if trace.suffix == ".gz" else open
        with opener(trace, "rt") as f:
            data = json.load(f)
        events += data.get("traceEvents", []) if isinstance(data, dict) else data
    calls: dict[str, int] = defaultdict(int)
    total: dict[str, float] = defaultdict(float)
    first, last = float("inf"), 0.0
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        calls[e["name"]] += 1
        total[e["name"]] += float(e.get("dur", 0.0))
        first = min(first, float(e["ts"]))
        last = max(last, float(e["ts"]) + float(e.get("dur", 0.0)))
    rows = sorted(((n, calls[n], total[n]) for n in calls), key=lambda r: -r[2])
    return rows, (last - first if rows else 0.0)


def profile_one(engine: str, preset: str, res: pathlib.Path, port: int, cmd: str | None,
                startup_timeout: float, points: dict[int, list[int]], decode: int = 0) -> None:
    traces = pathlib.Path("/tmp/traces") / f"{engine}-{preset}"
    traces.mkdir(parents=True, exist_ok=True)
    hybrid = bool(PRESETS[preset].get("hybrid"))
    if engine == "vllm":
        cmd = (cmd or COMMANDS["vllm"] + EXTRA_FLAGS.get(("vllm", hybrid), "")) + \
            VLLM_PROFILER.replace("DIR", str(traces))
    proc, base, tag, facts = start(engine, preset, res, port, cmd, startup_timeout)
    out = res / "profiles" / tag
    out.mkdir(parents=True, exist_ok=True)
    vocab = json.loads((res / "models" / preset / "config.json").read_text())["vocab_size"]
    try:
        # multi-chunk warm-up: every prefill kernel's JIT and autotune happens here
        for seed, (n, ctx) in enumerate(((1, 20000), (16, 1024), (1, 20000), (16, 1024))):
            took = batch(base, preset, prompts(n, ctx, vocab, seed))
            log(f"{tag}: warm-up {n} x {ctx}: {took:.2f} s")
        if decode:          # and the decode steps' (their CUDA graphs are captured at start)
            took = batch(base, preset, prompts(2, 1024, vocab, 99), 1 + decode)
            log(f"{tag}: warm-up 2 x 1024, {1 + decode} output tokens: {took:.2f} s")
        runs = [(ctx, b, n) for ctx, batches in points.items() for b in batches
                for n in ((1, 1 + decode) if decode else (1,))]
        for ctx, b, output in runs:
            ids = prompts(b, ctx, vocab, 1000 + ctx + b)
            t0 = time.time()
            if engine == "sglang":
                post(base + "/start_profile", {"output_dir": str(traces),
                                               "activities": ["GPU"],
                                               "with_stack": False})
            else:
                post(base + "/start_profile")
            wall = batch(base, preset, ids, output)
            post(base + "/stop_profile")
            found = new_traces(traces, t0)
            rows, span = summarise(found)
            name = f"ctx{ctx}x{b}" + (f"-out{output}" if output > 1 else "")
            said = "one output token" if output == 1 else f"{output} output tokens"
            with open(out / f"{name}.csv", "w", newline="") as f:
                w = csv.writer(f)
                f.write(f"# {tag} {b} x {ctx} tokens, {said}: client {wall:.6f} s, "
                        f"kernel span {span / 1e6:.6f} s, kernels busy "
                        f"{sum(r[2] for r in rows) / 1e6:.6f} s\n")
                w.writerow(["kernel", "calls", "total_us"])
                for r in rows:
                    w.writerow([r[0], r[1], f"{r[2]:.1f}"])
            top = [(r[0][:40], round(r[2] / 1e3, 1)) for r in rows[:3]]
            log(f"{tag}: {name}: client {wall:.3f} s, span {span / 1e6:.3f} s, "
                f"{len(rows)} kernels; top (ms): {top}")
            for i, trace in enumerate(found):       # keep small traces beside the table
                if trace.stat().st_size < 8 << 20:
                    trace.rename(out / f"{name}-{i}{''.join(trace.suffixes[-2:])}")
                else:
                    trace.unlink()
    finally:
        facts["stopped"] = stop(proc)
        (res / "logs" / f"{tag}.profile-facts.json").write_text(json.dumps(facts, indent=1))
        log(f"{tag}: stopped")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", required=True, help="ENGINE-PRESET tags, in order")
    ap.add_argument("--points", type=parse_grid, default=parse_grid("16384:1;1024:16"),
                    help="CTX:B,B;CTX:B,... to profile (default 16384:1;1024:16)")
    ap.add_argument("--engine-cmd", action="append", default=[],
                    help="TAG=TEMPLATE: that tag's command template (run.py's placeholders)")
    ap.add_argument("--res", type=pathlib.Path, default=pathlib.Path("/tmp/res"))
    ap.add_argument("--port", type=int, default=8100)
    ap.add_argument("--startup-timeout", type=float, default=420.0)
    ap.add_argument("--decode", type=int, default=0,
                    help="N: each point also with M = 1 + N output tokens (ctxCxB-outM.csv); "
                         "the difference of the two tables is N decode steps")
    a = ap.parse_args()
    cmds = dict(c.split("=", 1) for c in a.engine_cmd)
    a.res.mkdir(parents=True, exist_ok=True)
    for tag in a.only:
        engine, preset = tag.split("-", 1)
        if engine not in SITES or preset not in PRESETS:
            log(f"{tag}: unknown")
            continue
        try:
            profile_one(engine, preset, a.res, a.port, cmds.get(tag), a.startup_timeout,
                        a.points, a.decode)
        except Exception as exc:  # noqa: BLE001 - one failure must not stop the rest
            log(f"{tag}: FAILED {type(exc).__name__}: {exc}")
        archive(a.res)
    (a.res / "DONE").write_text("done\n")
    log("all done")


if __name__ == "__main__":
    main()
