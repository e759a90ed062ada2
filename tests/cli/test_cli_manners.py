"""CLI manners (issue 31): unknown flags first with the closest valid one, the failing
command's usage, --gpu-spec, --list-gpus / --list-presets, `transferred` in the table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from proc import Proc

from engine_advisor.cli.catalogue import gpu_table, preset_table
from engine_advisor.cli.main import build_parser, main
from engine_advisor.model.arch import PRESETS
from engine_advisor.model.fit.default import default_model
from engine_advisor.model.hardware.gpus import BUILTIN_GPUS, GpuSpec
from engine_advisor.model.recommend import recommend
from engine_advisor.model.workload import Workload
from engine_advisor.sim.config import SimConfig

EXE = str(Path(sys.executable).with_name("engine-advisor"))
A100 = {"name": "A100", "memory_bytes": 85_899_345_920, "hbm_bandwidth": 2.0e12,
        "flops_bf16": 312e12}
LLAMA = ["--preset", "llama-3.1-70b", "--context-tokens", "8192", "--output-tokens", "256",
         "--num-gpus", "4"]


def parse_error(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("argv, bad, meant", [
    # a typo of a required flag: reported as unknown, not as the required one missing
    (["recommend", "--ouput-tokens", "5", "--context-tokens", "3", "--preset", "kimi-k3"],
     "--ouput-tokens", "--output-tokens"),
    (["recommend", "--context-tokens", "3", "--output-tokens", "5", "--preset", "kimi-k3",
      "--gpu-count", "8"], "--gpu-count", "--num-gpus"),
    (["recommend", "--gpu-count=8"], "--gpu-count", "--num-gpus"),
    (["calibrate", "plan", "--preset", "kimi-k3", "--contxts", "1024"], "--contxts",
     "--contexts"),
    (["sim", "--engine", "vllm", "--port", "1", "--time-sacle", "0.1"], "--time-sacle",
     "--time-scale"),
])
def test_unknown_flag_first_with_the_closest_valid_one(capsys, argv, bad, meant):
    err = parse_error(capsys, *argv)
    last = err.strip().splitlines()[-1]
    command = " ".join(a for a in argv[:2] if not a.startswith("-"))
    if command.startswith("recommend") or command.startswith("sim"):
        command = argv[0]
    assert last == (f"engine-advisor {command}: error: unrecognized argument: {bad} "
                    f"(did you mean {meant}?)"), err
    assert err.startswith(f"usage: engine-advisor {command} ")


def test_errors_print_the_subcommands_usage(capsys):
    err = parse_error(capsys, "recommend", "--context-tokens", "3")
    assert err.startswith("usage: engine-advisor recommend ")
    assert "the following arguments are required: --output-tokens" in err
    err = parse_error(capsys, "calibrate", "run", "--engine", "tgi")
    assert err.startswith("usage: engine-advisor calibrate run ")
    # an unknown top-level command still gets the top-level usage
    err = parse_error(capsys, "recomend")
    assert err.startswith("usage: engine-advisor [-h] COMMAND")


def test_abbreviations_and_negative_numbers_are_not_unknown(capsys):
    code = main(["recommend", "--context", "8192", "--output-tokens", "64", "--preset",
                 "kimi-k3", "--json"])
    assert code == 0 and json.loads(capsys.readouterr().out)["engine"]
    code = main(["recommend", "--context-tokens", "-3", "--output-tokens", "64", "--preset",
                 "kimi-k3"])
    assert code == 2
    assert "--context-tokens: Input should be greater than 0" in capsys.readouterr().err


def _parsed_listing(text: str) -> list[str]:
    lines = text.splitlines()
    rows = lines[2:lines.index("")]
    return [r.split()[0] for r in rows]


@pytest.mark.parametrize("command", [["recommend"], ["sim"], ["calibrate", "plan"]])
def test_list_gpus_and_presets_exit_0_before_required_flags(capsys, command):
    with pytest.raises(SystemExit) as exc:
        main([*command, "--list-gpus"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.strip() == gpu_table()
    assert _parsed_listing(out) == list(BUILTIN_GPUS)
    with pytest.raises(SystemExit) as exc:
        main([*command, "--list-presets"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert _parsed_listing(out) == list(PRESETS)


def test_preset_listing_carries_the_models_figures():
    table = preset_table()
    for name in PRESETS:
        shape = Workload(context_tokens=1, output_tokens=1, preset=name).model_shape()
        line = next(x for x in table.splitlines() if x.startswith(name + " "))
        assert f"{shape.kv_bytes_per_token:,.0f}" in line
        assert f"{shape.weight_bytes / 1e9:,.1f} GB" in line


def test_gpu_spec_inline_json_equals_the_same_workload_over_rest_contract(capsys):
    code = main(["recommend", *LLAMA, "--gpu-spec", json.dumps(A100), "--json"])
    assert code == 0
    got = json.loads(capsys.readouterr().out)
    m = default_model()
    w = Workload(preset="llama-3.1-70b", context_tokens=8192, output_tokens=256, num_gpus=4,
                 gpu=GpuSpec(**A100))
    assert got == json.loads(recommend(m, w, m.version).model_dump_json())
    assert got["confidence"] == "prior"
    assert any("A100 x 4" in r for r in got["reasons"])


@pytest.mark.parametrize("suffix, body", [
    (".json", json.dumps(A100)),
    (".yaml", "name: A100\nmemory_bytes: 85899345920\nhbm_bandwidth: 2.0e12\n"
              "flops_bf16: 312e12\n"),      # YAML 1.1 reads 2.0e12 as text: taken as a number
])
def test_gpu_spec_from_a_file(capsys, tmp_path, suffix, body):
    path = tmp_path / f"a100{suffix}"
    path.write_text(body)
    assert main(["recommend", *LLAMA, "--gpu-spec", str(path), "--json"]) == 0
    from_file = json.loads(capsys.readouterr().out)
    assert main(["recommend", *LLAMA, "--gpu-spec", json.dumps(A100), "--json"]) == 0
    assert from_file == json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("spec, message", [
    ('{"name": "A100"}', "argument --gpu-spec: memory_bytes: Field required; hbm_bandwidth: "
                         "Field required"),
    ('{"name": "A100", "memory_bytes": 1, "hbm_bandwidth": 2e12}',
     "argument --gpu-spec: memory_bytes: Input should be greater than 1000000000"),
    ("{broken", "argument --gpu-spec: inline JSON: not valid JSON"),
    ("/nonexistent/gpu.yaml", "argument --gpu-spec: /nonexistent/gpu.yaml: neither inline "
                              "JSON (starting with '{') nor a readable file"),
    ("[1, 2]", "argument --gpu-spec: [1, 2]: neither inline JSON"),
])
def test_bad_gpu_specs_name_the_flag_and_the_field(capsys, spec, message):
    err = parse_error(capsys, "recommend", *LLAMA, "--gpu-spec", spec)
    assert message in err, err
    assert "Traceback" not in err


def test_gpu_and_gpu_spec_exclude_each_other(capsys):
    err = parse_error(capsys, "recommend", *LLAMA, "--gpu", "H100", "--gpu-spec",
                      json.dumps(A100))
    assert "argument --gpu-spec: not allowed with argument --gpu" in err


def test_unknown_gpu_points_to_gpu_spec(capsys):
    assert main(["recommend", *LLAMA, "--gpu", "A100"]) == 2
    err = capsys.readouterr().err
    assert "--gpu: unknown GPU 'A100'" in err and "with --gpu-spec" in err


def test_every_command_with_a_gpu_spec_flag_accepts_it():
    parser = build_parser()
    for argv in (["recommend", *LLAMA], ["sim", "--engine", "vllm", "--port", "1"],
                 ["calibrate", "plan", "--preset", "kimi-k3"]):
        ns = parser.parse_args([*argv, "--gpu-spec", json.dumps(A100)])
        assert ns.gpu_spec == GpuSpec(**A100)


def test_simulator_runs_on_a_custom_gpu(tmp_path):
    """A real simulator process on a --gpu-spec file: its KV capacity is the recommender's
    for that GPU."""
    spec = tmp_path / "a100.json"
    spec.write_text(json.dumps(A100))
    cfg = SimConfig(engine="vllm", model_name="llama-3.1-8b", kv_bytes_per_token=131072,
                    num_gpus=1, custom_gpu=A100, max_model_len=8192)
    sim = Proc("sim", "--engine", "vllm", "--gpu-spec", str(spec), "--num-gpus", "1",
               "--model-name", "llama-3.1-8b", "--kv-bytes-per-token", "131072",
               "--max-model-len", "8192", "--time-scale", "0.001")
    try:
        sim.start().wait_ready(timeout=120)
        info = httpx.get(sim.url + "/sim/info", timeout=30).json()
        assert info["kv_capacity_tokens"] == cfg.kv_capacity() > 0
    finally:
        sim.stop()


def test_table_status_says_transferred(capsys):
    """Qwen3-30B-A3B on the calibrated single H200 (its real runs are shipped unfitted): the
    engines' efficiencies transfer from the other models measured there."""
    args = ["recommend", "--preset", "qwen3-30b-a3b", "--gpu", "H200", "--num-gpus", "1",
            "--context-tokens", "8192", "--output-tokens", "256"]
    assert main([*args, "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    transferred = [(p["engine"], p["dcp_size"]) for p in rec["predictions"] if p["transferred"]]
    assert transferred
    assert main(args) == 0
    table = capsys.readouterr().out
    for engine, dcp in transferred:
        row = next(x for x in table.splitlines()
                   if x[1:].split()[:2] == [engine, str(dcp)])
        assert row.rstrip().endswith("transferred"), row
    assert sum("  uncalibrated" in x for x in table.splitlines()) == sum(
        not (p["calibrated"] or p["transferred"]) for p in rec["predictions"])


def test_listing_survives_a_closed_pipe():
    proc = subprocess.run(f"'{EXE}' recommend --list-presets | head -1", shell=True,
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.startswith("preset ")
    assert "Traceback" not in proc.stderr
