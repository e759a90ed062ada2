"""What the proxy adds: the same load directly against an upstream and through each gateway.

Targets, all in front of ONE upstream process, answering at once so only the HTTP path is
measured. ``--upstream sim`` (default): ``engine-advisor sim --engine sglang`` at time scale
1e-6. ``--upstream aiohttp``: bench/aiohttp_upstream.py, an independent OpenAI-compatible
server on aiohttp (another HTTP stack than the one the simulator shares with the proxy), run by
``--aiohttp-python`` (default /tmp/aiohttp-up/bin/python; ``python3 -m venv /tmp/aiohttp-up &&
/tmp/aiohttp-up/bin/pip install aiohttp``).

- ``direct``: the upstream itself.
- ``engine-advisor``: ``engine-advisor serve --upstreams FILE`` (one uvicorn worker) of this
  checkout; with ``--workers N`` (N > 1) also ``engine-advisor xN``, the same with
  ``--workers N``; with ``--baseline DIR`` also ``engine-advisor baseline``, the same from the
  checkout in DIR (its packages first on ``PYTHONPATH``), measured side by side in the same
  rounds, and the ratios of req/s and CPU per request printed.
- ``sglang-router``: the SGLang model gateway (Rust; PyPI ``sglang-router``), round robin.
- ``litellm``: LiteLLM's proxy (PyPI ``litellm[proxy]``), one worker.

The comparison tools live in their own virtual environments (not in this project's extras):
``python3 -m venv /tmp/venv-sgl-router && /tmp/venv-sgl-router/bin/pip install sglang-router``
and the same with ``litellm[proxy]`` in /tmp/venv-litellm; a target whose tool is missing is
reported with the reason and skipped, never faked.

Three loads per target, in interleaved rounds (medians reported):

1. non-streaming POST /v1/completions (``max_tokens`` 1) with ``wrk`` (C; Debian: ``apt-get
   update && apt-get install -y wrk``) at ``--connections`` (32) for ``--duration`` s: req/s,
   p50 and p99 latency.
2. streaming POST /v1/completions (``max_tokens`` 16) with this script's own asyncio load
   generator (raw sockets, keep-alive, one coroutine per connection) at the same concurrency
   for ``--stream-requests`` requests (bounded by ``--duration`` too): p50/p99 TTFT (first
   ``data:`` bytes) and total. The generator is checked against wrk on the direct target
   (non-streaming): its req/s and p50 are printed next to wrk's. ``--wrk-only`` skips
   loads 2 and 3.
3. the same streaming requests paced at ``--paced-rate`` req/s in all (default 1000) over
   the same connections for ``--duration`` s: what a hop adds when nothing queues (loads 1
   and 2 run every target at saturation, where three processes share this machine's CPUs and
   any CPU the proxy spends shows up as queueing). Not run against LiteLLM (~75 req/s).

CPU per request: each gateway's CPU time (user + system, from /proc: the process and its
live child processes, so all uvicorn workers) during its wrk run, divided by the requests wrk
completed (for ``direct``: the upstream's own).

Usage:  .venv/bin/python bench/bench_proxy.py [--rounds 3] [--duration 5] [--connections 32]
        [--upstream aiohttp] [--wrk-only] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import asyncio
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
from checkout import cli_module, import_path

from engine_advisor.calibration.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
EXE = Path(sys.executable).parent / "engine-advisor"
MODEL = "kimi-k3"
PLAIN = f'{{"model":"{MODEL}","prompt":"hello there","max_tokens":1}}'
STREAM = f'{{"model":"{MODEL}","prompt":"hello there","max_tokens":16,"stream":true}}'
KEY = "sk-bench-5f0c9e2a7b1d4e6f8a3c2b1d0e9f8a7b"   # LiteLLM refuses to start without one
ROUTER_VENV = Path("/tmp/venv-sgl-router")
AIOHTTP_PYTHON = Path("/tmp/aiohttp-up/bin/python")
LITELLM_VENV = Path("/tmp/venv-litellm")



# ----------------------------------------------------------------------------- processes
class Target:
    def __init__(self, name: str, url: str, proc: subprocess.Popen | None, log: Path | None):
        self.name, self.url, self.proc, self.log = name, url, proc, log


def start(cmd: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, cwd=ROOT, start_new_session=True,
                            env={**os.environ, **(env or {})})


def ready(t: Target, timeout: float) -> str | None:
    """None when ``t`` answers a completion, else why not."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if t.proc is not None and t.proc.poll() is not None:
            tail = t.log.read_text(errors="replace")[-1500:] if t.log else ""
            return f"exited with {t.proc.returncode}: {tail}"
        try:
            r = httpx.post(t.url + "/v1/completions", content=PLAIN, timeout=5,
                           headers={"content-type": "application/json",
                                    "authorization": f"Bearer {KEY}"})
            if r.status_code == 200:
                return None
            last = f"HTTP {r.status_code}: {r.text[:300]}"
        except httpx.HTTPError as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(0.3)
    return f"not ready after {timeout:g} s ({last})"


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, 15)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.wait()


# ----------------------------------------------------------------------------- wrk
def seconds(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()
    return float(value) * {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}[unit]


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its live descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                children.setdefault(int(_stat(int(d.name))[1]), []).append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass                              # gone meanwhile
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = _stat(p)
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
        todo += children.get(p, [])
    return total / os.sysconf("SC_CLK_TCK")


def run_wrk(url: str, lua: Path, connections: int, duration: int,
            pid: int | None = None) -> dict[str, float]:
    cpu0 = cpu_seconds(pid) if pid else 0.0
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{duration}s", "--latency",
                          "-s", str(lua), url + "/v1/completions"], capture_output=True,
                         text=True, check=True, timeout=duration + 60).stdout
    cpu = cpu_seconds(pid) - cpu0 if pid else float("nan")
    done = int(re.search(r"(\d+) requests in", out).group(1))
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    return {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
            "p50": seconds(re.search(r"\s50%\s+(\S+)", out).group(1)),
            "p99": seconds(re.search(r"\s99%\s+(\S+)", out).group(1)),
            "failed": float(bad.group(1)) if bad else 0.0,
            "cpu_us": cpu / max(done, 1) * 1e6,
            "socket_errors": errors.group(1) if errors else ""}


# ----------------------------------------------------------------------------- asyncio load
async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   request: bytes) -> tuple[int, bytes, float, float, bool]:
    """One request on a kept-alive connection: (status, body, ttft, total, keep-alive)."""
    t0 = time.perf_counter()
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    low = head.lower()
    parts: list[bytes] = []
    ttft = None
    if b"transfer-encoding: chunked" in low:
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            if ttft is None:
                ttft = time.perf_counter() - t0
            parts.append((await reader.readexactly(size + 2))[:-2])
    else:
        i = low.index(b"content-length:") + 15
        n = int(low[i:low.index(b"\r\n", i)])
        parts.append(await reader.readexactly(n))
    total = time.perf_counter() - t0
    return status, b"".join(parts), (ttft if ttft is not None else total), total, \
        b"connection: close" not in low


async def _load(url: str, body: str, connections: int, count: int, duration: float,
                rate: float | None = None) -> dict[str, float]:
    host, port = url.removeprefix("http://").split(":")
    request = (f"POST /v1/completions HTTP/1.1\r\nhost: {host}:{port}\r\n"
               f"content-type: application/json\r\nauthorization: Bearer {KEY}\r\n"
               f"content-length: {len(body)}\r\n\r\n{body}").encode()
    ttfts: list[float] = []
    totals: list[float] = []
    failed = 0
    left = count
    deadline = time.perf_counter() + duration

    async def worker(i: int) -> None:
        nonlocal left, failed
        reader, writer = await asyncio.open_connection(host, int(port), limit=1 << 20)
        # paced: connection i sends at t0 + (i + k * connections) / rate (k = 0, 1, ...)
        next_at = time.perf_counter() + i / rate if rate else 0.0
        try:
            while left > 0 and time.perf_counter() < deadline:
                if rate:
                    await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
                    next_at += connections / rate
                left -= 1
                status, _, ttft, total, _ = await exchange(reader, writer, request)
                if status != 200:
                    failed += 1
                ttfts.append(ttft)
                totals.append(total)
        finally:
            writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(connections)))
    took = time.perf_counter() - t0

    def q(xs: list[float], p: float) -> float:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(p * len(xs)))]

    return {"rps": len(totals) / took, "ttft_p50": q(ttfts, 0.5), "ttft_p99": q(ttfts, 0.99),
            "p50": q(totals, 0.5), "p99": q(totals, 0.99), "n": len(totals), "failed": failed}


def run_load(url: str, body: str, connections: int, count: int, duration: float,
             rate: float | None = None) -> dict:
    try:                           # libuv's loop: less of the load generator's CPU
        import uvloop
        factory = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(_load(url, body, connections, count, duration, rate))


# ----------------------------------------------------------------------------- targets
def write_upstreams(path: Path, sim_url: str) -> None:
    path.write_text(f"""pools:
  sglang:
    - {{name: sim, url: "{sim_url}", model: {MODEL}, dcp_size: 1, mem_fraction: 0.9}}
workload: {{kv_bytes_per_token: 70272, gpu: B300, num_gpus: 8, batch_size: 64}}
""")


def write_litellm(path: Path, sim_url: str) -> None:
    path.write_text(f"""model_list:
  - model_name: {MODEL}
    litellm_params:
      model: openai/{MODEL}
      api_base: {sim_url}/v1
      api_key: sk-sim
litellm_settings:
  telemetry: false
  drop_params: true
""")


def med(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def streaming_tables(args, st_res: dict, paced: dict, check: list, d_w: list) -> None:
    d_s = st_res["direct"]
    print("\n| target | stream TTFT p50 ms | TTFT p99 ms | total p50 ms | total p99 ms | "
          "added TTFT p50 ms |")
    print("|---|---|---|---|---|---|")
    for name, s in st_res.items():
        print(f"| {name} | {med(s, 'ttft_p50') * 1e3:.2f} | {med(s, 'ttft_p99') * 1e3:.2f} | "
              f"{med(s, 'p50') * 1e3:.2f} | {med(s, 'p99') * 1e3:.2f} | "
              f"{(med(s, 'ttft_p50') - med(d_s, 'ttft_p50')) * 1e3:+.2f} |")
    if paced["direct"]:
        d_p = paced["direct"]
        print(f"\nstreaming, paced at {args.paced_rate:g} req/s over {args.connections} "
              "connections (below every measured target's capacity but LiteLLM's, not run "
              "there): the latency a hop adds when nothing queues\n")
        print("| target | req/s | TTFT p50 ms | TTFT p99 ms | total p50 ms | total p99 ms | "
              "added TTFT p50 ms | added total p50 ms |")
        print("|---|---|---|---|---|---|---|---|")
        for name, rows in paced.items():
            if rows:
                print(f"| {name} | {med(rows, 'rps'):.0f} | {med(rows, 'ttft_p50') * 1e3:.2f} | "
                      f"{med(rows, 'ttft_p99') * 1e3:.2f} | {med(rows, 'p50') * 1e3:.2f} | "
                      f"{med(rows, 'p99') * 1e3:.2f} | "
                      f"{(med(rows, 'ttft_p50') - med(d_p, 'ttft_p50')) * 1e3:+.2f} | "
                      f"{(med(rows, 'p50') - med(d_p, 'p50')) * 1e3:+.2f} |")
    print(f"\nload generator check (direct, non-streaming): asyncio {med(check, 'rps'):.0f} "
          f"req/s p50 {med(check, 'p50') * 1e3:.2f} ms vs wrk {med(d_w, 'rps'):.0f} req/s p50 "
          f"{med(d_w, 'p50') * 1e3:.2f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--duration", type=int, default=5, help="seconds per wrk run (default 5)")
    ap.add_argument("--connections", type=int, default=32, help="concurrency (default 32)")
    ap.add_argument("--stream-requests", type=int, default=3000,
                    help="streamed requests per target and round (default 3000)")
    ap.add_argument("--paced-rate", type=float, default=1000.0,
                    help="req/s of the paced streaming load (default 1000; 0: skip it)")
    ap.add_argument("--router-venv", type=Path, default=ROUTER_VENV)
    ap.add_argument("--litellm-venv", type=Path, default=LITELLM_VENV)
    ap.add_argument("--upstream", choices=["sim", "aiohttp"], default="sim",
                    help="the upstream every target forwards to (default sim)")
    ap.add_argument("--aiohttp-python", type=Path, default=AIOHTTP_PYTHON,
                    help="a Python with aiohttp, for --upstream aiohttp")
    ap.add_argument("--wrk-only", action="store_true",
                    help="only the non-streaming wrk load (no streaming loads)")
    ap.add_argument("--workers", type=int, default=1,
                    help="also run engine-advisor with this many uvicorn workers (default 1: "
                         "only the one-worker target)")
    ap.add_argument("--baseline", type=Path,
                    help="also run engine-advisor from the checkout in this folder, side by "
                         "side (e.g. main, to compare a change)")
    args = ap.parse_args()
    if args.baseline is not None and not (args.baseline / "service").is_dir():
        ap.error(f"--baseline {args.baseline}: not a checkout of engine-advisor")
    if not (1 <= args.rounds <= 10 and 1 <= args.duration <= 60
            and 1 <= args.connections <= 1024 and 1 <= args.stream_requests <= 100_000
            and 0 <= args.paced_rate <= 100_000 and 1 <= args.workers <= 16):
        ap.error("--rounds 1..10, --duration 1..60, --connections 1..1024, "
                 "--stream-requests 1..100000, --paced-rate 0..100000, --workers 1..16")
    if shutil.which("wrk") is None:
        print("bench_proxy: wrk not found (Debian: apt-get update && apt-get install -y wrk)",
              file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="bench-proxy-"))
    procs: list[subprocess.Popen] = []
    targets: list[Target] = []
    skipped: dict[str, str] = {}
    try:
        sim_port = free_port()
        sim_url = f"http://127.0.0.1:{sim_port}"
        if args.upstream == "aiohttp":
            if not args.aiohttp_python.exists():
                raise SystemExit(f"bench_proxy: {args.aiohttp_python} not found (python3 -m "
                                 "venv /tmp/aiohttp-up && /tmp/aiohttp-up/bin/pip install "
                                 "aiohttp)")
            procs.append(start([str(args.aiohttp_python), str(ROOT / "bench" /
                                                              "aiohttp_upstream.py"),
                                "--port", str(sim_port)], tmp / "sim.log"))
        else:
            procs.append(start([str(EXE), "sim", "--engine", "sglang", "--port", str(sim_port),
                                "--time-scale", "1e-6", "--model-name", MODEL],
                               tmp / "sim.log"))
        targets.append(Target("direct", sim_url, procs[-1], tmp / "sim.log"))

        write_upstreams(tmp / "upstreams.yaml", sim_url)
        p = free_port()
        procs.append(start([sys.executable, "-m", cli_module(ROOT), "serve", "--port", str(p),
                            "--upstreams", str(tmp / "upstreams.yaml"), "--log-level",
                            "warning"], tmp / "proxy.log",
                           env={"PYTHONPATH": import_path(ROOT)}))
        targets.append(Target("engine-advisor", f"http://127.0.0.1:{p}", procs[-1],
                              tmp / "proxy.log"))
        if args.baseline is not None:
            p = free_port()
            procs.append(start([sys.executable, "-m", cli_module(args.baseline), "serve",
                                "--port", str(p), "--upstreams", str(tmp / "upstreams.yaml"),
                                "--log-level", "warning"], tmp / "proxy-baseline.log",
                               env={"PYTHONPATH": import_path(args.baseline)}))
            targets.append(Target("engine-advisor baseline", f"http://127.0.0.1:{p}",
                                  procs[-1], tmp / "proxy-baseline.log"))
        if args.workers > 1:
            p = free_port()
            name = f"engine-advisor x{args.workers}"
            procs.append(start([str(EXE), "serve", "--port", str(p), "--workers",
                                str(args.workers), "--upstreams", str(tmp / "upstreams.yaml"),
                                "--log-level", "warning"], tmp / "proxy-workers.log"))
            targets.append(Target(name, f"http://127.0.0.1:{p}", procs[-1],
                                  tmp / "proxy-workers.log"))

        router = args.router_venv / "bin" / "sglang-router"
        if router.exists():
            p = free_port()
            procs.append(start([str(router), "launch", "--host", "127.0.0.1", "--port", str(p),
                                "--worker-urls", sim_url, "--policy", "round_robin",
                                "--prometheus-port", str(free_port()),
                                "--log-level", "warn"], tmp / "router.log"))
            targets.append(Target("sglang-router", f"http://127.0.0.1:{p}", procs[-1],
                                  tmp / "router.log"))
        else:
            skipped["sglang-router"] = f"{router} not found (pip install sglang-router there)"

        litellm = args.litellm_venv / "bin" / "litellm"
        if litellm.exists():
            write_litellm(tmp / "litellm.yaml", sim_url)
            p = free_port()
            procs.append(start([str(litellm), "--config", str(tmp / "litellm.yaml"), "--host",
                                "127.0.0.1", "--port", str(p), "--num_workers", "1"],
                               tmp / "litellm.log",
                               env={"LITELLM_LOCAL_MODEL_COST_MAP": "True",
                                    "LITELLM_MASTER_KEY": KEY,
                                    "LITELLM_LOG": "ERROR", "NO_DOCS": "True"}))
            targets.append(Target("litellm", f"http://127.0.0.1:{p}", procs[-1],
                                  tmp / "litellm.log"))
        else:
            skipped["litellm"] = f"{litellm} not found (pip install 'litellm[proxy]' there)"

        live = []
        for t in targets:
            why = ready(t, 120.0)
            if why is None:
                live.append(t)
            elif t.name == "direct" or t.name.startswith("engine-advisor"):
                raise SystemExit(f"bench_proxy: {t.name} {why}")
            else:
                skipped[t.name] = why
        for t in live:                   # warm connections and caches
            run_load(t.url, PLAIN, 4, 50, 20)
        lua = tmp / "post.lua"
        lua.write_text(f"wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = "
                       f"\"application/json\"\nwrk.headers[\"Authorization\"] = \"Bearer "
                       f"{KEY}\"\nwrk.body = '{PLAIN}'\n")
        wrk_res: dict[str, list[dict]] = {t.name: [] for t in live}
        st_res: dict[str, list[dict]] = {t.name: [] for t in live}
        paced: dict[str, list[dict]] = {t.name: [] for t in live}
        check: list[dict] = []
        load_before = os.getloadavg()[0]
        for r in range(args.rounds):
            for t in live:
                w = run_wrk(t.url, lua, args.connections, args.duration, t.proc.pid)
                wrk_res[t.name].append(w)
                if args.wrk_only:
                    print(f"round {r + 1} {t.name:<15} wrk {w['rps']:7.0f} req/s p50 "
                          f"{w['p50'] * 1e3:7.2f} ms p99 {w['p99'] * 1e3:7.2f} ms cpu "
                          f"{w['cpu_us']:6.0f} us/req"
                          + (f" FAILED {w['failed']:.0f}" if w["failed"] else ""), flush=True)
                    continue
                s = run_load(t.url, STREAM, args.connections, args.stream_requests,
                             args.duration * 2)
                st_res[t.name].append(s)
                print(f"round {r + 1} {t.name:<15} wrk {w['rps']:7.0f} req/s p50 "
                      f"{w['p50'] * 1e3:7.2f} ms p99 {w['p99'] * 1e3:7.2f} ms cpu "
                      f"{w['cpu_us']:6.0f} us/req | stream "
                      f"{s['n']} req ttft p50 {s['ttft_p50'] * 1e3:7.2f} p99 "
                      f"{s['ttft_p99'] * 1e3:7.2f} total p50 {s['p50'] * 1e3:7.2f} p99 "
                      f"{s['p99'] * 1e3:7.2f} ms"
                      + (f" FAILED {w['failed']:.0f}+{s['failed']}" if w["failed"] or
                         s["failed"] else ""), flush=True)
                if args.paced_rate and t.name != "litellm":   # LiteLLM: ~75 req/s at most
                    pr = run_load(t.url, STREAM, args.connections, 100_000, args.duration,
                                  args.paced_rate)
                    paced[t.name].append(pr)
                    print(f"round {r + 1} {t.name:<15} paced stream {pr['rps']:.0f} req/s "
                          f"ttft p50 {pr['ttft_p50'] * 1e3:.2f} p99 {pr['ttft_p99'] * 1e3:.2f} "
                          f"total p50 {pr['p50'] * 1e3:.2f} p99 {pr['p99'] * 1e3:.2f} ms"
                          + (f" FAILED {pr['failed']}" if pr["failed"] else ""), flush=True)
            if not args.wrk_only:
                check.append(run_load(live[0].url, PLAIN, args.connections, 100_000,
                                      args.duration))
        load_after = os.getloadavg()[0]
    finally:
        stop(procs)

    d_w = wrk_res["direct"]
    what = "aiohttp server (bench/aiohttp_upstream.py)" if args.upstream == "aiohttp" \
        else "simulator"
    print(f"\nmedians of {args.rounds} interleaved rounds, concurrency {args.connections}, "
          f"loopback, {os.cpu_count()} CPUs, 1-min load average {load_before:.1f} before / "
          f"{load_after:.1f} after; upstream: one {what} process\n")
    print("| target | req/s (wrk) | p50 ms | p99 ms | added p50 ms | CPU us/req |")
    print("|---|---|---|---|---|---|")
    for name, w in wrk_res.items():
        print(f"| {name} | {med(w, 'rps'):.0f} | {med(w, 'p50') * 1e3:.2f} | "
              f"{med(w, 'p99') * 1e3:.2f} | {(med(w, 'p50') - med(d_w, 'p50')) * 1e3:+.2f} | "
              f"{med(w, 'cpu_us'):.0f} |")
    for name, why in skipped.items():
        print(f"| {name} | not measured: {why[:300]} |")
    if not args.wrk_only:
        streaming_tables(args, st_res, paced, check, d_w)
    for name in (n for n in wrk_res if n.startswith("engine-advisor")):
        ea = wrk_res[name]
        added = (med(ea, "p50") - med(d_w, "p50")) * 1e3
        cpu = med(ea, "cpu_us")
        print(f"\n{name}: target CPU <= 200 us per request: {cpu:.0f} us "
              f"{'met' if cpu <= 200 else 'NOT met'}")
        if "sglang-router" in wrk_res:
            sr = wrk_res["sglang-router"]
            ratio = med(ea, "rps") / med(sr, "rps")
            added_sr = (med(sr, "p50") - med(d_w, "p50")) * 1e3
            print(f"{name}: target throughput >= 0.8x sglang-router: {ratio:.2f}x "
                  f"{'met' if ratio >= 0.8 else 'NOT met'}")
            print(f"{name}: target added p50 <= sglang-router's: {added:+.2f} ms vs "
                  f"{added_sr:+.2f} ms {'met' if added <= added_sr else 'NOT met'}")
    if "engine-advisor baseline" in wrk_res:
        ea, base = wrk_res["engine-advisor"], wrk_res["engine-advisor baseline"]
        print(f"\nengine-advisor vs baseline ({args.baseline}): req/s "
              f"{med(ea, 'rps') / med(base, 'rps'):.3f}x, CPU per request "
              f"{med(ea, 'cpu_us') / med(base, 'cpu_us'):.3f}x")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
