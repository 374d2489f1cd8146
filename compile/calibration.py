"""Calibration: fit a device's cost coefficients to measured segment times.

``edgecap calibrate`` cuts models into random contiguous segments, times each
on the device, and fits the cost model's linear form

    ms = macs * a + elements * b + ops * op_overhead + invoke_overhead (+ link_bytes * c on a TPU)

by least squares on relative error (a 0.1 ms segment counts as much as a
100 ms one), with every coefficient kept non-negative (an overhead the data
drive below zero is zero). The result is a JSON file that
``edgecap compile --calibration`` applies to that device.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple, Union

import numpy as np

from edgecap.devices import load_edgetpu_delegate, parse_device
from edgecap.errors import EdgecapError
from edgecap.interpreter import make_delegate_interpreter
from edgecap_compile.boards import Board, Device
from edgecap_compile.cost_model import CostModel
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
    """

    model: str
    ops: Tuple[int, int]
    macs: int
    elements: int
    op_count: int
    link_bytes: int
    measured_ms: float

    def terms(self) -> List[float]:
        return [self.macs, self.elements, self.op_count, 1.0, self.link_bytes]


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


def _coefficients(device: Device) -> np.ndarray:
    link = 1e3 / device.link_bytes_per_s if device.is_tpu else 0.0
    return np.array([1e3 / device.macs_per_s, 1e3 / device.elements_per_s,
                     device.op_overhead_ms, device.invoke_overhead_ms, link])


_NAMES = ("macs_per_s", "elements_per_s", "op_overhead_ms", "invoke_overhead_ms",
          "link_bytes_per_s")
_RATES = (0, 1, 4)


def _nonnegative_fit(x: np.ndarray, y: np.ndarray, columns: List[int],
                     prior: np.ndarray) -> Tuple[np.ndarray, List[str]]:
    # Active-set non-negative least squares on relative error. A column the data
    # drive to or below zero is fixed and the rest refitted: an overhead at zero,
    # a rate at the profile's value, since a zero cost per MAC or per element is
    # not a device, only a sign that noisy timings cannot separate that term.
    weight = 1.0 / y
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


def _device(prior: Device, c: np.ndarray) -> Device:
    return dataclasses.replace(
        prior,
        macs_per_s=1e3 / c[0],
        elements_per_s=1e3 / c[1],
        op_overhead_ms=float(c[2]),
        invoke_overhead_ms=float(c[3]),
        link_bytes_per_s=1e3 / c[4] if prior.is_tpu else None,
    )


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
    columns = [0, 1, 2, 3, 4] if prior.is_tpu else [0, 1, 2, 3]
    if len(samples) < 2 * len(columns):
        raise CompileError(f"calibration needs at least {2 * len(columns)} segments "
                           f"(got {len(samples)}); raise --segments")
    x = np.array([s.terms() for s in samples], dtype=np.float64)
    y = np.array([s.measured_ms for s in samples])
    c, kept = _nonnegative_fit(x, y, columns, _coefficients(prior))
    half, _ = _nonnegative_fit(x[::2], y[::2], columns, _coefficients(prior))
    error = {"all": _errors(x, y, c), "holdout": _errors(x[1::2], y[1::2], half),
             "samples": len(samples), "kept_from_profile": kept}
    return _device(prior, c), error


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
                model=graph.name, ops=(start, end), macs=cost.macs,
                elements=sum(op.elements for op in graph.ops[start:end]),
                op_count=end - start, link_bytes=cost.streamed_bytes + cost.io_bytes,
                measured_ms=timer(build_segment(graph, start, end))))
            if progress is not None:
                progress(1)
    fitted, error = fit(samples, prior)
    return Calibration(board.name, fitted, threads, error, samples)


def save_calibration(calibration: Calibration, path: Union[str, os.PathLike]) -> None:
    """Writes a calibration file that ``edgecap compile --calibration`` reads."""
    d = calibration.device
    c = _coefficients(d)
    data = {
        "calibration_version": CALIBRATION_VERSION,
        "board": calibration.board,
        "device": d.name,
        "threads": calibration.threads,
        "coefficients": {"macs_per_s": d.macs_per_s, "elements_per_s": d.elements_per_s,
                         "op_overhead_ms": d.op_overhead_ms,
                         "invoke_overhead_ms": d.invoke_overhead_ms,
                         "link_bytes_per_s": d.link_bytes_per_s},
        "error": calibration.error,
        "samples": [dict(asdict(s), predicted_ms=float(np.dot(s.terms(), c)))
                    for s in calibration.samples],
    }
    Path(path).write_text(json.dumps(data, indent=2) + "\n")


def apply_calibration(board: Board, path: Union[str, os.PathLike]) -> Board:
    """Returns ``board`` with the calibrated device's coefficients from a calibration file.

    Raises:
      CompileError: If the file is unreadable, malformed, or for another board or device.
    """
    try:
        data = json.loads(Path(path).read_text())
        version = data["calibration_version"]
        name = data["device"]
        coefficients = data["coefficients"]
        board_name = data["board"]
    except OSError as e:
        raise CompileError(f"cannot read calibration {path}: {e.strerror or e}") from None
    except (ValueError, KeyError, TypeError) as e:
        raise CompileError(f"calibration {path} is malformed ({e}); "
                           "write it with `edgecap calibrate`") from None
    if version != CALIBRATION_VERSION:
        raise CompileError(f"calibration {path} has version {version}; "
                           f"this compiler reads {CALIBRATION_VERSION}")
    if board_name != board.name:
        raise CompileError(f"calibration {path} is for board {board_name}, not {board.name}")
    devices = {d.name: d for d in [board.cpu, *board.tpus]}
    if name not in devices:
        raise CompileError(f"calibration {path} is for device {name}, which board "
                           f"{board.name} lacks")
    try:
        fields = {k: float(v) for k, v in coefficients.items() if k in _NAMES and v is not None}
    except (TypeError, ValueError) as e:
        raise CompileError(f"calibration {path} has a non-numeric coefficient: {e}") from None
    if name == "cpu":
        fields.pop("link_bytes_per_s", None)
    return board.with_device(dataclasses.replace(devices[name], **fields))
