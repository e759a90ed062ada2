"""Instructions per request of the app, trivial endpoint against uncached POST /v1/recommend,
counted by valgrind: the service target's ratio without the machine's load in it.

Usage: .venv/bin/python bench/bench_service_instructions.py [--requests 300] [--baseline DIR]

Runs the app in-process (ASGI calls, the same middleware and routes as ``engine-advisor
serve`` with ENGINE_ADVISOR_BENCH_ROUTES=1, without uvicorn and sockets) under ``valgrind
--tool=callgrind``: after a warm-up, phases of ``--requests`` requests each, trivial
(``POST /bench/constant``, the seed workload's body) and uncached recommendations (the seed
workload with a new context each), twice over. Between phases the program waits and this
script dumps valgrind's counters (``callgrind_control -d``), so each phase is counted alone.

The ratio trivial / uncached instructions is what ``bench_service.py``'s req/s ratio would be
if both ran at the same instructions per second. Without uvicorn's and the sockets' share
(the same for both endpoints), the in-process ratio is lower than a server's.
``--baseline DIR``: the same for another checkout (``git worktree add DIR COMMIT``).

Needs valgrind (Debian: ``apt-get install -y valgrind``); a run takes two to four minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from checkout import import_path, prefix

ROOT = Path(__file__).resolve().parent.parent
SEED = {"output_tokens": 2048, "batch_size": 64, "preset": "kimi-k3", "gpu": "B300",
        "num_gpus": 8}
PHASES = ("trivial", "uncached", "trivial", "uncached")


def _scope(path: str, body: bytes) -> dict:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
            "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 2), "state": {},
            "headers": [(b"host", b"bench"), (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())]}


async def _drive(tmp: Path, n: int) -> None:
    """The program valgrind runs: the app, a warm-up, then the phases between barriers."""
    os.environ["ENGINE_ADVISOR_BENCH_ROUTES"] = "1"
    import importlib
    # the checkout's own import names (before the namespace, ``service.main``)
    main = importlib.import_module(os.environ["EA_BENCH_PREFIX"] + "service.main")
    app = main.app_from_env()

    async def call(path: str, body: bytes) -> None:
        status = []

        async def receive() -> dict:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])

        await app(_scope(path, body), receive, send)
        if status != [200]:
            raise SystemExit(f"{path}: status {status}")

    # every body written before the phases: the client's JSON encoding is not the app's work
    bodies = iter([json.dumps({**SEED, "context_tokens": 70_000 + i}).encode()
                   for i in range(200 + 2 * n)])
    fixed = json.dumps({**SEED, "context_tokens": 204_800}).encode()
    async with app.router.lifespan_context(app):
        for _ in range(200):
            await call("/v1/recommend", next(bodies))
            await call("/bench/constant", fixed)
        for i, phase in enumerate((*PHASES, "end")):
            (tmp / f"ready.{i}").touch()
            while not (tmp / f"go.{i}").exists():
                time.sleep(0.05)
            for _ in range(n if phase != "end" else 0):
                if phase == "trivial":
                    await call("/bench/constant", fixed)
                else:
                    await call("/v1/recommend", next(bodies))


def per_request(checkout: Path, n: int) -> dict[str, list[float]]:
    """Instructions per request of each phase (trivial, uncached: two values each)."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": import_path(checkout),
           "EA_BENCH_PREFIX": prefix(checkout)}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out",
             "--smc-check=all-non-file", sys.executable, str(Path(__file__).resolve()),
             "--drive", str(tmp), "--requests", str(n)],
            cwd=checkout, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True)
        for i in range(len(PHASES) + 1):
            while not (tmp / f"ready.{i}").exists():
                if proc.poll() is not None:
                    raise SystemExit(f"valgrind run failed ({checkout}):\n"
                                     f"{proc.stderr.read()[-2000:]}")
                time.sleep(0.2)
            subprocess.run(["callgrind_control", "-d", str(proc.pid)], check=True,
                           capture_output=True)
            (tmp / f"go.{i}").touch()
        proc.wait()
        dumps = sorted(tmp.glob("cg.out.*"), key=lambda p: int(p.suffix[1:]))
        totals = [int(re.search(r"^totals: (\d+)", d.read_text(), re.M).group(1))
                  for d in dumps]
    # dump 1: start-up and warm-up; dump k + 2: phase k
    out: dict[str, list[float]] = {"trivial": [], "uncached": []}
    for phase, total in zip(PHASES, totals[1:], strict=False):
        out[phase].append(total / n)
    return out


def report(name: str, counts: dict[str, list[float]]) -> float:
    t, u = min(counts["trivial"]), min(counts["uncached"])
    print(f"{name}: trivial {t / 1e3:,.0f}k instructions/request "
          f"({', '.join(f'{x / 1e3:,.0f}k' for x in counts['trivial'])}), uncached "
          f"recommend {u / 1e3:,.0f}k ({', '.join(f'{x / 1e3:,.0f}k' for x in counts['uncached'])})"
          f": ratio {t / u:.3f} (regression guard >= 0.4)")
    return t / u


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300, help="requests per phase")
    ap.add_argument("--baseline", type=Path, help="another checkout to compare with")
    ap.add_argument("--drive", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.drive:
        asyncio.run(_drive(args.drive, args.requests))
        return 0
    if shutil.which("valgrind") is None:
        print("bench_service_instructions: valgrind not found (apt-get install -y valgrind)",
              file=sys.stderr)
        return 2
    if args.requests < 10:
        ap.error("--requests must be at least 10")
    report("this checkout", per_request(ROOT, args.requests))
    if args.baseline:
        report(str(args.baseline), per_request(args.baseline.resolve(), args.requests))
    return 0


if __name__ == "__main__":
    sys.exit(main())
