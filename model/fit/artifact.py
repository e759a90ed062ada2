"""Artifacts are data: a JSON document plus a numpy ``.npz`` of its arrays. Loading one cannot
run code.

``NAME.json`` holds the metadata (schema version, versions, sha256s, a readable summary: fit
metrics, calibrated ranges, coefficients per term) and, under ``model``, the fitted model's state
(``engine_advisor.model.fit.codec``): every ``CostModel`` field, and per engine the estimator's
parameters and fitted attributes. ``NAME.npz`` beside it holds the arrays, read with
``allow_pickle=False``.

- ``arrays_sha256`` pins the ``.npz``'s bytes; ``artifact_sha256`` (whose first 12 digits are
  the model version) pins the ``model`` section and the arrays together. ``load`` checks both
  and refuses a file that was modified or truncated.
- Writes are atomic (``engine_advisor.model.diskio.atomic_write``). The two files cannot be replaced
  in one step,
  so the document goes first and carries the document it replaces (``replaces``): a writer
  killed between the two renames leaves the old arrays with a document that still vouches for
  them, and ``load`` loads the old model; never neither.
- A write that fails (a full or read-only disk ...) raises
  ``engine_advisor.model.errors.DiskError``, one line
  naming the path and the cause, and leaves the old artifact as it was and no temp file: if
  the arrays cannot be written after the new document went in, the old document (kept aside
  as a hard link, ``.NAME.json.previous``, while saving) is put back.
- Reading (``engine_advisor.model.diskio.read_regular``) names a directory or a FIFO as such, never
  read or
  waited on.
- joblib (pickle) artifacts of schema 2 are refused; ``engine-advisor model convert`` turns
  one the user trusts into this format (``engine_advisor.model.fit.legacy``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import io
import json
import os
import zipfile
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

import numpy as np
import sklearn

from engine_advisor.model.diskio import atomic_write, file_kind, read_regular
from engine_advisor.model.errors import DiskError
from engine_advisor.model.fit.codec import CodecError, decode_model, encode_model
from engine_advisor.model.fit.costmodel import CostModel
from engine_advisor.model.physics.terms import TERMS

SCHEMA_VERSION = 3   # 3: JSON + .npz (2: joblib, refused; 1: refused)
FORMAT = "engine-advisor cost model"
SUFFIX, ARRAYS_SUFFIX = ".json", ".npz"
PICKLE_MAGIC = b"\x80"          # the first byte of a pickle of protocol 2 or later
ZIP_TIME = (1980, 1, 1, 0, 0, 0)    # fixed member times: the same model, the same bytes


class ArtifactError(ValueError):
    """An artifact that cannot be saved or loaded; the message says why."""


def arrays_path(path: str | Path) -> Path:
    """The ``.npz`` beside the document ``NAME.json``."""
    return Path(path).with_suffix(ARRAYS_SUFFIX)


def convert_hint(old: Path) -> str:
    new = old.with_suffix(SUFFIX) if old.suffix == ".joblib" else old.with_name(old.name + SUFFIX)
    return (f"convert one you trust with `engine-advisor model convert {old} {new}` (it "
            "unpickles the file: only for artifacts you made), or refit with `engine-advisor "
            "fit`")


def _package_version() -> str:
    try:
        return importlib_metadata.version("engine-advisor")
    except importlib_metadata.PackageNotFoundError:
        return "0+unknown"


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def content_sha256(state: dict[str, Any], arrays_sha256: str) -> str:
    """The artifact's sha256: its ``model`` section (canonical JSON) and its arrays' sha256."""
    return hashlib.sha256(_canonical(state) + b"\n" + arrays_sha256.encode()).hexdigest()


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """The ``.npz`` of ``arrays``, byte for byte the same for the same arrays (``np.savez``
    stamps each member with the current time)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name in sorted(arrays):
            member = io.BytesIO()
            np.lib.format.write_array(member, np.asarray(arrays[name]), allow_pickle=False)
            z.writestr(zipfile.ZipInfo(name + ".npy", date_time=ZIP_TIME), member.getvalue())
    return buf.getvalue()


def build_metadata(model: CostModel, sha256: str) -> dict[str, Any]:
    """The metadata of an artifact whose sha256 is ``sha256`` (a readable summary; ``load``
    rebuilds the model from the ``model`` section only)."""
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


def _metadata(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in ("model", "replaces", "format")}


def check_name(p: Path) -> None:
    """Refuse a path that is not ``NAME.json``, or where a directory, a FIFO ... stands (before
    a fit spends its time)."""
    if p.suffix != SUFFIX:
        raise ArtifactError(f"artifact {p}: name it NAME{SUFFIX} (its arrays go to "
                            f"NAME{ARRAYS_SUFFIX} beside it)")
    for f in (p, arrays_path(p)):
        try:
            kind = file_kind(f.stat().st_mode)
        except OSError:
            continue
        if kind is not None:
            what = f"artifact {p}" + (f": its arrays {f.name}" if f != p else ":")
            raise ArtifactError(f"{what} {kind}; name a file to write")


def save(model: CostModel, path: str | Path) -> dict[str, Any]:
    """Write the artifact (``NAME.json`` and ``NAME.npz``); returns its metadata. A model
    holding a value that is neither JSON nor a numpy array raises ``ArtifactError``, before
    anything is written."""
    p = Path(path)
    check_name(p)
    try:
        state, arrays = encode_model(model)
    except CodecError as exc:
        raise ArtifactError(f"artifact {p}: cannot save this model: {exc}") from None
    data = npz_bytes(arrays)
    arrays_sha = hashlib.sha256(data).hexdigest()
    sha = content_sha256(state, arrays_sha)
    meta = build_metadata(model, sha)
    doc = {"format": FORMAT, **meta, "arrays_sha256": arrays_sha, "model": state}
    old = _intact(p)
    if old is not None and old.get("arrays_sha256") != arrays_sha:
        doc["replaces"] = old
    try:
        text = json.dumps(doc, indent=1, sort_keys=True, allow_nan=True) + "\n"
    except (TypeError, ValueError) as exc:   # not expected: encode_model checked the state
        raise ArtifactError(f"artifact {p}: cannot save this model: {exc}") from None
    existed, keep = p.exists(), _link_aside(p)
    try:
        atomic_write(p, text.encode())
        try:
            atomic_write(arrays_path(p), data)
        except OSError:
            _put_back(p, keep, existed)
            raise
    finally:
        if keep is not None:
            with contextlib.suppress(OSError):
                keep.unlink()
    return {**meta, "arrays_sha256": arrays_sha}


def _link_aside(p: Path) -> Path | None:
    """A hard link to the document at ``p`` (no space needed), to put back if the arrays cannot
    be written; None when there is none (or the file system has no hard links)."""
    aside = p.with_name(f".{p.name}.previous")
    with contextlib.suppress(OSError):
        aside.unlink()              # left by a writer that was killed
    try:
        os.link(p, aside)
    except OSError:
        return None
    return aside


def _put_back(p: Path, aside: Path | None, existed: bool) -> None:
    """After the new document went in and its arrays could not: the old document back (it
    vouches for the old arrays, still in place), or no document when there was none. Best
    effort: where it cannot (no hard link was made, or this fails), the new document stays and
    its ``replaces`` still vouches for the old arrays."""
    with contextlib.suppress(OSError):
        if aside is not None:
            os.replace(aside, p)
        elif not existed:
            p.unlink()


def _intact(p: Path) -> dict[str, Any] | None:
    """The document at ``p`` (without its own ``replaces``) if it and its arrays are whole."""
    try:
        doc = _parse(read_regular(p))
        data = read_regular(arrays_path(p))
    except (OSError, ArtifactError):
        return None
    if not _vouches(doc, hashlib.sha256(data).hexdigest()):
        return None
    return {k: v for k, v in doc.items() if k != "replaces"}


def _vouches(doc: Any, arrays_sha: str) -> bool:
    """Whether ``doc`` is a whole document of these arrays."""
    return (isinstance(doc, dict) and doc.get("arrays_sha256") == arrays_sha
            and isinstance(doc.get("model"), dict)
            and doc.get("artifact_sha256") == content_sha256(doc["model"], arrays_sha))


def _parse(raw: bytes) -> Any:
    if raw[:1] == PICKLE_MAGIC:
        raise ArtifactError("a pickle")
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ArtifactError(f"not valid JSON ({exc}): not an artifact, or a truncated or "
                            "damaged one") from None


def load(path: str | Path) -> tuple[CostModel, dict[str, Any]]:
    """Load an artifact after checking its schema version and sha256s; returns the model and its
    metadata. Nothing in the files can run code: the document is JSON, the arrays are read with
    ``allow_pickle=False`` and only ``engine_advisor.model.fit.codec``'s classes are built."""
    p = Path(path)
    if p.suffix == ".joblib" or p.name.endswith(".joblib.json"):
        old = p if p.suffix == ".joblib" else p.with_suffix("")
        raise ArtifactError(f"artifact {p}: a joblib (pickle) artifact, which engine-advisor "
                            f"no longer loads (unpickling can run code); {convert_hint(old)}")
    try:
        doc = _parse(read_regular(p))
    except FileNotFoundError:
        raise ArtifactError(f"artifact {p}: no such file") from None
    except DiskError as exc:        # a directory, a FIFO ...
        raise ArtifactError(f"artifact {p}: {exc.doing}") from None
    except OSError as exc:
        raise ArtifactError(f"artifact {p}: cannot read ({exc.strerror})") from None
    except ArtifactError as exc:
        if str(exc) == "a pickle":
            raise ArtifactError(f"artifact {p}: a pickle, not a JSON document; engine-advisor "
                                "never unpickles an artifact (it can run code); "
                                f"{convert_hint(p)}") from None
        raise ArtifactError(f"artifact {p}: {exc}") from None
    if not isinstance(doc, dict):
        raise ArtifactError(f"artifact {p}: not a JSON object")
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION:
        hint = (convert_hint(p.with_suffix(".joblib")) if version == 2
                else "refit with `engine-advisor fit`")
        raise ArtifactError(f"artifact {p}: schema version {version!r}, this engine-advisor "
                            f"reads {SCHEMA_VERSION}; {hint}")
    ap = arrays_path(p)
    try:
        data = read_regular(ap)
    except DiskError as exc:        # a directory, a FIFO ...
        raise ArtifactError(f"artifact {p}: its arrays {ap.name} {exc.doing}") from None
    except OSError as exc:
        raise ArtifactError(f"artifact {p}: its arrays {ap.name}: cannot read "
                            f"({exc.strerror})") from None
    actual = hashlib.sha256(data).hexdigest()
    previous = doc.get("replaces")
    if doc.get("arrays_sha256") != actual and _vouches(previous, actual):
        doc = previous        # a save killed between its two renames: the old artifact
    if doc.get("arrays_sha256") != actual:
        raise ArtifactError(f"artifact {p}: sha256 {actual[:16]}... of {ap.name} does not match "
                            f"the metadata ({str(doc.get('arrays_sha256'))[:16]}...): the file "
                            "was modified or truncated; refusing to load it")
    if not _vouches(doc, actual):
        raise ArtifactError(f"artifact {p}: artifact_sha256 does not match its model section: "
                            "the file was modified or truncated; refusing to load it")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except Exception as exc:  # noqa: BLE001 - numpy and zipfile raise many types
        raise ArtifactError(f"artifact {p}: {ap.name} cannot be read as arrays "
                            f"({type(exc).__name__}: {exc})") from None
    try:
        model = decode_model(doc["model"], arrays)
    except CodecError as exc:
        raise ArtifactError(f"artifact {p}: {exc}") from None
    _check_terms(p, model, doc)
    model.version = doc.get("model_version", doc["artifact_sha256"][:12])
    return model, {**_metadata(doc), "arrays_sha256": actual}


def _check_terms(p: Path, model: CostModel, doc: dict) -> None:
    """Refuse a model fitted over other cost terms than this version's (``TERMS``): its
    coefficients would be read against the wrong terms."""
    for name, est in model.engines.items():
        theirs = (doc.get("coefficients") or {}).get(name) or {}
        # the same count of terms is not enough: a term renamed is a term whose count means
        # something else (``layer_fixed``, per layer, became ``kernel_fixed``, per kernel)
        if len(est.coef_) == len(TERMS) and (not theirs or set(theirs) == set(TERMS)):
            continue
        new = [t for t in TERMS if t not in theirs]
        gone = [t for t in theirs if t not in TERMS]
        what = "; ".join(x for x in (f"new: {', '.join(new)}" if new else "",
                                     f"removed: {', '.join(gone)}" if gone else "") if x)
        count = (f"fitted over {len(est.coef_)} cost terms, this engine-advisor's cost model "
                 f"has {len(TERMS)}" if len(est.coef_) != len(TERMS) else
                 "fitted over other cost terms than this engine-advisor's")
        raise ArtifactError(f"artifact {p}: {count}" + (f" ({what})" if what else "")
                            + "; refit it from its dataset with `engine-advisor fit`")
