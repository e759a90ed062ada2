"""The command line's user-error type, and how a command's handler is run: its own errors, the
libraries' (``engine_advisor.calibration.errors.CalibrationError``) and a file the disk would not
take (``engine_advisor.model.errors.DiskError``: a full or read-only disk ..., naming the path and
the cause) print as ``engine-advisor: error: ...`` with exit status 2 (stdlib only: importable on a
bare GPU image)."""

from __future__ import annotations

import os
import sys

from engine_advisor.calibration.errors import CalibrationError


class CliError(Exception):
    """A user error: printed as ``engine-advisor: error: ...`` with exit status 2."""


def run_handler(args) -> int:
    """Run ``args.handler``: its exit status, 2 with ``engine-advisor: error: ...`` for a
    CliError, a CalibrationError or a DiskError, 130 on Ctrl-C, 141 quietly when stdout's
    reader went away (``| head``)."""
    try:
        return int(args.handler(args) or 0)
    except (CliError, CalibrationError) as exc:
        print(f"engine-advisor: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as exc:
        if not is_disk_error(exc):
            raise
        print(f"engine-advisor: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("engine-advisor: interrupted", file=sys.stderr)
        return 130


def is_disk_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a ``engine_advisor.model.errors.DiskError``. Looked up among the loaded
    modules, not imported (model/ is not stdlib): a command that never loaded it cannot have raised
    one."""
    errors = sys.modules.get("engine_advisor.model.errors")
    return errors is not None and isinstance(exc, errors.DiskError)
