"""Reading a joblib (pickle) artifact of schema 2, for ``engine-advisor model convert`` only.

Unpickling runs whatever code the file names: this module exists so that a user can convert
an artifact they made (or trust) into the JSON + ``.npz`` format, on explicit request. Nothing
else imports it; ``engine_advisor.model.fit.artifact.load`` refuses such files.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from unittest import mock

from engine_advisor.model.fit.artifact import ArtifactError
from engine_advisor.model.fit.costmodel import CostModel

LEGACY_SCHEMA = 2
# Schema-2 artifacts were written when the packages were top-level (``model.fit.costmodel``);
# their classes now live under ``engine_advisor``. Only these names are rewritten: any other
# module a pickle names is looked up as it is.
OLD_TOPS = ("model", "calibration", "service", "sim", "cli")


def current_module(module: str) -> str:
    """The module a schema-2 pickle's ``module`` is today."""
    return f"engine_advisor.{module}" if module.partition(".")[0] in OLD_TOPS else module


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_trusted_joblib(path: str | Path) -> CostModel:
    """The model of a schema-2 ``NAME.joblib`` whose metadata ``NAME.joblib.json`` vouches for
    it (sha256). UNPICKLES THE FILE: call it only for a file the user said they trust."""
    p = Path(path)
    mp = p.with_name(p.name + ".json")
    if not p.is_file():
        raise ArtifactError(f"{p}: no such file")
    try:
        meta = json.loads(mp.read_text(encoding="utf-8"))
    except OSError:
        raise ArtifactError(f"{p}: its metadata {mp.name} is missing; without it the file "
                            "cannot be checked, so it is not unpickled") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ArtifactError(f"{p}: its metadata {mp.name} is not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("schema_version") != LEGACY_SCHEMA:
        raise ArtifactError(f"{p}: metadata {mp.name} is not that of a schema "
                            f"{LEGACY_SCHEMA} artifact")
    actual = _sha256(p)
    if actual != meta.get("artifact_sha256"):
        raise ArtifactError(f"{p}: sha256 {actual[:16]}... does not match its metadata: the "
                            "file was modified or truncated; not unpickling it")
    import joblib
    from joblib import numpy_pickle

    class Renamed(numpy_pickle.NumpyUnpickler):
        def find_class(self, module, name):
            return super().find_class(current_module(module), name)

    try:
        # joblib.load builds its unpickler from this module attribute: ours renames the
        # packages, and a user's own top-level ``model`` package is never imported
        with mock.patch.object(numpy_pickle, "NumpyUnpickler", Renamed):
            model = joblib.load(p)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure is a bad artifact
        raise ArtifactError(f"{p}: cannot be read ({type(exc).__name__}: {exc})") from None
    if not isinstance(model, CostModel):
        raise ArtifactError(f"{p}: holds a {type(model).__name__}, not a CostModel")
    return model
