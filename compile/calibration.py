"""Calibration: fit a device's cost coefficients to measured segment times.

``edgecap calibrate`` cuts models into random contiguous segments, times each
on the device, and fits the cost model's one formula (``cost_model.work_features``
of a segment dotted with ``Device.coefficients()``)

    ms = macs * a + elements * b + ops * op_overhead + invoke_overhead (+ link_bytes * c on a TPU)

(plus, on a CPU whose profile gives a memory bandwidth, the bytes its ops move
at that fixed, sourced figure: timings of whole segments cannot tell memory
time from MAC time, so the bandwidth is not fitted), by least squares on relative error (a 0.1 ms segment counts as much as a
100 ms one), with every coefficient kept non-negative (an overhead the data
drive below zero is zero). The result is a JSON file that
``edgecap compile --calibration`` applies to that device.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import msgspec
import numpy as np

from edgecap import files, schema
from edgecap.devices import parse_device
from edgecap.stages import load_edgetpu_delegate
from edgecap.errors import EdgecapError
from edgecap.interpreter import make_delegate_interpreter
from edgecap_compile.boards import PRICES, Board, Device
from edgecap_compile.cost_model import CostModel, work_features
from edgecap_compile.edgetpu import compile_segment, find_compiler
from edgecap_compile.errors import CompileError
from edgecap_compile.graph import Graph
from edgecap_compile.segments import build_segment
from edgecap_compile.timing import measure_invoke_ms, time_invokes

CALIBRATION_VERSION = 1


@dataclass(frozen=True)
class Sample:
    """One timed segment.

    Attributes:
      model: Source model name.
      ops: Op range ``[start, end)``.
      macs: Its multiply-accumulates.
      elements: Its element work.
      op_count: Its number of ops.
      link_bytes: Streamed parameters plus boundary tensors (TPU; 0 on the CPU).
      measured_ms: Median measured invoke time.
      memory_bytes: Parameter and activation bytes its ops move.
    """

    model: str
    ops: Tuple[int, int]
    macs: int
    elements: int
    op_count: int
    link_bytes: int
    measured_ms: float
    memory_bytes: int = 0

    def terms(self) -> np.ndarray:
        """Returns the segment's work features, the cost model's ``work_features``."""
        return work_features(self.macs, self.elements, self.op_count, self.link_bytes,
                             self.memory_bytes)


@dataclass
class Calibration:
    """A device's fitted coefficients and how well they fit.

    Attributes:
      board: Board profile name the device belongs to.
      device: The device with its fitted coefficients.
      threads: CPU threads the segments ran with.
      error: Fit error over all samples and on a held-out half.
      samples: The timed segments.
    """

    board: str
    device: Device
    threads: int
    error: dict
    samples: List[Sample]


# The Device field each coefficient sets, and which of them are rates.
_NAMES = tuple(field for _, field in PRICES)
_RATES = tuple(i for i, name in enumerate(_NAMES) if name.endswith("_per_s"))
_LINK = _NAMES.index("link_bytes_per_s")
_MEMORY = _NAMES.index("memory_bytes_per_s")


def nonnegative_fit(x: np.ndarray, y: np.ndarray, columns: List[int],
                    prior: np.ndarray,
                    relative_to: Optional[np.ndarray] = None) -> Tuple[np.ndarray, List[str]]:
    """Fits ``y ~ x @ c`` on relative error over some columns, every coefficient >= 0.

    Args:
      x: Work features, one row per sample (``cost_model.work_features``).
      y: Measured milliseconds.
      columns: The columns fitted; the others get 0.
      prior: The profile's coefficients, kept for a rate the data cannot determine.
      relative_to: The milliseconds the error is relative to (default ``y``):
        where ``y`` is what is left of a measurement after fixed terms, the
        whole measurement, so that fixing a term does not reweight the rows.

    Returns:
      ``(c, kept)``: the coefficients and the names of the rates kept from ``prior``.
    """
    # Active-set non-negative least squares on relative error. A column the data
    # drive to or below zero is fixed and the rest refitted: an overhead at zero,
    # a rate at the profile's value, since a zero cost per MAC or per element is
    # not a device, only a sign that noisy timings cannot separate that term.
    weight = 1.0 / (y if relative_to is None else relative_to)
    c = np.zeros(x.shape[1])
    free = list(columns)
    kept = []
    while free:
        fixed = [j for j in columns if j not in free]
        target = y - x[:, fixed] @ c[fixed]
        solution, *_ = np.linalg.lstsq(x[:, free] * weight[:, None], target * weight,
                                       rcond=None)
        bad = [i for i, j in enumerate(free)
               if solution[i] < 0 or (j in _RATES and solution[i] == 0)]
        if not bad:
            c[free] = solution
            break
        worst = min(bad, key=lambda i: solution[i])
        j = free[worst]
        if j in _RATES:
            c[j] = prior[j]
            kept.append(_NAMES[j])
        free.pop(worst)
    return c, kept


def _errors(x: np.ndarray, y: np.ndarray, c: np.ndarray) -> dict:
    predicted = x @ c
    relative = np.abs(predicted - y) / y
    return {"rms_ms": float(np.sqrt(np.mean((predicted - y) ** 2))),
            "mean_abs_rel": float(relative.mean()), "max_abs_rel": float(relative.max())}


def fit(samples: Sequence[Sample], prior: Device) -> Tuple[Device, dict]:
    """Fits a device's coefficients to timed samples.

    Args:
      samples: Timed segments (at least as many as fitted coefficients).
      prior: The device as the board profile describes it.

    Returns:
      ``(device, error)``: the fitted device, and the fit's error over all
      samples (``all``) and when fitted on the even samples and scored on the
      odd ones (``holdout``). ``kept_from_profile`` names the rates the
      timings could not determine, which keep the profile's value.

    Raises:
      CompileError: If there are too few samples.
    """
    # The CPU has no link: its link coefficient stays 0. The memory bandwidth
    # stays the profile's figure (0 where it has none), its time taken out first.
    columns = [i for i in range(len(_NAMES))
               if i != _MEMORY and (prior.is_tpu or i != _LINK)]
    if len(samples) < 2 * len(columns):
        raise CompileError(f"calibration needs at least {2 * len(columns)} segments "
                           f"(got {len(samples)}); raise --segments")
    x = np.array([s.terms() for s in samples], dtype=np.float64)
    y = np.array([s.measured_ms for s in samples])
    prior_c = prior.coefficients()
    rest = y - x[:, _MEMORY] * prior_c[_MEMORY]
    c, kept = nonnegative_fit(x, rest, columns, prior_c, relative_to=y)
    half, _ = nonnegative_fit(x[::2], rest[::2], columns, prior_c, relative_to=y[::2])
    c[_MEMORY] = half[_MEMORY] = prior_c[_MEMORY]
    error = {"all": _errors(x, y, c), "holdout": _errors(x[1::2], y[1::2], half),
             "samples": len(samples), "kept_from_profile": kept}
    return prior.with_coefficients(c), error


def random_ranges(n_ops: int, count: int, rng: np.random.Generator) -> List[Tuple[int, int]]:
    """Returns ``count`` distinct random op ranges of a graph with ``n_ops`` ops."""
    pairs = {(0, n_ops)}
    limit = n_ops * (n_ops + 1) // 2
    while len(pairs) < min(count, limit):
        a, b = sorted(rng.choice(n_ops + 1, size=2, replace=False))
        pairs.add((int(a), int(b)))
    return sorted(pairs)


def _tpu_timer(device: Device, repeats: int) -> Callable[[bytes], float]:
    # Real EdgeTPU: compile each segment, then time it through libedgetpu.
    compiler = find_compiler()
    if compiler is None:
        raise CompileError("calibrating a TPU needs edgetpu_compiler on PATH; install it, "
                           "or calibrate --device cpu")
    try:
        delegate = load_edgetpu_delegate(parse_device(device.name))
    except EdgecapError as e:
        raise CompileError(f"cannot calibrate {device.name}: {e}") from None

    def timer(segment: bytes) -> float:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "segment.tflite"
            path.write_bytes(segment)
            report = compile_segment(compiler, path)
            if not report.compiled:
                raise CompileError(f"edgetpu_compiler failed on a calibration segment: "
                                   f"{report.reason}")
            try:
                interp = make_delegate_interpreter(path.parent / report.compiled_segment,
                                                   [delegate])
            except (ValueError, RuntimeError) as e:
                raise CompileError(f"{device.name} cannot run a calibration segment ({e}); "
                                   "check the Edge TPU runtime and edgetpu_compiler "
                                   "versions match") from None
            return time_invokes(interp, repeats=repeats)

    return timer


def calibrate(graphs: Sequence[Graph], board: Board, device: str = "cpu",
              threads: Optional[int] = None, segments: int = 24, repeats: int = 15,
              seed: int = 0, progress: Optional[Callable[[int], object]] = None) -> Calibration:
    """Times random segments of ``graphs`` on a device and fits its coefficients.

    Args:
      graphs: Int8 models to cut into segments.
      board: The board profile whose device is calibrated.
      device: ``cpu`` (this machine's CPU) or ``tpu:N`` (needs the EdgeTPU and edgetpu_compiler).
      threads: CPU threads; defaults to the profile's core count.
      segments: Random segments per model.
      repeats: Timed invokes per segment.
      seed: Seed of the segment choice.
      progress: Called with 1 after each segment is timed.

    Returns:
      The ``Calibration``.

    Raises:
      CompileError: If the device is not on the board or cannot be timed, or a
        count is below 1.
    """
    for flag, value in (("--threads", threads), ("--segments", segments),
                        ("--repeats", repeats)):
        if value is not None and value < 1:
            raise CompileError(f"{flag} must be >= 1, got {value}")
    devices = {d.name: d for d in [board.cpu, *board.tpus]}
    if device not in devices:
        raise CompileError(f"board {board.name} has no device '{device}'; "
                           f"choose one of {', '.join(devices)}")
    prior = devices[device]
    threads = threads or prior.cores or 1
    timer = (_tpu_timer(prior, repeats) if prior.is_tpu
             else lambda seg: measure_invoke_ms(seg, threads=threads, repeats=repeats))
    rng = np.random.default_rng(seed)
    samples = []
    for graph in graphs:
        model = CostModel(graph, [prior])
        for start, end in random_ranges(len(graph.ops), segments, rng):
            cost = model.stage(0, start, end)
            samples.append(Sample(
                model=graph.name, ops=(start, end), macs=cost.macs, elements=cost.elements,
                op_count=end - start, link_bytes=cost.streamed_bytes + cost.io_bytes,
                measured_ms=timer(build_segment(graph, start, end)),
                memory_bytes=cost.memory_bytes))
            if progress is not None:
                progress(1)
    fitted, error = fit(samples, prior)
    return Calibration(board.name, fitted, threads, error, samples)


def save_calibration(calibration: Calibration, path: Union[str, os.PathLike]) -> None:
    """Writes a calibration file that ``edgecap compile --calibration`` reads."""
    d = calibration.device
    c = d.coefficients()
    doc = _CalibrationFile(
        calibration_version=CALIBRATION_VERSION,
        board=calibration.board,
        device=d.name,
        coefficients=_Coefficients(**{name: getattr(d, name) for name in _NAMES}),
        threads=calibration.threads,
        error=calibration.error,
        samples=[dict(asdict(s), predicted_ms=float(s.terms() @ c)) for s in calibration.samples],
    )
    Path(path).write_bytes(schema.encode(doc))


class _Coefficients(msgspec.Struct, forbid_unknown_fields=True):
    # A coefficient left out (or null: the CPU's link) keeps the profile's value.
    macs_per_s: Optional[schema.Rate] = None
    elements_per_s: Optional[schema.Rate] = None
    op_overhead_ms: Optional[schema.Millis] = None
    invoke_overhead_ms: Optional[schema.Millis] = None
    link_bytes_per_s: Optional[schema.Rate] = None
    memory_bytes_per_s: Optional[schema.Rate] = None


class _CalibrationFile(msgspec.Struct, forbid_unknown_fields=True):
    calibration_version: int
    board: schema.Name
    device: schema.Name
    coefficients: _Coefficients
    # What the fit saw, for people; the compiler does not read them.
    threads: Optional[schema.Positive] = None
    error: Optional[Dict[str, Any]] = None
    samples: Optional[List[Dict[str, Any]]] = None


def apply_calibration(board: Board, path: Union[str, os.PathLike]) -> Board:
    """Returns ``board`` with the calibrated device's coefficients from a calibration file.

    Raises:
      CompileError: If the file is unreadable or malformed (a missing, unknown or
        mistyped field, a rate that is not positive and finite), of another
        version, or for another board or device: one line naming the file and field.
    """
    fix = "write it with `edgecap calibrate`"
    try:
        data = files.read_regular(path, "json")[0]
    except OSError as e:
        raise CompileError(f"cannot read calibration {path}: {e.strerror or e}; {fix}") from None
    doc = schema.decode(data, _CalibrationFile, where=str(path), fix=fix, error=CompileError)
    if doc.calibration_version != CALIBRATION_VERSION:
        raise CompileError(f"calibration {path} has version {doc.calibration_version}; "
                           f"this compiler reads {CALIBRATION_VERSION}")
    if doc.board != board.name:
        raise CompileError(f"calibration {path} is for board {doc.board}, not {board.name}")
    devices = {d.name: d for d in [board.cpu, *board.tpus]}
    if doc.device not in devices:
        raise CompileError(f"calibration {path} is for device {doc.device}, which board "
                           f"{board.name} lacks")
    fields = {name: getattr(doc.coefficients, name) for name in _NAMES
              if getattr(doc.coefficients, name) is not None}
    if doc.device == "cpu":
        fields.pop("link_bytes_per_s", None)  # the CPU has no link
    else:
        fields.pop("memory_bytes_per_s", None)  # a TPU's ops do not use host memory
    return board.with_device(dataclasses.replace(devices[doc.device], **fields))
