"""Plans on the fly for a named board profile: the runtime's one door to the compiler.

The runtime reads plans and never needs the compiler, except here: asked for a
board by name (``EdgeCaptioner(board="devboard-usb")``, ``edgecap bench``), it
imports ``edgecap_compile`` lazily and compiles the bundle's encoder into a
cache directory keyed by the models, the board profile and the tools (plan
version, edgecap's version, edgetpu_compiler's presence), so a second run
reuses the segments. ``host_schedule`` decides how a plan whose CNN is one
CPU stage uses this machine's cores.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Dict, Optional

from edgecap.bundle import Bundle, WindowSpec
from edgecap.errors import ConfigError
from edgecap.plan import PLAN_FILE, PLAN_VERSION, Plan, load_plan


def cache_root() -> Path:
    """Where compiled plans are kept: ``$XDG_CACHE_HOME/edgecap/plans`` (default ``~/.cache``)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "edgecap" / "plans"


def plan_for_board(
    bundle: Bundle, board: str, *, tpus: Optional[int] = None, whole_on_tpu: bool = False,
    equal_param: bool = False, window: Optional[WindowSpec] = None,
) -> Plan:
    """Compiles the bundle's encoder for a board profile and loads the plan.

    Args:
      bundle: The bundle whose encoder (and RNN encoder step) to plan for.
      board: A board profile name of the compiler (e.g. ``devboard-usb``).
      tpus: Number of TPUs to use (default: the board's).
      whole_on_tpu: Put the whole encoder on ``tpu:0`` and only the RNN on the
        CPU (Coral's default of one model per TPU) instead of the best split.
      equal_param: Split the encoder into TPU segments of about equal parameter
        bytes, the CPU left with only the RNN (``edgetpu_compiler
        --num_segments N``) instead of the best split.
      window: The window the plan will run (default: the bundle's): the CPU
        stage is charged one RNN step per window a frame feeds, so a smaller
        stride moves the split towards the TPUs.

    Returns:
      The loaded ``Plan``.

    Raises:
      ConfigError: If the compiler is not installed, or both ``whole_on_tpu``
        and ``equal_param`` are asked for.
      EdgecapError: If the compiler rejects the board or the model.
    """
    if whole_on_tpu and equal_param:
        raise ConfigError("whole_on_tpu and equal_param are two different splits; ask for one")
    try:
        import edgecap_compile  # the runtime's one door to the compiler
    except ImportError as exc:
        raise ConfigError(
            f"planning for board {board!r} needs the compiler ({exc}); install edgecap from a "
            "source checkout, or pass a plan.json from `edgecap compile`"
        ) from None
    # The compiler reads only frames and stride: a window differing in rate alone is the same plan.
    if window is not None and (window.frames, window.stride) != (bundle.window.frames, bundle.window.stride):
        bundle = dataclasses.replace(bundle, window=dataclasses.replace(
            bundle.window, frames=window.frames, stride=window.stride))
    chosen = edgecap_compile.make_board(board, tpus=1 if whole_on_tpu else tpus)
    key = hashlib.sha256()
    # The bundle recorded both models' hashes when it validated them.
    key.update(bundle.encoder_model.sha256.encode())
    key.update(bundle.encoder_step_model.sha256.encode())
    # A plan made without edgetpu_compiler, or by another compiler or plan
    # version, must not be reused once that changes (edgecap_compile ships in
    # the edgecap distribution, so its version is edgecap's).
    key.update(repr((chosen, (bundle.window.frames, bundle.window.stride), whole_on_tpu, equal_param,
                     edgecap_compile.find_compiler(), PLAN_VERSION,
                     metadata.version("edgecap"))).encode())
    out = cache_root() / f"{bundle.encoder.stem}-{chosen.name}-{key.hexdigest()[:16]}"
    if not (out / PLAN_FILE).is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=".staging-"))
        try:
            # Coral's default for whole_on_tpu: every op on tpu:0, only the RNN on the CPU.
            n = bundle.encoder_model.ops
            ranges = [(0, n), (n, n)] if whole_on_tpu else None
            if equal_param:
                ranges = edgecap_compile.equal_param_ranges(bundle.encoder, len(chosen.tpus))
            edgecap_compile.compile_model(bundle, chosen, staging, ranges=ranges)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        try:
            staging.rename(out)  # atomic: a concurrent planner's identical result may win
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
    return load_plan(out)


@dataclass(frozen=True)
class HostSchedule:
    """How a plan whose CNN is one CPU stage runs on this machine's cores.

    Attributes:
      kind: ``threads`` (every core to the CNN's interpreter, the RNN after it
        on the same worker) or ``pipeline`` (the CNN on a worker of its own,
        ``cpu:1``, with a core fewer, the RNN on ``cpu`` at the same time).
      num_threads: Threads of the CNN's interpreter.
      devices_map: The ``CaptionerOptions.devices_map`` it takes.
      reason: One line: the predicted periods compared.
    """

    kind: str
    num_threads: int
    devices_map: Dict[str, str] = field(default_factory=dict)
    reason: str = ""

    def overrides(self) -> Dict[str, Any]:
        """Returns the ``CaptionerOptions`` overrides that run this schedule."""
        return {"pipelined": True, "num_threads": self.num_threads,
                "devices_map": dict(self.devices_map)}


def host_schedule(plan: Plan, cores: int) -> HostSchedule:
    """Chooses between intra-op threads and pipelining for a plan with the CNN on one CPU stage.

    With ``C`` cores, the CNN taking ``t`` ms a frame on all of them and the
    RNN ``r`` ms a frame (its steps for every window the frame feeds), threads
    take ``t + r`` a frame; pipelining the CNN against the RNN takes
    ``max(t * C / (C - 1), r)``, the CNN losing a core to the RNN. So
    pipelining pays only when ``r > t / (C - 1)``: when the RNN takes longer
    than the time the CNN loses by giving up a core. The CNN's scaling is taken as linear,
    the best case for threads; a CNN that scales worse than that loses less by
    the core it gives up. Where the plan has no predictions, threads.

    Args:
      plan: A plan whose active stages are one CPU stage (the ``host`` profile's).
      cores: The physical cores to use.

    Returns:
      The ``HostSchedule``.
    """
    cores = max(1, cores)
    stages = plan.active_stages
    if len(stages) != 1 or stages[0].spec.kind != "cpu" or stages[0].predicted_ms is None:
        return HostSchedule("threads", cores, reason="no predicted CPU stage: every core to the CNN")
    if cores == 1:
        return HostSchedule("threads", 1, reason="one core: nothing to pipeline onto")
    r = plan.rnn_frame_ms
    t = max(0.0, stages[0].predicted_ms - r)
    pipelined = max(t * cores / (cores - 1), r)
    compared = (f"CNN {t:.2f} ms on {cores} cores, RNN {r:.2f} ms a frame: threads {t + r:.2f} ms, "
                f"pipeline {pipelined:.2f} ms a frame")
    if r > t / (cores - 1):
        return HostSchedule("pipeline", cores - 1, {"cpu": "cpu:1"}, compared)
    return HostSchedule("threads", cores, reason=compared)
