"""Argument types shared by the commands (stdlib only: importable on the GPU device too)."""

from __future__ import annotations

import argparse


def int_list(text: str) -> list[int]:
    """'1,2,4,8' -> [1, 2, 4, 8]; positive integers only."""
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}") from None
    if not vals or any(v <= 0 for v in vals):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return vals


def fraction_list(text: str) -> list[float]:
    """'0.90,0.92' -> [0.9, 0.92]; each in (0, 1]."""
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}") from None
    if not vals or any(not 0 < v <= 1 for v in vals):
        raise argparse.ArgumentTypeError(f"expected fractions in (0, 1], got {text!r}")
    return vals
