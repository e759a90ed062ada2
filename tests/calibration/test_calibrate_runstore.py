"""The run folder: durable appends, torn-line repair, sample clean-up, sweep identity."""

from __future__ import annotations

import json

import pytest

from engine_advisor.calibration.sweep.runstore import PointKey, RunStore, RunStoreError
from engine_advisor.model.fit.dataset import Measurement, read_csv

PARAMS = {"engine": "vllm", "contexts": [1024, 2048], "batch_sizes": [1]}


def _row(key: PointKey, total: float = 1.0) -> Measurement:
    return Measurement(engine=key.engine, gpu="B300", num_gpus=8, dcp_size=key.dcp_size,
                       mem_fraction=key.mem_fraction, context_tokens=key.context_tokens,
                       output_tokens=key.output_tokens, batch_size=key.batch_size,
                       kv_bytes_per_token=1000, total_s=total, source=key.source())


def key(ctx: int, rep: int = 0) -> PointKey:
    return PointKey("vllm", 1, 0.92, ctx, 4, 64, rep)


def test_key_round_trips_through_source():
    k = key(204800, 2)
    assert PointKey.parse(k.text()) == k
    assert k.source().startswith("calibrate:")


def test_points_are_appended_and_found_again(tmp_path):
    store = RunStore(tmp_path, PARAMS)
    store.append_point(key(1024), _row(key(1024)), [{"index": 0, "ttft_s": 0.1}])
    store.append_point(key(2048), _row(key(2048)), [])
    again = RunStore(tmp_path, PARAMS)
    assert again.done == {key(1024), key(2048)}
    assert [r.context_tokens for r in read_csv(tmp_path / "dataset.csv")] == [1024, 2048]
    with pytest.raises(RunStoreError, match="already recorded"):
        again.append_point(key(1024), _row(key(1024)), [])


@pytest.mark.parametrize("tail", [b"vllm,,B300,8,1,0.92,4096,64,4,1000,1,,,0.5",   # no newline
                                  b"vllm,,B300,8,1,0.9\n",                            # cut short
                                  b"\x00\x00\x00\x00"])                              # garbage
def test_a_torn_last_line_is_repaired(tmp_path, tail):
    store = RunStore(tmp_path, PARAMS)
    store.append_point(key(1024), _row(key(1024)), [{"index": 0}])
    with open(tmp_path / "dataset.csv", "ab") as f:
        f.write(tail)
    with open(tmp_path / "samples.jsonl", "a") as f:    # samples of the point in flight
        f.write(json.dumps({"key": key(4096).text(), "index": 0}) + "\n" + '{"key": "tor')
    again = RunStore(tmp_path, PARAMS)
    assert again.done == {key(1024)}
    assert again.repaired, "the repair must be reported"
    assert len(read_csv(tmp_path / "dataset.csv")) == 1
    samples = (tmp_path / "samples.jsonl").read_text().splitlines()
    assert [json.loads(s)["key"] for s in samples] == [key(1024).text()]


def test_an_empty_dataset_gets_its_header_back(tmp_path):
    RunStore(tmp_path, PARAMS)
    (tmp_path / "dataset.csv").write_bytes(b"")     # a kill before the header reached the disk
    store = RunStore(tmp_path, PARAMS)
    store.append_point(key(1024), _row(key(1024)), [])
    assert [r.context_tokens for r in read_csv(tmp_path / "dataset.csv")] == [1024]
    assert RunStore(tmp_path, PARAMS).done == {key(1024)}


def test_corruption_in_the_middle_is_refused(tmp_path):
    store = RunStore(tmp_path, PARAMS)
    store.append_point(key(1024), _row(key(1024)), [])
    text = (tmp_path / "dataset.csv").read_text()
    (tmp_path / "dataset.csv").write_text(text + "garbage,row\n" + text.splitlines()[1] + "\n")
    with pytest.raises(RunStoreError, match=r"dataset.csv:3: corrupt row in the middle"):
        RunStore(tmp_path, PARAMS)


def test_a_different_sweep_is_refused_with_the_difference(tmp_path):
    RunStore(tmp_path, PARAMS)
    with pytest.raises(RunStoreError, match=r"different sweep \(contexts: \[1024, 2048\] there, "
                                            r"\[1024\] now\)"):
        RunStore(tmp_path, {**PARAMS, "contexts": [1024]})


def test_a_foreign_dataset_folder_is_refused(tmp_path):
    (tmp_path / "dataset.csv").write_text("engine\n")
    with pytest.raises(RunStoreError, match="no manifest.json"):
        RunStore(tmp_path, PARAMS)


def test_manifest_is_written_atomically_with_parameters(tmp_path):
    store = RunStore(tmp_path, PARAMS)
    store.record_engine("dcp=1,mem=0.92", {"version": "0.11.0"})
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["parameters"] == PARAMS and m["engines"]["dcp=1,mem=0.92"]["version"] == "0.11.0"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".manifest")]
