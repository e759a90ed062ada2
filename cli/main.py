"""``engine-advisor`` entry point. Each package registers its subcommands through a small
``register(subparsers)`` function; heavy imports happen inside the command handlers."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from cli.errors import CliError

# Modules with a ``register(subparsers)`` function, in help order.
COMMAND_MODULES = ("cli.recommend", "calibration.cli", "service.cli", "sim.cli")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="engine-advisor",
        description="Choose vLLM or SGLang, the DCP size and the memory fraction for "
                    "long-context serving, from a calibrated cost model.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # package not built yet
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except CliError as exc:
        print(f"engine-advisor: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("engine-advisor: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
