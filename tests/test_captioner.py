"""EdgeCaptioner on the CPU: windowing, overrides, records, lifecycle."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import SAMPLE_CLIP, Story
from edgecap.bundle import WindowSpec
from edgecap.captioner import Caption, EdgeCaptioner, _windows_of
from edgecap.errors import ConfigError, EdgecapError
from edgecap.sources import ArraySource
from edgecap.trace import Tracer


@pytest.mark.parametrize("frames,stride,k,expected", [
    (8, 8, 0, [0]), (8, 8, 7, [0]), (8, 8, 8, [1]),
    (8, 4, 5, [0, 1]), (8, 4, 8, [1, 2]), (8, 4, 3, [0]),
    (4, 8, 5, []), (4, 8, 9, [1]),
])
def test_window_membership(frames: int, stride: int, k: int, expected: list) -> None:
    assert list(_windows_of(k, WindowSpec(frames, stride, 8.0))) == expected


def _clip(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, (n, 80, 96, 3), dtype=np.uint8)


def test_one_caption_per_complete_window(captioner: EdgeCaptioner) -> None:
    n = captioner.window.frames
    caps = captioner.caption_frames(_clip(2 * n + n // 2))
    assert [c.window for c in caps] == [0, 1]  # the trailing half window is not captioned
    assert (caps[1].start_frame, caps[1].end_frame) == (n, 2 * n - 1)
    assert all(isinstance(c, Caption) and c.text == captioner.bundle.detokenize(c.tokens)
               for c in caps)
    assert set(caps[0].stage_ms) == {"preprocess", "cnn", "rnn_step", "decode"}
    assert all(v >= 0 for v in caps[0].stage_ms.values())


def test_stream_equals_caption_frames(captioner: EdgeCaptioner, story: Story) -> None:
    frames = story.frames
    streamed = [c.text for c in captioner.stream(frames, fps=0)]
    assert streamed == [c.text for c in captioner.caption_frames(frames)]
    # caption_frames is stream underneath: what makes the check independent is
    # the clips' ground truth, and the sample file read and sampled by the source.
    assert streamed == story.truths
    from_file = [c.text for c in captioner.stream(str(SAMPLE_CLIP))]
    assert from_file == story.truths[:3]


def test_source_rate_is_sampled(captioner: EdgeCaptioner) -> None:
    w = captioner.window
    frames = _clip(2 * w.frames, seed=1)
    twice = np.repeat(frames, 2, axis=0)  # the same clip at double the sampling rate
    slow = captioner.stream(frames, fps=w.sample_fps)
    fast = captioner.stream(twice, fps=2 * w.sample_fps)
    assert [c.tokens for c in slow] == [c.tokens for c in fast]


def test_overlapping_windows(shipped_bundle: Path) -> None:
    with EdgeCaptioner(shipped_bundle, frames=4, stride=2) as cap:
        caps = cap.caption_frames(_clip(10))
    assert [(c.start_frame, c.end_frame) for c in caps] == [(0, 3), (2, 5), (4, 7), (6, 9)]


def test_window_state_is_independent(shipped_bundle: Path, story: Story) -> None:
    # Real clips with different ground truth: window 1 straddles clips 0 and 1
    # and opens while window 0 is open; windows 0 and 2 are clips 0 and 1.
    n = story.per_window
    frames = story.frames[: 3 * n]
    with EdgeCaptioner(shipped_bundle, frames=n, stride=n // 2) as cap:
        overlapped = cap.caption_frames(frames)
    with EdgeCaptioner(shipped_bundle, frames=n, stride=n) as cap:
        alone = cap.caption_frames(frames[n // 2: n // 2 + n])
    assert overlapped[1].tokens == alone[0].tokens
    assert [c.text for c in overlapped[::2]] == story.truths[:3]


@pytest.mark.parametrize("options,message", [
    (dict(frames=0), "frames and stride"),
    (dict(sample_fps=float("nan")), "sample fps a finite number"),
    (dict(sample_fps=float("inf")), "sample fps a finite number"),
    (dict(sample_fps=-1.0), "sample fps a finite number"),
    (dict(num_threads=-3), "-3 threads: use 1 to 256"),
    (dict(num_threads=0), "0 threads: use 1 to 256"),
    (dict(num_threads=32768), "32768 threads: use 1 to 256"),  # TFLite crashed
    (dict(queue_size=0), "queue_size 0: each queue must hold"),
    (dict(batch=0), "batch 0: hand over at least 1 frame"),
])
def test_bad_override(shipped_bundle: Path, options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        EdgeCaptioner(shipped_bundle, **options)


class _TrackedSource(ArraySource):
    closed = False

    def close(self) -> None:
        self.closed = True


def test_early_stop_closes_source(captioner: EdgeCaptioner) -> None:
    src = _TrackedSource(_clip(4 * captioner.window.frames), fps=captioner.window.sample_fps)
    it = captioner.stream(src)
    assert next(it).window == 0 and not src.closed
    it.close()
    assert src.closed


def test_stream_after_close_is_one_line_and_opens_nothing(shipped_bundle: Path, monkeypatch) -> None:
    cap = EdgeCaptioner(shipped_bundle, num_threads=1)
    cap.close()
    opened = []
    monkeypatch.setattr("edgecap.captioner.open_source", lambda *a, **k: opened.append(a))
    with pytest.raises(EdgecapError, match="EdgeCaptioner is closed; create a new one"):
        next(cap.stream(_clip(4)))
    assert opened == []


@pytest.mark.parametrize("where", ["missing/trace.json", "."])
def test_trace_path_that_cannot_be_written_is_refused_up_front(shipped_bundle: Path, tmp_path: Path,
                                                              where: str) -> None:
    with pytest.raises(ConfigError, match="not a file in an existing directory"):
        EdgeCaptioner(shipped_bundle, num_threads=1, trace=tmp_path / where)


def test_trace_write_failure_is_a_config_error(tmp_path: Path) -> None:
    tracer = Tracer()
    tracer.add_tracks(["cpu"])
    with pytest.raises(ConfigError, match=f"trace {tmp_path}: cannot write it") as err:
        tracer.write(tmp_path)  # a directory
    assert "\n" not in str(err.value)
