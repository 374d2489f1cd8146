"""Plans on the fly for a named board profile: the runtime's one door to the compiler.

The runtime reads plans and never needs the compiler, except here: asked for a
board by name (``EdgeCaptioner(board="devboard-usb")``, ``edgecap bench``), it
imports ``edgecap_compile`` lazily and compiles the bundle's encoder into a
cache directory keyed by the models, the board profile and the tools (plan
version, edgecap's version, edgetpu_compiler's presence), so a second run
reuses the segments. Which plan runs is the planner's (``edgecap.planner``).
``oracle`` plans for a board as an emulated truth (``edgecap.emulation``)
really makes it: what a runtime that corrects its plan should reach.
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
from typing import Optional

from edgecap.bundle import Bundle, WindowSpec
from edgecap.emulation import ENV, Truth, resolve
from edgecap.errors import ConfigError
from edgecap.plan import PLAN_FILE, PLAN_VERSION, Plan, load_plan


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
) -> Plan:
    """Compiles the bundle's encoder for a board profile and loads the plan.

    Args:
      bundle: The bundle whose encoder (and RNN encoder step) to plan for.
      board: A board profile name of the compiler (e.g. ``devboard-usb``), or
        a loaded ``edgecap_compile`` ``Board`` (``true_board``'s).
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
            edgecap_compile.compile_model(bundle, chosen, staging, ranges=ranges)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        try:
            staging.rename(out)  # atomic: a concurrent planner's identical result may win
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
    return load_plan(out)


@dataclasses.dataclass(frozen=True)
class Oracle:
    """The partitioner's best plan under an emulated board's true costs.

    Attributes:
      plan: The plan (its ``predicted`` figures are the true costs').
      fps: Its predicted fps under the truth (*modelled*).
      board: The board profile with the truth applied (an ``edgecap_compile`` ``Board``).
    """

    plan: Plan
    fps: float
    board: object


def true_board(board: object, truth: Truth, plan: Optional[Plan] = None) -> object:
    """Applies a truth (``edgecap.emulation``) to a compiler board profile.

    A device's ``speed`` scales its compute coefficients (MAC and element
    rates up, per-op and per-invoke overheads down), as the emulated pacing
    divides its compute and invoke time; a throttling device counts at its
    throttled steady state; ``link`` sets the TPU's link rate to that kind's
    usable rate (the device keeps its profile's link name, so plans still
    name it ``pci:N`` / ``usb:N``).

    Args:
      board: An ``edgecap_compile`` ``Board``.
      truth: The truth.
      plan: The plan the emulated run starts with, to name ``emu-tpu:N``
        (``emulation.resolve``); None: the truth names no ``emu-tpu:N``.

    Returns:
      The board as it really is.

    Raises:
      ConfigError: If the truth names a TPU the board lacks.
    """
    # The profile's TPUs as plans name them (the compiler's plan module, loaded with the package).
    names = _compiler(board).plan.plan_devices(board)
    if plan is not None:
        truth = resolve(truth, plan)
    for device, part in truth.devices:
        if device == "cpu":
            board = dataclasses.replace(board, cpu=_at_speed(board.cpu, part.steady_speed))
            continue
        if device not in names:
            raise ConfigError(f"{ENV}: {device} is no EdgeTPU of board {board.name} (its TPUs: "
                              f"{', '.join(names) or 'none'}); name one of them")
        i = names.index(device)
        tpu = _at_speed(board.tpus[i], part.steady_speed)
        if part.link is not None:
            tpu = dataclasses.replace(tpu, link_bytes_per_s=part.link_bytes_per_s)
        board = board.with_device(tpu)
    return board


def _at_speed(device: object, speed: float) -> object:
    return dataclasses.replace(device, macs_per_s=device.macs_per_s * speed,
                               elements_per_s=device.elements_per_s * speed,
                               op_overhead_ms=device.op_overhead_ms / speed,
                               invoke_overhead_ms=device.invoke_overhead_ms / speed)


def oracle(bundle: Bundle, board: str, truth: Truth, plan: Optional[Plan] = None,
           window: Optional[WindowSpec] = None) -> Oracle:
    """The partitioner's best plan for ``board`` under ``truth`` (the compiler never sees it otherwise).

    Args:
      bundle: The bundle.
      board: A board profile name of the compiler.
      truth: The emulated board's truth.
      plan: The plan the emulated run starts with (maps ``emu-tpu:N``; see ``true_board``).
      window: As ``plan_for_board`` takes it.

    Returns:
      The ``Oracle``: the plan, compiled into the plan cache, and its fps.

    Raises:
      ConfigError: As ``plan_for_board``, or if the truth names a TPU the board lacks.
    """
    real = true_board(_compiler(board).make_board(board), truth, plan)
    best = plan_for_board(bundle, real, window=window)
    fps = best.predicted.fps if best.predicted is not None and best.predicted.fps else 0.0
    return Oracle(plan=best, fps=fps, board=real)
