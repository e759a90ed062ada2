import pytest
from pydantic import ValidationError

from engine_advisor.model.hardware.gpus import (
    ASSUMED_FLOPS_PER_BYTE,
    BUILTIN_GPUS,
    GpuSpec,
    builtin_gpu,
)


def test_catalogue_has_the_issue_gpus():
    assert set(BUILTIN_GPUS) == {"H100", "H200", "H20", "B200", "B300", "GB200", "GB300",
                                 "MI300X", "MI325X", "MI355X"}


@pytest.mark.parametrize("name", sorted(BUILTIN_GPUS))
def test_entries_are_positive_and_ordered(name):
    g = BUILTIN_GPUS[name]
    assert g.name == name and g.vendor in ("nvidia", "amd") and g.source
    assert g.memory_bytes > 50e9 and g.hbm_bandwidth > 1e12 and g.nvlink_bandwidth > 1e11
    assert 0 < g.flops_bf16 < g.flops_fp8
    if g.flops_fp4 is not None:
        assert g.flops_fp8 < g.flops_fp4
    # dense bf16 FLOPs per byte of HBM bandwidth: between 150 and 350 for every GPU here
    # machine balance: FLOPs per HBM byte (H20, the export Hopper, is bandwidth-rich: 37)
    assert (30 if g.name == "H20" else 150) < g.flops_bf16 / g.hbm_bandwidth < 350
    assert g.flops("bf16") == (g.flops_bf16, False)
    assert g.flops("fp8") == (g.flops_fp8, False)


def test_datasheet_values():
    h100, h200, b300, mi300x = (builtin_gpu(n) for n in ("H100", "h200", "B300", "mi300x"))
    assert h100.hbm_bandwidth == 3.35e12 and h100.flops_bf16 == 989e12
    assert h100.flops_fp8 == 1979e12 and h100.flops_fp4 is None
    assert h100.nvlink_bandwidth == 450e9           # 900 GB/s bidirectional, per direction
    # the CUDA total of a real H200 (vLLM 0.26.0: "(0.9, 125.82 GiB)"), not the datasheet 141 GB
    assert h200.hbm_bandwidth == 4.8e12 and h200.memory_bytes == round(139.8 * 2**30)
    assert b300.memory_bytes == 288_400_343_040     # 275,040 MiB as nvidia-smi reports
    assert (b300.flops_bf16, b300.flops_fp8, b300.flops_fp4) == (2.25e15, 4.5e15, 14e15)
    assert b300.nvlink_bandwidth == 900e9
    assert mi300x.memory_bytes == 192e9 and mi300x.hbm_bandwidth == 5.3e12
    assert mi300x.flops_bf16 == pytest.approx(1307.4e12)


def test_fp4_without_fp4_tensor_cores_runs_at_bf16_rate():
    assert builtin_gpu("H200").flops("fp4") == (989e12, False)
    assert builtin_gpu("GB300").flops("fp4") == (15e15, False)


def test_builtin_gpu_unknown_name():
    with pytest.raises(KeyError):
        builtin_gpu("A100")


def test_custom_spec_with_three_fields_assumes_flops():
    g = GpuSpec(name="X1", memory_bytes=96e9, hbm_bandwidth=4e12)
    assert g.nvlink_bandwidth is None and g.flops_bf16 is None and g.vendor is None
    assert g.flops("bf16") == (4e12 * ASSUMED_FLOPS_PER_BYTE, True)
    assert g.flops("fp8") == (2 * 4e12 * ASSUMED_FLOPS_PER_BYTE, True)
    assert g.flops("fp4") == (4e12 * ASSUMED_FLOPS_PER_BYTE, True)
    given = GpuSpec(name="X2", memory_bytes=96e9, hbm_bandwidth=4e12, flops_bf16=1e15)
    assert given.flops("fp8") == (2e15, True) and given.flops("bf16") == (1e15, False)
    with pytest.raises(ValueError):
        g.flops("int2")


@pytest.mark.parametrize("extra", [{"flops_bf16": "1e15"}, {"flops_fp8": -1.0},
                                   {"vendor": "intel"}, {"tflops": 5}])
def test_custom_spec_validation(extra):
    with pytest.raises(ValidationError):
        GpuSpec.model_validate({"name": "X", "memory_bytes": 96e9, "hbm_bandwidth": 4e12,
                                **extra})


def test_specs_are_frozen():
    with pytest.raises(ValidationError):
        builtin_gpu("B200").memory_bytes = 1e9
