"""The published benchmark's workload under the reference data's assumptions: the batch, output
tokens and prompt sharing of model/data/b300_reference.csv's rows (the ones
engine_advisor.model.fit.seedcheck's rule chose). One place for every test that asks the seed's
question."""

from __future__ import annotations

from engine_advisor.model.fit.dataset import read_csv
from engine_advisor.model.fit.default import REFERENCE_CSV
from engine_advisor.model.workload import Workload

_ROW = next(r for r in read_csv(REFERENCE_CSV) if r.total_s)
BATCH, OUTPUT, SHARE = _ROW.batch_size, _ROW.output_tokens, _ROW.prefix_share
# the contract's fields (REST bodies, Workload) and the CLI's flags of that workload
FIELDS = {"output_tokens": OUTPUT, "batch_size": BATCH, "preset": "kimi-k3", "gpu": "B300",
          "num_gpus": 8, "requirements": {"prefix_reuse_share": SHARE}}
CLI = ["--gpu", "B300", "--num-gpus", "8", "--preset", "kimi-k3", "--batch-size", str(BATCH),
       "--output-tokens", str(OUTPUT), "--prefix-reuse-share", repr(SHARE)]


def workload(context_tokens: int, **kw) -> Workload:
    return Workload(context_tokens=context_tokens, **{**FIELDS, **kw})
