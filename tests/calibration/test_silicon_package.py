"""The importer on the installed aiconfigurator-core (skipped when it is not installed): the
committed profiles are what it produces, and the test fixture has the package's schema."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

if importlib.util.find_spec("aiconfigurator_core") is None:
    pytest.skip("aiconfigurator-core is not installed (pip install 'engine-advisor[silicon]')",
                allow_module_level=True)
pytest.importorskip("pyarrow")

import pyarrow.parquet as pq  # noqa: E402
import silicon_fixture as fx  # noqa: E402
from calib_helpers import cli_in_process  # noqa: E402

from engine_advisor.calibration.silicon.tables import package_systems_dir  # noqa: E402

PROFILES = Path(__file__).resolve().parents[2] / "calibration" / "profiles"


def _without_run_details(p: dict) -> dict:
    src = {k: v for k, v in p["source"].items() if k not in ("date", "command")}
    return {**p, "source": src}


def test_committed_b300_profile_is_what_the_import_gives(tmp_path):
    out = tmp_path / "b300.json"
    r = cli_in_process("calibrate", "import", "--format", "aiconfigurator", "--system",
                       "b300_sxm", "--engine", "sglang", "--out", str(out))
    assert r.returncode == 0, r.stderr
    new = json.loads(out.read_text())
    committed = json.loads((PROFILES / "b300.json").read_text())
    assert new["source"]["package_version"] == committed["source"]["package_version"]
    assert _without_run_details(new) == _without_run_details(committed)
    assert new["gpu_key"] == "B300" and new["source"]["device"].startswith("NVIDIA B300")
    # measured MLA decode reads below the 7.75 TB/s of the spec sheet, above half of it
    assert 0.5 < new["kv_read"]["asymptotic_Bps"] / new["spec_bandwidth_Bps"] < 1.0
    assert set(new["collectives"]["all_gather"]) == {"2", "4", "8"}


def test_vllm_has_no_mla_kernel_table_and_the_error_says_who_has():
    r = cli_in_process("calibrate", "import", "--format", "aiconfigurator", "--system",
                       "b300_sxm", "--engine", "vllm", "--out", "/nonexistent/x.json")
    assert r.returncode == 2
    assert ("--engine: b300_sxm has no mla/vllm/*/generation_mla_perf.parquet; engines with "
            "it: sglang, trtllm") in r.stderr


@pytest.mark.parametrize("table", sorted(fx.SCHEMAS))
def test_fixture_tables_have_the_package_schema(table):
    op, engine, _ = fx.PATHS[table]
    found = sorted((package_systems_dir() / "data" / "h200_sxm" / op / engine).glob(
        f"*/{table}.parquet"))
    assert found, table
    real = pq.read_schema(found[-1])
    assert [(f.name, str(f.type)) for f in real] == [
        (name, str(t)) for name, t in fx.SCHEMAS[table]]
