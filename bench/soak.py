"""Soak: many requests at high concurrency through the proxy and to /v1/recommend, loopback only.

The stack: two ``engine-advisor sim --engine vllm`` processes (time scale ``--time-scale``,
default 0.001: a 16-token answer takes a few ms) as the vLLM pool of ``engine-advisor serve
--upstreams FILE`` (one uvicorn worker), an SGLang simulator as its SGLang pool (short prompts
never go there; it makes the routing decision a real one).

Two phases, each ``--requests`` requests at ``--concurrency`` connections (keep-alive):

1. ``proxy``: a mix of four request kinds in turn: chat streaming, completions non-streaming,
   completions streaming (with ``stream_options.include_usage``), chat non-streaming. A request
   counts as an error unless it answers 200 and, streaming, ends with ``data: [DONE]`` and holds
   no error event, or, not streaming, is a JSON object with ``choices``.
2. ``recommend``: POST /v1/recommend over a set of distinct workloads (min(256, N/10)) in
   turn; an error is anything but 200 with an ``engine``.

Resident memory of the service process (VmRSS of /proc/PID/status) is read at every 5 % of
each phase's requests; growth is the median of the last quarter's readings over the median of
the first quarter's (the first reading comes after 5 % of the requests, so start-up is
excluded, warm-up is not). Also reported: req/s, p50/p99 latency (streaming: TTFT too), the
service's open file descriptors and threads before and after the phase.

The load generator is asyncio on raw sockets (one coroutine per connection, pre-encoded
requests): on 2 CPUs an httpx client would cost more CPU than the proxy it measures.

Usage:  .venv/bin/python bench/soak.py [--requests 20000] [--concurrency 64] [--json OUT]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_proxy import EXE, ROOT, exchange, free_port, stop  # noqa: E402

MODEL = "kimi-k3"
ADMIN = "soak-admin-token"
STEPS = 20                         # RSS readings per phase (every 5 %)


def start(cmd: list[str], log: Path, env: dict[str, str] | None = None):
    """A process in its own session, output to ``log`` (closed here; the child keeps it)."""
    with log.open("wb") as f:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=ROOT, start_new_session=True,
                                env={**os.environ, **(env or {})})


# ----------------------------------------------------------------------------- /proc
def _status(pid: int, key: str) -> int:
    """One number of /proc/PID/status (``VmRSS`` in KiB, ``Threads``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def rss_kib(pid: int) -> int:
    return _status(pid, "VmRSS")


def threads(pid: int) -> int:
    return _status(pid, "Threads")


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


# ----------------------------------------------------------------------------- requests
def _post(host: str, port: int, path: str, body: dict) -> bytes:
    data = json.dumps(body, separators=(",", ":")).encode()
    return (f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(data)}\r\n\r\n").encode() + data


def proxy_requests(host: str, port: int, max_tokens: int = 16) -> list[tuple[bytes, bool]]:
    """(request bytes, streaming) of the four kinds, used in turn."""
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "soak test, please"}],
            "max_tokens": max_tokens, "ignore_eos": True}
    comp = {"model": MODEL, "prompt": "soak test, please", "max_tokens": max_tokens,
            "ignore_eos": True}
    return [(_post(host, port, "/v1/chat/completions", {**chat, "stream": True}), True),
            (_post(host, port, "/v1/completions", comp), False),
            (_post(host, port, "/v1/completions", {**comp, "stream": True,
                                                   "stream_options": {"include_usage": True}}),
             True),
            (_post(host, port, "/v1/chat/completions", chat), False)]


def recommend_requests(host: str, port: int, n: int) -> list[tuple[bytes, bool]]:
    out = []
    for i in range(max(1, min(256, n // 10))):
        body = {"context_tokens": 4096 + 65_536 * i, "output_tokens": 2048,
                "batch_size": 64, "kv_bytes_per_token": 70272}
        out.append((_post(host, port, "/v1/recommend", body), False))
    return out


def ok_proxy(status: int, body: bytes, streaming: bool) -> bool:
    if status != 200:
        return False
    if streaming:
        return body.endswith(b"data: [DONE]\n\n") and b'data: {"error"' not in body
    return body.startswith(b"{") and b'"choices"' in body


def ok_recommend(status: int, body: bytes, streaming: bool) -> bool:
    return status == 200 and b'"engine"' in body


# ----------------------------------------------------------------------------- load generator
async def drive(url: str, requests: list[tuple[bytes, bool]], n: int, concurrency: int,
                check, pid: int) -> dict:
    """``n`` requests (``requests`` in turn) over ``concurrency`` connections."""
    host, port = url.removeprefix("http://").split(":")
    totals: list[float] = []
    ttfts: list[float] = []
    errors: list[str] = []
    rss: list[tuple[int, int]] = []
    state = {"next": 0, "done": 0}
    step = max(1, n // STEPS)

    async def connect():
        return await asyncio.open_connection(host, int(port), limit=1 << 22)

    async def worker() -> None:
        reader, writer = await connect()
        try:
            while state["next"] < n:
                i = state["next"]
                state["next"] += 1
                request, streaming = requests[i % len(requests)]
                try:
                    status, body, ttft, total, keep = await exchange(reader, writer, request)
                except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                    errors.append(f"request {i}: {type(exc).__name__}: {exc}")
                    writer.close()
                    reader, writer = await connect()
                    continue
                if not check(status, body, streaming):
                    errors.append(f"request {i}: HTTP {status}: {body[-300:]!r}")
                totals.append(total)
                if streaming:
                    ttfts.append(ttft)
                if not keep:
                    writer.close()
                    reader, writer = await connect()
                state["done"] += 1
                if state["done"] % step == 0:
                    rss.append((state["done"], rss_kib(pid)))
        finally:
            writer.close()

    fd0, th0 = fds(pid), threads(pid)
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    took = time.perf_counter() - t0
    await asyncio.sleep(0.5)                 # let the server close its side
    return summarize(n, concurrency, took, totals, ttfts, errors, rss,
                     {"fds_before": fd0, "fds_after": fds(pid), "threads_before": th0,
                      "threads_after": threads(pid)})


def quantile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


def summarize(n, concurrency, took, totals, ttfts, errors, rss, procinfo) -> dict:
    first = [kib for done, kib in rss if done <= n // 4]
    last = [kib for done, kib in rss if done > n - n // 4]
    m0, m1 = statistics.median(first), statistics.median(last)
    return {
        "requests": n, "concurrency": concurrency, "completed": len(totals),
        "errors": len(errors), "error_samples": errors[:5], "seconds": round(took, 2),
        "req_per_s": round(len(totals) / took, 1),
        "p50_ms": round(quantile(totals, 0.5) * 1e3, 2),
        "p99_ms": round(quantile(totals, 0.99) * 1e3, 2),
        "max_ms": round(max(totals) * 1e3, 2) if totals else None,
        "stream_ttft_p50_ms": round(quantile(ttfts, 0.5) * 1e3, 2) if ttfts else None,
        "stream_ttft_p99_ms": round(quantile(ttfts, 0.99) * 1e3, 2) if ttfts else None,
        "rss_first_quarter_mib": round(m0 / 1024, 1), "rss_last_quarter_mib": round(m1 / 1024, 1),
        "rss_growth_pct": round(100 * (m1 - m0) / m0, 2),
        "rss_readings_mib": [round(k / 1024, 1) for _, k in rss], **procinfo,
    }


# ----------------------------------------------------------------------------- the stack
class Stack:
    """Two vLLM simulators and an SGLang one behind ``engine-advisor serve --upstreams``."""

    def __init__(self, time_scale: float, tmp: Path, env: dict[str, str] | None = None):
        self.tmp = tmp
        self.procs = []
        self.sims = []
        for i, engine in enumerate(("vllm", "vllm", "sglang")):
            port = free_port()
            extra = ["--dcp-size", "8"] if engine == "sglang" else []
            self.procs.append(start([str(EXE), "sim", "--engine", engine, "--port", str(port),
                                     "--time-scale", str(time_scale), "--model-name", MODEL,
                                     *extra], tmp / f"sim{i}.log"))
            self.sims.append(f"http://127.0.0.1:{port}")
        self.upstreams = tmp / "upstreams.yaml"
        self.write_upstreams()
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.procs.append(start([str(EXE), "serve", "--port", str(port), "--upstreams",
                                 str(self.upstreams), "--log-level", "warning"],
                                tmp / "serve.log", env={"ENGINE_ADVISOR_ADMIN_TOKEN": ADMIN,
                                                        "ENGINE_ADVISOR_UPSTREAMS_WATCH_S": "0",
                                                        **(env or {})}))
        self.serve = self.procs[-1]
        try:
            for url, path in [*((s, "/health") for s in self.sims), (self.url, "/readyz")]:
                self._wait(url + path)
        except BaseException:
            self.close()
            raise

    def write_upstreams(self, **extra) -> None:
        doc = {
            "pools": {"vllm": [{"url": u, "model": MODEL, "dcp_size": 1, "mem_fraction": 0.92}
                               for u in self.sims[:2]],
                      "sglang": [{"url": self.sims[2], "model": MODEL, "dcp_size": 8,
                                  "mem_fraction": 0.92}]},
            "workload": {"kv_bytes_per_token": 70272, "gpu": "B300", "num_gpus": 8,
                         "batch_size": 64, "output_tokens": 2048},
            "health": {"interval_s": 0.5, "timeout_s": 1.0, "failure_threshold": 1},
            "timeouts": {"connect_s": 1.0, "first_byte_s": 10.0, "idle_s": 10.0,
                         "total_s": 30.0},
            "retries": {"max_attempts": 3, "backoff_base_s": 0.01, "backoff_max_s": 0.1},
            **extra,
        }
        self.upstreams.write_text(json.dumps(doc, indent=1))     # JSON is YAML

    def _wait(self, url: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                logs = {f.name: f.read_text(errors="replace")[-800:]
                        for f in self.tmp.glob("*.log")}
                raise RuntimeError(f"a process of the soak stack exited: {logs}")
            try:
                if httpx.get(url, timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{url} not ready after {timeout} s")

    def close(self) -> None:
        stop(self.procs)


def run(n: int, concurrency: int, phases: tuple[str, ...] = ("proxy", "recommend"),
        time_scale: float = 0.001) -> dict:
    """Start the stack, run the phases, stop it; one summary per phase."""
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        stack = Stack(time_scale, Path(tmp))
        try:
            host, port = stack.url.removeprefix("http://").split(":")
            pid = stack.serve.pid
            out = {"cpus": os.cpu_count(), "load_before": round(os.getloadavg()[0], 2)}
            for phase in phases:
                if phase == "proxy":
                    reqs, check = proxy_requests(host, int(port)), ok_proxy
                else:
                    reqs, check = recommend_requests(host, int(port), n), ok_recommend
                # warm-up: connections, caches, first-call imports (not measured)
                asyncio.run(drive(stack.url, reqs, min(200, n), 8, check, pid))
                out[phase] = asyncio.run(drive(stack.url, reqs, n, concurrency, check, pid))
            out["load_after"] = round(os.getloadavg()[0], 2)
            return out
        finally:
            stack.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=20_000, help="per phase (default 20000)")
    ap.add_argument("--concurrency", type=int, default=64, help="connections (default 64)")
    ap.add_argument("--phases", default="proxy,recommend", help="proxy,recommend")
    ap.add_argument("--time-scale", type=float, default=0.001,
                    help="simulator time scale (default 0.001)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    phases = tuple(p for p in args.phases.split(",") if p)
    if not (100 <= args.requests <= 1_000_000 and 1 <= args.concurrency <= 1024
            and set(phases) <= {"proxy", "recommend"} and phases and args.time_scale > 0):
        ap.error("--requests 100..1000000, --concurrency 1..1024, --phases from "
                 "proxy,recommend, --time-scale > 0")
    res = run(args.requests, args.concurrency, phases, args.time_scale)
    print(json.dumps(res, indent=1))
    print(f"\n{os.cpu_count()} CPUs, loopback, 1-min load average {res['load_before']} before / "
          f"{res['load_after']} after\n")
    print("| phase | requests | concurrency | errors | req/s | p50 ms | p99 ms | TTFT p50 ms | "
          "TTFT p99 ms | RSS first quarter MiB | RSS last quarter MiB | RSS growth | "
          "fds before/after |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for phase in phases:
        r = res[phase]
        print(f"| {phase} | {r['requests']} | {r['concurrency']} | {r['errors']} | "
              f"{r['req_per_s']:.0f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
              f"{r['stream_ttft_p50_ms'] or '-'} | {r['stream_ttft_p99_ms'] or '-'} | "
              f"{r['rss_first_quarter_mib']} | {r['rss_last_quarter_mib']} | "
              f"{r['rss_growth_pct']:+.1f} % | {r['fds_before']}/{r['fds_after']} |")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1) + "\n")
    bad = [p for p in phases if res[p]["errors"] or res[p]["rss_growth_pct"] >= 10]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
