"""Tests of the synthetic shapes dataset (models/dataset.py): no TensorFlow needed."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from edgecap.dataset import read_dataset
from edgecap.errors import ConfigError
from models import dataset as ds


def _spec(seed: int, **overrides) -> ds.ClipSpec:
    return dataclasses.replace(ds.random_spec(np.random.default_rng(seed)), **overrides)


def test_same_seed_renders_same_clip_and_other_seeds_differ():
    a, cap_a = ds.render_clip(_spec(7), 7)
    b, cap_b = ds.render_clip(_spec(7), 7)
    c, _ = ds.render_clip(_spec(8), 8)
    assert cap_a == cap_b
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    assert a.shape == (ds.FRAMES, ds.SIZE, ds.SIZE, 3) and a.dtype == np.uint8


def test_captions_follow_the_template_and_circles_never_rotate():
    rng = np.random.default_rng(0)
    specs = [ds.random_spec(rng) for _ in range(600)]
    for spec in specs:
        assert spec.caption == f"a {spec.color} {spec.shape} {spec.motion}"
        assert spec.shape in ds.SHAPES and spec.color in ds.COLORS and spec.motion in ds.MOTIONS
        assert not (spec.shape == "circle" and spec.motion in ds.ROTATIONS)
    # Every shape, colour and motion occurs, so the vocabulary is complete.
    assert {s.shape for s in specs} == set(ds.SHAPES)
    assert {s.color for s in specs} == set(ds.COLORS)
    assert {s.motion for s in specs} == set(ds.MOTIONS)


@pytest.mark.parametrize("shape", ["square", "triangle", "star"])
def test_first_frame_is_the_same_whatever_the_motion(shape):
    clips = {m: ds.render_clip(_spec(3, shape=shape, motion=m), 3)[0] for m in ds.MOTIONS}
    first = clips[ds.MOTIONS[0]][0]
    for motion, frames in clips.items():
        assert np.array_equal(frames[0], first), motion
        # ... while the motion does show later in the clip.
        assert np.abs(frames[-1].astype(int) - frames[0].astype(int)).mean() > 0.5, motion


def test_start_state_is_drawn_independently_of_the_motion():
    rng = np.random.default_rng(1)
    by_motion = {m: [] for m in ds.MOTIONS}
    for _ in range(4000):
        spec = ds.random_spec(rng)
        by_motion[spec.motion].append((spec.x0, spec.y0, spec.radius0))
    means = np.array([np.mean(v, axis=0) for v in by_motion.values()])
    # Standard error of each mean is about 0.004 for x0/y0; a motion-dependent
    # start (e.g. "moves left" starting on the right) shifts it by far more.
    assert np.ptp(means, axis=0).max() < 0.03


@pytest.mark.parametrize("shape", ["square", "triangle", "star"])
def test_rotation_direction_is_visible_between_two_sampled_frames(shape):
    # At the bundle's 8 fps every other frame is seen; if a step turned by half the
    # outline's symmetry period, clockwise and counterclockwise would look alike.
    for rate in (0.0, 1.0):
        cw = ds.render_clip(_spec(5, shape=shape, motion="rotates clockwise", rate=rate), 5)[0]
        ccw = ds.render_clip(_spec(5, shape=shape, motion="rotates counterclockwise", rate=rate), 5)[0]
        diff = np.abs(cw[2].astype(int) - ccw[2].astype(int))
        assert (diff.max(axis=-1) > 60).sum() > 20, (shape, rate)


def test_write_then_read_round_trips(tmp_path):
    written = ds.write_dataset(tmp_path, 6, seed=4, size=64)
    meta = json.loads((tmp_path / "captions.json").read_text())
    assert set(meta) >= {"clips", "splits", "fps"}
    read = read_dataset(tmp_path)
    assert read.captions == written.captions
    assert read.splits == written.splits
    assert read.fps == ds.FPS
    split_ids = [i for ids in read.splits.values() for i in ids]
    assert sorted(split_ids) == sorted(read.captions)
    frames, fps = ds.read_video(read.clip_path("clip00002"))
    rng = np.random.default_rng([4, 2])
    rendered, caption = ds.render_clip(ds.random_spec(rng, size=64), rng)
    assert caption == read.captions["clip00002"][0]
    assert frames.shape == rendered.shape and fps == ds.FPS
    assert np.abs(frames.astype(int) - rendered.astype(int)).mean() < 8  # mp4v is lossy


def test_read_dataset_rejects_missing_files(tmp_path):
    with pytest.raises(ConfigError, match="captions.json: missing"):
        read_dataset(tmp_path)
    ds.write_dataset(tmp_path, 2, seed=0, size=32)
    (tmp_path / "clips" / "clip00001.mp4").unlink()
    with pytest.raises(ConfigError, match="no file for clip 'clip00001'"):
        read_dataset(tmp_path).clip_path("clip00001")


def test_sample_window_takes_every_other_frame_and_pads_short_clips():
    frames = np.arange(16)[:, None, None, None] * np.ones((1, 2, 2, 3), np.uint8)
    picked = ds.sample_window(frames, fps=16.0, sample_fps=8.0, n=8)
    assert list(picked[:, 0, 0, 0]) == [0, 2, 4, 6, 8, 10, 12, 14]
    padded = ds.sample_window(frames, fps=16.0, sample_fps=8.0, n=8, start=8)
    assert list(padded[:, 0, 0, 0]) == [8, 10, 12, 14, 15, 15, 15, 15]


def test_orientation_targets_turn_the_way_the_caption_says(tmp_path):
    from models.train import SAMPLE_FPS, orientation_targets

    data = ds.write_dataset(tmp_path, 40, seed=7, size=32, split_fractions=(1, 0, 0))
    assert read_dataset(tmp_path).orientation == data.orientation
    ids = list(data.captions)
    targets = orientation_targets(data, ids, 8, SAMPLE_FPS)
    seen = set()
    for clip_id, t in zip(ids, targets):
        caption = data.captions[clip_id][0]
        if "circle" in caption:
            assert clip_id not in data.orientation and not t.any()
            continue
        np.testing.assert_allclose(np.hypot(t[:, 0], t[:, 1]), 1.0, atol=1e-6)
        assert (t[:, 2] == 1).all()
        # Sign of the turn between sampled frames, on the circle of the symmetry period.
        turn = np.sign(t[:-1, 0] * t[1:, 1] - t[:-1, 1] * t[1:, 0])
        motion = caption.split(maxsplit=3)[3]
        expected = {"rotates clockwise": 1, "rotates counterclockwise": -1}.get(motion, 0)
        assert (turn == expected).all() if expected else np.allclose(t[0], t[-1]), caption
        seen.add(expected)
    assert seen == {-1, 0, 1}
