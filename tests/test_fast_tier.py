"""conftest.py's fast-tier check: a listed test that is gone stops a full collection, a node-id run still runs.

Each case runs pytest in a subprocess on a small tree of its own: the real
conftest.py beside a fast_tier.py and a test file written for the case. Half
a second or more a case, so the file is in the full suite, not the fast tier.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TESTS = '''
def test_kept():
    pass


def test_other():
    pass
'''


def _pytest(tmp_path: Path, listed: list, *args: str,
            files: frozenset = frozenset()) -> subprocess.CompletedProcess:
    """Runs pytest on a tree whose fast tier lists ``files`` whole and ``listed`` of test_a.py."""
    tests = tmp_path / "tests"
    tests.mkdir(exist_ok=True)
    shutil.copy(HERE / "conftest.py", tests / "conftest.py")
    (tests / "fast_tier.py").write_text(f"FAST_FILES = {files!r}\nFAST_TESTS = {{'test_a.py': {listed!r}}}\n")
    (tests / "test_a.py").write_text(TESTS)
    # Without hypothesis's plugin (a third of pytest's start here): the tree has no property test.
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", *args]
    return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)


def test_a_listed_test_that_is_gone_stops_a_full_collection(tmp_path) -> None:
    run = _pytest(tmp_path, ["test_kept", "test_renamed"], "tests")
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, run.stdout + run.stderr
    assert "tests/fast_tier.py lists tests that do not exist: test_a.py::test_renamed; update the list" in run.stderr


def test_a_listed_file_that_is_gone_stops_even_a_node_id_run(tmp_path) -> None:
    run = _pytest(tmp_path, ["test_kept"], "tests/test_a.py::test_other", files=frozenset({"test_gone.py"}))
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, run.stdout + run.stderr
    assert "lists tests that do not exist: test_gone.py" in run.stderr


def test_one_test_runs_by_its_node_id(tmp_path) -> None:
    # What `pytest tests/test_beam.py::test_...` was refused for: the file's other listed tests are not collected.
    run = _pytest(tmp_path, ["test_kept", "test_other"], "tests/test_a.py::test_other")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout
