"""GPU catalogue: memory, HBM bandwidth, scale-up link bandwidth and dense tensor-core FLOP/s.

Units and conventions:

- ``memory_bytes``: device memory as the driver reports it, the total that an engine's memory
  fraction multiplies (vLLM ``--gpu-memory-utilization``, SGLang ``--mem-fraction-static``).
  NVIDIA figures are aiconfigurator-core 0.12.0's ``mem_capacity`` (B300, GB200, GB300: the
  nvidia-smi total; H100/B200: the datasheet's 80/180 GB read as GiB, within 0.5 % of the
  driver's total). H200: the total CUDA reports on our H200 (139.8 GiB = 150,109,106,995 B,
  the figure vLLM 0.26.0 multiplies by its fraction: "Desired GPU memory utilization is (0.9,
  125.82 GiB)"; the datasheet says 141 GB, nvidia-smi 143,771 MiB). AMD figures are the
  datasheet's decimal GB (drivers may report a few percent more).
- ``hbm_bandwidth``: peak bytes/s per GPU from the datasheet.
- ``nvlink_bandwidth``: bytes/s per GPU **per direction** on the scale-up fabric (NVLink;
  AMD Infinity Fabric / xGMI for the MI parts): half the datasheet's bidirectional figure.
- ``flops_bf16`` / ``flops_fp8`` / ``flops_fp4``: dense (no 2:4 sparsity) tensor-core FLOP/s
  per GPU, one multiply-add = 2 FLOPs; ``None`` where the GPU has no such tensor-core format.

A custom spec needs only ``name``, ``memory_bytes`` and ``hbm_bandwidth``. Without FLOP figures
``flops()`` assumes a machine balance of ``ASSUMED_FLOPS_PER_BYTE`` dense bf16 FLOPs per byte of
HBM bandwidth (the lowest of the built-in GPUs, H200's 206, rounded down, so compute is not
over-promised), fp8 at twice that; and says the figure is assumed. fp4 weights on a GPU without
fp4 tensor cores run at the bf16 rate (weight-only dequantizing kernels).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from engine_advisor.model.jsonnum import JsonModel

GB = 1e9
GIB = 1 << 30
TB = 1e12
TFLOPS = 1e12
ASSUMED_FLOPS_PER_BYTE = 200.0
FlopDtype = Literal["bf16", "fp16", "fp8", "fp4"]

# GPUs whose engines run the same kernels (FlashMLA / FA3 builds, CUTLASS and TRT-LLM paths) share a
# family: the fit pools an engine's rows over a family (engine_advisor.model.fit.fitting), and the
# silicon's kernel floors are the family's (engine_advisor.model.hardware.silicon.MOE_CALL_S)
GPU_FAMILIES = {"H100": "hopper", "H200": "hopper", "H20": "hopper", "H800": "hopper",
                "GH200": "hopper", "B200": "blackwell", "B300": "blackwell",
                "GB200": "blackwell", "GB300": "blackwell"}


def gpu_family(gpu: str) -> str:
    """A GPU's family (its own name when it has none)."""
    return GPU_FAMILIES.get(gpu.upper(), gpu.upper().lower())


_Flops = Annotated[float | None, Field(gt=1e12, lt=1e18, allow_inf_nan=False,
                                       description="dense tensor-core FLOP/s per GPU")]


class GpuSpec(JsonModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(min_length=1, max_length=64, description="GPU type name")]
    memory_bytes: Annotated[float, Field(gt=1e9, lt=1e13, allow_inf_nan=False,
                                         description="memory per GPU in bytes")]
    hbm_bandwidth: Annotated[float, Field(gt=1e10, lt=1e15, allow_inf_nan=False,
                                          description="HBM bandwidth per GPU in bytes/s")]
    nvlink_bandwidth: Annotated[float | None, Field(
        gt=0, lt=1e14, allow_inf_nan=False,
        description="scale-up link bytes/s per GPU per direction")] = None
    flops_bf16: _Flops = None
    flops_fp8: _Flops = None
    flops_fp4: _Flops = None
    vendor: Literal["nvidia", "amd"] | None = None
    source: Annotated[str, Field(max_length=400)] | None = None

    def flops(self, dtype: FlopDtype) -> tuple[float, bool]:
        """(dense FLOP/s for matmuls with ``dtype`` operands, whether the figure is assumed)."""
        bf16, assumed = self.flops_bf16, False
        if bf16 is None:
            bf16, assumed = self.hbm_bandwidth * ASSUMED_FLOPS_PER_BYTE, True
        if dtype in ("bf16", "fp16"):
            return bf16, assumed
        if dtype == "fp8":
            return (self.flops_fp8, False) if self.flops_fp8 else (2 * bf16, True)
        if dtype == "fp4":
            return (self.flops_fp4, False) if self.flops_fp4 else (bf16, assumed)
        raise ValueError(f"unknown dtype {dtype!r}; known: bf16, fp16, fp8, fp4")


_AIC = "aiconfigurator-core 0.12.0 systems/"
_NV_HOPPER = "NVIDIA H100/H200 Tensor Core GPU datasheets (SXM)"
_NV_BLACKWELL = "NVIDIA Blackwell datasheet (HGX B200, GB200 NVL72)"
_NV_ULTRA = "NVIDIA Blackwell Ultra datasheet (HGX B300, GB300 NVL72)"


def _nv(name, mem, hbm, link, bf16, fp8, fp4, source):
    return GpuSpec(name=name, memory_bytes=mem, hbm_bandwidth=hbm, nvlink_bandwidth=link,
                   flops_bf16=bf16, flops_fp8=fp8, flops_fp4=fp4, vendor="nvidia", source=source)


def _amd(name, mem, hbm, link, bf16, fp8, fp4, source):
    return GpuSpec(name=name, memory_bytes=mem, hbm_bandwidth=hbm, nvlink_bandwidth=link,
                   flops_bf16=bf16, flops_fp8=fp8, flops_fp4=fp4, vendor="amd", source=source)


BUILTIN_GPUS: dict[str, GpuSpec] = {
    "H100": _nv("H100", 80 * GIB, 3.35 * TB, 450 * GB, 989 * TFLOPS, 1979 * TFLOPS, None,
                f"{_NV_HOPPER}; {_AIC}h100_sxm.yaml"),
    "H200": _nv("H200", 150_109_106_995, 4.8 * TB, 450 * GB, 989 * TFLOPS, 1979 * TFLOPS, None,
                f"{_NV_HOPPER}; {_AIC}h200_sxm.yaml"),
    # H20: the export Hopper (HGX H20 datasheet): 96 GB HBM3 at 4.0 TB/s, 148 / 296 TFLOPS dense
    "H20": _nv("H20", 96 * GIB, 4.0 * TB, 450 * GB, 148 * TFLOPS, 296 * TFLOPS, None,
               "NVIDIA HGX H20 datasheet"),
    "B200": _nv("B200", 180 * GIB, 8 * TB, 900 * GB, 2250 * TFLOPS, 4500 * TFLOPS,
                9000 * TFLOPS, f"{_NV_BLACKWELL} (8 TB/s; {_AIC}b200_sxm.yaml has 7.7 TB/s)"),
    "B300": _nv("B300", 288_400_343_040, 7.75 * TB, 900 * GB, 2250 * TFLOPS, 4500 * TFLOPS,
                14000 * TFLOPS, f"{_NV_ULTRA}; {_AIC}b300_sxm.yaml (memory: nvidia-smi "
                "275,040 MiB)"),
    "GB200": _nv("GB200", 198_674_743_296, 8 * TB, 900 * GB, 2500 * TFLOPS, 5000 * TFLOPS,
                 10000 * TFLOPS, f"{_NV_BLACKWELL}; {_AIC}gb200.yaml (memory: nvidia-smi "
                 "189,471 MiB)"),
    "GB300": _nv("GB300", 298_013_687_808, 8 * TB, 900 * GB, 2500 * TFLOPS, 5000 * TFLOPS,
                 15000 * TFLOPS, f"{_NV_ULTRA}; {_AIC}gb300.yaml (memory: nvidia-smi "
                 "284,208 MiB)"),
    "MI300X": _amd("MI300X", 192 * GB, 5.3 * TB, 448 * GB, 1307.4 * TFLOPS, 2614.9 * TFLOPS,
                   None, "AMD Instinct MI300X datasheet (Infinity Fabric 7 x 128 GB/s "
                   "bidirectional)"),
    "MI325X": _amd("MI325X", 256 * GB, 6.0 * TB, 448 * GB, 1307.4 * TFLOPS, 2614.9 * TFLOPS,
                   None, "AMD Instinct MI325X datasheet (Infinity Fabric 7 x 128 GB/s "
                   "bidirectional)"),
    "MI355X": _amd("MI355X", 288 * GB, 8.0 * TB, 537.6 * GB, 2500 * TFLOPS, 5000 * TFLOPS,
                   10000 * TFLOPS, "AMD Instinct MI355X datasheet (MXFP4 dense; Infinity Fabric "
                   "7 x 153.6 GB/s bidirectional)"),
}


def builtin_gpu(name: str) -> GpuSpec:
    """A built-in GPU by name, case-insensitive; KeyError for an unknown name."""
    spec = BUILTIN_GPUS.get(name.upper()) if isinstance(name, str) else None
    if spec is None:
        raise KeyError(name)
    return spec
