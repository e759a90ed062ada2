"""Find and read aiconfigurator-core's per-operation latency tables (parquet).

The package ``aiconfigurator-core`` (Apache-2.0, the optional extra ``engine-advisor[silicon]``)
ships ``aiconfigurator_core/systems/<system>.yaml`` spec sheets and, under the ``data_dir`` each
names, tables ``<op>/<engine>/<version>/<table>.parquet`` measured by NVIDIA on that GPU: one row
per shape, ``latency`` in milliseconds per call. This module only locates and reads them; what
they mean is calibration/silicon/importer.py's business. Every error names what does exist.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine_advisor.calibration.errors import CalibrationError

PACKAGE = "aiconfigurator-core"
MODULE = "aiconfigurator_core"


class SiliconError(CalibrationError, ValueError):
    """A bad or missing input, worded as ``--flag: problem`` for the command line."""


@dataclass(frozen=True)
class System:
    name: str
    root: Path          # the systems directory
    data_dir: Path      # root / spec["data_dir"]
    spec: dict          # the parsed <name>.yaml


@dataclass(frozen=True)
class TableRef:
    path: Path
    op: str
    engine: str
    version: str

    def relative(self, root: Path) -> str:
        return self.path.relative_to(root.parent).as_posix()


def package_systems_dir() -> Path:
    """``aiconfigurator_core/systems`` of the installed package (not imported, only found)."""
    spec = importlib.util.find_spec(MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise SiliconError(f"--format aiconfigurator: the {PACKAGE} package is not installed "
                           "(pip install 'engine-advisor[silicon]'), and no --systems-dir given")
    return Path(list(spec.submodule_search_locations)[0]) / "systems"


def package_version() -> str | None:
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None


def version_key(version: str) -> tuple:
    """Sort key of version directory names: numeric parts compared as numbers."""
    return tuple(int(p) if p.isdigit() else -1 for p in re.findall(r"\d+|[a-z]+", version))


def _subdirs(path: Path) -> list[str]:
    try:
        return sorted(p.name for p in path.iterdir() if p.is_dir())
    except OSError:
        return []


def _names(items) -> str:
    items = sorted(items)
    return ", ".join(items) if items else "none"


def list_systems(root: Path) -> list[str]:
    return sorted(p.stem for p in Path(root).glob("*.yaml") if _data_dir_of(p) is not None)


def _data_dir_of(yaml_path: Path) -> Path | None:
    import yaml

    try:
        spec = yaml.safe_load(yaml_path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(spec, dict) or not isinstance(spec.get("data_dir"), str):
        return None
    d = yaml_path.parent / spec["data_dir"]
    return d if d.is_dir() else None


def load_system(root: Path, name: str) -> System:
    import yaml

    root = Path(root)
    if not root.is_dir():
        raise SiliconError(f"--systems-dir: {root} is not a directory")
    path = root / f"{name}.yaml"
    if not path.is_file():
        raise SiliconError(f"--system: no system {name!r} in {root}; systems: "
                           f"{_names(list_systems(root))}")
    try:
        spec = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SiliconError(f"--system: {path} is not valid YAML ({exc})") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("data_dir"), str):
        raise SiliconError(f"--system: {path} has no data_dir")
    data_dir = root / spec["data_dir"]
    if not data_dir.is_dir():
        raise SiliconError(f"--system: {name} names data_dir {spec['data_dir']!r}, which does "
                           f"not exist under {root}")
    return System(name, root, data_dir, spec)


def find_table(system: System, op: str, engine: str, table: str,
               version: str | None = None) -> TableRef:
    """The ``<op>/<engine>/<version>/<table>.parquet`` of a system: the given version, or the
    newest version directory holding that table."""
    op_dir = system.data_dir / op
    if not op_dir.is_dir():
        raise SiliconError(f"--system: {system.name} has no {op!r} tables; ops: "
                           f"{_names(_subdirs(system.data_dir))}")
    file = f"{table}.parquet"

    def versions_with(eng: str) -> list[str]:
        return sorted((v for v in _subdirs(op_dir / eng) if (op_dir / eng / v / file).is_file()),
                      key=version_key)

    have = versions_with(engine)
    if not have:
        others = [e for e in _subdirs(op_dir) if versions_with(e)]
        raise SiliconError(f"--engine: {system.name} has no {op}/{engine}/*/{file}; engines "
                           f"with it: {_names(others)}")
    if version is None:
        version = have[-1]
    elif version not in have:
        raise SiliconError(f"--engine-version: {system.name} has no {op}/{engine}/{version}/"
                           f"{file}; versions with it: {_names(have)}")
    return TableRef(op_dir / engine / version / file, op, engine, version)


def read_table(ref: TableRef, columns: dict[str, type], root: Path) -> dict[str, np.ndarray]:
    """The named columns of a table as arrays (``str`` -> object array, ``float`` -> float64),
    rows whose ``latency`` is not a positive finite number dropped. Missing columns or no
    usable rows raise SiliconError."""
    import pyarrow.parquet as pq

    name = ref.relative(root)
    try:
        tbl = pq.read_table(ref.path)
    except (OSError, ValueError) as exc:
        raise SiliconError(f"--system: cannot read {name}: {exc}") from None
    missing = [c for c in columns if c not in tbl.column_names]
    if missing:
        raise SiliconError(f"--system: table {name} lacks column(s) {', '.join(missing)} "
                           f"(has: {', '.join(tbl.column_names)})")
    out: dict[str, np.ndarray] = {}
    for col, kind in columns.items():
        values = tbl.column(col).to_pylist()
        try:
            out[col] = (np.array([str(v) for v in values], dtype=object) if kind is str
                        else np.array([np.nan if v is None else v for v in values], dtype=float))
        except (TypeError, ValueError):
            raise SiliconError(f"--system: column {col!r} of {name} is not numeric") from None
    if "latency" in out:
        ok = np.isfinite(out["latency"]) & (out["latency"] > 0)
        out = {k: v[ok] for k, v in out.items()}
    if not len(next(iter(out.values()), [])):
        raise SiliconError(f"--system: table {name} has no rows with a positive latency")
    return out
