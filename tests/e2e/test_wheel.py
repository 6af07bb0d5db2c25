"""pdbench installed from its wheel, not from the checkout: every package and subpackage is
in it, the Hydra tree comes along as package data, and a preset composes and validates."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_holds_every_package_and_composes_a_preset(tmp_path: Path):
    # The checkout's files (tracked, or new and not ignored) copied out: no build/ left
    # from an earlier build can fill in what the package list forgets.
    src = tmp_path / "src"
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in listed:
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    built = subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", str(src), "-w", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = tmp_path.glob("pdbench-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    source = {
        str(p.relative_to(ROOT))
        for top in ("pdbench", "jobs", "connector", "analysis")
        for p in (ROOT / top).rglob("*.py")
    }
    assert source - names == set(), "modules missing from the wheel"
    yamls = {str(p.relative_to(ROOT)) for p in (ROOT / "conf").rglob("*.yaml")}
    assert yamls - names == set(), "Hydra configs missing from the wheel"

    site = tmp_path / "site"
    installed = subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    # From outside the checkout, the installed copy first on the path (the venv's editable
    # install stays behind it): the preset composes from the wheel's conf/.
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run(
        [sys.executable, "-c", "import pdbench, analysis.questions as q; print(q.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert where.stdout.strip().startswith(str(site)), where.stdout + where.stderr[-2000:]
    proc = subprocess.run(
        [sys.executable, "-m", "pdbench", "+experiment=crossover", "--cfg", "job"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "name: crossover" in proc.stdout and "trace: true" in proc.stdout
