"""Measures how long one invoke of a TFLite model takes on this machine."""

from __future__ import annotations

import os
import time
from typing import Any, Union

import numpy as np

from edgecap.interpreter import make_cpu_interpreter


def measure_invoke_ms(model: Union[str, os.PathLike, bytes], threads: int = 1,
                      repeats: int = 15, warmup: int = 2, seed: int = 0) -> float:
    """Returns the median wall time of ``repeats`` CPU invokes on random inputs.

    Args:
      model: A .tflite path or bytes.
      threads: Interpreter threads.
      repeats: Timed invokes; the median resists other processes' noise.
      warmup: Untimed invokes first (allocation, caches, XNNPACK packing).
      seed: Seed of the random inputs.

    Returns:
      Milliseconds per invoke.
    """
    return time_invokes(make_cpu_interpreter(model, num_threads=threads), repeats, warmup, seed)


def time_invokes(interp: Any, repeats: int = 15, warmup: int = 2, seed: int = 0) -> float:
    """Returns the median milliseconds of ``repeats`` invokes of an allocated interpreter.

    Args:
      interp: An allocated TFLite ``Interpreter`` (CPU or EdgeTPU delegate).
      repeats: Timed invokes.
      warmup: Untimed invokes first.
      seed: Seed of the random inputs.

    Returns:
      Milliseconds per invoke.
    """
    rng = np.random.default_rng(seed)
    for detail in interp.get_input_details():
        dtype = np.dtype(detail["dtype"])
        if dtype.kind == "f":
            value = rng.standard_normal(detail["shape"]).astype(dtype)
        else:
            info = np.iinfo(dtype)
            value = rng.integers(max(info.min, -128), min(info.max, 127) + 1,
                                 size=detail["shape"]).astype(dtype)
        interp.set_tensor(detail["index"], value)
    for _ in range(warmup):
        interp.invoke()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        interp.invoke()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))
