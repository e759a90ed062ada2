"""Upstream engine pools from a YAML file (``engine-advisor serve --upstreams FILE``).

```yaml
pools:                      # engine -> upstreams (one engine instance each)
  vllm:
    - {url: http://10.0.0.1:8000, model: kimi-k3, dcp_size: 1, mem_fraction: 0.92}
  sglang:
    - {name: sg-a, url: http://10.0.0.2:30000, model: kimi-k3, dcp_size: 8,
       mem_fraction: 0.92, api_key: KEY}
workload:                   # what the recommender needs beyond each request
  kv_bytes_per_token: 70272 # or preset: kimi-k3, or hf_config: {...}
  gpu: B300
  num_gpus: 8
  batch_size: 64            # floor of the batch (concurrent sequences) an engine runs
  output_tokens: 2048       # when a request sets no max_tokens
```
plus optional ``tokens``, ``timeouts``, ``retries``, ``breaker``, ``health``, ``limits``,
``client_api_keys`` and ``observations`` sections (defaults below). An upstream may set its own
``timeouts: {idle_s, end_grace_s, keepalive_s}``. Unknown keys are errors.

A file is parsed into ``PoolsConfig`` (pure data, validated); ``Pools`` is the running form
with one ``Upstream`` (in-flight count, health, circuit breaker, HTTP clients) per entry.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import httpx
import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from engine_advisor.model.errors import validation_message
from engine_advisor.model.hardware.gpus import GpuSpec
from engine_advisor.model.kv import KvDtype
from engine_advisor.model.workload import MAX_CONTEXT, MAX_GPUS, Engine, Workload
from engine_advisor.service.proxy.breaker import CircuitBreaker
from engine_advisor.service.transport.client import Http1Pool, Limits

NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
PosFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class UpstreamTimeouts(Strict):
    """An upstream's own values of these ``timeouts`` (unset: the file's)."""

    idle_s: PosFloat | None = None
    end_grace_s: Annotated[float, Field(ge=0, le=60)] | None = None
    keepalive_s: Annotated[float, Field(gt=0, le=3600)] | None = None


class UpstreamSpec(Strict):
    name: Annotated[str, Field(pattern=NAME.pattern)] | None = Field(
        default=None, description="label in headers and metrics (default ENGINE-INDEX)")
    url: Annotated[str, Field(pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$",
                              description="server root, e.g. http://10.0.0.1:8000")]
    model: Annotated[str, Field(min_length=1, max_length=256)]
    dcp_size: Annotated[int, Field(gt=0, le=MAX_GPUS)] = 1
    mem_fraction: Annotated[float, Field(gt=0, le=1)] = 0.9
    api_key: SecretStr | None = None
    max_connections: Annotated[int, Field(gt=0, le=100_000)] = 512
    max_model_len: Annotated[int, Field(gt=0, le=MAX_CONTEXT)] | None = Field(
        default=None, description="the engine's context limit (sizes the default body cap)")
    timeouts: UpstreamTimeouts | None = Field(
        default=None, description="this upstream's idle_s, end_grace_s, keepalive_s (else the "
                                  "file's timeouts)")

    @field_validator("url")
    @classmethod
    def _no_credentials(cls, v: str) -> str:
        if "@" in v.split("://", 1)[-1].split("/", 1)[0]:
            raise ValueError("credentials in the URL would show in /v1/route, /v1/upstreams, "
                             "metrics and logs; give the key as api_key")
        return v

    def base_url(self) -> str:
        u = self.url.rstrip("/")
        return u[:-3] if u.endswith("/v1") else u


class WorkloadSpec(Strict):
    kv_bytes_per_token: Annotated[int, Field(gt=0, le=1 << 26)] | None = None
    preset: str | None = None
    hf_config: dict[str, Any] | None = None
    kv_cache_dtype: KvDtype = "bf16"
    model_weight_bytes: Annotated[float, Field(gt=0)] | None = None
    gpu: str | GpuSpec = "B300"
    num_gpus: Annotated[int, Field(gt=0, le=MAX_GPUS)] = 8
    batch_size: Annotated[int, Field(gt=0, le=65_536)] = 1
    output_tokens: Annotated[int, Field(gt=0, le=1_048_576)] = 2048
    allow_extrapolation: bool = False

    def workload(self, context: int, output: int, batch: int, engines: list[str],
                 dcp_sizes: list[int]) -> Workload:
        return Workload(
            context_tokens=context, output_tokens=output, batch_size=batch,
            kv_bytes_per_token=self.kv_bytes_per_token, preset=self.preset,
            hf_config=self.hf_config, kv_cache_dtype=self.kv_cache_dtype,
            model_weight_bytes=self.model_weight_bytes, gpu=self.gpu, num_gpus=self.num_gpus,
            engines=engines, dcp_sizes=dcp_sizes, allow_extrapolation=self.allow_extrapolation)

    @model_validator(mode="after")
    def _valid(self) -> WorkloadSpec:
        # The workload's own validators name the problem (unknown GPU, two KV sources, ...).
        try:
            self.workload(1024, 1, 1, ["vllm"], [1])
        except ValidationError as exc:
            raise ValueError(validation_message(exc, limit=1)) from None
        return self


class TokensSpec(Strict):
    tokenizer_file: Path | None = Field(
        default=None, description="a Hugging Face tokenizer.json (needs the 'tokenizer' extra)")
    upstream_tokenize: bool = Field(
        default=True, description="ask an upstream's /tokenize when the decision depends on it")
    bytes_per_token: PosFloat = Field(default=4.0, description="the estimate's ratio")
    tokenize_timeout_s: PosFloat = 2.0
    max_concurrent: Annotated[int, Field(gt=0, le=1024)] = Field(
        default=4, description="prompts counted at once (local tokenizer or /tokenize); past "
                               "it a prompt is routed by its estimate")


class TimeoutsSpec(Strict):
    connect_s: PosFloat = 3.0
    first_byte_s: PosFloat = Field(
        default=120.0, description="streaming: until the first event (the TTFT bound)")
    answer_s: PosFloat = Field(
        default=600.0, description="non-streaming: the whole answer (an engine sends it once it "
                                   "has generated the whole output, so this bounds the "
                                   "generation)")
    idle_s: PosFloat = Field(
        default=60.0, description="the longest gap between a stream's events, and the longest "
                                  "an answer under way (whole or streamed) may go without a "
                                  "byte")
    total_s: PosFloat = Field(default=1800.0, description="the whole request")
    end_grace_s: Annotated[float, Field(ge=0, le=60)] = Field(
        default=2.0, description="after a stream's [DONE], how long the upstream may take to "
                                 "end its response (chunked terminator or close); then its "
                                 "connection is closed (the client's stream is complete "
                                 "at [DONE] either way)")
    keepalive_s: Annotated[float, Field(gt=0, le=3600)] = Field(
        default=4.0, description="a pooled upstream connection unused this long is closed; keep "
                                 "it below the upstreams' own keep-alive timeout (uvicorn's: "
                                 "5 s)")


class RetriesSpec(Strict):
    max_attempts: Annotated[int, Field(ge=1, le=16)] = 3
    other_engine: bool = Field(
        default=True, description="after the chosen engine's upstreams, try the other engine")
    backoff_base_s: Annotated[float, Field(ge=0, le=60)] = 0.05
    backoff_max_s: Annotated[float, Field(ge=0, le=600)] = 2.0


class BreakerSpec(Strict):
    failure_threshold: Annotated[int, Field(ge=1, le=1000)] = 5
    open_s: Annotated[float, Field(ge=0, le=3600)] = 10.0
    max_open_percent: Annotated[int, Field(ge=0, le=100)] = Field(
        default=50, description="the panic threshold: a breaker opens only while at most this "
                                "share of its pool (the upstreams serving the same model, of "
                                "either engine) would be open, and never the pool's last "
                                "closed one")


class HealthSpec(Strict):
    interval_s: PosFloat = 5.0
    timeout_s: PosFloat = 2.0
    failure_threshold: Annotated[int, Field(ge=1, le=100)] = 2
    success_threshold: Annotated[int, Field(ge=1, le=100)] = 1
    path: str = "/health"


MiB = 1 << 20


class LimitsSpec(Strict):
    """What one upstream response may hold; over a limit: 502 (or a retry) and a log line."""

    header_bytes: Annotated[int, Field(ge=1024, le=16 * MiB)] = Field(
        default=64 << 10, description="status line and header fields (interim 1xx included)")
    body_bytes: Annotated[int, Field(ge=1024, le=4096 * MiB)] = Field(
        default=64 * MiB, description="a non-streaming body (and a streaming request's error "
                                      "body); checked against Content-Length before reading")
    event_bytes: Annotated[int, Field(ge=1024, le=1024 * MiB)] = Field(
        default=8 * MiB, description="one server-sent event, while its end is awaited")
    trailer_bytes: Annotated[int, Field(ge=0, le=MiB)] = Field(
        default=16 << 10, description="trailer fields after the last chunk (dropped)")

    def client_limits(self) -> Limits:
        return Limits(header_bytes=self.header_bytes, body_bytes=self.body_bytes,
                      trailer_bytes=self.trailer_bytes)


class PoolsConfig(Strict):
    pools: dict[Engine, list[UpstreamSpec]]
    workload: WorkloadSpec
    tokens: TokensSpec = TokensSpec()
    timeouts: TimeoutsSpec = TimeoutsSpec()
    retries: RetriesSpec = RetriesSpec()
    breaker: BreakerSpec = BreakerSpec()
    health: HealthSpec = HealthSpec()
    limits: LimitsSpec = LimitsSpec()
    client_api_keys: list[SecretStr] = Field(
        default_factory=list, description="keys clients must send as 'Authorization: Bearer'")
    observations: Annotated[int, Field(ge=0, le=1_000_000)] = 10_000

    @model_validator(mode="after")
    def _names(self) -> PoolsConfig:
        if not any(self.pools.values()):
            raise ValueError("pools: no upstream configured")
        seen: set[str] = set()
        for engine, ups in self.pools.items():
            for i, u in enumerate(ups):
                if u.name is None:
                    u.name = f"{engine}-{i}"
                if u.name in seen:
                    raise ValueError(f"pools.{engine}.{i}.name: {u.name!r} is used twice")
                seen.add(u.name)
                if self.workload.num_gpus % u.dcp_size:
                    raise ValueError(f"pools.{engine}.{i}.dcp_size: {u.dcp_size} does not divide "
                                     f"workload.num_gpus {self.workload.num_gpus}")
        return self


class UpstreamsError(ValueError):
    """A pools file that cannot be used; the message names the file and the field."""


def parse(text: str, source: str = "<upstreams>") -> PoolsConfig:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        # problem and position only: str(exc) quotes the offending line, which may hold a key
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = getattr(exc, "problem", None) or type(exc).__name__
        raise UpstreamsError(f"{source}: not valid YAML ({what}{where})") from None
    if not isinstance(data, dict):
        raise UpstreamsError(f"{source}: expected a mapping with 'pools' and 'workload'")
    try:
        return PoolsConfig.model_validate(data)
    except ValidationError as exc:
        raise UpstreamsError(f"{source}: {validation_message(exc, limit=5)}") from None


def read(path: Path) -> tuple[PoolsConfig, str]:
    """The parsed file and the sha256 of its bytes."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UpstreamsError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UpstreamsError(f"{path}: not UTF-8 text") from None
    return parse(text, str(path)), hashlib.sha256(raw).hexdigest()


def new_client(max_connections: int) -> httpx.AsyncClient:
    """The httpx client of health checks and /tokenize (forwarding uses ``Http1Pool``)."""
    return httpx.AsyncClient(
        limits=httpx.Limits(max_connections=max_connections,
                            max_keepalive_connections=max_connections, keepalive_expiry=30.0),
        timeout=httpx.Timeout(None), trust_env=False, follow_redirects=False)


@dataclass(eq=False)
class Upstream:
    """One engine instance: its configuration, clients and live state
    (``Upstream.create`` builds one with its clients)."""

    engine: str
    spec: UpstreamSpec
    breaker: CircuitBreaker
    client: httpx.AsyncClient       # health checks, /tokenize
    fast: Http1Pool                 # forwarding
    in_flight: int = 0
    healthy: bool = True
    health_ok: int = 0          # consecutive successful health checks
    health_fail: int = 0        # consecutive failed health checks
    last_error: str | None = None
    not_before: float = 0.0     # Retry-After: no requests before this monotonic time
    picked: int = 0             # when it was last picked (ties of in-flight go round-robin)
    tokenize: bool = True       # serves /tokenize (False once it answered 404 or 405: an
                                # engine without one, TensorRT-LLM's trtllm-serve)
    name: str = field(init=False, default="")    # spec.name, fixed for the upstream's life
    # its timeouts.idle_s, end_grace_s and keepalive_s (its own, else the file's): ``timing``
    idle_s: float = field(init=False, default=60.0)
    end_grace_s: float = field(init=False, default=2.0)
    lines: bytes = field(init=False, default=b"")  # its response header lines (see below)
    # ``group`` as metric label values (engine, DCP size), set with ``spec``
    group_labels: tuple[str, str] = field(init=False, default=("", ""), repr=False,
                                          compare=False)
    # the count of decisions for its group_labels (a ``Counts`` cell, which the proxy's state
    # sets when it installs the pools)
    decided: list[float] = field(init=False, default_factory=lambda: [0.0], repr=False,
                                 compare=False)
    # the constant fields of its observations (engine_advisor.service.proxy.relay.observe) for one
    # pools generation
    observed: tuple[tuple | None, tuple] = field(init=False, default=(None, ()), repr=False)
    observed_of: int = field(init=False, default=-1, repr=False)   # pools generation

    def __post_init__(self) -> None:
        self.name = self.spec.name or ""
        self.group_labels = (self.engine, str(self.spec.dcp_size))
        # what every response through it carries (engine and name: NAME-pattern tokens)
        self.lines = (b"x-engine-advisor-engine: %b\r\nx-engine-advisor-upstream: %b\r\n"
                      % (self.engine.encode(), self.name.encode()))

    @classmethod
    def create(cls, engine: str, spec: UpstreamSpec, cfg: PoolsConfig) -> Upstream:
        up = cls(engine, spec,
                 CircuitBreaker(cfg.breaker.failure_threshold, cfg.breaker.open_s),
                 new_client(spec.max_connections),
                 Http1Pool(spec.base_url(), spec.max_connections, cfg.limits.client_limits()))
        up.timing(cfg)
        return up

    def configure(self, spec: UpstreamSpec, cfg: PoolsConfig) -> None:
        """A reload kept this upstream: take the new file's settings."""
        self.spec = spec
        self.group_labels = (self.engine, str(spec.dcp_size))
        self.breaker.failure_threshold = cfg.breaker.failure_threshold
        self.breaker.open_s = cfg.breaker.open_s
        self.fast.limits = cfg.limits.client_limits()
        self.timing(cfg)

    def timing(self, cfg: PoolsConfig) -> None:
        """Its timeouts: its own ``timeouts`` entry over the file's (the pool's too)."""
        t, own = cfg.timeouts, self.spec.timeouts or UpstreamTimeouts()
        self.idle_s = own.idle_s if own.idle_s is not None else t.idle_s
        self.end_grace_s = own.end_grace_s if own.end_grace_s is not None else t.end_grace_s
        self.fast.keepalive_s = own.keepalive_s if own.keepalive_s is not None \
            else t.keepalive_s
        self.fast.idle_s = self.idle_s

    async def aclose(self) -> None:
        await self.client.aclose()
        await self.fast.aclose()

    @property
    def url(self) -> str:
        return self.spec.base_url()

    @property
    def group(self) -> tuple[str, int]:
        return (self.engine, self.spec.dcp_size)

    def available(self, now: float) -> bool:
        return self.healthy and now >= self.not_before and (
            self.breaker.closed or self.breaker.available())

    def identity(self) -> tuple:
        return self.identity_of(self.engine, self.spec)

    @staticmethod
    def identity_of(engine: str, s: UpstreamSpec) -> tuple:
        """What must stay equal for a reload to keep an upstream's state and connections."""
        key = s.api_key.get_secret_value() if s.api_key else None
        return (engine, s.name, s.base_url(), key, s.max_connections)


@dataclass(eq=False)
class Pools:
    """One loaded pools file, immutable once built (a reload builds a new one)."""

    config: PoolsConfig
    upstreams: list[Upstream]
    source: str
    sha256: str
    generation: int
    loaded_at: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        self.groups: dict[tuple[str, int], list[Upstream]] = {}
        for u in self.upstreams:
            self.groups.setdefault(u.group, []).append(u)
        self.engines = sorted({u.engine for u in self.upstreams})
        self.dcp_sizes = sorted({u.spec.dcp_size for u in self.upstreams})
        self.models = sorted({u.spec.model for u in self.upstreams})
        self.api_keys = [k.get_secret_value().encode() for k in self.config.client_api_keys]
        layout = self.config.workload.workload(1024, 1, 1, ["vllm"], [1]).model_shape()
        self.kv_bytes_per_token = int(layout.kv_bytes_per_token)
        self.kv_shards = layout.shards(self.config.workload.num_gpus)
        gpu = self.config.workload.gpu
        self.gpu_name = (gpu if isinstance(gpu, str) else gpu.name).upper()   # observations
        self._serving = {m: [u for u in self.upstreams if u.spec.model == m]
                         for m in self.models}

    def serving(self, model: str | None) -> list[Upstream]:
        if model is None:
            return self.upstreams
        return self._serving.get(model) or []

    def max_model_len(self, model: str | None = None) -> int | None:
        """The longest context the upstreams serving ``model`` (default: all) accept."""
        lens = [u.spec.max_model_len for u in self.serving(model) if u.spec.max_model_len]
        return max(lens) if lens else None
