"""Calibration commands: ``engine-advisor fit`` (and ``calibrate ...`` subcommands)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fit", help="fit the cost model from dataset CSV files",
                       description="Fit the cost model from calibration dataset CSV files (or "
                                   "run folders holding dataset.csv) and write an artifact.")
    p.add_argument("data", nargs="+", metavar="DATA", help="dataset CSV files or run folders")
    p.add_argument("--out", required=True, metavar="ARTIFACT", help="artifact path to write")
    p.set_defaults(handler=run_fit)


def run_fit(args: argparse.Namespace) -> int:
    from calibration.fit import fit_files, format_fit_summary
    from cli.main import CliError
    from model.dataset import DatasetError

    try:
        model, meta = fit_files(args.data, args.out)
    except (DatasetError, ValueError) as exc:
        raise CliError(str(exc)) from None
    print(format_fit_summary(model, meta, args.out))
    return 0
