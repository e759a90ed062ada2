"""Fixtures of the calibration tests."""

from __future__ import annotations

import pytest
from calib_helpers import SimProcs


@pytest.fixture
def sims(tmp_path):
    s = SimProcs(tmp_path)
    yield s
    s.stop_all()
