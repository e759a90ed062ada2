import copy
import hashlib
import io
import json
import os
import pickle
import zipfile

import numpy as np
import pytest

from engine_advisor.model.fit import artifact
from engine_advisor.model.fit.artifact import SCHEMA_VERSION, ArtifactError, arrays_path, load, save
from engine_advisor.model.fit.costmodel import CostModel
from engine_advisor.model.fit.default import default_model
from engine_advisor.model.fit.legacy import read_trusted_joblib
from engine_advisor.model.predict.predictor import predictor_for
from engine_advisor.model.predict.query import build_case
from engine_advisor.model.recommend import recommend
from engine_advisor.model.workload import Workload

W = Workload(context_tokens=131072, output_tokens=2048, batch_size=64, kv_bytes_per_token=70272)


def fresh() -> CostModel:
    """A copy of the embedded model to change (default_model() is shared)."""
    return copy.deepcopy(default_model())


def test_fit_save_load_gives_identical_predictions(tmp_path):
    m = default_model()
    path = tmp_path / "m.json"
    meta = save(m, path)
    loaded, meta2 = load(path)
    assert meta2 == meta
    assert loaded.version == meta["model_version"] == meta["artifact_sha256"][:12]
    a, b = recommend(m, W, "v"), recommend(loaded, W, "v")
    assert a.model_dump() == b.model_dump()
    layout = W.model_shape()
    from engine_advisor.model.predict.query import candidates
    cfgs, _ = candidates(W, layout)
    pa = predictor_for(m).predict(build_case(m, W, layout, cfgs))
    pb = predictor_for(loaded).predict(build_case(loaded, W, layout, cfgs))
    np.testing.assert_array_equal(pa.total, pb.total)
    np.testing.assert_array_equal(pa.total_hi, pb.total_hi)


def test_a_model_fitted_over_other_cost_terms_is_refused(tmp_path, monkeypatch):
    """An artifact of a version with another term list (a term added since) would be read
    against the wrong terms: it is refused at load, naming the difference and the fix."""
    path = tmp_path / "m.json"
    save(default_model(), path)
    monkeypatch.setattr(artifact, "TERMS", (*artifact.TERMS, "pf_new_fixed"))
    with pytest.raises(ArtifactError, match=r"fitted over \d+ cost terms, this engine-advisor's "
                       r"cost model has \d+ \(new: pf_new_fixed\); refit it"):
        load(path)


def test_a_model_fitted_over_a_renamed_term_is_refused(tmp_path, monkeypatch):
    """As many terms but one renamed (its count means something else now: ``layer_fixed``
    per layer became ``kernel_fixed`` per kernel launched): refused, naming both."""
    path = tmp_path / "m.json"
    save(default_model(), path)
    renamed = tuple("layer_fixed" if t == "kernel_fixed" else t for t in artifact.TERMS)
    monkeypatch.setattr(artifact, "TERMS", renamed)
    with pytest.raises(ArtifactError, match=r"\(new: layer_fixed; removed: kernel_fixed\); "
                       r"refit it"):
        load(path)


def test_every_field_and_fitted_attribute_round_trips(tmp_path):
    m = default_model()
    save(m, tmp_path / "m.json")
    loaded, _ = load(tmp_path / "m.json")
    for name in ("ranges", "points", "memory", "metrics", "data_sha256", "sources", "hardware",
                 "roofline_warnings"):
        assert getattr(loaded, name) == getattr(m, name), name
    assert loaded.engines.keys() == m.engines.keys()
    for key, est in m.engines.items():
        got = loaded.engines[key]
        assert got.get_params() == est.get_params()
        fitted = {k for k in vars(est) if k.endswith("_")}
        assert fitted and fitted == {k for k in vars(got) if k.endswith("_")}
        for k in fitted:
            a, b = getattr(est, k), getattr(got, k)
            if isinstance(a, np.ndarray):
                assert b.dtype == a.dtype
                np.testing.assert_array_equal(a, b)
            else:
                assert a == b and type(a) is type(b), k


def test_a_new_fitted_attribute_or_field_value_is_saved_without_code_changes(tmp_path):
    """The serializer is generic: a fitted attribute or CostModel field it has never seen
    round-trips if it is JSON or an array."""
    m = fresh()
    est = next(iter(m.engines.values()))
    est.spread_ = np.arange(6, dtype=np.float32).reshape(2, 3)
    est.labels_ = {"a": [1, 2.5, None, True]}
    m.sources = ["x", "y"]
    save(m, tmp_path / "m.json")
    got = next(iter(load(tmp_path / "m.json")[0].engines.values()))
    np.testing.assert_array_equal(got.spread_, est.spread_)
    assert got.spread_.dtype == np.float32
    assert got.labels_ == {"a": [1, 2.5, None, True]}


@pytest.mark.parametrize("where, value, words", [
    ("attribute", object(), ["spread_", "object", "artifacts store"]),
    ("attribute", (1, 2), ["spread_", "tuple"]),
    ("attribute", np.array([object()], dtype=object), ["spread_", "dtype object", "pickle"]),
    ("attribute", {1: "int key"}, ["spread_", "key 1"]),
    ("field", {"nested": {1, 2}}, ["CostModel.points.nested", "set"]),
])
def test_a_value_that_is_not_data_is_refused_at_save_time(tmp_path, where, value, words):
    m = fresh()
    if where == "attribute":
        next(iter(m.engines.values())).spread_ = value
    else:
        m.points = value
    with pytest.raises(ArtifactError) as info:
        save(m, tmp_path / "m.json")
    for w in words:
        assert w in str(info.value)
    assert not list(tmp_path.iterdir())          # refused before anything is written


def test_an_attribute_that_is_neither_parameter_nor_fitted_is_refused(tmp_path):
    m = fresh()
    next(iter(m.engines.values())).scratch = 1.0
    with pytest.raises(ArtifactError, match="scratch is neither a parameter nor a fitted"):
        save(m, tmp_path / "m.json")


def test_metadata_content(tmp_path):
    meta = save(default_model(), tmp_path / "m.json")
    on_disk = json.loads((tmp_path / "m.json").read_text())
    assert {k: v for k, v in on_disk.items() if k not in ("model", "format")} == meta
    for key in ("schema_version", "engine_advisor_version", "sklearn_version", "created",
                "training_data_sha256", "fit_metrics", "calibrated_ranges", "artifact_sha256",
                "arrays_sha256", "coefficients"):
        assert key in meta
    assert meta["schema_version"] == SCHEMA_VERSION == 3
    assert "vllm/B300/8/1" in meta["calibrated_ranges"]
    with np.load(arrays_path(tmp_path / "m.json"), allow_pickle=False) as npz:
        assert {f for f in npz.files} >= {"engine0.coef_", "engine0.coef_cov_"}


def test_the_same_model_gives_the_same_bytes(tmp_path):
    m = default_model()
    a = save(m, tmp_path / "a.json")
    b = save(m, tmp_path / "b.json")
    assert a["artifact_sha256"] == b["artifact_sha256"]
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()


def test_tampered_arrays_are_refused(tmp_path):
    path = tmp_path / "m.json"
    save(default_model(), path)
    ap = arrays_path(path)
    data = bytearray(ap.read_bytes())
    data[len(data) // 2] ^= 0xFF
    ap.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="sha256 .* does not match .*modified or truncated"):
        load(path)


def test_an_edited_model_section_is_refused(tmp_path):
    path = tmp_path / "m.json"
    save(default_model(), path)
    doc = json.loads(path.read_text())
    doc["model"]["fields"]["points"]["vllm/B300/8/1"] += 1
    path.write_text(json.dumps(doc))
    with pytest.raises(ArtifactError, match="artifact_sha256 does not match its model section"):
        load(path)


def test_truncated_document_is_refused(tmp_path):
    path = tmp_path / "m.json"
    save(default_model(), path)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ArtifactError, match="not valid JSON .*truncated"):
        load(path)


def test_wrong_schema_version_is_refused(tmp_path):
    path = tmp_path / "m.json"
    save(default_model(), path)
    doc = json.loads(path.read_text())
    doc["schema_version"] = 99
    path.write_text(json.dumps(doc))
    with pytest.raises(ArtifactError, match="schema version 99.*reads 3.*refit"):
        load(path)


def test_missing_file_and_missing_arrays(tmp_path):
    with pytest.raises(ArtifactError, match="no such file"):
        load(tmp_path / "nope.json")
    save(default_model(), tmp_path / "m.json")
    arrays_path(tmp_path / "m.json").unlink()
    with pytest.raises(ArtifactError, match="arrays m.npz: cannot read"):
        load(tmp_path / "m.json")


def test_only_json_names_are_written(tmp_path):
    with pytest.raises(ArtifactError, match="name it NAME.json"):
        save(default_model(), tmp_path / "m.joblib")
    assert not list(tmp_path.iterdir())


def test_write_is_atomic_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "sub" / "m.json"
    save(default_model(), path)
    save(default_model(), path)  # overwrite in place
    assert sorted(p.name for p in path.parent.iterdir()) == ["m.json", "m.npz"]


# ------------------------------------------------------------------ code cannot run
class Payload:
    """Unpickling this creates a marker (a directory): what a hostile artifact would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def _point_at(path, data: bytes) -> None:
    """Make the document at ``path`` vouch for ``data`` as its arrays (sha256 and all), as
    an attacker who can write both files would."""
    arrays_path(path).write_bytes(data)
    doc = json.loads(path.read_text())
    doc["arrays_sha256"] = artifact.hashlib.sha256(data).hexdigest()
    doc["artifact_sha256"] = artifact.content_sha256(doc["model"], doc["arrays_sha256"])
    doc.pop("replaces", None)
    path.write_text(json.dumps(doc))


def _pickled_npy(obj) -> bytes:
    member = io.BytesIO()
    np.lib.format.write_array(member, np.array([obj], dtype=object), allow_pickle=True)
    return member.getvalue()


def _npz_with(name: str, npy: bytes, base: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(base)) as src, zipfile.ZipFile(buf, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, npy if info.filename == name else src.read(info))
    return buf.getvalue()


@pytest.mark.parametrize("where", ["arrays-file", "npy-member", "document", "joblib-name"])
def test_a_crafted_artifact_cannot_run_code(tmp_path, where):
    marker = tmp_path / "pwned"
    payload = pickle.dumps(Payload(marker), protocol=4)
    path = tmp_path / "m.json"
    save(default_model(), path)
    if where == "arrays-file":            # a pickle in place of the .npz, sha256 matching
        _point_at(path, payload)
        words = "cannot be read as arrays"
    elif where == "npy-member":           # an object array (pickled) inside the .npz
        _point_at(path, _npz_with("engine0.coef_.npy", _pickled_npy(Payload(marker)),
                                  arrays_path(path).read_bytes()))
        words = "allow_pickle=False"
    elif where == "document":             # a pickle in place of the JSON
        path.write_bytes(payload)
        words = "a pickle, not a JSON document.*model convert"
    else:                                 # an old joblib artifact, by name
        path = tmp_path / "m.joblib"
        path.write_bytes(payload)
        (tmp_path / "m.joblib.json").write_text("{}")
        words = "joblib .*model convert .*m.joblib .*m.json"
    with pytest.raises(ArtifactError, match=words):
        load(path)
    assert not marker.exists()
    pickle.loads(payload)                 # the payload itself does work
    assert marker.exists()


def _legacy(tmp_path, obj):
    """A schema-2 joblib artifact of ``obj`` with the metadata it was written with."""
    import hashlib

    import joblib
    path = tmp_path / "old.joblib"
    joblib.dump(obj, path)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    (tmp_path / "old.joblib.json").write_text(json.dumps({"schema_version": 2,
                                                          "artifact_sha256": sha}))
    return path


def test_convert_reads_a_trusted_joblib_artifact_and_checks_it(tmp_path):
    m = default_model()
    path = _legacy(tmp_path, m)
    got = read_trusted_joblib(path)
    assert isinstance(got, CostModel) and got.engines.keys() == m.engines.keys()
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(ArtifactError, match="does not match its metadata"):
        read_trusted_joblib(path)
    other = _legacy(tmp_path, {"not": "a model"})
    with pytest.raises(ArtifactError, match="not a CostModel"):
        read_trusted_joblib(other)
    (tmp_path / "old.joblib.json").unlink()
    with pytest.raises(ArtifactError, match="metadata old.joblib.json is missing"):
        read_trusted_joblib(other)


def test_convert_reads_an_artifact_pickled_before_the_namespace(tmp_path):
    """A schema-2 pickle names the old top-level modules (``model.fit.costmodel``): they are
    read as ``engine_advisor``'s, never imported as top-level names."""
    import sys

    import joblib
    m = default_model()
    path = tmp_path / "old.joblib"
    joblib.dump(m, path, protocol=2)     # GLOBAL opcodes: the module names in plain text
    data = path.read_bytes()
    assert b"cengine_advisor.model.fit.costmodel\n" in data
    old = data.replace(b"cengine_advisor.", b"c")
    assert b"engine_advisor" not in old and b"cmodel.fit.costmodel\n" in old
    path.write_bytes(old)
    (tmp_path / "old.joblib.json").write_text(json.dumps({
        "schema_version": 2, "artifact_sha256": hashlib.sha256(old).hexdigest()}))
    got = read_trusted_joblib(path)
    assert isinstance(got, CostModel) and got.engines.keys() == m.engines.keys()
    assert "model" not in sys.modules and "model.fit" not in sys.modules


def test_model_convert_command(tmp_path, capsys):
    from engine_advisor.cli.main import main

    m = default_model()
    old = _legacy(tmp_path, m)
    new = tmp_path / "new.json"
    assert main(["model", "convert", str(old), str(new)]) == 0
    loaded, meta = load(new)
    assert recommend(loaded, W, "v").engine == recommend(m, W, "v").engine
    assert f"wrote {new} (model {meta['model_version']})" in capsys.readouterr().out
    assert main(["model", "convert", str(tmp_path / "nope.joblib"), str(new)]) == 2
    assert "no such file" in capsys.readouterr().err


def test_atomic_write_gives_open_s_permissions_and_keeps_a_replaced_file_s(tmp_path):
    """mkstemp makes its file 0600; the written file must read as a plain open() would make it
    (0666 less the umask), so a service running as another user can read an artifact, and a
    file replaced keeps the permissions it had."""
    import os
    import stat

    from engine_advisor.model.diskio import atomic_write

    mask = os.umask(0o022)
    os.umask(mask)
    fresh = tmp_path / "fresh.json"
    atomic_write(fresh, b"{}")
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~mask
    kept = tmp_path / "kept.json"
    kept.write_bytes(b"old")
    kept.chmod(0o640)
    atomic_write(kept, b"new")
    assert kept.read_bytes() == b"new"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o640
