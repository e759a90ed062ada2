"""Which architecture a calibration row measured, and how the fit finds it again.

A dataset row's ``model`` cell names the served model's architecture:

- a preset name (``deepseek-v2-lite``): ``--preset``, a ``--hf-config`` whose architecture is a
  preset's, or an engine model id that names one (``engine_advisor.model.arch.aliases``);
- ``hf:NAME@HASH`` for any other ``--hf-config``: ``NAME`` is the config's ``_name_or_path`` /
  ``architectures[0]`` (letters, digits, ``._-``), ``HASH`` the first 16 hex digits of the
  sha256 of the architecture's physics (``physics_hash``: every derived figure but the name
  and the maximum context, so a copy with a raised ``max_position_embeddings`` keeps its key).
  The config itself is stored next to the dataset: ``model-config.json`` in the run folder, or
  ``model-configs/HASH.json`` beside a combined CSV; ``resolve_row_config`` reads it back;
- empty: the architecture is unknown (only ``kv_bytes_per_token`` is).

The KV bytes per token follow from the architecture at the KV dtype. Given as well, they must
agree (an error naming both figures) when the architecture was named by a flag; when it was only
inferred from the engine's model id, a disagreement leaves the architecture unknown (a warning):
the name may be a coincidence, the flag is a claim.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from engine_advisor.calibration.errors import CalibrationError
from engine_advisor.model.arch import ArchConfigError, from_hf_config, preset, preset_config
from engine_advisor.model.arch.aliases import preset_of_model_id
from engine_advisor.model.arch.architecture import Architecture
from engine_advisor.model.arch.presets import PRESETS
from engine_advisor.model.physics.shape import from_architecture

KEY_PREFIX = "hf:"
MODEL_CONFIG = "model-config.json"       # in a run folder
MODEL_CONFIGS = "model-configs"          # beside a combined CSV: model-configs/HASH.json
KV_DTYPES = ("bf16", "fp8")
_KEY = re.compile(r"^hf:(?P<name>[\w.\-]{1,120})@(?P<hash>[0-9a-f]{16})$")


class ServedModelError(CalibrationError, ValueError):
    """The architecture cannot be named; the message names the flag or field."""


@dataclass(frozen=True)
class ServedModel:
    """What the rows record about the served model."""

    key: str                     # the rows' ``model`` cell ("" when unknown)
    source: str                  # preset | hf-config | model-id | kv-only
    kv_bytes_per_token: int
    kv_cache_dtype: str
    kv_shards: int
    config: dict[str, Any] | None = None     # an hf-config that is no preset: stored by the run
    note: str = ""               # why an inferred architecture was dropped

    @property
    def physics_hash(self) -> str | None:
        m = _KEY.match(self.key)
        return m["hash"] if m else None

    def to_json(self) -> dict[str, Any]:
        return {"model": self.key, "source": self.source,
                "kv_bytes_per_token": self.kv_bytes_per_token,
                "kv_cache_dtype": self.kv_cache_dtype, "kv_shards": self.kv_shards,
                **({"note": self.note} if self.note else {})}


def physics_hash(arch: Architecture) -> str:
    """sha256 (16 hex digits) of everything ``from_hf_config`` derived but the name and the
    maximum context."""
    physics = {f.name: getattr(arch, f.name) for f in fields(arch)
               if f.name not in ("name", "arch_hash", "max_context")}
    blob = json.dumps(physics, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _preset_hashes() -> dict[str, str]:
    return {physics_hash(preset(p)): p for p in PRESETS}


def config_key(config: dict[str, Any]) -> str:
    """The rows' ``model`` cell for a config.json: its preset's name when the architecture is a
    preset's, else ``hf:NAME@HASH``. Raises ``ArchConfigError`` naming the field."""
    arch = from_hf_config(config)
    h = physics_hash(arch)
    known = _preset_hashes().get(h)
    if known:
        return known
    name = re.sub(r"[^\w.\-]+", "-", str(arch.name).rsplit("/", 1)[-1]).strip("-")[:120]
    return f"{KEY_PREFIX}{name or 'custom'}@{h}"


def _kv_bytes(arch: Architecture, dtype: str) -> int:
    return int(round(from_architecture(arch, dtype).kv_bytes_per_token))


def resolve_served_model(*, preset_name: str | None = None,
                         hf_config: dict[str, Any] | None = None,
                         model_id: str | None = None, kv_bytes_per_token: int | None = None,
                         kv_cache_dtype: str | None = None, kv_shards: int | None = None,
                         num_gpus: int = 1) -> ServedModel:
    """The served model of a sweep or import, from (in this order) ``--preset``,
    ``--hf-config``, the engine's model id, else ``--kv-bytes-per-token`` alone."""
    if kv_cache_dtype is not None and kv_cache_dtype not in KV_DTYPES:
        raise ServedModelError(f"--kv-cache-dtype: expected one of {', '.join(KV_DTYPES)}, got "
                               f"{kv_cache_dtype!r}")
    if preset_name is not None and hf_config is not None:
        raise ServedModelError("--preset and --hf-config: give one of them")
    if preset_name is not None:
        if preset_name not in PRESETS:
            raise ServedModelError(f"--preset: unknown preset {preset_name!r}; known: "
                                   f"{', '.join(PRESETS)}")
        return _named(preset(preset_name), preset_name, "preset", f"--preset {preset_name}",
                      kv_bytes_per_token, kv_cache_dtype, kv_shards, num_gpus)
    if hf_config is not None:
        try:
            arch = from_hf_config(hf_config)
            key = config_key(hf_config)
        except ArchConfigError as exc:
            raise ServedModelError(f"--hf-config: {exc}") from None
        stored = None if key in PRESETS else dict(hf_config)
        return _named(arch, key, "hf-config", "--hf-config", kv_bytes_per_token,
                      kv_cache_dtype, kv_shards, num_gpus, config=stored)
    name = preset_of_model_id(model_id)
    if name is not None:
        try:
            return _named(preset(name), name, "model-id", f"the served model {model_id!r}",
                          kv_bytes_per_token, kv_cache_dtype, kv_shards, num_gpus)
        except ServedModelError as exc:
            if kv_bytes_per_token is None:
                raise
            note = (f"{exc}; the rows record no architecture (give --preset or --hf-config to "
                    "name it)")
            return ServedModel("", "kv-only", kv_bytes_per_token, kv_cache_dtype or "bf16",
                               kv_shards or 1, note=note)
    if kv_bytes_per_token is None:
        what = f"the served model {model_id!r} names no known architecture" if model_id else \
            "no served model name is known"
        raise ServedModelError(f"--kv-bytes-per-token: required: {what}; give --preset, "
                               "--hf-config or --kv-bytes-per-token")
    return ServedModel("", "kv-only", kv_bytes_per_token, kv_cache_dtype or "bf16",
                       kv_shards or 1)


def _named(arch: Architecture, key: str, source: str, what: str, kv: int | None,
           dtype: str | None, shards: int | None, num_gpus: int,
           config: dict[str, Any] | None = None) -> ServedModel:
    figures = {d: _kv_bytes(arch, d) for d in KV_DTYPES}
    if dtype is None:       # the KV bytes given tell the dtype; bf16 when not given
        dtype = next((d for d, v in figures.items() if v == kv), "bf16") if kv else "bf16"
    if kv is not None and kv != figures[dtype]:
        others = ", ".join(f"{v} at {d}" for d, v in figures.items())
        raise ServedModelError(f"--kv-bytes-per-token: {kv} disagrees with {what}, whose "
                               f"architecture stores {figures[dtype]} B/token at {dtype} "
                               f"({others})")
    arch_shards = from_architecture(arch, dtype).shards(num_gpus)
    if shards is not None and shards != arch_shards:
        raise ServedModelError(f"--kv-shards: {shards} disagrees with {what}, whose KV is split "
                               f"over {arch_shards} of {num_gpus} TP ranks")
    return ServedModel(key, source, figures[dtype], dtype, arch_shards, config=config)


# ----------------------------------------------------------------------------- stored configs
def config_bytes(config: dict[str, Any]) -> bytes:
    return (json.dumps(config, indent=1, sort_keys=True) + "\n").encode()


def resolve_row_config(dataset_path: str | Path, model_key: str) -> dict[str, Any] | None:
    """The config.json of a row's ``model`` cell.

    ``dataset_path``: the row's dataset CSV or its run folder. A preset name gives the preset's
    stored config; ``hf:NAME@HASH`` the config stored beside the dataset (``model-config.json``
    in the folder, else ``model-configs/HASH.json``), checked against ``HASH``; anything else
    (empty, a plain served name) None. A missing or altered stored config raises
    ``ServedModelError``.
    """
    if model_key in PRESETS:
        return preset_config(model_key)
    m = _KEY.match(model_key or "")
    if not m:
        return None
    p = Path(dataset_path)
    folder = p if p.is_dir() else p.parent
    candidates = [folder / MODEL_CONFIG, folder / MODEL_CONFIGS / f"{m['hash']}.json"]
    for path in candidates:
        if not path.is_file():
            continue
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
            h = physics_hash(from_hf_config(config))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, ArchConfigError) as exc:
            raise ServedModelError(f"{path}: unreadable model config ({exc})") from None
        if h == m["hash"]:
            return config
    raise ServedModelError(f"model {model_key!r}: no stored config.json with architecture hash "
                           f"{m['hash']} in {folder} (looked for "
                           f"{', '.join(str(c.relative_to(folder)) for c in candidates)})")
