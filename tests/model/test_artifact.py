import json

import numpy as np
import pytest

from model import artifact
from model.artifact import ArtifactError, load, metadata_path, save
from model.default import default_model
from model.predictor import predictor_for
from model.recommend import build_case, recommend
from model.workload import Workload

W = Workload(context_tokens=131072, output_tokens=2048, batch_size=64, kv_bytes_per_token=70272)


def test_fit_save_load_gives_identical_predictions(tmp_path):
    m = default_model()
    path = tmp_path / "m.joblib"
    meta = save(m, path)
    loaded, meta2 = load(path)
    assert meta2 == meta
    assert loaded.version == meta["model_version"] == meta["artifact_sha256"][:12]
    a, b = recommend(m, W, "v"), recommend(loaded, W, "v")
    assert a.model_dump() == b.model_dump()
    layout = W.model_shape()
    from model.recommend import candidates
    cfgs, _ = candidates(m, W, layout)
    pa = predictor_for(m).predict(build_case(m, W, layout, cfgs))
    pb = predictor_for(loaded).predict(build_case(loaded, W, layout, cfgs))
    np.testing.assert_array_equal(pa.total, pb.total)
    np.testing.assert_array_equal(pa.total_hi, pb.total_hi)


def test_metadata_content(tmp_path):
    meta = save(default_model(), tmp_path / "m.joblib")
    on_disk = json.loads(metadata_path(tmp_path / "m.joblib").read_text())
    assert on_disk == meta
    for key in ("schema_version", "engine_advisor_version", "sklearn_version", "created",
                "training_data_sha256", "fit_metrics", "calibrated_ranges", "artifact_sha256"):
        assert key in meta
    assert "vllm/B300/8/1" in meta["calibrated_ranges"]


def test_tampered_artifact_is_refused(tmp_path):
    path = tmp_path / "m.joblib"
    save(default_model(), path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="sha256 .* does not match .*modified or truncated"):
        load(path)


def test_truncated_artifact_is_refused(tmp_path):
    path = tmp_path / "m.joblib"
    save(default_model(), path)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ArtifactError, match="does not match"):
        load(path)


def test_wrong_schema_version_is_refused(tmp_path):
    path = tmp_path / "m.joblib"
    save(default_model(), path)
    mp = metadata_path(path)
    meta = json.loads(mp.read_text())
    meta["schema_version"] = 99
    mp.write_text(json.dumps(meta))
    with pytest.raises(ArtifactError, match="schema version 99.*reads 2.*refit"):
        load(path)


@pytest.mark.parametrize("meta_text,match", [(None, "metadata .* is missing"),
                                             ("{not json", "not valid JSON"),
                                             ("[1, 2]", "not a JSON object")])
def test_missing_or_broken_metadata_is_refused(tmp_path, meta_text, match):
    path = tmp_path / "m.joblib"
    save(default_model(), path)
    mp = metadata_path(path)
    if meta_text is None:
        mp.unlink()
    else:
        mp.write_text(meta_text)
    with pytest.raises(ArtifactError, match=match):
        load(path)


def test_missing_file(tmp_path):
    with pytest.raises(ArtifactError, match="no such file"):
        load(tmp_path / "nope.joblib")


def test_a_pickle_of_something_else_is_refused(tmp_path):
    import joblib
    path = tmp_path / "m.joblib"
    save(default_model(), path)
    joblib.dump({"not": "a model"}, path)
    meta = json.loads(metadata_path(path).read_text())
    meta["artifact_sha256"] = artifact._sha256(path)
    metadata_path(path).write_text(json.dumps(meta))
    with pytest.raises(ArtifactError, match="not a CostModel"):
        load(path)


def test_write_is_atomic_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "sub" / "m.joblib"
    save(default_model(), path)
    save(default_model(), path)  # overwrite in place
    assert sorted(p.name for p in path.parent.iterdir()) == ["m.joblib", "m.joblib.json"]
