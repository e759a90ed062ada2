"""The reliability suite reuses the other suites' process helpers (tests/proc.py,
tests/service/svc_helpers.py, tests/sim/simproc.py, tests/calibration/calib_helpers.py)."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
for sub in ("service", "sim", "calibration"):
    if str(TESTS / sub) not in sys.path:
        sys.path.append(str(TESTS / sub))
