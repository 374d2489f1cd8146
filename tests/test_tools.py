"""The developer scripts under tools/ run as written in the docs, from any directory, with edgecap's exit policy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"


@pytest.mark.parametrize("script, bad, needle", [
    ("soak.py", ["--frames", "100", "--warmup", "200"], "warm-up"),
    ("isolation_bench.py", ["--frames", "0"], "--frames 0"),
    ("service_bench.py", ["--json", "/nonexistent-edgecap-dir/x.json"], "--json"),
    ("hostile_bench.py", ["--slow-clients", "-1"], "--slow-clients -1"),
    ("hostile_bench.py", ["--json", "/nonexistent-edgecap-dir/x.json"], "--json"),
    ("flapping.py", ["--fail-every", "0"], "--fail-every 0"),
    ("beam_bench.py", ["--data", ".", "--widths", "0"], "argument --widths"),
])
def test_a_script_refuses_bad_input_in_one_line(tmp_path, script, bad, needle) -> None:
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(TOOLS / script), *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)

    helped = run("--help")
    assert helped.returncode == 0 and helped.stdout.startswith(f"usage: python tools/{script}"), helped
    refused = run(*bad)
    assert refused.returncode == 2 and refused.stdout == "", refused
    assert refused.stderr.splitlines() == [refused.stderr.strip()], refused.stderr
    assert refused.stderr.startswith(f"python tools/{script}: error: ") and needle in refused.stderr
    assert list(tmp_path.iterdir()) == []
