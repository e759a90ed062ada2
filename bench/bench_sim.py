"""Throughput of one simulator process under many concurrent streaming requests.

Starts ``engine-advisor sim`` on a free loopback port, fires ``--requests`` streaming chat
completions with ``--concurrency`` in flight at once (asyncio + httpx; token events are
counted in the raw SSE bytes, so the client is cheap next to the server), and reports the
tokens per second the simulator sustained, errors, TTFT / E2E medians seen by the client, the
simulator's own mean TTFT (from its metrics) and its CPU seconds per million tokens.
Every stream must end with ``[DONE]`` and its usage chunk must match the tokens received.

    .venv/bin/python bench/bench_sim.py --requests 200 --concurrency 200 --time-scale 0.001
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from engine_advisor.calibration.ports import free_port

TOKEN_MARK = b'"delta":{"content":"'     # one per token event (the role event has "role")
USAGE_MARK = b'"choices":[],"usage":'



async def one(client: httpx.AsyncClient, i: int, args, out: dict) -> None:
    body = {"model": "bench", "max_tokens": args.max_tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user",
                          "content": f"request {i} " + "word " * args.prompt_words}]}
    t0 = time.perf_counter()
    tokens, ttft, usage, done = 0, None, None, False
    rest = b""
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                out["errors"].append(f"HTTP {r.status_code}")
                await r.aread()
                return
            async for chunk in r.aiter_raw():
                buf = rest + chunk
                cut = buf.rfind(b"\n\n") + 2          # complete events only
                if cut < 2:                             # none yet: keep reading
                    rest = buf
                    continue
                events, rest = buf[:cut], buf[cut:]
                n = events.count(TOKEN_MARK)
                if n and ttft is None:
                    ttft = time.perf_counter() - t0
                tokens += n
                k = events.find(USAGE_MARK)
                if k >= 0:
                    line = events[events.rfind(b"data: ", 0, k):].split(b"\n", 1)[0]
                    usage = json.loads(line[6:])["usage"]["completion_tokens"]
                done = done or events.endswith(b"data: [DONE]\n\n")
    except Exception as exc:  # noqa: BLE001 - every failure is counted and shown
        out["errors"].append(f"request {i}: {type(exc).__name__}: {exc}")
        return
    if rest or not done or usage != tokens or tokens != args.max_tokens:
        out["errors"].append(f"request {i}: done={done} usage={usage} tokens={tokens}")
        return
    out["tokens"] += tokens
    out["ttft"].append(ttft)
    out["e2e"].append(time.perf_counter() - t0)


async def drive(url: str, args) -> dict:
    out: dict = {"tokens": 0, "errors": [], "ttft": [], "e2e": []}
    limits = httpx.Limits(max_connections=args.concurrency,
                          max_keepalive_connections=args.concurrency)
    sem = asyncio.Semaphore(args.concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120.0) as client:
        async def guarded(i: int) -> None:
            async with sem:
                await one(client, i, args, out)

        t0 = time.perf_counter()
        await asyncio.gather(*(guarded(i) for i in range(args.requests)))
        out["wall_s"] = time.perf_counter() - t0
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="vllm", choices=("vllm", "sglang"))
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--prompt-words", type=int, default=200)
    ap.add_argument("--time-scale", type=float, default=0.001)
    ap.add_argument("--max-running", type=int, default=256)
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args()

    exe = str(Path(sys.executable).with_name("engine-advisor"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([exe, "sim", "--engine", args.engine, "--port", str(port),
                             "--model-name", "bench", "--time-scale", str(args.time_scale),
                             "--max-running", str(args.max_running)],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                print(f"simulator did not become healthy (exit status {proc.poll()}):",
                      file=sys.stderr)
                log.seek(0)
                print(log.read().decode(errors="replace"), file=sys.stderr)
                return 1
            time.sleep(0.05)
        cpu0 = _cpu_seconds(proc.pid)
        res = asyncio.run(drive(url, args))
        sim_cpu = _cpu_seconds(proc.pid) - cpu0
        metrics = httpx.get(url + "/metrics").text
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    ttft = f"{args.engine}:time_to_first_token_seconds"
    result = {
        "engine": args.engine, "requests": args.requests, "concurrency": args.concurrency,
        "max_tokens": args.max_tokens, "time_scale": args.time_scale,
        "completed": len(res["e2e"]), "errors": len(res["errors"]),
        "tokens": res["tokens"], "wall_s": round(res["wall_s"], 3),
        "tokens_per_s": round(res["tokens"] / res["wall_s"]),
        "median_ttft_ms": round(statistics.median(res["ttft"]) * 1e3, 1) if res["ttft"] else None,
        "median_e2e_s": round(statistics.median(res["e2e"]), 3) if res["e2e"] else None,
        "sim_cpu_s": round(sim_cpu, 2),
        "sim_cpu_s_per_million_tokens": round(sim_cpu / max(res["tokens"], 1) * 1e6, 2),
        "sim_generation_tokens_total": _metric(metrics, f"{args.engine}:generation_tokens_total"),
        "sim_mean_ttft_ms": round(1e3 * _metric(metrics, f"{ttft}_sum")
                                  / max(_metric(metrics, f"{ttft}_count") or 1, 1), 1),
    }
    print(json.dumps(result, indent=2))
    for e in res["errors"][:5]:
        print("error:", e, file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if not res["errors"] else 1


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


if __name__ == "__main__":
    sys.exit(main())
