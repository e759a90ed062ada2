import pytest

from engine_advisor.model.fit.dataset import (
    COLUMNS,
    DatasetError,
    Measurement,
    dataset_sha256,
    parse_csv,
    read_csv,
    write_csv,
)
from engine_advisor.model.fit.default import REFERENCE_CSV

ROW = Measurement(engine="vllm", gpu="b300", num_gpus=8, dcp_size=1, mem_fraction=0.92,
                  context_tokens=65536, output_tokens=2048, batch_size=64,
                  kv_bytes_per_token=70272, total_s=100.5, tpot_s=0.045, source="t")


def test_reference_data_states_its_assumptions_and_parses():
    text = REFERENCE_CSV.read_text()
    for fact in ("65,536", "204,800", "27,648", "8 distinct prompts x 4,096 output tokens",
                 "engine_advisor.model.fit.seedcheck", "roofline", "tensor parallel 8", "0.95",
                 "0.92", "Kimi-K3"):
        assert fact in text
    rows = read_csv(REFERENCE_CSV)
    assert len([r for r in rows if r.total_s]) == 4
    assert {r.mem_fraction for r in rows if r.unsafe} == {0.95}


def test_round_trip(tmp_path):
    path = tmp_path / "d.csv"
    write_csv(path, [ROW, ROW.model_copy(update={"engine": "sglang", "dcp_size": 8})])
    back = read_csv(path)
    assert back[0] == ROW and back[0].gpu == "B300"
    assert back[1].engine == "sglang"
    assert dataset_sha256(back) == dataset_sha256([ROW, back[1]])


@pytest.mark.parametrize("line,message", [
    ("vllm,,B300,8,1,0.92,65536,2048,64,70272,1,,,-1,0,0,x",
     "total_s: Input should be greater than 0"),
    ("lmdeploy,,B300,8,1,0.92,65536,2048,64,70272,1,,,1,0,0,x",
     "engine: Value error, unknown engine"),
    ("vllm,,B300,8,1,1.5,65536,2048,64,70272,1,,,1,0,0,x", "mem_fraction: Input should be less"),
    ("vllm,,B300,8,1,0.92,65536,2048,64,70272,1,,,nan,0,0,x", "total_s: Input should be a finite"),
    ("vllm,,B300,8,1", "expected 17 cells, got 5"),
    ("vllm,,B300,8,1,0.92,65536,2048,64,27648,1,,,1,0,0,x,kimi-k3,int3",
     "kv_cache_dtype: Input should be 'bf16', 'fp16' or 'fp8'"),
    ("vllm,,B300,8,1,0.92,65536,2048,64,27648,1,,,1,0,0,x,kimi-k3,bf16,1.5",
     "prefix_share: Input should be less than or equal to 1"),
])
def test_bad_rows_name_file_line_and_field(line, message):
    # the header has as many of the columns as the line has cells (optional ones may be left out)
    header = COLUMNS[:max(17, line.count(",") + 1)]
    text = ",".join(header) + "\n# comment\n" + line + "\n"
    with pytest.raises(DatasetError) as exc:
        parse_csv(text, "runs/x.csv")
    assert str(exc.value).startswith("runs/x.csv:3: ")
    assert message in str(exc.value)


def test_bad_headers():
    with pytest.raises(DatasetError, match="lacks required columns"):
        parse_csv("engine,gpu\nvllm,B300\n")
    with pytest.raises(DatasetError, match="unknown columns"):
        parse_csv(",".join(COLUMNS) + ",colour\n")
    with pytest.raises(DatasetError, match="empty dataset"):
        parse_csv("# nothing\n")


def test_unreadable_file(tmp_path):
    with pytest.raises(DatasetError, match="cannot read"):
        read_csv(tmp_path / "missing.csv")
    (tmp_path / "bin.csv").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(DatasetError, match="not UTF-8"):
        read_csv(tmp_path / "bin.csv")


def test_the_decode_step_a_row_states():
    """A batch-1 TPOT stands for the decode step only where the row has no token streams: a
    sweep's row whose streams showed no step (vLLM sent a 260,000-token prompt's 128 tokens in
    three chunks, a TPOT of 31 ms against 3.2 at 131,072 tokens) states none."""
    one = ROW.model_copy(update={"batch_size": 1})
    assert one.decode_step == 0.045                           # an imported summary's TPOT
    assert ROW.decode_step is None                            # a batch's TPOT is not a step
    assert one.model_copy(update={"decode_step_s": 0.04}).decode_step == 0.04
    swept = one.model_copy(update={"source": "calibrate:vllm:dcp=1:mem=0.9:ctx=260000:batch=1"})
    assert swept.decode_step is None
    assert swept.model_copy(update={"decode_step_s": 0.0032}).decode_step == 0.0032
