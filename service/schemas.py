"""Request and response models of the service's own endpoints (the recommendation contract itself
lives in engine_advisor.model.workload / engine_advisor.model.schemas, shared with the CLI)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from engine_advisor.model.decision.crossover import CROSSOVER_RANGE
from engine_advisor.model.jsonnum import JsonModel
from engine_advisor.model.schemas import ConfigPrediction, ConfigRef, Exclusion, Recommendation
from engine_advisor.model.workload import MAX_CONTEXT, MAX_GPUS, Engine, Workload
from engine_advisor.service.errors import ErrorDetail

WORKLOAD_REF = {"$ref": "#/components/schemas/Workload"}


class BatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    workloads: Annotated[list[Any], Field(
        min_length=1, description="workloads (each validated on its own; the number is capped "
                                  "by the max_batch setting, default 1000)",
        json_schema_extra={"items": WORKLOAD_REF})]


class BatchItem(BaseModel):
    index: int
    recommendation: Recommendation | None = None
    error: ErrorDetail | None = None


class BatchResponse(BaseModel):
    results: list[BatchItem]
    succeeded: int
    failed: int


class PredictRequest(JsonModel):
    model_config = ConfigDict(extra="forbid")

    workload: Workload
    engine: Engine
    dcp_size: Annotated[int, Field(gt=0, le=MAX_GPUS)]


class StepSeconds(BaseModel):
    """Seconds of each physical term of one decode step (engine_advisor.model.physics.terms)."""

    gemm: float
    moe: float
    kv_read: float
    mla_read: float
    dcp_read: float
    state: float
    tp_comm: float
    dcp_comm: float
    dcp_fixed: float
    kernel_fixed: float
    moe_fixed: float
    seq_fixed: float
    step_fixed: float


class PredictResponse(BaseModel):
    prediction: ConfigPrediction
    decode_step_s: StepSeconds
    model_version: str


Context = Annotated[int, Field(gt=0, le=MAX_CONTEXT)]


class CrossoverRequest(Workload):
    """A workload without ``context_tokens``: the context is swept over ``context_range``."""

    context_tokens: int | None = Field(default=None, description="not accepted: the context "
                                       "is swept over context_range")
    context_range: tuple[Context, Context] = Field(
        default=CROSSOVER_RANGE, description="[low, high] context tokens searched for crossovers")
    points: Annotated[list[Context], Field(min_length=1, max_length=256)] | None = Field(
        default=None, description="contexts at which to return the curves (default: 16 "
                                  "log-spaced points over context_range)")

    @field_validator("context_tokens", mode="before")
    @classmethod
    def _no_context(cls, v: Any) -> None:
        if v is not None:
            raise ValueError("crossover sweeps the context; give context_range and/or points "
                             "instead of context_tokens")
        return None

    @model_validator(mode="after")
    def _range(self) -> CrossoverRequest:
        lo, hi = self.context_range
        if lo >= hi:
            raise ValueError(f"context_range: low {lo} must be below high {hi}")
        return self


class Crossing(BaseModel):
    context_tokens: int
    before: ConfigRef
    after: ConfigRef


class Curve(BaseModel):
    engine: str
    dcp_size: int
    calibrated: bool
    total_s: list[float | None] = Field(
        description="predicted total per point; null where not even one sequence fits")


class CrossoverResponse(BaseModel):
    context_range: tuple[int, int]
    crossover_context_tokens: int | None = Field(
        description="the first context in the range where the best engine changes, or null")
    engine_crossovers: list[Crossing]
    config_crossovers: list[Crossing]
    points: list[int]
    best: list[ConfigRef] = Field(description="the fastest configuration at each point")
    curves: list[Curve] = Field(description="predicted total seconds at each point (prefix "
                                            "reuse applied, as in POST /v1/recommend)")
    excluded: list[Exclusion]
    model_version: str


class ModelInfo(BaseModel):
    model_version: str
    source: str
    loaded_at: str
    created: str | None = None
    engine_advisor_version: str | None = None
    artifact_sha256: str | None = None
    training_data_sha256: str
    engines: list[str]
    sources: list[str]
    calibrated_ranges: dict[str, dict[str, dict[str, list[float]]]] = Field(
        description="engine/GPU/GPU count/DCP -> served model (name@architecture hash) -> "
                    "dimension -> [lowest, highest] calibrated value")
    calibrated_points: dict[str, int]
    fit_metrics: dict[str, dict[str, Any]] = Field(
        description="per engine/GPU: points, observations, residual sd, CV MAPE")
    efficiencies: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="per engine/GPU: the fitted coefficient of each "
        "physical term (1 = the silicon's achievable rate; counts in seconds per unit)")
    hardware: dict[str, dict[str, str]] = Field(
        default_factory=dict, description="per GPU type: where each part of its physics came "
        "from (a measured profile or the spec sheet)")
    roofline_warnings: list[str] = Field(
        default_factory=list, description="calibration rows faster than their roofline")
    memory_fractions: dict[str, dict[str, list[float]]]


class ReloadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: Annotated[str, Field(min_length=1, max_length=4096)] | None = Field(
        default=None, description="artifact to load: the configured model_path or a file inside "
                                  "models_dir (default: the configured model_path)")


class ReloadResponse(BaseModel):
    model_version: str
    previous_version: str
    source: str
    loaded_at: str


class Health(BaseModel):
    status: str
    model_version: str | None = None
