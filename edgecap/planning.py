"""Plans on the fly for a named board profile, with the host-side compiler.

The runtime reads plans and never needs the compiler, except here: asked for a
board by name (``EdgeCaptioner(board="devboard-usb")``, ``edgecap bench``), it
imports ``edgecap_compile`` lazily and compiles the bundle's encoder into a
cache directory keyed by the models and the board profile, so a second run
reuses the segments.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

from edgecap.bundle import Bundle
from edgecap.errors import ConfigError
from edgecap.plan import Plan, load_plan


def cache_root() -> Path:
    """Where compiled plans are kept: ``$XDG_CACHE_HOME/edgecap/plans`` (default ``~/.cache``)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "edgecap" / "plans"


def plan_for_board(
    bundle: Bundle, board: str, *, tpus: Optional[int] = None, whole_on_tpu: bool = False
) -> Plan:
    """Compiles the bundle's encoder for a board profile and loads the plan.

    Args:
      bundle: The bundle whose encoder (and RNN encoder step) to plan for.
      board: A board profile name of the compiler (e.g. ``devboard-usb``).
      tpus: Number of TPUs to use (default: the board's).
      whole_on_tpu: Put the whole encoder on ``tpu:0`` and only the RNN on the
        CPU (Coral's default of one model per TPU) instead of the best split.

    Returns:
      The loaded ``Plan``.

    Raises:
      ConfigError: If the compiler is not installed.
      EdgecapError: If the compiler rejects the board or the model.
    """
    try:
        from edgecap_compile import compiler
    except ImportError as exc:
        raise ConfigError(
            f"planning for board {board!r} needs the compiler ({exc}); install edgecap from a "
            "source checkout, or pass a plan.json from `edgecap compile`"
        ) from None
    chosen = compiler.make_board(board, tpus=1 if whole_on_tpu else tpus)
    key = hashlib.sha256()
    for path in (bundle.encoder, bundle.encoder_step):
        key.update(path.read_bytes())
    key.update(repr((chosen, whole_on_tpu)).encode())
    out = cache_root() / f"{bundle.encoder.stem}-{chosen.name}-{key.hexdigest()[:16]}"
    if not (out / "plan.json").is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=".staging-"))
        if whole_on_tpu:
            _compile_whole_on_tpu(compiler, bundle, chosen, staging)
        else:
            compiler.compile_model(bundle.root, board, staging, tpus=tpus)
        try:
            staging.rename(out)  # atomic: a concurrent planner's identical result may win
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
    return load_plan(out)


def _compile_whole_on_tpu(compiler, bundle: Bundle, board, out: Path) -> None:
    # The compiler picks the best split; here the split is fixed: every op on tpu:0.
    from edgecap_compile.cost_model import CostModel
    from edgecap_compile.edgetpu import EdgeTpuReport, compile_segment, find_compiler
    from edgecap_compile.graph import read_graph
    from edgecap_compile.partitioner import evaluate
    from edgecap_compile.plan import build_plan, write_plan
    from edgecap_compile.segments import write_segments

    graph = read_graph(bundle.encoder)
    model = CostModel(graph, [*board.tpus, board.cpu], compiler.rnn_step_ms(bundle.encoder_step, board))
    n = len(graph.ops)
    split = evaluate([model.matrix(k) for k in range(2)], [0, n, n])
    segments = write_segments(graph, list(split.ranges), out)
    tool = find_compiler()
    edgetpu = {0: compile_segment(tool, segments[0].path) if tool else
               EdgeTpuReport(compiled=False, reason="edgetpu_compiler not on PATH")}
    plan = build_plan(graph, bundle.encoder.name, board, model, split, segments, edgetpu)
    write_plan(plan, out / "plan.json")
