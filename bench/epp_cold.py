"""The picker's own Python per request, warm and with cold caches, next to the floor's
(bench/epp_floor.py): a quiet, minutes-not-rounds view of what bench_epp.py's "x floor"
measures through Envoy on a shared machine.

In a gateway the picker runs between Envoy, the engines and the kernel: by the time its next
message comes, those have evicted most of its code and data from the CPU caches. Its Python
then costs several times what a warm micro-benchmark shows (on the 2-vCPU machine of
docs/gateway.md, 2026-12-05: 19 us warm, 34 us cold, the floor's 4 us and 10 us). This
script reproduces that: before each message it touches ``--pollute-mb`` MiB (every 64-byte
line), then times the message's handling alone. The same messages go to both, shaped as the
shipped Envoy configuration sends them (``deploy/gateway/envoy.yaml``: BUFFERED, the
forwarded headers only): request headers, the whole body, response headers naming the
primary's endpoint.

- ``picker``: ``engine_advisor.service.epp.exchange.Exchange`` in an app serving a pools
  file of two upstreams of one vLLM pool (as bench_epp.py's), its decision included.
- ``floor``: bench/epp_floor.py's ``Floor`` (parse each message, answer CONTINUE).

Each message is given as its bytes, as the gRPC server hands them over, and read inside the
timing: the picker reads the wire format itself (engine_advisor.service.epp.wire), the floor
decodes it (``ProcessingRequest.FromString``).

``--pollute-mb``: 8 (the default) evicts the per-core caches and some of the shared one; 64
evicts the shared last-level cache too (32 MiB on the machine of docs/gateway.md), an upper
bound where every line a request touches comes from memory.

Usage:  .venv/bin/python bench/epp_cold.py [--requests 2000] [--pollute-mb 8] [--reps 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "bench")]

import numpy as np  # noqa: E402
import yaml  # noqa: E402
from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue  # noqa: E402
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import (  # noqa: E402
    ProcessingMode,
)
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb  # noqa: E402
from epp_floor import Floor  # noqa: E402

from engine_advisor.service.epp.endpoints import Endpoints  # noqa: E402
from engine_advisor.service.epp.exchange import FILTER, Answers, Exchange  # noqa: E402
from engine_advisor.service.epp.shared import Local  # noqa: E402
from engine_advisor.service.main import create_app  # noqa: E402
from engine_advisor.service.settings import Settings  # noqa: E402

MODEL = "kimi-k3"
BODY = (f'{{"model":"{MODEL}","messages":[{{"role":"user","content":"hello there"}}],'
        f'"max_tokens":1}}').encode()
POOLS = {"pools": {"vllm": [{"name": f"up{i}", "url": f"http://127.0.0.1:{i + 1}",
                             "model": MODEL} for i in range(2)]},
         "workload": {"kv_bytes_per_token": 70272, "gpu": "B300", "num_gpus": 8,
                      "batch_size": 64},
         "tokens": {"upstream_tokenize": False},
         # the upstreams are not there: no health check may take them out during the run
         "health": {"interval_s": 600, "failure_threshold": 100}}
PARTS = ("request headers", "request body", "response headers")


def messages(served: str) -> list[bytes]:
    """One request's messages as Envoy sends them to the shipped picker."""
    def hv(k: str, v: str) -> HeaderValue:
        return HeaderValue(key=k, raw_value=v.encode())

    head = pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=HeaderMap(headers=[
        hv(":path", "/v1/chat/completions"), hv(":method", "POST")])))
    head.protocol_config.request_body_mode = ProcessingMode.BUFFERED
    body = pb.ProcessingRequest(request_body=pb.HttpBody(body=BODY, end_of_stream=True))
    resp = pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=HeaderMap(headers=[
        hv(":status", "200")])))
    resp.attributes[FILTER].update({"upstream.address": served})
    return [m.SerializeToString() for m in (head, body, resp)]


class Cold:
    """Evicts the caches: touches every 64-byte line of ``mib`` MiB (nothing with 0)."""

    def __init__(self, mib: int):
        self.lines = np.zeros(max(mib, 1) << 20, dtype=np.uint8)[::64]
        self.on = mib > 0

    def __call__(self) -> None:
        if self.on:
            self.lines += 1


async def measure(args) -> dict[str, list[list[float]]]:
    tmp = Path(tempfile.mkdtemp(prefix="epp-cold-"))
    (tmp / "pools.yaml").write_text(yaml.safe_dump(POOLS))
    app = create_app(Settings(_env_file=None, upstreams=tmp / "pools.yaml",
                              upstreams_watch_s=0))
    out: dict[str, list[list[float]]] = {}
    async with app.router.lifespan_context(app):
        proxy, holder = app.state.proxy, app.state.holder
        endpoints, answers, counts = Endpoints(), Answers(), Local()
        await endpoints.refresh(proxy.pools.generation, proxy.pools.upstreams)
        raw = {u.name: messages(endpoints.endpoint(u)) for u in proxy.pools.upstreams}
        first = next(iter(raw.values()))

        async def picker(cold: Cold, t: list[float]) -> None:
            ex = Exchange(proxy, holder.current, endpoints, answers, counts)
            msgs = first
            for i in range(3):
                cold()
                t0 = time.perf_counter_ns()
                answer = ex.on(msgs[i])
                if answer is None:
                    await ex.decide()
                t[i] += time.perf_counter_ns() - t0
                if i == 1:       # the response names the endpoint the decision put first
                    msgs = raw[ex.listed[0].name]
            ex.finish()

        async def floor(cold: Cold, t: list[float]) -> None:
            f = Floor()
            for i in range(3):
                cold()
                t0 = time.perf_counter_ns()
                f.answer(pb.ProcessingRequest.FromString(first[i])).SerializeToString()
                t[i] += time.perf_counter_ns() - t0

        for state, mib in (("warm", 0), ("cold", args.pollute_mb)):
            cold = Cold(mib)
            for name, fn in (("picker", picker), ("floor", floor)):
                for _ in range(min(args.requests, 500)):          # warm-up
                    await fn(cold, [0.0, 0.0, 0.0])
                reps = []
                for _ in range(args.reps):
                    t = [0.0, 0.0, 0.0]
                    for _ in range(args.requests):
                        await fn(cold, t)
                    reps.append([x / args.requests / 1e3 for x in t])
                out[f"{name} {state}"] = reps
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=2000, help="per repetition (2000)")
    ap.add_argument("--pollute-mb", type=int, default=8,
                    help="MiB touched before each message of the cold runs (8)")
    ap.add_argument("--reps", type=int, default=5, help="repetitions; medians (5)")
    args = ap.parse_args()
    if not (100 <= args.requests <= 100_000 and 1 <= args.pollute_mb <= 1024
            and 1 <= args.reps <= 50):
        ap.error("--requests 100..100000, --pollute-mb 1..1024, --reps 1..50")
    got = asyncio.run(measure(args))
    print(f"{time.strftime('%Y-%m-%d %H:%M')}: us per request, medians of {args.reps} x "
          f"{args.requests} requests; cold: {args.pollute_mb} MiB touched before each message")
    print("| | " + " | ".join(PARTS) + " | total | picker over floor |")
    print("|---|---|---|---|---|---|")
    for state in ("warm", "cold"):
        floor_total = statistics.median(sum(r) for r in got[f"floor {state}"])
        for name in ("picker", "floor"):
            reps = got[f"{name} {state}"]
            parts = [statistics.median(r[i] for r in reps) for i in range(3)]
            total = statistics.median(sum(r) for r in reps)
            over = f"+{total - floor_total:.1f}" if name == "picker" else ""
            print(f"| {name}, {state} | " + " | ".join(f"{p:.1f}" for p in parts)
                  + f" | {total:.1f} | {over} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
