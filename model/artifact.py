"""Artifacts: a joblib file plus JSON metadata that pins its sha256 and schema version.

joblib is pickle: only files the operator configured are ever loaded, and only after their
sha256 matches the metadata written beside them. Writes are atomic (temp file, fsync, rename).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import os
import tempfile
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

import joblib
import sklearn

from model.costmodel import CostModel

SCHEMA_VERSION = 2   # 2: efficiencies over physical terms (model.terms); 1 is refused


class ArtifactError(ValueError):
    """An artifact that cannot be loaded; the message says why."""


def metadata_path(path: str | Path) -> Path:
    p = Path(path)
    return p.with_name(p.name + ".json")


def _package_version() -> str:
    try:
        return importlib_metadata.version("engine-advisor")
    except importlib_metadata.PackageNotFoundError:
        return "0+unknown"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def build_metadata(model: CostModel, sha256: str) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "engine_advisor_version": _package_version(),
        "sklearn_version": sklearn.__version__,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "artifact_sha256": sha256,
        "model_version": sha256[:12],
        "training_data_sha256": model.data_sha256,
        "sources": model.sources,
        "fit_metrics": model.metrics,
        "calibrated_ranges": model.ranges,
        "calibrated_points": model.points,
        "memory_fractions": model.memory,
        "coefficients": {e: est.coefficients_ for e, est in model.engines.items()},
    }


def _intact_metadata(p: Path) -> dict[str, Any] | None:
    """The metadata of the artifact at ``p`` if both are there and its sha256 matches."""
    try:
        meta = json.loads(metadata_path(p).read_text(encoding="utf-8"))
        ok = isinstance(meta, dict) and meta.get("artifact_sha256") == _sha256(p)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return {k: v for k, v in meta.items() if k != "replaces"} if ok else None


def save(model: CostModel, path: str | Path) -> dict[str, Any]:
    """Write the artifact and its metadata; returns the metadata.

    Two files cannot be replaced in one atomic step, so the metadata goes first and carries
    the metadata of the artifact it replaces (``replaces``): a writer killed between the two
    renames leaves the old artifact with metadata that still vouches for it, and ``load``
    loads the old model; never neither.
    """
    p = Path(path)
    buf = io.BytesIO()
    joblib.dump(model, buf)
    data = buf.getvalue()
    sha = hashlib.sha256(data).hexdigest()
    meta = build_metadata(model, sha)
    old = _intact_metadata(p) if p.is_file() else None
    if old is not None and old.get("artifact_sha256") != sha:
        meta["replaces"] = old
    atomic_write(metadata_path(p), (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode())
    atomic_write(p, data)
    return meta


def load(path: str | Path) -> tuple[CostModel, dict[str, Any]]:
    """Load an operator-configured artifact after checking its metadata and sha256."""
    p = Path(path)
    mp = metadata_path(p)
    if not p.is_file():
        raise ArtifactError(f"artifact {p}: no such file")
    if not mp.is_file():
        raise ArtifactError(f"artifact {p}: metadata {mp.name} is missing; refusing to unpickle "
                            "an unverified file")
    try:
        meta = json.loads(mp.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"artifact {p}: metadata {mp.name} is not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise ArtifactError(f"artifact {p}: metadata {mp.name} is not a JSON object")
    version = meta.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ArtifactError(f"artifact {p}: schema version {version!r}, this engine-advisor reads "
                            f"{SCHEMA_VERSION}; refit with `engine-advisor fit`")
    actual = _sha256(p)
    previous = meta.get("replaces")
    if (actual != meta.get("artifact_sha256") and isinstance(previous, dict)
            and actual == previous.get("artifact_sha256")):
        meta = previous       # a save killed between its two renames: the old artifact
    if actual != meta.get("artifact_sha256"):
        raise ArtifactError(f"artifact {p}: sha256 {actual[:16]}... does not match the metadata "
                            f"({str(meta.get('artifact_sha256'))[:16]}...): the file was modified "
                            "or truncated; refusing to load it")
    try:
        model = joblib.load(p)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure is a bad artifact
        raise ArtifactError(f"artifact {p}: cannot be read ({type(exc).__name__}: {exc})") from None
    if not isinstance(model, CostModel):
        raise ArtifactError(f"artifact {p}: holds a {type(model).__name__}, not a CostModel")
    model.version = meta.get("model_version", actual[:12])
    return model, meta
