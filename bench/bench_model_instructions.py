"""Instructions per recommendation, counted by valgrind: a speed comparison the machine's load
cannot disturb.

Usage: .venv/bin/python bench/bench_model_instructions.py [--baseline DIR] [--small 500]
       [--large 1500]

Runs a short program (the model loaded, then N recommendations of the seed's batch and output
with a new context each, validation included, as ``bench_model.py``) under ``valgrind
--tool=callgrind`` twice, with ``--small`` and ``--large`` recommendations, and divides the
difference of the instructions executed by the difference of the counts: start-up cancels.
``--baseline DIR``: the same for another checkout of this project (``git worktree add DIR
COMMIT``), run by this checkout's Python with DIR first on the path, for a ratio.

Instructions are not time: the interpreter and compiled code retire instructions at different
rates. In the runs docs/benchmarks.md quotes, the ratio of the two models' instructions and the
ratio of their CPU times (``bench_model.py``, run alternately) agreed within 10 %.

Needs valgrind (Debian: ``apt-get install -y valgrind``); each run takes one to two minutes.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from checkout import import_path, prefix

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = """
import sys
import numpy as np
from {ns}model.fit.default import default_model
from {ns}model.recommend import recommend
from {ns}model.workload import Workload
SEED = {"output_tokens": 2048, "batch_size": 64, "preset": "kimi-k3", "gpu": "B300",
        "num_gpus": 8}
m = default_model()
rng = np.random.default_rng(1)
payloads = [{**SEED, "context_tokens": int(c)} for c in rng.integers(1024, 1_000_000, 10_000)]
recommend(m, Workload.model_validate(payloads[-1]), m.version)
for p in payloads[:int(sys.argv[1])]:
    recommend(m, Workload.model_validate(p), m.version)
"""


def instructions(checkout: Path, n: int, program: Path) -> int:
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": import_path(checkout)}
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out",
             "--smc-check=all-non-file", sys.executable, str(program), str(n)],
            cwd=checkout, env=env, capture_output=True, text=True)
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode or not found:
        raise SystemExit(f"valgrind run failed ({checkout}, n={n}):\n{proc.stderr[-2000:]}")
    return int(found.group(1))


def per_recommendation(checkout: Path, small: int, large: int, tmp: Path) -> float:
    """Instructions per recommendation of ``checkout``'s code (its own import names)."""
    program = tmp / f"recommend_n_{len(list(tmp.iterdir()))}.py"
    program.write_text(PROGRAM.replace("{ns}", prefix(checkout)))
    instructions(checkout, small, program)   # numba compiles for valgrind's CPU once
    return ((instructions(checkout, large, program) - instructions(checkout, small, program))
            / (large - small))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, help="another checkout to compare with")
    ap.add_argument("--small", type=int, default=500)
    ap.add_argument("--large", type=int, default=1500)
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        print("bench_model_instructions: valgrind not found (apt-get install -y valgrind)",
              file=sys.stderr)
        return 2
    if not 0 <= args.small < args.large <= 10_000:
        ap.error("need 0 <= --small < --large <= 10000")
    with tempfile.TemporaryDirectory() as tmp:
        this = per_recommendation(ROOT, args.small, args.large, Path(tmp))
        print(f"this checkout: {this:,.0f} instructions per recommendation")
        if args.baseline:
            base = per_recommendation(args.baseline.resolve(), args.small, args.large,
                                      Path(tmp))
            print(f"baseline {args.baseline}: {base:,.0f} instructions per recommendation")
            print(f"ratio this / baseline: {this / base:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
