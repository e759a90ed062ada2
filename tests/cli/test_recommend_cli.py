import json
import subprocess
import sys
from pathlib import Path

import pytest
import seedload

from engine_advisor.cli.main import main
from engine_advisor.model.fit.default import default_model
from engine_advisor.model.recommend import recommend

# the published benchmark under the reference data's assumptions (model/data/b300_reference.csv)
SEED = ["recommend", *seedload.CLI]


def run(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("ctx,engine,dcp", [(65536, "vllm", 1), (204800, "sglang", 8)])
def test_json_is_exactly_the_contract_object(capsys, ctx, engine, dcp):
    code, out, _ = run(capsys, *SEED, "--context-tokens", str(ctx), "--json")
    assert code == 0
    got = json.loads(out)
    assert (got["engine"], got["dcp_size"], got["mem_fraction"]) == (engine, dcp, 0.92)
    m = default_model()
    w = seedload.workload(ctx)
    assert got == json.loads(recommend(m, w, m.version).model_dump_json())


def test_table_output(capsys):
    code, out, _ = run(capsys, *SEED, "--context-tokens", "204800")
    assert code == 0
    assert "Recommendation: sglang dcp 8, --mem-fraction-static 0.92" in out
    assert "python -m sglang.launch_server --model-path MODEL --tp 8 --dcp-size 8" in out
    assert "*sglang" in out


def test_preset_and_hf_config(capsys, tmp_path):
    code, out, _ = run(capsys, "recommend", "--context-tokens", "8192", "--output-tokens", "128",
                       "--preset", "llama-3.1-70b", "--gpu", "H200", "--allow-extrapolation",
                       "--json")
    assert code == 0
    rec = json.loads(out)
    assert any(e["engine"] == "sglang" and e["dcp_size"] == 2 and "GQA" in e["reason"]
               for e in rec["excluded"])
    from engine_advisor.model.arch.presets import PRESET_DIR
    cfg = tmp_path / "config.json"
    cfg.write_text((PRESET_DIR / "kimi-k3.json").read_text())   # the same model as a config.json
    code, out, _ = run(capsys, *SEED[:5], *SEED[7:], "--hf-config", str(cfg), "--context-tokens",
                       "65536", "--json")
    rec = json.loads(out)
    assert code == 0 and (rec["engine"], rec["dcp_size"]) == ("vllm", 1)
    chosen = next(p for p in rec["predictions"] if (p["engine"], p["dcp_size"]) == ("vllm", 1))
    assert chosen["calibrated"]      # the same architecture hash as the preset's


BAD = [
    (["--context-tokens", "0"], "--context-tokens: Input should be greater than 0"),
    (["--context-tokens", "-3"], "--context-tokens: Input should be greater than 0"),
    (["--context-tokens", "nan"], "argument --context-tokens: invalid int value: 'nan'"),
    (["--context-tokens", "100000000000000"], "--context-tokens: Input should be less than"),
    (["--context-tokens", "1000", "--batch-size", "0"], "--batch-size: Input should be greater"),
    (["--context-tokens", "1000", "--dcp-sizes", "3"], "--dcp-sizes: [3] do not divide num_gpus 8"),
    (["--context-tokens", "1000", "--gpu", "A100X"], "--gpu: unknown GPU 'A100X'"),
    (["--context-tokens", "1000", "--num-gpus", "0"], "--num-gpus: Input should be greater"),
    (["--context-tokens", "1000", "--kv-cache-dtype", "int3"], "--kv-cache-dtype: Input should be"),
    (["--context-tokens", "1000", "--engines", "lmdeploy"], "--engines: Input should be 'vllm'"),
]


@pytest.mark.parametrize("args,message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_inputs_exit_2_with_the_flag_named(capsys, args, message):
    base = ["recommend", "--output-tokens", "2048", "--kv-bytes-per-token", "70272"]
    if "invalid int" in message:  # argparse's own type check exits by itself
        with pytest.raises(SystemExit) as exc:
            run(capsys, *base, *args)
        code, err = exc.value.code, capsys.readouterr().err
    else:
        code, _, err = run(capsys, *base, *args)
    assert code == 2
    assert message in err, err
    assert "Traceback" not in err


def test_bad_preset_and_config_files(capsys, tmp_path):
    base = ["recommend", "--output-tokens", "8", "--context-tokens", "100"]
    code, _, err = run(capsys, *base, "--preset", "gpt-9")
    assert code == 2 and "--preset: unknown preset 'gpt-9'" in err
    bad = tmp_path / "config.json"
    bad.write_text("{broken")
    code, _, err = run(capsys, *base, "--hf-config", str(bad))
    assert code == 2 and f"--hf-config {bad}: not valid JSON" in err
    code, _, err = run(capsys, *base, "--hf-config", str(tmp_path / "missing.json"))
    assert code == 2 and "cannot read" in err
    bad.write_text(json.dumps({"num_hidden_layers": 4}))
    code, _, err = run(capsys, *base, "--hf-config", str(bad))
    assert code == 2 and "--hf-config: hf_config.hidden_size: missing" in err


def test_table_lists_exclusions(capsys):
    code, out, _ = run(capsys, "recommend", "--context-tokens", "8192", "--output-tokens", "128",
                       "--preset", "llama-3.1-70b", "--gpu", "H200", "--allow-extrapolation")
    assert code == 0
    assert "Excluded:\n  - vllm dcp 2: vLLM needs (tp // kv_heads) % dcp == 0" in out
    assert "\n  - sglang dcp 2: SGLang implements DCP for MLA attention only" in out


QWEN = str(Path(__file__).parents[1] / "data" / "qwen2.5-72b-config.json")


def test_uncalibrated_hardware_is_answered_from_the_prior(capsys):
    """Issue 31: Qwen2.5-72B from a config.json on 8 x H100, nothing calibrated there."""
    code, out, err = run(capsys, "recommend", "--hf-config", QWEN, "--gpu", "H100",
                         "--num-gpus", "8", "--context-tokens", "32768", "--output-tokens", "512",
                         "--batch-size", "8")
    assert code == 0, err
    assert "(confidence prior)" in out
    assert "answered from the physics prior: no configuration is calibrated on H100 x 8" in out


def test_a_model_that_does_not_fit_names_the_weights_and_the_flag(capsys):
    """Issue 31: DeepSeek-V3 (673 GB) on 8 x H100, with and without --allow-extrapolation."""
    args = ["recommend", "--preset", "deepseek-v3", "--gpu", "H100", "--num-gpus", "8",
            "--context-tokens", "1024", "--output-tokens", "128"]
    for extra in ([], ["--allow-extrapolation"]):
        code, _, err = run(capsys, *args, *extra)
        assert code == 2
        assert err.startswith("engine-advisor: error: --num-gpus: the model does not fit on "
                              "H100 x 8: its weights take 84.1 GB per GPU"), err
        assert "it would fit with --num-gpus 16 (16 x H100)" in err
        assert "extrapolation" not in err and "context" not in err


def test_console_script_runs_as_a_real_process():
    exe = Path(sys.executable).with_name("engine-advisor")
    proc = subprocess.run([str(exe), *SEED, "--context-tokens", "65536", "--json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["engine"] == "vllm"
    bad = subprocess.run([str(exe), *SEED, "--context-tokens", "0"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("engine-advisor: error: --context-tokens")
