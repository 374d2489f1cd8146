"""The partitioner: cut an op chain into pipeline stages with the smallest bottleneck.

Stage k takes a contiguous op range on a fixed device; ``costs[k][a, b]`` is its
time for ops ``[a, b)`` (inf where a > b). The exact optimum is found in two
dynamic programs: the first finds the smallest bottleneck B*, the second the
smallest end-to-end latency among the partitions whose every stage fits in B*.
(One lexicographic program would not be exact: a prefix with a worse
bottleneck but a better latency can win once a later stage dominates.)
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence, Tuple

import numpy as np

# Stage times within this relative distance of the bottleneck count as equal to it.
_TOLERANCE = 1e-9


@dataclass(frozen=True)
class Partition:
    """Cut points and the resulting stage times.

    Attributes:
      cuts: ``K + 1`` op boundaries, ``0 = cuts[0] <= ... <= cuts[K] = n``; stage k
        runs ops ``[cuts[k], cuts[k+1])``.
      stage_ms: Predicted time of each stage.
    """

    cuts: Tuple[int, ...]
    stage_ms: Tuple[float, ...]

    @property
    def bottleneck_ms(self) -> float:
        return max(self.stage_ms)

    @property
    def bottleneck_stage(self) -> int:
        return int(np.argmax(self.stage_ms))

    @property
    def latency_ms(self) -> float:
        return float(sum(self.stage_ms))

    @property
    def ranges(self) -> Tuple[Tuple[int, int], ...]:
        return tuple(zip(self.cuts[:-1], self.cuts[1:]))


def evaluate(costs: Sequence[np.ndarray], cuts: Sequence[int]) -> Partition:
    """Returns the partition with the given cut points under ``costs``."""
    cuts = tuple(int(c) for c in cuts)
    return Partition(cuts, tuple(float(c[a, b]) for c, (a, b) in zip(costs, zip(cuts, cuts[1:]))))


def _backtrack(choice: Sequence[np.ndarray], n: int) -> Tuple[int, ...]:
    cuts = [n]
    for k in range(len(choice) - 1, -1, -1):
        cuts.append(int(choice[k][cuts[-1]]))
    return tuple(reversed(cuts))


def partition(costs: Sequence[np.ndarray]) -> Partition:
    """Finds the partition with the smallest bottleneck, ties broken by the smallest latency.

    Args:
      costs: One ``(n+1, n+1)`` matrix per stage, in pipeline order.

    Returns:
      The optimal ``Partition``; among exact ties, later stages get fewer ops.
    """
    n = costs[0].shape[0] - 1
    # Pass 1: best[b] = smallest bottleneck of stages 0..k covering ops [0, b).
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    for c in costs:
        best = np.min(np.maximum(best[:, None], c), axis=0)
    limit = best[n] * (1 + _TOLERANCE)
    # Pass 2: smallest latency with every stage within the bottleneck.
    latency = np.full(n + 1, np.inf)
    latency[0] = 0.0
    choice = []
    for c in costs:
        total = latency[:, None] + np.where(c <= limit, c, np.inf)
        # The last start among exact ties: later stages take as few ops as they
        # can, so the TPUs a model does not need are the last ones.
        choice.append(n - np.argmin(total[::-1], axis=0))
        latency = np.min(total, axis=0)
    return evaluate(costs, _backtrack(choice, n))


def exhaustive(costs: Sequence[np.ndarray]) -> Partition:
    """Finds the optimum by trying every set of cut points (for checking ``partition``).

    Args:
      costs: As for ``partition``.

    Returns:
      The partition with the smallest (bottleneck, latency).
    """
    n = costs[0].shape[0] - 1
    best = None
    best_key = (np.inf, np.inf)
    for inner in itertools.combinations_with_replacement(range(n + 1), len(costs) - 1):
        cuts = (0, *inner, n)
        stage = [c[a, b] for c, a, b in zip(costs, cuts, cuts[1:])]
        key = (max(stage), sum(stage))
        if key[0] < best_key[0] * (1 - _TOLERANCE) or (
                key[0] <= best_key[0] * (1 + _TOLERANCE) and key[1] < best_key[1]):
            best, best_key = cuts, key
    return evaluate(costs, best)


def equal_param_split(costs: Sequence[np.ndarray], param_prefix: np.ndarray,
                      n_tpus: int) -> Partition:
    """The split ``edgetpu_compiler --num_segments N`` makes: N TPU segments of about equal
    parameter bytes covering the whole model, the CPU stage left with no ops.

    Args:
      costs: ``n_tpus`` TPU matrices then the CPU matrix.
      param_prefix: Parameter bytes of ops ``[0, i)`` for i = 0..n.
      n_tpus: Number of TPU segments.

    Returns:
      The partition, evaluated under ``costs``.
    """
    n = len(param_prefix) - 1
    if n_tpus == 0:
        return evaluate(costs, (0, n))
    total = param_prefix[-1]
    cuts = [0]
    for k in range(1, n_tpus):
        target = total * k / n_tpus
        cut = int(np.argmin(np.abs(param_prefix[cuts[-1]:] - target))) + cuts[-1]
        cuts.append(cut)
    return evaluate(costs, (*cuts, n, n))
