"""Deployment files for a recommendation: a Kubernetes Deployment + Service, or a docker compose
service. Pure functions (dicts and YAML text, no I/O), shared by ``engine-advisor recommend
--emit`` and ``POST /v1/deploy``.

The container runs the recommendation's own ``launch_command`` (so the engine, TP, DCP and
memory-fraction flags are exactly the ones the recommendation prints) plus ``--host`` and
``--port``. Engine facts used here (``engine_advisor.model.engines``: ``image``, ``port``): the
engines answer ``GET /health`` with 200 once serving. An engine whose command names a
configuration file (TensorRT-LLM's ``--config`` YAML, ``Recommendation.config_file``) gets it as
a ConfigMap mounted at that path (Kubernetes) or a compose ``configs`` entry with its content.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from engine_advisor.model import engines
from engine_advisor.model.schemas import Recommendation
from engine_advisor.model.workload import Workload

Format = Literal["k8s", "compose"]

HEALTH_PATH = "/health"
# Kubernetes device-plugin resource per GPU vendor (Workload.requirements.hardware_vendor)
GPU_RESOURCES = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu"}
HF_CACHE = "/root/.cache/huggingface"
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"   # DNS-1123 label
TAG_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$"      # docker image tag grammar
# an image repository without its tag: [registry[:port]/]path, lower-case components
REPO_PATTERN = r"^[a-z0-9]([a-z0-9._-]*[a-z0-9])?(:[0-9]{1,5})?(/[a-z0-9]([a-z0-9._-]*[a-z0-9])?)*$"
# Model loading (weights from disk or the hub, CUDA-graph capture) can take many minutes for
# the large models this tool is about: the startup probe allows up to this long.
STARTUP_SECONDS = 3600
# the ConfigMap key of an engine's configuration file (TensorRT-LLM's --config YAML)
CONFIG_KEY = "config.yml"


class DeployOptions(BaseModel):
    """What the deployment files need beyond the recommendation (REST: query parameters, so
    numbers arrive as text and are parsed, unlike the JSON bodies' JsonModel)."""

    model_config = ConfigDict(extra="forbid")

    format: Format = "k8s"
    image: Annotated[str, Field(pattern=REPO_PATTERN, max_length=255, description=(
        "engine image repository without the tag (default "
        + " or ".join(engines.get(e).image for e in engines.names())
        + "; AMD GPUs need a ROCm build)"))] | None = None
    image_tag: Annotated[str, Field(pattern=TAG_PATTERN, description=(
        "engine image tag (default latest)"))] = "latest"
    name: Annotated[str, Field(pattern=NAME_PATTERN, description=(
        "name of the Deployment / Service / compose service (DNS-1123 label; default "
        "derived from the engine and the model)"))] | None = None
    shm_gib: Annotated[int, Field(gt=0, le=1024, description=(
        "shared memory (/dev/shm) in GiB for the engine's inter-process communication"))] = 16


class DeployError(ValueError):
    """The workload cannot be turned into deployment files; ``field`` names the input."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


def default_name(rec: Recommendation, w: Workload) -> str:
    """'<engine>-<model>' as a DNS-1123 label (the model part lower-cased, at most 63 chars)."""
    model = (w.model or "").rsplit("/", 1)[-1].lower()
    slug = re.sub(r"[^a-z0-9]+", "-", model).strip("-")
    return (f"{rec.engine}-{slug}" if slug else rec.engine)[:63].rstrip("-")


def image_ref(rec: Recommendation, opts: DeployOptions) -> str:
    return f"{opts.image or engines.get(rec.engine).image}:{opts.image_tag}"


def container_command(rec: Recommendation) -> list[str]:
    """The recommendation's launch command, listening on all interfaces at the engine's port."""
    return [*rec.launch_command, "--host", "0.0.0.0", "--port", str(engines.get(rec.engine).port)]


def _vendor(w: Workload) -> str:
    """The GPU vendor: the workload's requirement, else the GPU spec's ``vendor`` where the
    catalogue has one, else AMD for Instinct names (MI...), else NVIDIA."""
    gpu = w.gpu_spec()
    vendor = ((w.requirements.hardware_vendor if w.requirements else None)
              or getattr(gpu, "vendor", None)
              or ("amd" if gpu.name.upper().startswith("MI") else "nvidia"))
    if vendor not in GPU_RESOURCES:
        raise DeployError("requirements.hardware_vendor",
                          f"deployment files are written for {', '.join(GPU_RESOURCES)} GPUs, "
                          f"not {vendor}")
    return vendor


def _annotations(rec: Recommendation) -> dict[str, str]:
    best = next((p for p in rec.predictions
                 if (p.engine, p.dcp_size) == (rec.engine, rec.dcp_size)), None)
    out = {"engine-advisor/model-version": rec.model_version,
           "engine-advisor/engine": rec.engine, "engine-advisor/dcp-size": str(rec.dcp_size),
           "engine-advisor/mem-fraction": f"{rec.mem_fraction:.2f}",
           **({"engine-advisor/mem-flag-value": f"{rec.mem_flag_value:.2f}"}
              if rec.mem_flag_value is not None
              and abs(rec.mem_flag_value - rec.mem_fraction) >= 0.005 else {}),
           "engine-advisor/confidence": rec.confidence}
    if best is not None:
        out["engine-advisor/predicted-total-s"] = f"{best.total_s:.1f}"
    return out


def kubernetes(rec: Recommendation, w: Workload, opts: DeployOptions) -> list[dict[str, Any]]:
    """A Deployment (one replica, all ``num_gpus`` GPUs in one pod) and a ClusterIP Service."""
    name = opts.name or default_name(rec, w)
    port = engines.get(rec.engine).port
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/component": "llm-engine",
              "app.kubernetes.io/managed-by": "engine-advisor"}
    gpus = {GPU_RESOURCES[_vendor(w)]: w.num_gpus}
    probe = {"httpGet": {"path": HEALTH_PATH, "port": "http"}}
    container = {
        "name": rec.engine,
        "image": image_ref(rec, opts),
        "command": container_command(rec),
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": "hf-token", "key": "token", "optional": True}}}],
        "resources": {"limits": gpus, "requests": dict(gpus)},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"},
                         {"name": "model-cache", "mountPath": HF_CACHE},
                         *([{"name": "engine-config", "mountPath": rec.config_file.path,
                             "subPath": CONFIG_KEY, "readOnly": True}]
                           if rec.config_file else [])],
        "startupProbe": {**probe, "periodSeconds": 10,
                         "failureThreshold": STARTUP_SECONDS // 10},
        "readinessProbe": {**probe, "periodSeconds": 5, "timeoutSeconds": 5,
                           "failureThreshold": 3},
        "livenessProbe": {**probe, "periodSeconds": 10, "timeoutSeconds": 5,
                          "failureThreshold": 6},
    }
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": labels, "annotations": _annotations(rec)},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
            # a second pod would need a second set of GPUs: replace instead of surging
            "strategy": {"type": "Recreate"},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [container],
                    "volumes": [
                        {"name": "dshm", "emptyDir": {"medium": "Memory",
                                                      "sizeLimit": f"{opts.shm_gib}Gi"}},
                        # replace with a PersistentVolumeClaim to keep downloaded weights
                        {"name": "model-cache", "emptyDir": {}},
                        *([{"name": "engine-config", "configMap": {"name": f"{name}-config"}}]
                          if rec.config_file else []),
                    ],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "labels": labels},
        "spec": {"type": "ClusterIP", "selector": {"app.kubernetes.io/name": name},
                 "ports": [{"name": "http", "port": port, "targetPort": "http",
                            "protocol": "TCP"}]},
    }
    if rec.config_file is None:
        return [deployment, service]
    config = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": f"{name}-config", "labels": labels},
              "data": {CONFIG_KEY: rec.config_file.content}}
    return [config, deployment, service]


def compose(rec: Recommendation, w: Workload, opts: DeployOptions) -> dict[str, Any]:
    """A compose file with one service holding ``num_gpus`` GPUs."""
    name = opts.name or default_name(rec, w)
    port = engines.get(rec.engine).port
    vendor = _vendor(w)
    probe = (f"import urllib.request; urllib.request.urlopen("
             f"'http://127.0.0.1:{port}{HEALTH_PATH}', timeout=5)")
    service: dict[str, Any] = {
        "image": image_ref(rec, opts),
        # the image's own entrypoint is replaced by the full launch command
        "entrypoint": container_command(rec),
        "ports": [f"{port}:{port}"],
        "shm_size": f"{opts.shm_gib}gb",
        "environment": {"HF_TOKEN": "${HF_TOKEN:-}"},
        "volumes": [f"${{HF_HOME:-~/.cache/huggingface}}:{HF_CACHE}"],
        "labels": _annotations(rec),
        "healthcheck": {"test": ["CMD", "python3", "-c", probe], "interval": "10s",
                        "timeout": "5s", "retries": 6, "start_period": f"{STARTUP_SECONDS}s"},
        "restart": "unless-stopped",
    }
    if vendor == "nvidia":
        service["deploy"] = {"resources": {"reservations": {"devices": [
            {"driver": "nvidia", "count": w.num_gpus, "capabilities": ["gpu"]}]}}}
    else:  # ROCm: the devices themselves, as AMD's container docs show
        service["devices"] = ["/dev/kfd", "/dev/dri"]
        service["group_add"] = ["video"]
    if rec.config_file is None:
        return {"name": name, "services": {name: service}}
    config = f"{name}-config"
    service["configs"] = [{"source": config, "target": rec.config_file.path}]
    return {"name": name, "services": {name: service},
            "configs": {config: {"content": rec.config_file.content}}}


class _PlainDumper(yaml.SafeDumper):
    """Writes a shared dict out in full each time (no &anchors / *aliases)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _text_block(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    """A multi-line string (an engine's configuration file) as a literal block."""
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_PlainDumper.add_representer(str, _text_block)


def render(rec: Recommendation, w: Workload, opts: DeployOptions) -> str:
    """The deployment files as YAML text (Kubernetes: two documents)."""
    docs = kubernetes(rec, w, opts) if opts.format == "k8s" else [compose(rec, w, opts)]
    return yaml.dump_all(docs, Dumper=_PlainDumper, sort_keys=False)
