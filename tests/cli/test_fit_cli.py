import json

import seedload

from engine_advisor.cli.main import main
from engine_advisor.model.fit.artifact import arrays_path, load
from engine_advisor.model.fit.default import REFERENCE_CSV


def test_fit_writes_a_loadable_artifact_and_prints_quality(tmp_path, capsys):
    out = tmp_path / "m.json"
    assert main(["fit", str(REFERENCE_CSV), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "vllm/B300" in text and "sglang/B300" in text and "terms moved" in text
    assert "held out" in text and "prior" in text
    model, meta = load(out)
    assert meta["training_data_sha256"] == model.data_sha256
    code = main(["recommend", "--context-tokens", "204800", *seedload.CLI, "--model", str(out),
                 "--json"])
    rec = json.loads(capsys.readouterr().out)
    assert code == 0 and rec["engine"] == "sglang" and rec["model_version"] == meta["model_version"]


def test_fit_errors_name_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text(REFERENCE_CSV.read_text().replace("100.5", "-100.5"))
    assert main(["fit", str(bad), "--out", str(tmp_path / "m.json")]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:" in err and "total_s" in err
    assert not (tmp_path / "m.json").exists()
    assert main(["fit", str(tmp_path / "missing.csv"), "--out", str(tmp_path / "m.json")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["fit", str(REFERENCE_CSV), "--out", str(tmp_path / "m.joblib")]) == 2
    assert "name it NAME.json" in capsys.readouterr().err


def test_recommend_refuses_a_tampered_artifact(tmp_path, capsys):
    out = tmp_path / "m.json"
    main(["fit", str(REFERENCE_CSV), "--out", str(out)])
    capsys.readouterr()
    arrays = arrays_path(out)
    arrays.write_bytes(arrays.read_bytes()[:-10])
    code = main(["recommend", "--context-tokens", "1000", "--output-tokens", "8",
                 "--kv-bytes-per-token", "70272", "--model", str(out)])
    assert code == 2 and "refusing to load" in capsys.readouterr().err
