"""How close an EdgeTPU's results must be to the CPU's: quantization steps and captions, not bits.

The EdgeTPU does not reproduce the CPU's int8 arithmetic bit for bit
(google-coral/edgetpu#503: MobileNet v1 scores off by 2-5 steps of 1/256 on
the same image; #382: a single quantized Conv2D off by several steps), so the
hardware test compares outputs in quantization steps and captions by
agreement. The bounds are this project's judgment from those reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

# Most values within one step; none further than a whole MobileNet's worst in #503, doubled.
MIN_WITHIN_ONE = 0.9
MAX_STEPS = 10
# Share of caption windows that must read the same on the TPU as on the CPU.
MIN_CAPTION_AGREEMENT = 0.8


@dataclass(frozen=True)
class StepDiff:
    """How far two quantized tensors are apart, in quantization steps.

    Attributes:
      values: Elements compared.
      max_steps: The largest difference.
      within_one: Share of elements that differ by at most one step.
    """

    values: int
    max_steps: int
    within_one: float


def step_diff(a: np.ndarray, b: np.ndarray) -> StepDiff:
    """Compares two integer (quantized) tensors of one shape and dtype.

    Args:
      a: E.g. the EdgeTPU's output.
      b: The CPU's output of the same input.

    Returns:
      The ``StepDiff``.

    Raises:
      ValueError: If shapes or dtypes differ, or the tensors are not integers.
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype or a.dtype.kind not in "iu":
        raise ValueError(f"compare quantized tensors of one shape and dtype, got "
                         f"{a.dtype}{list(a.shape)} and {b.dtype}{list(b.shape)}")
    steps = np.abs(a.astype(np.int64) - b.astype(np.int64))
    if steps.size == 0:
        return StepDiff(0, 0, 1.0)
    return StepDiff(int(steps.size), int(steps.max()), float(np.mean(steps <= 1)))


def assert_close_in_steps(a: np.ndarray, b: np.ndarray, min_within_one: float = MIN_WITHIN_ONE,
                          max_steps: int = MAX_STEPS) -> StepDiff:
    """Asserts that two quantized tensors agree to within the EdgeTPU's rounding.

    Returns:
      The ``StepDiff``, for reporting.

    Raises:
      AssertionError: If fewer than ``min_within_one`` of the values are within
        one step, or any is more than ``max_steps`` apart.
    """
    d = step_diff(a, b)
    assert d.within_one >= min_within_one and d.max_steps <= max_steps, (
        f"{d.within_one:.1%} of {d.values} values within 1 step (need {min_within_one:.0%}), "
        f"max {d.max_steps} steps (allowed {max_steps})")
    return d


def caption_agreement(a: Sequence[str], b: Sequence[str]) -> float:
    """Returns the share of windows whose captions are the same text.

    Raises:
      ValueError: If the two runs captioned a different number of windows.
    """
    if len(a) != len(b):
        raise ValueError(f"{len(a)} captions against {len(b)}: the runs saw different windows")
    if not a:
        return 1.0
    return sum(x == y for x, y in zip(a, b)) / len(a)
