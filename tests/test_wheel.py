"""The wheel a user installs: one package, `arkvory`, that works from a fresh virtual environment
with no trace of this checkout (no editable finder, no repository on sys.path).

The fresh venv borrows the test venv's third-party packages (starlette, httpx...) through a
`.pth` line naming the test venv's site-packages: site processes a `.pth` file's lines only in
the site-packages it finds them in, so the editable install's own `.pth` there stays unread.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
# What the wheel is built from, as the Dockerfile copies it.
SOURCES = ("pyproject.toml", "README.md", "__init__.py", "shared", "writer", "gateway")

# One worker builds the wheel once (the module-scoped fixture would be built on each worker).
pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("wheel")]

PROBE = """
import inspect, json, pathlib, sys, sysconfig
from arkvory import Client
import arkvory, arkvory.shared.settings, arkvory.writer, arkvory.gateway
from arkvory.shared import db
print(json.dumps({
    "client": inspect.getfile(Client),
    "package": arkvory.__file__,
    "site": sysconfig.get_paths()["purelib"],
    "migrations": len(db.migrations()),
    "schema": db.CODE_SCHEMA_VERSION,
    "editable": [m for m in sys.modules if "editable" in m],
}))
"""


def _run(command: list[str], *, cwd: pathlib.Path, timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _tail(text: str) -> str:
    return "\n".join(text.strip().splitlines()[-5:])


@pytest.fixture(scope="module")
def wheel(module_tmp_path) -> pathlib.Path:
    work = module_tmp_path
    source = work / "source"  # a copy: an in-tree build would leave build/ and egg-info behind
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=ignore)
        else:
            shutil.copy2(path, source / name)
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(work / "dist"), str(source)]
    try:
        built = _run(command, cwd=work, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.skip("pip wheel did not finish in 120 s (it fetches setuptools for its build environment)")
    if built.returncode != 0:
        pytest.skip(f"pip wheel cannot run here (it needs setuptools>=69 from an index): {_tail(built.stderr)}")
    (found,) = (work / "dist").glob("arkvory-*.whl")
    return found


def test_the_wheel_holds_one_package_with_its_data(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {"arkvory", wheel.name.split("-py")[0] + ".dist-info"}
    assert "arkvory/__init__.py" in names
    assert "arkvory/shared/client/py.typed" in names
    assert "arkvory/shared/migrations/0001_coordination.sql" in names
    assert "arkvory/writer/console/templates/base.html" in names  # the console's pages and scripts
    assert "arkvory/writer/console/static/upload.js" in names
    assert not [name for name in names if "/tests/" in name or "/bench/" in name]


def test_a_fresh_venv_imports_the_installed_wheel_and_runs_the_command(wheel, tmp_path):
    venv = tmp_path / "venv"
    created = _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path, timeout=120)
    if created.returncode != 0:
        pytest.skip(f"python -m venv cannot make a venv with pip here: {_tail(created.stderr)}")
    python = venv / "bin" / "python"
    installed = _run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)], cwd=tmp_path, timeout=120
    )
    assert installed.returncode == 0, installed.stderr
    site = pathlib.Path(
        _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp_path, timeout=30)
        .stdout.strip()
    )
    ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (site / "zz_test_venv_packages.pth").write_text("".join(f"{path}\n" for path in ours))

    neutral = tmp_path / "elsewhere"  # not the checkout: nothing of it on sys.path
    neutral.mkdir()
    probe = _run([str(python), "-c", PROBE], cwd=neutral, timeout=60)
    assert probe.returncode == 0, probe.stderr
    seen = json.loads(probe.stdout)
    installed_at = pathlib.Path(seen["site"]).resolve()
    assert pathlib.Path(seen["client"]).resolve().is_relative_to(installed_at), seen
    assert pathlib.Path(seen["package"]).resolve() == installed_at / "arkvory" / "__init__.py", seen
    assert seen["editable"] == [], seen
    assert seen["migrations"] == seen["schema"], "the migrations' .sql files are not in the wheel"

    command = _run([str(venv / "bin" / "arkvory"), "--help"], cwd=neutral, timeout=60)
    assert command.returncode == 0, command.stderr
    assert "serve" in command.stdout and "worker" in command.stdout
