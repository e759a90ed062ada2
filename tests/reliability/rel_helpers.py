"""Helpers of the reliability suite: a proxy in front of simulators, /proc readings."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
from pathlib import Path

import httpx
from proc import Proc, start_all
from test_proxy_e2e import pools_yaml

TOKEN = "reliability-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


SOAK = Path(__file__).resolve().parents[2] / "bench" / "soak.py"


@functools.cache
def load_soak():
    """bench/soak.py as a module (its load generator, stack and /proc readings are reused)."""
    spec = importlib.util.spec_from_file_location("soak", SOAK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rss_kib(pid: int) -> int:
    """Resident memory of a process (VmRSS of /proc/PID/status), KiB."""
    return load_soak().rss_kib(pid)


def open_fds(pid: int) -> int:
    return load_soak().fds(pid)


def tcp_connections(pid: int) -> int:
    """Sockets the process holds (fds that are sockets)."""
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                n += 1
        except OSError:
            pass
    return n


def metric_sum(url: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith("#") or not line.startswith((name + "{", name + " ")):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def serve_proc(tmp: Path, sims_vllm: list[Proc], sims_sglang: list[Proc], *,
               env: dict[str, str] | None = None, **extra) -> Proc:
    """``engine-advisor serve --upstreams FILE`` over the given simulators (not started)."""
    path = tmp / "upstreams.yaml"
    path.write_text(pools_yaml([s.url for s in sims_vllm], [s.url for s in sims_sglang],
                               **extra))
    return Proc("serve", "--upstreams", str(path), "--log-level", "warning", ready="/readyz",
                env={"ENGINE_ADVISOR_ADMIN_TOKEN": TOKEN,
                     "ENGINE_ADVISOR_UPSTREAMS_WATCH_S": "0", **(env or {})})


__all__ = ["AUTH", "TOKEN", "Proc", "load_soak", "metric_sum", "open_fds", "rss_kib",
           "serve_proc", "start_all", "tcp_connections"]


@contextlib.contextmanager
def full_stack(tmp: Path):
    """The service with a good artifact in its models folder and two simulator pools (vLLM,
    SGLang dcp 8) as real processes; yields the service's Proc and stops everything after."""
    from svc_helpers import fit_artifact

    (tmp / "models").mkdir()
    fit_artifact(tmp / "models" / "good.json")
    sims = [Proc("sim", "--engine", "vllm", "--time-scale", "0.001"),
            Proc("sim", "--engine", "sglang", "--dcp-size", "8", "--time-scale", "0.001")]
    srv = serve_proc(tmp, sims[:1], sims[1:],
                     env={"ENGINE_ADVISOR_MODELS_DIR": str(tmp / "models")})
    procs = start_all(*sims, srv)
    try:
        yield srv
    finally:
        for p in procs:
            p.stop()
