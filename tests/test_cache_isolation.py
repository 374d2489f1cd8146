"""The suite plans into a private cache, never the user's ~/.cache/edgecap/plans.

These tests do not ask for conftest's ``private_cache`` fixture: they pass only
because it is autouse, for every test of the session.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from edgecap.plans import compiler as planning

REPO = Path(__file__).resolve().parent.parent


def test_plan_cache_is_a_private_directory_of_the_session(tmp_path_factory) -> None:
    root = planning.cache_root()
    assert tmp_path_factory.getbasetemp() in root.parents
    assert (Path.home() / ".cache") not in root.parents


def test_cli_subprocesses_inherit_the_private_cache() -> None:
    code = "from edgecap.plans.compiler import cache_root; print(cache_root())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert Path(out.stdout.strip()) == planning.cache_root()
    assert Path(os.environ["XDG_CACHE_HOME"]) in planning.cache_root().parents
