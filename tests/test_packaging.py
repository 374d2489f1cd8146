"""Packaging: the wheel ships the board profiles and its build warns about no stray package."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_wheel_ships_board_profiles_without_a_packages_warning(tmp_path: Path) -> None:
    # Builds in an isolated environment, as `pip install .` does: tens of seconds.
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(tmp_path),
                          str(REPO)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    log = run.stdout + run.stderr
    assert "absent from the `packages` configuration" not in log
    (wheel,) = tmp_path.glob("edgecap-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {p.name for p in (REPO / "compile" / "boards").glob("*.json")}
    assert shipped and {f"edgecap_compile/boards/{n}" for n in shipped} <= names
    assert "edgecap_compile/boards.py" in names
