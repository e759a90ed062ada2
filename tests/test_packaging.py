"""The package installs beside anything: its only top-level import name is ``engine_advisor``.

A fresh virtual environment that already holds packages named ``model``, ``service``, ``cli``,
``sim`` and ``calibration`` (tiny local ones built here) gets the project's wheel and then an
editable install; the command serves, and the other packages still import as themselves. No
network: the project's dependencies come from this test's own environment (a plain path line,
so none of its ``.pth`` hooks run in the new one), and the wheel is built without isolation.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import httpx
import pytest
from proc import terminate, wait_for
from seedload import FIELDS

from engine_advisor.calibration.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("model", "service", "calibration", "sim", "cli")
SITE = next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())

pytestmark = pytest.mark.slow


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_folder_is_in_the_namespace_and_nothing_else():
    """pyproject.toml lists each folder holding an ``__init__.py`` as ``engine_advisor.<path>``,
    and maps exactly the five top-level folders."""
    cfg = _pyproject()["tool"]["setuptools"]
    on_disk = {"engine_advisor." + ".".join(p.parent.relative_to(ROOT).parts)
               for top in FOLDERS for p in (ROOT / top).rglob("__init__.py")
               if "__pycache__" not in p.parts}
    assert set(cfg["packages"]) == on_disk
    assert cfg["package-dir"] == {f"engine_advisor.{t}": t for t in FOLDERS}
    assert _pyproject()["project"]["scripts"]["engine-advisor"].startswith("engine_advisor.")


def _tiny_package(where: Path, name: str) -> Path:
    """A one-module project whose import name is ``name``, marked as someone else's."""
    src = where / f"other-{name}"
    (src / name).mkdir(parents=True)
    (src / name / "__init__.py").write_text(f"OWNER = 'other-{name}'\n")
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        f'[project]\nname = "other-{name}"\nversion = "1.0"\n'
        f'[tool.setuptools]\npackages = ["{name}"]\n')
    return src


def _pip(python: Path, *args: str) -> None:
    """pip of this environment, run against ``python``'s (so the build backend is this
    environment's setuptools, reached through the path line)."""
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                        "--no-deps", "--no-build-isolation", "--no-index", *args],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture(scope="module")
def crowded_env(tmp_path_factory) -> Path:
    """A fresh venv with the five generic names already taken; its python."""
    tmp = tmp_path_factory.mktemp("crowded")
    env = tmp / "venv"
    venv.EnvBuilder(with_pip=False).create(env)
    python = env / "bin" / "python"
    site = Path(subprocess.check_output(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        text=True).strip())
    # the project's dependencies, from this environment: a path line, not addsitedir
    (site / "zz-deps.pth").write_text(SITE + "\n")
    for name in FOLDERS:
        _pip(python, str(_tiny_package(tmp, name)))
    return python


def _copy_project(dest: Path) -> Path:
    for name in (*FOLDERS, "pyproject.toml", "README.md"):
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, dest / name)
    return dest


def _others_import_as_themselves(python: Path) -> None:
    code = ("import model, service, cli, sim, calibration\n"
            "for m in (model, service, cli, sim, calibration):\n"
            "    assert m.OWNER == 'other-' + m.__name__, (m.__name__, m.__file__)\n"
            "import engine_advisor.model.recommend, engine_advisor.service.main\n"
            "import engine_advisor.cli.main, engine_advisor.sim.app\n"
            "import engine_advisor.calibration.fit.fitter\n"
            "print('ok')\n")
    # from a neutral folder: the repository root on sys.path would prove nothing
    r = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                       cwd=python.parents[2], timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def _serves(python: Path, log: Path) -> None:
    """``engine-advisor serve`` of that environment answers a recommendation."""
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ENGINE_ADVISOR_") and k != "PYTHONPATH"}
    with log.open("wb") as out:
        proc = subprocess.Popen([str(python.parent / "engine-advisor"), "serve", "--port",
                                 str(port)], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, cwd=python.parents[2],
                                start_new_session=True)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(base + "/healthz", timeout=1.0).status_code == 200
        except httpx.TransportError:
            return proc.poll() is not None
    try:
        assert wait_for(up, 90, step=0.1) and proc.poll() is None, log.read_text()
        r = httpx.post(base + "/v1/recommend", json={"context_tokens": 65_536, **FIELDS},
                       timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["engine"] in ("vllm", "sglang")
    finally:
        terminate(proc)


def test_the_wheel_installs_beside_packages_named_like_our_folders(crowded_env, tmp_path):
    src = _copy_project(tmp_path / "src")
    out = tmp_path / "wheel"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--no-build-isolation", "--no-index", "-w", str(out), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = out.glob("engine_advisor-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"engine_advisor"}
    assert "engine_advisor/model/data/b300_reference.csv" in names
    assert "engine_advisor/service/ui/index.html" in names
    assert not any(n.startswith("engine_advisor/__init__") for n in names)   # a namespace
    _pip(crowded_env, str(wheel))
    _others_import_as_themselves(crowded_env)
    _serves(crowded_env, tmp_path / "serve-wheel.log")


def test_an_editable_install_beside_them_too(crowded_env, tmp_path):
    """After the wheel test (same venv): an editable install replaces it and reads the source."""
    src = _copy_project(tmp_path / "src")
    _pip(crowded_env, "-e", str(src))
    _others_import_as_themselves(crowded_env)
    where = subprocess.check_output(
        [str(crowded_env), "-c", "import engine_advisor.model.recommend as m; print(m.__file__)"],
        text=True, cwd=crowded_env.parents[2]).strip()
    assert Path(where).resolve() == (src / "model" / "recommend.py").resolve()
    _serves(crowded_env, tmp_path / "serve-editable.log")
