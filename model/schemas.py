"""Response models of the recommendation contract, shared by CLI --json and REST."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Literal, TypeVar

import orjson
from pydantic import BaseModel, Field

M = TypeVar("M", bound=BaseModel)
_setattr = object.__setattr__
_new = object.__new__


def constructor(cls: type[M]) -> Callable[[dict], M]:
    """A maker of ``cls`` instances from values the caller guarantees valid, naming every
    field: what ``cls.model_construct(**values)`` builds, without its per-field loop (the
    recommender builds nine per query). Only for the plain models of this module (no aliases,
    validators, private attributes or extra fields; ``tests/model/test_eval_modes.py`` checks
    the result equals validation's). Every field is set: one set of them for all instances (a
    later assignment would only add a member it has)."""
    fields = set(cls.model_fields)

    def make(values: dict) -> M:
        m = _new(cls)
        _setattr(m, "__dict__", values)
        _setattr(m, "__pydantic_fields_set__", fields)
        _setattr(m, "__pydantic_extra__", None)
        _setattr(m, "__pydantic_private__", None)
        return m

    return make


def to_json(m: BaseModel) -> bytes:
    """``m.model_dump_json()`` as bytes, written by orjson in about half the time of
    pydantic-core's serializer: the same bytes for the plain models of the recommendation
    contract (fields of JSON types and nested plain models, in their declared order;
    ``tests/model/test_eval_modes.py`` compares them). An object of no JSON type is written as
    its ``vars()`` (a model's: its fields); one without a ``__dict__`` raises ``TypeError``."""
    return orjson.dumps(m, default=vars)


class ConfigPrediction(BaseModel):
    engine: str
    dcp_size: int
    total_s: float
    prefill_s: float
    decode_s: float
    tpot_s: float
    interval_s: tuple[float, float]
    calibrated: bool
    extrapolated: bool
    transferred: bool = Field(
        default=False, description="the engine's efficiencies were fitted on this hardware "
        "configuration but for other models: physics of this model, wider interval")
    mem_fraction: float
    kv_capacity_tokens: int
    fits_in_memory: bool
    running_sequences: int = Field(
        default=0, description="sequences the memory lets run at once (the rest queue)")
    running_limit: Literal["none", "kv", "state", "max_running"] = Field(
        default="none", description="what binds the sequences running at once: none (the "
        "whole batch runs), the KV cache, the linear-attention state slots or pages, or the "
        "engine's running-request limit")
    state_slots: int | None = Field(
        default=None, description="requests' linear-attention states the engine's state pool "
        "holds (SGLang's max_mamba_cache_size); null where state and KV share one pool (vLLM) "
        "or the model has none")
    memory_flags: list[str] = Field(
        default_factory=list, description="the engine's memory flags this prediction assumes, "
        "chosen for the workload (for example SGLang's --max-mamba-cache-size and "
        "--max-running-requests, vLLM's --max-num-seqs); empty: the engine's defaults")
    kv_read_source: str
    step_terms_s: dict[str, float] = Field(
        default_factory=dict, description="seconds of each physical term of one decode step "
        "at the workload's mean context (engine_advisor.model.physics.terms.DECODE_TERMS)")
    eligible: bool = Field(
        default=True, description="whether the recommendation may choose this configuration "
        "among those evaluated with it (in /v1/recommend: every candidate of the workload; "
        "/v1/predict evaluates one alone): it holds at least one sequence, and it is calibrated "
        "(or transferred) for the hardware, unless allow_extrapolation is set or no "
        "configuration holding a sequence is")
    ineligible_reason: str | None = Field(
        default=None, description="why it may not be chosen (not even one sequence fits, or "
        "no calibration data for the hardware without allow_extrapolation); null when eligible")
    calibration_note: str | None = Field(
        default=None, description="why calibrated is false where the engine has no calibration "
        "data anywhere (TensorRT-LLM: its predictions are the physics priors); null otherwise")


class ConfigRef(BaseModel):
    engine: str
    dcp_size: int


class Exclusion(BaseModel):
    engine: str
    dcp_size: int | None = None
    reason: str

    def describe(self) -> str:
        """'engine[ dcp N]: reason', as messages and tables print it."""
        return self.engine + (f" dcp {self.dcp_size}" if self.dcp_size else "") + f": {self.reason}"


Confidence = Annotated[Literal["high", "medium", "low", "prior"], Field(
    description="high: measured, interval clear of its rival's; medium: extrapolated, the "
    "batch's KV over capacity, or only KV bytes known; low: intervals overlap, or an "
    "unmeasured configuration chosen with allow_extrapolation; prior: no configuration is "
    "calibrated for the hardware, the answer is the physics prior's")]


class ConfigFile(BaseModel):
    path: str = Field(description="where the launch command expects the file")
    content: str = Field(description="the file's text (YAML)")


MEM_FLAG_VALUE = ("the value the launch command gives mem_fraction_flag: mem_fraction itself for "
                  "vLLM and SGLang (a share of the whole GPU), for TensorRT-LLM the same memory "
                  "as a share of what is free after weights, activations and buffers")
CONFIG_FILE = ("the configuration file the launch command names (TensorRT-LLM's --config "
               "YAML: KV cache settings, metrics, Helix); null for engines without one")


class Recommendation(BaseModel):
    engine: str
    dcp_size: int
    mem_fraction: float
    mem_fraction_flag: str
    mem_flag_value: float | None = Field(default=None, description=MEM_FLAG_VALUE)
    config_file: ConfigFile | None = Field(default=None, description=CONFIG_FILE)
    predictions: list[ConfigPrediction]
    speedup: float | None
    speedup_over: ConfigRef | None = Field(
        description="the configuration the speed-up is over: the fastest eligible "
        "configuration of another engine, else the next-fastest eligible one; null with speedup")
    confidence: Confidence
    crossover_context_tokens: int | None
    kv_capacity_tokens: int
    fits_in_memory: bool
    launch_command: list[str]
    reasons: list[str]
    excluded: list[Exclusion]
    model_version: str
