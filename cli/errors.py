"""The one user-error type of the command line, and how a command's handler is run (a leaf
module: importable from anywhere)."""

from __future__ import annotations

import os
import sys


class CliError(Exception):
    """A user error: printed as ``engine-advisor: error: ...`` with exit status 2."""


def run_handler(args) -> int:
    """Run ``args.handler``: its exit status, 2 with ``engine-advisor: error: ...`` for a
    CliError, 130 on Ctrl-C, 141 quietly when stdout's reader went away (``| head``)."""
    try:
        return int(args.handler(args) or 0)
    except CliError as exc:
        print(f"engine-advisor: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("engine-advisor: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
