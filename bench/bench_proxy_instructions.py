"""Instructions per proxied request, counted by valgrind: the proxy's CPU cost in a measure the
machine's load cannot disturb.

Usage: .venv/bin/python bench/bench_proxy_instructions.py [--small 500] [--large 1500]
       [--connections 32] [--keep DIR]

Starts the aiohttp upstream of ``bench_proxy.py --upstream aiohttp`` (not under valgrind) and
``engine-advisor serve --upstreams FILE`` under ``valgrind --tool=callgrind``, warms it up with
``--warmup`` requests, then twice zeroes the counters (``callgrind_control -z``), sends ``N``
non-streaming completions (``--small``, then ``--large``; ``max_tokens`` 1, ``--connections``
keep-alive connections, this project's asyncio load generator of bench_proxy.py) and dumps
them (``callgrind_control -d``). The difference of the two dumps' instructions divided by the
difference of the counts is the steady-state cost of one request: uvicorn and the direct lane,
the proxy's own logic and the upstream round trip; what the idle loop and the connections'
set-up cost cancels. ``--keep DIR``: keep the dumps (``callgrind_annotate DIR/cg.out.*``).

Instructions are not time (the interpreter and compiled code retire them at different rates),
but the proxy's CPU per request in ``bench_proxy.py`` follows them closely.

Needs valgrind (Debian: ``apt-get install -y valgrind``) and the aiohttp environment of
bench_proxy.py (``--aiohttp-python``); a run takes about two minutes.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_proxy import (
    AIOHTTP_PYTHON,
    PLAIN,
    ROOT,
    Target,
    ready,
    run_load,
    start,
    stop,
    write_upstreams,
)
from checkout import import_path

from engine_advisor.calibration.ports import free_port


def control(flag: str, pid: int, prefix: Path) -> None:
    subprocess.run(["callgrind_control", f"--vgdb-prefix={prefix}", flag, str(pid)],
                   check=True, capture_output=True, timeout=120)


def dumped(out: Path, before: set[Path]) -> int:
    """Instructions in the dump file that appeared since ``before``."""
    for _ in range(600):
        new = [p for p in out.parent.glob(out.name + ".*") if p not in before]
        if new:
            time.sleep(0.5)                 # written by the time callgrind_control returns
            text = new[0].read_text(errors="replace")
            found = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
            if found:
                return int(found.group(1))
        time.sleep(0.1)
    raise SystemExit(f"bench_proxy_instructions: no callgrind dump in {out.parent}")


def window(pid: int, url: str, n: int, connections: int, out: Path, prefix: Path) -> int:
    """Instructions for ``n`` requests (counters zeroed before, dumped after)."""
    control("--zero", pid, prefix)
    before = set(out.parent.glob(out.name + ".*"))
    res = run_load(url, PLAIN, connections, n, 600.0)
    if res["n"] != n or res["failed"]:
        raise SystemExit(f"bench_proxy_instructions: {res['n']} of {n} requests done, "
                         f"{res['failed']} failed")
    control("--dump", pid, prefix)
    return dumped(out, before)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", type=int, default=500)
    ap.add_argument("--large", type=int, default=1500)
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--aiohttp-python", type=Path, default=AIOHTTP_PYTHON)
    ap.add_argument("--keep", type=Path, help="keep the callgrind dumps in this folder")
    args = ap.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("bench_proxy_instructions: valgrind not found (apt-get install -y valgrind)",
              file=sys.stderr)
        return 2
    if not 0 < args.small < args.large or args.connections < 1:
        ap.error("need 0 < --small < --large and --connections >= 1")
    tmp = Path(tempfile.mkdtemp(prefix="bench-proxy-instr-"))
    dumps = args.keep.resolve() if args.keep else tmp
    dumps.mkdir(parents=True, exist_ok=True)
    out = dumps / "cg.out"
    procs: list[subprocess.Popen] = []
    try:
        up_port, port = free_port(), free_port()
        procs.append(start([str(args.aiohttp_python), str(ROOT / "bench" / "aiohttp_upstream.py"),
                            "--port", str(up_port)], tmp / "upstream.log"))
        write_upstreams(tmp / "upstreams.yaml", f"http://127.0.0.1:{up_port}")
        procs.append(start(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
             f"--vgdb-prefix={tmp / 'vgdb'}",        # callgrind_control of others: not ours
             "--smc-check=all-non-file", sys.executable, "-c",
             "import sys; from engine_advisor.cli.main import main; sys.exit(main())", "serve",
             "--port", str(port), "--upstreams", str(tmp / "upstreams.yaml"),
             "--log-level", "warning"], tmp / "proxy.log",
            env={"PYTHONHASHSEED": "0", "PYTHONPATH": import_path(ROOT)}))
        url = f"http://127.0.0.1:{port}"
        why = ready(Target("engine-advisor", url, procs[-1], tmp / "proxy.log"), 1800.0)
        if why is not None:
            raise SystemExit(f"bench_proxy_instructions: engine-advisor {why}")
        run_load(url, PLAIN, args.connections, args.warmup, 600.0)
        pid = procs[-1].pid
        small = window(pid, url, args.small, args.connections, out, tmp / "vgdb")
        large = window(pid, url, args.large, args.connections, out, tmp / "vgdb")
    finally:
        stop(procs)
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    per = (large - small) / (args.large - args.small)
    print(f"{per:,.0f} instructions per proxied request (non-streaming, {args.connections} "
          f"connections; {small:,} for {args.small}, {large:,} for {args.large}; "
          f"git {_commit()})")
    return 0


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


if __name__ == "__main__":
    os.chdir(ROOT)
    raise SystemExit(main())
