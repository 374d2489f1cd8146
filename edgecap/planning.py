"""Plans on the fly for a named board profile, with the host-side compiler.

The runtime reads plans and never needs the compiler, except here: asked for a
board by name (``EdgeCaptioner(board="devboard-usb")``, ``edgecap bench``), it
imports ``edgecap_compile`` lazily and compiles the bundle's encoder into a
cache directory keyed by the models, the board profile and the tools (plan
version, edgecap's version, edgetpu_compiler's presence), so a second run
reuses the segments.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Optional

from edgecap.bundle import Bundle
from edgecap.errors import ConfigError
from edgecap.plan import PLAN_VERSION, Plan, load_plan


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
        from edgecap_compile.edgetpu import find_compiler
        from edgecap_compile.graph import read_graph
    except ImportError as exc:
        raise ConfigError(
            f"planning for board {board!r} needs the compiler ({exc}); install edgecap from a "
            "source checkout, or pass a plan.json from `edgecap compile`"
        ) from None
    chosen = compiler.make_board(board, tpus=1 if whole_on_tpu else tpus)
    key = hashlib.sha256()
    for path in (bundle.encoder, bundle.encoder_step):
        key.update(path.read_bytes())
    # A plan made without edgetpu_compiler, or by another compiler or plan
    # version, must not be reused once that changes (edgecap_compile ships in
    # the edgecap distribution, so its version is edgecap's).
    key.update(repr((chosen, whole_on_tpu, find_compiler(), PLAN_VERSION,
                     metadata.version("edgecap"))).encode())
    out = cache_root() / f"{bundle.encoder.stem}-{chosen.name}-{key.hexdigest()[:16]}"
    if not (out / "plan.json").is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=".staging-"))
        try:
            if whole_on_tpu:
                # Coral's default: every op on tpu:0, only the RNN on the CPU.
                n = len(read_graph(bundle.encoder).ops)
                compiler.compile_model(bundle.root, board, staging, tpus=1,
                                       ranges=[(0, n), (n, n)])
            else:
                compiler.compile_model(bundle.root, board, staging, tpus=tpus)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        try:
            staging.rename(out)  # atomic: a concurrent planner's identical result may win
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
    return load_plan(out)
