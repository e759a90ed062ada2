"""Schema fuzzing: schemathesis generates requests for every operation of openapi.yaml and
sends them to a running ``engine-advisor serve`` (proxy enabled, in front of two simulators,
admin token and a models folder configured, so every route does its real work).

Each operation gets a bounded number of schema-valid ("positive") and schema-violating
("negative") examples. Every response must: not be a 5xx, have a documented status code,
content type and headers, match the documented response schema, and (negative examples)
reject the invalid input with a 4xx. Not checked: "a schema-valid request is accepted", since
the schema cannot state the cross-field rules the routes enforce (exactly one of
kv_bytes_per_token / hf_config / preset, an SLO needs one of its bounds, reload without a
configured model_path needs a path, an OpenAI body needs messages or prompt); those answer a
documented 422/400, which the other checks still validate.

Batch items are validated one by one (a bad item gets its own error object and the batch
still answers 200, as documented), so for POST /v1/recommend/batch a schema-violating item is
checked to come back as a failed item instead of a rejected request.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from rel_helpers import AUTH, full_stack
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import (
    negative_data_rejection,
    positive_data_acceptance,
    response_schema_conformance,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

OPENAPI = Path(__file__).resolve().parents[2] / "openapi.yaml"
# per operation and mode (hypothesis stops early where an operation has fewer distinct inputs);
# FUZZ_EXAMPLES=500 for a deeper run outside CI
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "60"))


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with full_stack(tmp_path_factory.mktemp("fuzz")) as srv:
        yield srv


def _yaml_stream(response) -> None:
    """POST /v1/deploy answers deployment files, a Kubernetes stream of two YAML documents,
    which schemathesis's YAML reader (one document) cannot take: checked here instead."""
    import yaml

    if response.status_code == 200:
        docs = list(yaml.safe_load_all(response.text))
        assert docs and all(isinstance(d, dict) for d in docs), response.text[:300]


def _batch_items_failed(response) -> None:
    if response.status_code == 200:
        body = response.json()
        assert body["failed"] >= 1, f"schema-violating batch fully accepted: {body}"


def test_every_operation_answers_as_documented(stack):
    schema = schemathesis.openapi.from_path(str(OPENAPI))
    operations = [r.ok() for r in schema.get_all_operations()]
    labels = {op.label for op in operations}
    assert len(labels) >= 17 and "POST /v1/chat/completions" in labels
    sent: Counter[str] = Counter()
    statuses: Counter[int] = Counter()
    failures: list[str] = []
    t0 = time.monotonic()

    def runner(op, mode):
        excluded = [positive_data_acceptance]
        batch_negative = op.label == "POST /v1/recommend/batch" and mode is GenerationMode.NEGATIVE
        if batch_negative:
            excluded.append(negative_data_rejection)
        files = op.label == "POST /v1/deploy"
        if files:
            excluded.append(response_schema_conformance)

        @settings(max_examples=EXAMPLES, database=None, deadline=None, derandomize=True,
                  suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
        @given(case=op.as_strategy(generation_mode=mode))
        def one(case):
            sent[op.label] += 1
            try:
                response = case.call_and_validate(base_url=stack.url, headers=AUTH, timeout=30,
                                                  excluded_checks=excluded)
                statuses[response.status_code] += 1
                assert b"Traceback" not in response.content
                if batch_negative:
                    _batch_items_failed(response)
                if files:
                    _yaml_stream(response)
            except (Exception, BaseExceptionGroup) as exc:  # noqa: B014 - collect them all
                failures.append(f"{op.label} [{mode.value}] body={case.body!r} "
                                f"query={case.query!r}: {str(exc)[:1500]}")

        return one

    for op in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                runner(op, mode)()
            except Unsatisfiable:
                # nothing to violate: an operation without parameters or body
                assert mode is GenerationMode.NEGATIVE, op.label

    took = time.monotonic() - t0
    total = sum(sent.values())
    print(f"\nschema fuzz: {total} requests over {len(sent)} operations in {took:.1f} s; "
          f"statuses {dict(sorted(statuses.items()))}; failures {len(failures)}")
    assert not failures, "\n\n".join(failures[:5])
    assert set(sent) == labels                          # every operation was exercised
    assert not any(s >= 500 for s in statuses)
    assert statuses[200] > 0 and sum(v for s, v in statuses.items() if 400 <= s < 500) > 0
