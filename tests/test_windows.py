"""RNN steps per sampled frame: the mean count of windows that contain a frame."""

from __future__ import annotations

import pytest

from edgecap.errors import ConfigError
from edgecap.windows import windows_per_frame


def _count_by_hand(frames: int, stride: int, k: int) -> int:
    # Window n spans samples [n * stride, n * stride + frames).
    return sum(1 for n in range(k // stride + 1) if n * stride <= k < n * stride + frames)


@pytest.mark.parametrize("frames, stride", [(8, 2), (8, 8), (8, 4), (8, 3), (4, 8), (5, 1)])
def test_is_the_steady_state_mean_of_the_windows_holding_a_frame(frames, stride):
    # Past the first window, membership repeats every `stride` samples.
    start = frames + stride
    counts = [_count_by_hand(frames, stride, k) for k in range(start, start + stride * 7)]
    assert windows_per_frame(frames, stride) == pytest.approx(sum(counts) / len(counts))


def test_the_issue_figure_8_frames_stride_2_is_4_steps():
    assert windows_per_frame(8, 2) == 4.0
    assert windows_per_frame(8, 8) == 1.0


@pytest.mark.parametrize("frames, stride", [(0, 2), (8, 0), (-1, 1)])
def test_a_window_below_one_frame_or_stride_is_a_config_error(frames, stride):
    with pytest.raises(ConfigError, match="frames and stride must be >= 1"):
        windows_per_frame(frames, stride)
