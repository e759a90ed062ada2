"""The command line's user-error type, and how a command's handler is run: its own errors and
the libraries' (``calibration.errors.CalibrationError``) print as ``engine-advisor: error: ...``
with exit status 2 (stdlib only: importable on a bare GPU image)."""

from __future__ import annotations

import os
import sys

from calibration.errors import CalibrationError


class CliError(Exception):
    """A user error: printed as ``engine-advisor: error: ...`` with exit status 2."""


def run_handler(args) -> int:
    """Run ``args.handler``: its exit status, 2 with ``engine-advisor: error: ...`` for a
    CliError or a CalibrationError, 130 on Ctrl-C, 141 quietly when stdout's reader went
    away (``| head``)."""
    try:
        return int(args.handler(args) or 0)
    except (CliError, CalibrationError) as exc:
        print(f"engine-advisor: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("engine-advisor: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
