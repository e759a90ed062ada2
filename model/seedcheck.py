"""Roofline check of the published B300 benchmark (model/data/b300_reference.csv).

``python -m model.seedcheck`` prints, for each published figure, the lowest time the physics
allows at the B300's spec-sheet peaks (prefill FLOPs, weight and KV reads, collectives; every
engine efficiency at its best) with 64 distinct prompts and with one shared prompt, and what
the fitted default model predicts under the data file's stated assumptions.
"""

from __future__ import annotations

import dataclasses

from model.costmodel import roofline_total_s, row_case
from model.dataset import read_csv
from model.default import REFERENCE_CSV


def rooflines() -> list[dict]:
    out = []
    for r in read_csv(REFERENCE_CSV):
        if r.total_s is None:
            continue
        for prompts, share in (("distinct", 0.0), ("shared", r.prefix_share)):
            for batch, output in ((64, 2048), (r.batch_size, r.output_tokens)):
                row = r.model_copy(update={"batch_size": batch, "output_tokens": output,
                                           "prefix_share": share if prompts == "shared"
                                           else 0.0})
                case = row_case(row)
                if prompts == "shared":
                    case = dataclasses.replace(case, share=(batch - 1) / batch)
                out.append({"engine": r.engine, "dcp_size": r.dcp_size,
                            "context_tokens": r.context_tokens, "prompts": prompts,
                            "batch_size": batch, "output_tokens": output,
                            "published_s": r.total_s,
                            "roofline_s": float(roofline_total_s(case)[0])})
    return out


def main() -> None:
    print(f"{'engine':<7}{'dcp':>4}{'context':>9}  {'prompts':<9}{'batch x output':>15}"
          f"{'roofline s':>12}{'published s':>13}  verdict")
    for r in rooflines():
        ok = r["roofline_s"] < r["published_s"]
        print(f"{r['engine']:<7}{r['dcp_size']:>4}{r['context_tokens']:>9,}  {r['prompts']:<9}"
              f"{r['batch_size']:>7} x {r['output_tokens']:<5}{r['roofline_s']:>12.1f}"
              f"{r['published_s']:>13.1f}  {'possible' if ok else 'faster than physics'}")


if __name__ == "__main__":
    main()
