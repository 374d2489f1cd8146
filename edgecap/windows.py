"""How many open windows a sampled frame feeds: the RNN encoder steps it costs.

The runtime steps the RNN encoder once per frame for every window that frame
belongs to. Windows of ``frames`` sampled frames start every ``stride`` frames,
so in the steady state each window takes ``frames`` steps and one window
starts per ``stride`` frames: ``frames / stride`` steps per frame on average
(4 with 8-frame windows at stride 2; 0.5 at stride 8 with 4-frame windows, where
half the frames belong to no window). The compiler's cost model and the bench's
bound both charge the RNN step this many times per frame.

This module imports only ``edgecap.errors``, so the runtime and the compiler can both use it.
"""

from __future__ import annotations

from edgecap.errors import ConfigError


def windows_per_frame(frames: int, stride: int) -> float:
    """Returns the steady-state mean number of windows that contain a sampled frame.

    Args:
      frames: Sampled frames per window (>= 1).
      stride: Sampled frames between window starts (>= 1).

    Returns:
      ``frames / stride``: RNN encoder steps per sampled frame.

    Raises:
      ConfigError: If ``frames`` or ``stride`` is below 1.
    """
    if frames < 1 or stride < 1:
        raise ConfigError(f"window of {frames} frames, stride {stride}: frames and stride "
                          "must be >= 1")
    return frames / stride
