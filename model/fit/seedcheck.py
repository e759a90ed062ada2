"""Which workload the published B300 benchmark ran: the seed's assumptions, chosen by a rule.

The source gives four times (vLLM dcp 1 and SGLang dcp 8 at 64K and 200K context on 8 x B300,
Kimi-K3) and states neither the batch, the output length nor whether the prompts were shared.
``python -m engine_advisor.model.fit.seedcheck`` scans batch x output tokens x prompt sharing and,
for each assumption, fits the B300 level of both engines exactly as the default model does
(``engine_advisor.model.fit.fitting``: each engine starts from its efficiencies measured on the
other GPUs, and two points may move one term; SGLang's DCP-8 points only its DCP terms), then
reports:

- ``consistent``: every published time is reproduced within 5 % by that fit, and none is faster
  than its roofline (the physics terms at spec-sheet peaks);
- ``distance``: how far the fit had to move from physics, the sum of |log(coefficient / its
  prior)| over the two engines' freed terms (``engine_advisor.model.fit.estimator.departure``: a
  count term such as SGLang's per-layer DCP merge cost counts as much as a physics term, and may not
  pass its plausible ceiling; 0 = the published times need no engine slower or faster than its
  prior).

The rule: the default model uses the consistent assumption with the smallest distance (ties: the
smaller batch, then the shorter output).
``model/data/b300_reference.csv`` states the chosen assumption; ``tests/model/test_seed.py``
checks that it is still the rule's choice and that the seed's own question (64K -> vLLM,
200K -> SGLang DCP 8) has the same answer under every consistent assumption.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from engine_advisor.model.fit.dataset import Measurement, read_csv

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
OUTPUTS = (256, 512, 1024, 2048, 4096, 8192)
SHARING = ("distinct", "shared")
TOLERANCE = 0.05


@dataclass(frozen=True)
class Assumption:
    batch_size: int
    output_tokens: int
    prompts: str                   # distinct | shared (one prompt, prefix cache on)

    @property
    def prefix_share(self) -> float:
        return (self.batch_size - 1) / self.batch_size if self.prompts == "shared" else 0.0


@dataclass
class Verdict:
    assumption: Assumption
    predicted: dict[tuple[str, int], float]      # (engine, context) -> fitted total
    published: dict[tuple[str, int], float]
    roofline: dict[tuple[str, int], float]
    freed: dict[str, float]                      # "engine term" -> coefficient / prior
    max_error: float
    distance: float

    @property
    def consistent(self) -> bool:
        return (self.max_error <= TOLERANCE and math.isfinite(self.distance)
                and all(self.roofline[k] < self.published[k] for k in self.published))


def published_rows() -> list[Measurement]:
    from engine_advisor.model.fit.default import REFERENCE_CSV
    return read_csv(REFERENCE_CSV)


def with_assumption(rows: list[Measurement], a: Assumption) -> list[Measurement]:
    return [r.model_copy(update={"batch_size": a.batch_size, "output_tokens": a.output_tokens,
                                 "prefix_share": a.prefix_share}) for r in rows]


@lru_cache(maxsize=1)
def _parents() -> dict[str, tuple[np.ndarray, float]]:
    """Each engine's efficiencies fitted on the other Blackwell GPUs' rows (the B300 level's
    prior) and its routing diversity: what the default model starts the B300 fit from."""
    from engine_advisor.model.fit.default import real_rows
    from engine_advisor.model.fit.estimator import prior_vector
    from engine_advisor.model.fit.fitting import choose_diversity, engine_prior, fit_level
    from engine_advisor.model.fit.rows import trainable
    from engine_advisor.model.hardware.gpus import gpu_family

    out = {}
    rows = [r for r in real_rows() if trainable(r)]
    for engine in ("sglang", "vllm"):
        erows = [r for r in rows if r.engine == engine]
        rho = choose_diversity(erows)[0] if erows else {}
        same = [r for r in erows if gpu_family(r.gpu) == gpu_family("B300") and r.gpu != "B300"]
        start = engine_prior(engine, "B300")
        lf = fit_level(same, start, rho) if same else None
        out[engine] = (lf.estimator.coef_ if lf else prior_vector(start), rho)
    return out


def judge(a: Assumption) -> Verdict:
    from engine_advisor.model.fit.estimator import prior_vector
    from engine_advisor.model.fit.fitting import engine_prior, fit_level
    from engine_advisor.model.fit.rows import row_case, trainable
    from engine_advisor.model.physics.features import roofline_total_s
    from engine_advisor.model.physics.terms import TERMS

    rows = with_assumption(published_rows(), a)
    parents = _parents()
    from engine_advisor.model.fit.estimator import departure

    predicted, published, roofline, freed = {}, {}, {}, {}
    distance = 0.0
    for engine in sorted({r.engine for r in rows}):
        timed = [r for r in rows if r.engine == engine and trainable(r)]
        prior, rho = parents.get(engine, (prior_vector(engine_prior(engine, "B300")), {}))
        lf = fit_level(timed, prior, rho)
        pred = lf.estimator.predict(lf.obs.X) if lf else []
        for r, p in zip(timed, pred, strict=True):
            k = (engine, r.context_tokens)
            predicted[k], published[k] = float(p), float(r.total_s)
            roofline[k] = float(roofline_total_s(row_case(r))[0])
        for t in lf.estimator.free_ if lf else ():
            i = TERMS.index(t)
            freed[f"{engine} {t}"] = float(lf.estimator.coef_[i] / prior[i])
        if lf:
            distance += departure(lf.estimator)
    err = max(abs(predicted[k] / published[k] - 1) for k in published)
    return Verdict(a, predicted, published, roofline, freed, err, distance)


def scan() -> list[Verdict]:
    return [judge(Assumption(b, o, s)) for s in SHARING for b in BATCHES for o in OUTPUTS]


def choose(verdicts: list[Verdict]) -> Verdict | None:
    """The rule (module docstring)."""
    ok = [v for v in verdicts if v.consistent]
    if not ok:
        return None
    return min(ok, key=lambda v: (round(v.distance, 6), v.assumption.batch_size,
                                  v.assumption.output_tokens))


def main() -> None:
    verdicts = scan()
    best = choose(verdicts)
    print(f"{'prompts':<9}{'batch':>6}{'output':>7}{'max err':>9}{'distance':>9}  freed terms "
          "(coefficient / prior)")
    for v in sorted(verdicts, key=lambda v: (not v.consistent, v.distance)):
        if not v.consistent:
            continue
        a = v.assumption
        mark = "  <- the default model's seed" if v is best else ""
        freed = ", ".join(f"{k} x{r:.2f}" for k, r in sorted(v.freed.items()))
        print(f"{a.prompts:<9}{a.batch_size:>6}{a.output_tokens:>7}{v.max_error:>9.1%}"
              f"{v.distance:>9.2f}  {freed}{mark}")
    n = sum(v.consistent for v in verdicts)
    print(f"\n{n} of {len(verdicts)} assumptions are consistent with the four published times "
          f"(within {TOLERANCE:.0%} after the fit, none faster than its roofline)")


if __name__ == "__main__":
    main()
