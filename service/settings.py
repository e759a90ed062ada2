"""Service settings: one pydantic-settings object, environment prefix ``ENGINE_ADVISOR_``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ENGINE_ADVISOR_", extra="ignore")

    model_path: Path | None = Field(
        default=None, description="fitted model artifact to serve; unset: the embedded default")
    models_dir: Path | None = Field(
        default=None, description="directory whose artifacts POST /v1/model/reload may load")
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8000
    workers: Annotated[int, Field(ge=1, le=64)] = 1
    admin_token: SecretStr | None = Field(
        default=None, description="bearer token of the admin routes; unset: admin disabled")
    max_body_bytes: Annotated[int, Field(gt=0)] = 1 << 20
    max_batch: Annotated[int, Field(gt=0, le=100_000)] = 1000
    recommend_cache_size: Annotated[int, Field(
        ge=0, le=1_000_000, description="answers of POST /v1/recommend kept (LRU); 0: off")] = 4096
    log_level: str = "info"
    bench_routes: bool = Field(default=False, description="add POST /bench/constant (benchmarks)")
    data_dir: Path | None = Field(
        default=None, description="directory of what the service keeps across restarts (the "
                                  "proxy's observations, observations.csv); unset: in memory "
                                  "only")
    upstreams: Path | None = Field(
        default=None, description="YAML file of upstream engine pools; unset: no proxy routes")
    upstreams_watch_s: Annotated[float, Field(
        ge=0, le=3600, description="how often the pools file's mtime is checked; 0: off")] = 2.0
    proxy_max_body_bytes: Annotated[int, Field(gt=0)] | None = Field(
        default=None, description="body cap of the proxy routes; unset: enough for the longest "
                                  "context the pools serve, at least 32 MiB")
    max_header_bytes: Annotated[int, Field(ge=1024, le=16 << 20)] = Field(
        default=60 << 10, description="request line and header lines of one request; more: 431 "
                                      "and the connection closed (Envoy's default, 60 KiB)")
    max_header_fields: Annotated[int, Field(ge=1, le=10_000)] = Field(
        default=100, description="header fields of one request; more: 431 (Envoy's default)")
    header_timeout_s: Annotated[float, Field(gt=0, le=3600)] = Field(
        default=60.0, description="a request head must arrive within this many seconds of its "
                                  "first byte (or of the connection's opening); else 408 and "
                                  "the connection closed (nginx's client_header_timeout)")
    body_timeout_s: Annotated[float, Field(gt=0, le=86_400)] = Field(
        default=60.0, description="a request body must have arrived this many seconds after "
                                  "its head; else 408 and the connection closed")
    max_connections: Annotated[int, Field(ge=1, le=1_000_000)] | None = Field(
        default=None, description="open client connections per process; past it a new one is "
                                  "answered 503 and closed. Unset: half the open-file limit "
                                  "less 128")
    epp_port: Annotated[int, Field(ge=1, le=65535)] | None = Field(
        default=None, description="also serve the Endpoint Picker (Envoy ext_proc, gRPC) on this "
                                  "port; needs the pools (upstreams) and the 'epp' extra")

    # ---- the Endpoint Picker (service/epp): who may call it, and its streams -------------
    epp_token: SecretStr | None = Field(
        default=None, description="shared token the gateway must send in the picker's gRPC "
                                  "metadata ('authorization: Bearer <token>'); read from "
                                  "ENGINE_ADVISOR_EPP_TOKEN only")
    epp_tls_cert: Path | None = Field(
        default=None, description="PEM certificate chain the picker's port serves TLS with")
    epp_tls_key: Path | None = Field(default=None, description="PEM private key of epp_tls_cert")
    epp_tls_client_ca: Path | None = Field(
        default=None, description="PEM CA bundle: the gateway must present a client certificate "
                                  "it signed (mutual TLS)")
    epp_idle_timeout_s: Annotated[float, Field(
        gt=0, le=86_400, description="a picker stream silent this long gives up the in-flight "
                                     "count of its request")] = 1800.0
