"""``engine-advisor`` entry point. Each package registers its subcommands through a small
``register(subparsers)`` function; heavy imports happen inside the command handlers."""

from __future__ import annotations

import argparse
import importlib
import sys

from engine_advisor.cli.errors import run_handler
from engine_advisor.cli.parser import CliParser

# Modules with a ``register(subparsers)`` function, in help order.
COMMAND_MODULES = ("engine_advisor.cli.recommend", "engine_advisor.cli.calibrate",
                   "engine_advisor.cli.model", "engine_advisor.cli.serve", "engine_advisor.cli.sim")


def build_parser() -> argparse.ArgumentParser:
    parser = CliParser(
        prog="engine-advisor",
        description="Choose vLLM or SGLang, the DCP size and the memory fraction for "
                    "long-context serving, from a calibrated cost model.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    return run_handler(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
