"""Board profiles pinned to pipelines, for tests whose subject is a pipeline's shape, not its schedule.

The demo CNN runs fastest as copies on the shipped two-TPU profiles (issue 27),
so tests written about one stage per device (a failover of the TPU stage, the
RNN stage's pacing, isolated TPU stages, bus pacing) run on the same profile
with ``"replicas": false`` (``edgecap_compile.boards.Board.replicas``);
tests/test_replicas_run.py and tests/test_compile_schedules.py cover copies.
They leave out the CPU's own work a frame too (``cpu.frame_ms``,
``cpu.frame_elements_per_s``, ``cpu.handoff_ms``): with it the demo's CPU has
no time left for a CNN tail, and these tests study a TPU segment and a CPU tail.
"""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

BOARDS = Path(__file__).resolve().parents[1] / "compile" / "boards"


@functools.lru_cache(maxsize=None)
def pipeline_board(name: str) -> str:
    """The shipped profile ``name`` (same name, same device figures) with copies of a stage turned off
    and no CPU work a frame besides the stages', as a path."""
    doc = json.loads((BOARDS / f"{name}.json").read_text())
    doc["replicas"] = False
    for field in ("frame_ms", "frame_elements_per_s", "handoff_ms"):
        doc["cpu"].pop(field, None)
    path = Path(tempfile.mkdtemp(prefix="edgecap-pipeline-boards-")) / f"{name}.json"
    path.write_text(json.dumps(doc, indent=2))
    return str(path)
