"""Load test of the REST service on loopback: POST /v1/recommend against a trivial endpoint.

Starts ``engine-advisor serve`` (one uvicorn worker, ENGINE_ADVISOR_BENCH_ROUTES=1 adds the
trivial ``POST /bench/constant`` to the same app, behind the same middleware and server
options) and drives it with ``wrk`` at a fixed concurrency. Scenarios, interleaved over rounds:

- ``trivial``: POST /bench/constant (returns a constant; the stack's floor), same body.
- ``recommend``: POST /v1/recommend, the seed workload every time (answered from the
  response cache after the first request).
- ``recommend-uncached``: POST /v1/recommend with a different context in every request (and
  a model name of its own per run), so every request runs the recommender.
- ``bare-trivial``: a constant endpoint of a bare FastAPI app (no middleware) in a separate
  uvicorn process with the same options, for reference.

Usage:  .venv/bin/python bench/bench_service.py [--duration 5] [--rounds 3] [--connections 32]
Needs wrk (Debian: apt-get update && apt-get install -y wrk).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_proxy import EXE, ROOT, free_port, seconds  # noqa: E402

BODY = ('{"context_tokens":204800,"output_tokens":2048,"batch_size":64,'
        '"preset":"kimi-k3","gpu":"B300","num_gpus":8}')
LUA_FIXED = f"""
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{BODY}'
"""
LUA_UNIQUE = """
-- a new model name per run, so no run meets the answers an earlier one left in the response
-- cache (the name only enters the launch command)
math.randomseed(os.time())
local run = math.random(0, 999999)
local n = 0
local headers = {["Content-Type"] = "application/json"}
request = function()
  n = n + 1
  local body = string.format('{"context_tokens":%d,"output_tokens":2048,"batch_size":64,'
    .. '"preset":"kimi-k3","gpu":"B300","num_gpus":8,"model":"bench-%d"}', 65536 + n, run)
  return wrk.format("POST", nil, headers, body)
end
"""


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode} before it was ready")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"server not ready at {url} after {timeout} s")


def run_wrk(url: str, lua: Path, connections: int, duration: int) -> dict[str, float]:
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{duration}s", "--latency",
                          "-s", str(lua), url], capture_output=True, text=True, check=True,
                         timeout=duration + 30).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p50 = seconds(re.search(r"\s50%\s+(\S+)", out).group(1))
    p99 = seconds(re.search(r"\s99%\s+(\S+)", out).group(1))
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    if bad or errors:
        raise SystemExit(f"wrk against {url} saw failures:\n{out}")
    return {"rps": rps, "p50": p50, "p99": p99}


def serve_bare(port: int) -> None:
    """A bare FastAPI app returning a constant, under the same uvicorn options as serve."""
    import uvicorn
    from fastapi import FastAPI, Response

    app = FastAPI()

    @app.post("/constant")
    async def constant() -> Response:
        return Response(b'{"ok":true}', media_type="application/json")

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False,
                server_header=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=int, default=5, help="seconds per wrk run (default 5)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--connections", type=int, default=32, help="concurrency (default 32)")
    ap.add_argument("--serve-bare", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_bare:
        serve_bare(args.serve_bare)
        return 0
    if not (1 <= args.duration <= 60 and 1 <= args.rounds <= 10):
        ap.error("--duration must be 1..60 and --rounds 1..10")
    if shutil.which("wrk") is None:
        print("bench_service: wrk not found; install it (Debian: apt-get update && "
              "apt-get install -y wrk)", file=sys.stderr)
        return 2
    port, bare_port = free_port(), free_port()
    env = {**os.environ, "ENGINE_ADVISOR_BENCH_ROUTES": "1"}
    procs = [
        subprocess.Popen([str(EXE), "serve", "--port", str(port), "--log-level", "warning"],
                         env=env, cwd=ROOT),
        subprocess.Popen([sys.executable, __file__, "--serve-bare", str(bare_port)], cwd=ROOT),
    ]
    try:
        wait_ready(f"http://127.0.0.1:{port}/readyz", procs[0])
        base = f"http://127.0.0.1:{port}"
        for _ in range(200):  # warm-up: every request must succeed before timing starts
            assert httpx.post(f"{base}/v1/recommend", content=BODY,
                              headers={"content-type": "application/json"}).status_code == 200
        with tempfile.TemporaryDirectory() as tmp:
            fixed, unique = Path(tmp, "fixed.lua"), Path(tmp, "unique.lua")
            fixed.write_text(LUA_FIXED)
            unique.write_text(LUA_UNIQUE)
            # the bare app must answer before it is measured
            bare_url = f"http://127.0.0.1:{bare_port}/constant"
            deadline = time.monotonic() + 30
            while True:
                try:
                    httpx.post(bare_url, content=BODY)
                    break
                except httpx.HTTPError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            scenarios = {
                "trivial": (f"{base}/bench/constant", fixed),
                "recommend": (f"{base}/v1/recommend", fixed),
                "recommend-uncached": (f"{base}/v1/recommend", unique),
                "bare-trivial": (bare_url, fixed),
            }
            results: dict[str, list[dict[str, float]]] = {k: [] for k in scenarios}
            load_before = os.getloadavg()[0]
            for r in range(args.rounds):
                for name, (url, lua) in scenarios.items():
                    res = run_wrk(url, lua, args.connections, args.duration)
                    results[name].append(res)
                    print(f"round {r + 1} {name:<19} {res['rps']:>8.0f} req/s  "
                          f"p50 {res['p50'] * 1e3:6.2f} ms  p99 {res['p99'] * 1e3:6.2f} ms",
                          flush=True)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
    load_after = os.getloadavg()[0]
    med = {k: {m: statistics.median(x[m] for x in v) for m in ("rps", "p50", "p99")}
           for k, v in results.items()}
    print(f"\nmedians of {args.rounds} interleaved rounds, wrk -t1 -c{args.connections} "
          f"-d{args.duration}s, one uvicorn worker, loopback, {os.cpu_count()} CPUs, 1-min load "
          f"average {load_before:.1f} before / {load_after:.1f} after:\n")
    print("| endpoint | req/s | p50 ms | p99 ms | req/s vs trivial | p99 vs trivial |")
    print("|---|---|---|---|---|---|")
    t = med["trivial"]
    for name, m in med.items():
        print(f"| {name} | {m['rps']:.0f} | {m['p50'] * 1e3:.2f} | {m['p99'] * 1e3:.2f} | "
              f"{m['rps'] / t['rps']:.2f} | {m['p99'] / t['p99']:.2f} |")
    for name in ("recommend", "recommend-uncached"):
        m = med[name]
        ok = m["rps"] >= 0.6 * t["rps"] and m["p99"] <= 1.5 * t["p99"]
        print(f"{name}: targets (>= 0.6x req/s, <= 1.5x p99 of trivial) "
              f"{'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
