"""The workload of the recommendation contract, shared by the CLI and the REST API."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal, NamedTuple

import orjson
from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from engine_advisor.model.arch import PRESETS, ArchConfigError, from_hf_config
from engine_advisor.model.engines import defaults as default_engines
from engine_advisor.model.engines import names as engine_names
from engine_advisor.model.hardware.gpus import BUILTIN_GPUS, GpuSpec
from engine_advisor.model.jsonnum import JsonModel
from engine_advisor.model.kv import KvDtype
from engine_advisor.model.physics.shape import ModelShape, bare, from_architecture, preset_shape

Engine = Literal[engine_names()]      # the registered engines (engine_advisor.model.engines)
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
    engines: Annotated[list[Engine], Field(
        min_length=1, max_length=N_ENGINES,
        description="the engines to consider (default: vllm and sglang; trtllm, predicted from "
                    "physics priors only, when named here)")] | None = None
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
        if ((self.preset is None) + (self.hf_config is None)
                + (self.kv_bytes_per_token is None)) == 2:       # exactly one given
            return self
        given = [k for k in ("kv_bytes_per_token", "hf_config", "preset")
                 if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of kv_bytes_per_token, hf_config or preset"
                             + (f" (got {', '.join(given)})" if given else ""))
        return self

    def query_key(self) -> tuple:
        """Every field that a prediction depends on but the sizes (context, output, batch),
        hashable: workloads with equal keys are one query at different sizes
        (``engine_advisor.model.queries.query_for``). ``model`` names the launch command's model,
        and a config.json's model (its calibration key, ``ModelShape.key``): only with ``hf_config``
        is it one. Without ``engines``, the engines considered by default
        (``engine_advisor.model.engines.defaults``)."""
        r = self.requirements
        return (self.preset, self.kv_bytes_per_token,
                (orjson.dumps(self.hf_config, option=orjson.OPT_SORT_KEYS), self.model)
                if self.hf_config is not None else None,
                self.kv_cache_dtype, self.model_weight_bytes, self.gpu,
                self.num_gpus, tuple(self.engines) if self.engines else default_engines(),
                tuple(self.dcp_sizes) if self.dcp_sizes else None,
                tuple(r.__dict__.values()) if r is not None else None, self.allow_extrapolation)

    def gpu_spec(self) -> GpuSpec:
        return BUILTIN_GPUS[self.gpu.upper()] if isinstance(self.gpu, str) else self.gpu

    def model_shape(self) -> ModelShape:
        """The served model's physics at this workload's KV dtype
        (engine_advisor.model.physics.shape)."""
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


class Config(NamedTuple):
    """One candidate serving configuration (a tuple: cheap to hash on the hot path)."""

    engine: str
    dcp_size: int
