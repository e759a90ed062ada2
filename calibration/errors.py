"""The calibration library's error type: every refusal a user can act on derives from
``CalibrationError`` (the command line prints its message and exits 2). Stdlib only."""

from __future__ import annotations


class CalibrationError(Exception):
    """A calibration input or run the library refuses, with a message naming what to fix."""
