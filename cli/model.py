"""``engine-advisor model convert OLD NEW``: a joblib artifact (schema 2) the user trusts, into
the JSON + ``.npz`` format (engine_advisor.model.fit.artifact) that every other command loads."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model", help="manage fitted model artifacts",
                       description="Manage fitted model artifacts.")
    msub = p.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    c = msub.add_parser(
        "convert", help="convert a joblib artifact you trust to the JSON + .npz format",
        description="Convert a joblib artifact (engine-advisor before schema 3) to the JSON + "
                    ".npz format. The old file is UNPICKLED, which runs any code it names: "
                    "convert only artifacts you made or trust. Its metadata (OLD.json beside "
                    "it) must vouch for it (sha256).")
    c.add_argument("old", metavar="OLD", help="the joblib artifact (NAME.joblib)")
    c.add_argument("new", metavar="NEW", help="the artifact to write (NAME.json; the arrays go "
                                              "to NAME.npz)")
    c.set_defaults(handler=run_convert)


def run_convert(args: argparse.Namespace) -> int:
    from engine_advisor.cli.errors import CliError
    from engine_advisor.model.fit.artifact import ArtifactError, save
    from engine_advisor.model.fit.legacy import read_trusted_joblib

    try:
        model = read_trusted_joblib(args.old)
        meta = save(model, args.new)
    except ArtifactError as exc:
        raise CliError(str(exc)) from None
    print(f"wrote {args.new} (model {meta['model_version']}) from {args.old}")
    return 0
