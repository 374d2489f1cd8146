"""tools/scene_bench.py: the runtime's unknown-scene share per bundle and set, as a table and JSON (issue #26)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TOOL = REPO / "tools" / "scene_bench.py"
SAMPLE = REPO / "models" / "demo" / "sample.mp4"
DEMO = f"demo={REPO / 'models' / 'demo' / 'bundle'}"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=300, cwd=REPO)


def test_a_small_run_writes_the_table_and_the_json(tmp_path: Path) -> None:
    held = tmp_path / "held" / "clips"
    held.mkdir(parents=True)
    shutil.copy(SAMPLE, held / "a.mp4")  # the demo's own world: known
    out = tmp_path / "r.json"
    done = _run("--bundle", DEMO, "--heldout", str(held.parent), "--street", str(SAMPLE),
                "--json", str(out), "--md", str(tmp_path / "r.md"))
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    demo = result["bundles"]["demo"]
    held = demo["sets"]["heldout:held"]
    assert (held["windows"], held["unknown"], held["agree"]) == (1, 0, True)
    street = demo["sets"]["street"]
    assert (street["windows"], street["unknown"], street["by_clip"]) == (3, 0, {"sample.mp4": [0, 3]})
    assert demo["goals_met"] is False  # the sample is no street: 0 % called unknown
    assert "| demo | confidence < -0.000301 | held: 0.0% (0/1) | 0.0% (0/3) | – | 0 / – of 3 | yes | NOT met |" in done.stdout
    assert "load average before:" in done.stdout
    assert (tmp_path / "r.md").read_text().startswith("| bundle | calibration |")


@pytest.mark.parametrize("args, says", [
    (["--bundle", "demo"], "--bundle 'demo': give NAME=DIR"),
    (["--bundle", "demo=/nonexistent"], "bundle directory not found"),
    (["--bundle", DEMO], "nothing to measure"),
    (["--bundle", DEMO, "--street", "/nonexistent.mp4"], "--street /nonexistent.mp4: not a video file"),
])
def test_bad_input_is_one_line_and_exit_2(args, says: str) -> None:
    done = _run(*args)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert says in done.stderr
