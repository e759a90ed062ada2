"""The workload of the recommendation contract, shared by the CLI and the REST API."""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from model.arch import PRESETS, ArchConfigError, from_hf_config, preset
from model.engines import names as engine_names
from model.gpus import BUILTIN_GPUS, GpuSpec
from model.jsonnum import JsonModel
from model.kv import KvDtype
from model.shape import ModelShape, bare, from_architecture

Engine = Literal[engine_names()]      # the registered engines (model.engines)
N_ENGINES = len(engine_names())

MAX_CONTEXT = 16_777_216  # 16M tokens: beyond any model served today
MAX_OUTPUT = 1_048_576
MAX_BATCH = 65_536
MAX_GPUS = 1024

PosInt = Annotated[int, Field(strict=False, gt=0)]


class Requirements(JsonModel):
    """Capabilities the workload needs; engines lacking one are excluded (see capabilities)."""

    model_config = ConfigDict(extra="forbid")

    hardware_vendor: Literal["nvidia", "amd", "intel", "tpu", "cpu", "ascend"] | None = None
    quantization: Annotated[str, Field(min_length=1, max_length=32)] | None = None
    speculative_method: Annotated[str, Field(min_length=1, max_length=32)] | None = None
    pipeline_parallel: bool = False
    lora: bool = False
    dp_attention: bool = False  # SGLang's data-parallel attention for MLA models
    prefix_reuse_share: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)] = 0.0


class Workload(JsonModel):
    """A batch of ``batch_size`` concurrent sequences of ``context_tokens`` prompt and
    ``output_tokens`` output each, on ``num_gpus`` GPUs of one type (tensor parallel = num_gpus)."""

    model_config = ConfigDict(extra="forbid")

    context_tokens: Annotated[int, Field(gt=0, le=MAX_CONTEXT,
                                         description="prompt tokens per sequence")]
    output_tokens: Annotated[int, Field(gt=0, le=MAX_OUTPUT,
                                        description="output tokens per sequence")]
    batch_size: Annotated[int, Field(gt=0, le=MAX_BATCH, description="concurrent sequences")] = 1
    kv_bytes_per_token: Annotated[int, Field(
        gt=0, le=1 << 26,
        description="KV bytes per token (all layers) at kv_cache_dtype")] | None = None
    hf_config: dict[str, Any] | None = Field(
        default=None, description="contents of the model's config.json")
    preset: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    kv_cache_dtype: KvDtype = "bf16"
    model_weight_bytes: Annotated[float, Field(
        gt=0, lt=1e14, allow_inf_nan=False,
        description="total weight bytes (for KV capacity); presets supply it")] | None = None
    model: Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[\w./:@+-]+$")] | None = \
        Field(default=None, description="model name or path for the launch command")
    gpu: str | GpuSpec = "B300"
    num_gpus: Annotated[int, Field(gt=0, le=MAX_GPUS)] = 8
    engines: Annotated[list[Engine], Field(min_length=1, max_length=N_ENGINES)] | None = None
    dcp_sizes: Annotated[list[Annotated[int, Field(gt=0, le=MAX_GPUS)]],
                         Field(min_length=1, max_length=16)] | None = None
    requirements: Requirements | None = None
    allow_extrapolation: bool = False

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, v: str | GpuSpec) -> str | GpuSpec:
        if isinstance(v, str) and v.upper() not in BUILTIN_GPUS:
            raise ValueError(f"unknown GPU {v!r}; built in: {', '.join(BUILTIN_GPUS)}; "
                             "or give a custom spec {name, memory_bytes, hbm_bandwidth}")
        return v

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, v: str | None) -> str | None:
        if v is not None and v not in PRESETS:
            raise ValueError(f"unknown preset {v!r}; known: {', '.join(sorted(PRESETS))}")
        return v

    @field_validator("hf_config")
    @classmethod
    def _usable_config(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None:
            try:
                from_hf_config(v)
            except ArchConfigError as exc:
                raise ValueError(str(exc)) from None
        return v

    @field_validator("dcp_sizes")
    @classmethod
    def _dcp_divides(cls, v: list[int] | None, info: ValidationInfo) -> list[int] | None:
        num_gpus = info.data.get("num_gpus")
        if v and num_gpus:
            bad = [d for d in v if num_gpus % d]
            if bad:
                raise ValueError(f"{bad} do not divide num_gpus {num_gpus} (DCP stripes the KV "
                                 "over ranks of the tensor-parallel group)")
        return v

    @model_validator(mode="after")
    def _one_kv_source(self) -> Workload:
        given = [k for k in ("kv_bytes_per_token", "hf_config", "preset")
                 if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of kv_bytes_per_token, hf_config or preset"
                             + (f" (got {', '.join(given)})" if given else ""))
        return self

    def gpu_spec(self) -> GpuSpec:
        return BUILTIN_GPUS[self.gpu.upper()] if isinstance(self.gpu, str) else self.gpu

    def model_shape(self) -> ModelShape:
        """The served model's physics at this workload's KV dtype (model.shape)."""
        if self.preset is not None:
            shape = preset_shape(self.preset, self.kv_cache_dtype)
        elif self.hf_config is not None:
            shape = from_architecture(from_hf_config(self.hf_config, name=self.model),
                                      self.kv_cache_dtype)
        else:
            shape = bare(int(self.kv_bytes_per_token or 0), self.kv_cache_dtype)
        if self.model_weight_bytes is not None:
            shape = dataclasses.replace(shape, weight_bytes=self.model_weight_bytes,
                                        weights_known=True)
        return shape


@lru_cache(maxsize=64)
def preset_shape(name: str, kv_dtype: str) -> ModelShape:
    return from_architecture(preset(name), kv_dtype)


def served_preset(model: str | None, kv_bytes_per_token: int) -> tuple[str, str]:
    """(preset, KV dtype) when a served model's name is a preset whose KV bytes per token at
    bf16 or fp8 equal the measured ones, else ("", "bf16"): what a dataset row records."""
    name = (model or "").rsplit("/", 1)[-1].lower()
    if name in PRESETS:
        for dtype in ("bf16", "fp8"):
            if abs(preset_shape(name, dtype).kv_bytes_per_token - kv_bytes_per_token) < 0.5:
                return name, dtype
    return "", "bf16"


# config.json contents of the rows' ``hf:NAME@HASH`` architectures (calibration.sweep.served_model),
# registered by whoever read them from the run folders (``register_row_config``)
ROW_CONFIGS: dict[str, dict] = {}


def register_row_config(key: str, config: dict) -> None:
    """Make a row's ``hf:`` architecture key resolvable by ``shape_of``."""
    ROW_CONFIGS[key] = config
    _row_shape.cache_clear()


@lru_cache(maxsize=64)
def _row_shape(key: str, kv_dtype: str) -> ModelShape:
    return from_architecture(from_hf_config(ROW_CONFIGS[key], name=key.split("@")[0][3:]),
                             kv_dtype)


def shape_of(model: str, kv_dtype: str, kv_bytes_per_token: int, kv_shards: int = 1) -> ModelShape:
    """The served model of a dataset row: its preset when ``model`` names one, its registered
    config.json for an ``hf:`` key (its KV bytes must agree either way), else a bare shape from
    the KV bytes (``kv_shards`` > 1: GQA heads split)."""
    if model.startswith("hf:"):
        if model not in ROW_CONFIGS:
            raise ValueError(f"model: {model!r} names a config.json that is not loaded (fit reads "
                             "it from the run folder's model-config.json)")
        shape = _row_shape(model, kv_dtype)
        if abs(shape.kv_bytes_per_token - kv_bytes_per_token) > 0.5:
            raise ValueError(f"kv_bytes_per_token: {kv_bytes_per_token} disagrees with {model!r} "
                             f"at {kv_dtype} ({shape.kv_bytes_per_token:.0f})")
        return shape
    if model in PRESETS:
        shape = preset_shape(model, kv_dtype)
        if abs(shape.kv_bytes_per_token - kv_bytes_per_token) > 0.5:
            raise ValueError(f"kv_bytes_per_token: {kv_bytes_per_token} disagrees with preset "
                             f"{model!r} at {kv_dtype} ({shape.kv_bytes_per_token:.0f})")
        return shape
    if kv_shards > 1:
        return bare(kv_bytes_per_token, kv_dtype, "gqa", kv_shards)
    return bare(kv_bytes_per_token, kv_dtype)


class Config(NamedTuple):
    """One candidate serving configuration (a tuple: cheap to hash on the hot path)."""

    engine: str
    dcp_size: int
