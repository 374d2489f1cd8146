"""Plans on the fly for a named board profile: the runtime's one door to the compiler.

The runtime reads plans and never needs the compiler, except here: asked for a
board by name (``EdgeCaptioner(board="devboard-usb")``, ``edgecap bench``), it
imports ``edgecap_compile`` lazily and compiles the bundle's encoder into a
cache directory keyed by the models, the board profile and the tools (plan
version, edgecap's version, edgetpu_compiler's presence), so a second run
reuses the segments. Which plan runs is the planner's (``edgecap.planner``).
``board_profile`` loads a profile with its devices corrected (what the
running board measured, or an emulated truth), for a caller to plan for.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import tempfile
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, List, Mapping, Optional

from edgecap.bundle import Bundle, WindowSpec
from edgecap.errors import ConfigError
from edgecap.plans.plan import PLAN_FILE, PLAN_VERSION, CpuFrame, Plan, Stage, load_plan
from edgecap.plans.pricing import AS_PROFILED, CPU, Correction, Corrections, price


# Bumped when plan.json gains an optional field the runtime relies on: a plan
# cached before stages recorded their cost parts (``Stage.cost``) cannot be
# re-priced by the running board (edgecap.adapt) nor paced by a truth.
# 3: a bundle's plan charges the RNN step the runtime runs (the int8 one where shipped), not the float one.
CACHE_FORMAT = 4


def cache_root() -> Path:
    """Where compiled plans are kept: ``$XDG_CACHE_HOME/edgecap/plans`` (default ``~/.cache``)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "edgecap" / "plans"


def _compiler(board: object) -> ModuleType:
    """Imports the compiler, the runtime's one door to it, or says in one line that it is missing."""
    try:
        import edgecap_compile
    except ImportError as exc:
        raise ConfigError(
            f"planning for board {getattr(board, 'name', board)!r} needs the compiler ({exc}); install "
            "edgecap from a source checkout, or pass a plan.json from `edgecap compile`"
        ) from None
    return edgecap_compile


def plan_for_board(
    bundle: Bundle, board: "str | object", *, tpus: Optional[int] = None, whole_on_tpu: bool = False,
    equal_param: bool = False, window: Optional[WindowSpec] = None,
    corrections: Corrections = AS_PROFILED, replicas: bool = True,
) -> Plan:
    """Compiles the bundle's encoder for a board profile and loads the plan.

    Args:
      bundle: The bundle whose encoder (and RNN encoder step) to plan for.
      board: A board profile name of the compiler (e.g. ``devboard-usb``), or
        a loaded ``edgecap_compile`` ``Board`` (``board_profile``'s).
      tpus: Number of TPUs to use (default: the board's).
      whole_on_tpu: Put the whole encoder on ``tpu:0`` and only the RNN on the
        CPU (Coral's default of one model per TPU) instead of the best split.
      equal_param: Split the encoder into TPU segments of about equal parameter
        bytes, the CPU left with only the RNN (``edgetpu_compiler
        --num_segments N``) instead of the best split.
      window: The window the plan will run (default: the bundle's): the CPU
        stage is charged one RNN step per window a frame feeds, so a smaller
        stride moves the split towards the TPUs.
      corrections: Plan device (``pci:0``, ``cpu``) -> ``edgecap.plans.pricing.Correction``:
        what the running board measured (``edgecap.adapt``). The split is
        searched on the board as they say it runs (``board_profile``), so it
        is the best for the board as measured; the plan's predictions stay
        the profile's, as every plan's: what is measured is compared with
        them, and an emulated board paces to them.
      replicas: Also search copies of a stage on several devices (the
        default); False: the best pipeline, one device per stage.

    Returns:
      The loaded ``Plan``.

    Raises:
      ConfigError: If the plan cache (``cache_root``) cannot be written, the
        compiler is not installed, or both ``whole_on_tpu``
        and ``equal_param`` are asked for.
      EdgecapError: If the compiler rejects the board or the model.
    """
    if whole_on_tpu and equal_param:
        raise ConfigError("whole_on_tpu and equal_param are two different splits; ask for one")
    edgecap_compile = _compiler(board)
    # The compiler reads only frames and stride: a window differing in rate alone is the same plan.
    if window is not None and (window.frames, window.stride) != (bundle.window.frames, bundle.window.stride):
        bundle = dataclasses.replace(bundle, window=dataclasses.replace(
            bundle.window, frames=window.frames, stride=window.stride))
    chosen = profile = edgecap_compile.make_board(board, tpus=1 if whole_on_tpu else tpus)
    names = edgecap_compile.plan.plan_devices(profile)
    fixes = _rounded(corrections)
    if fixes:
        chosen = edgecap_compile.corrected_board(profile, fixes)
    key = hashlib.sha256()
    # The bundle recorded both models' hashes when it validated them.
    key.update(bundle.encoder_model.sha256.encode())
    key.update(bundle.encoder_step_model.sha256.encode())
    # The step the plan charges (``Bundle.steps``: the int8 one where shipped).
    key.update(hashlib.sha256(bundle.steps().encoder_step.read_bytes()).hexdigest().encode())
    # A plan made without edgetpu_compiler, or by another compiler or plan
    # version, must not be reused once that changes (edgecap_compile ships in
    # the edgecap distribution, so its version is edgecap's). CACHE_FORMAT marks
    # plan.json gaining optional fields within one plan version.
    key.update(repr((chosen, (bundle.window.frames, bundle.window.stride), whole_on_tpu, equal_param,
                     edgecap_compile.find_compiler(), PLAN_VERSION, CACHE_FORMAT, replicas,
                     metadata.version("edgecap"))).encode())
    out = cache_root() / f"{bundle.encoder.stem}-{chosen.name}-{key.hexdigest()[:16]}"
    if not (out / PLAN_FILE).is_file():
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=".staging-"))
        except OSError as exc:  # e.g. XDG_CACHE_HOME is a file, or read-only
            raise ConfigError(f"plan cache {out.parent}: cannot write it ({exc.strerror}); set "
                              "XDG_CACHE_HOME to a directory you can write") from None
        try:
            # Coral's default for whole_on_tpu: every op on tpu:0, only the RNN on the CPU.
            n = bundle.encoder_model.ops
            ranges = [(0, n), (n, n)] if whole_on_tpu else None
            if equal_param:
                ranges = edgecap_compile.equal_param_ranges(bundle.encoder, len(chosen.tpus))
            edgecap_compile.compile_model(bundle, chosen, staging, ranges=ranges, replicas=replicas)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        try:
            staging.rename(out)  # atomic: a concurrent planner's identical result may win
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
    plan = load_plan(out)
    return _as_profiled(plan, fixes, profile, names) if fixes else plan


def board_profile(board: "str | object", corrections: Corrections = AS_PROFILED) -> Any:
    """Loads a board profile of the compiler, each device named in ``corrections`` as it says it runs.

    A device's ``speed`` divides its time per unit of work (MACs, elements,
    per-op, per-invoke and memory costs: the parts a stage's ``compute_ms``
    and ``invoke_ms`` are made of), and its ``link_bytes_per_s`` replaces its
    link rate; the device keeps its name and link kind. Planning for the
    result (``plan_for_board``) gives the best plan for the board as it runs.

    Args:
      board: A board profile name (``devboard-usb``), or a loaded ``edgecap_compile`` ``Board``.
      corrections: Plan device (``pci:0``, ``usb:0``, ``cpu``) -> its
        ``Correction`` (an emulated truth's: ``Truth.corrections``).

    Returns:
      The ``edgecap_compile`` ``Board``.

    Raises:
      ConfigError: If the compiler is missing, or a correction names a TPU the board lacks.
    """
    edgecap_compile = _compiler(board)
    profile = edgecap_compile.make_board(board)
    names = edgecap_compile.plan.plan_devices(profile)
    for device in corrections:
        if device != CPU and device not in names:
            raise ConfigError(f"{device} is no EdgeTPU of board {profile.name} (its TPUs: "
                              f"{', '.join(names) or 'none'}); name one of them")
    return edgecap_compile.corrected_board(profile, corrections)


def _rounded(corrections: Corrections) -> Dict[str, Correction]:
    """The corrections, each figure to three significant digits.

    Refits from noisy medians then mostly reuse a cached plan instead of compiling a new one.
    """
    return {name: Correction(float(f"{c.speed:.3g}"),
                             float(f"{c.link_bytes_per_s:.3g}") if c.link_bytes_per_s else None)
            for name, c in corrections.items()}


def _as_profiled(plan: Plan, fixes: Corrections, profile: Any, names: List[str]) -> Plan:
    """A plan split under corrections, its predictions priced again at the profile's coefficients.

    Each cost part is linear in its coefficient: the compute and invoke parts
    were priced at the device's speed, the extra CPU work at the CPU's, and
    the link bytes at the corrected rate; back at the profile's, the plan
    predicts what every plan predicts, the profile's figures (what is measured
    is compared with them, and an emulated board paces to them).
    """
    rates = dict(zip(names, (t.link_bytes_per_s for t in profile.tpus)))
    cpu = fixes.get(CPU, Correction()).speed
    stages = tuple(_stage_as_profiled(s, fixes.get(s.device, Correction()).speed, cpu, rates, fixes)
                   for s in plan.stages)
    frame = plan.cpu_frame and CpuFrame(plan.cpu_frame.preprocess_ms * cpu, plan.cpu_frame.handoff_ms * cpu)
    plan = dataclasses.replace(plan, stages=stages, rnn_ms=None if plan.rnn_ms is None else plan.rnn_ms * cpu,
                               cpu_frame=frame)
    return dataclasses.replace(plan, predicted=plan.predicted and price(plan).prediction())


def _stage_as_profiled(stage: Stage, speed: float, cpu: float, rates: Mapping[str, Optional[float]],
                       fixes: Corrections = AS_PROFILED) -> Stage:
    cost = stage.cost
    if cost is None:
        return stage
    cost = dataclasses.replace(cost, compute_ms=cost.compute_ms * speed, invoke_ms=cost.invoke_ms * speed,
                               extra_ms=cost.extra_ms * cpu,
                               link_bytes_per_s=rates.get(stage.device, cost.link_bytes_per_s))
    # A replicated stage's copies, each at its own device's speed.
    replicas = tuple(dataclasses.replace(r, cost=c.cost, predicted_ms=c.predicted_ms) for r, c in zip(
        stage.replicas, (_stage_as_profiled(c, fixes.get(c.device, Correction()).speed, cpu, rates)
                         for c in stage.copies[1:])))
    return dataclasses.replace(stage, cost=cost, predicted_ms=round(cost.total_ms, 6), replicas=replicas)
