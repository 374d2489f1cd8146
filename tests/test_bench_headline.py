"""The headline benchmark's parts: equal-parameter plans, the output check, goals, the host's
thread choice, published figures and start-up."""

from __future__ import annotations

import json

import pytest

from conftest import write_noise_clip
from edgecap_lab.bench import (Row, bench_startup, check_outputs, goals, load_published, PUBLISHED,
                           _load_frames)
from edgecap.bundle import load_bundle
from edgecap.errors import ConfigError
from edgecap.modelfile import open_model
from edgecap.plans.plan import single_cpu_plan
from edgecap.plans.compiler import plan_for_board


@pytest.fixture(autouse=True)
def plan_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "xdg"))


@pytest.fixture(scope="module")
def bundle(shipped_bundle):
    return load_bundle(shipped_bundle)


def test_equal_param_plan_puts_the_whole_cnn_on_the_tpus(bundle):
    import edgecap_compile

    plan = plan_for_board(bundle, "devboard-usb", equal_param=True)
    ranges = edgecap_compile.equal_param_ranges(bundle.encoder, 2)
    assert [s.device for s in plan.stages] == ["pci:0", "usb:0", "cpu"]
    assert [tuple(s.ops) for s in plan.stages] == [tuple(r) for r in ranges]
    assert plan.stages[-1].empty and ranges[0][0] == 0 and ranges[1][1] == bundle.encoder_model.ops
    # A different split from the compiler's own plan, cached apart from it.
    assert plan.path != plan_for_board(bundle, "devboard-usb").path


def test_two_splits_at_once_is_a_config_error(bundle):
    with pytest.raises(ConfigError, match="whole_on_tpu and equal_param"):
        plan_for_board(bundle, "devboard-usb", whole_on_tpu=True, equal_param=True)


def test_output_check_finds_features_that_differ(bundle, shipped_bundle):
    frames = _load_frames([str(shipped_bundle.parent / "sample.mp4")], 4)
    window = bundle.window
    plans = {"a": plan_for_board(bundle, "devboard-usb", tpus=0),
             "d": plan_for_board(bundle, "devboard-usb"),
             # The float reference encoder computes other features from the same frames.
             "f": single_cpu_plan(open_model(bundle.reference_encoder)[0])}
    checks = check_outputs(bundle, plans, {"a": False, "d": True, "f": False}, frames, window,
                           with_captions=False)
    assert checks["a"] == (True, None, 4) and checks["d"] == (True, None, 4)
    assert checks["f"][0] is False


def _row(profile, schedule, fps, speedup=1.0, rounds=()):
    return Row(profile, schedule, "", 100, 8, fps, 1.0, 2.0, {}, speedup=speedup, fps_rounds=list(rounds))


def test_goals_compare_the_pipeline_with_cpu_only_and_the_equal_split():
    board = "devboard-usb (emulated)"
    rows = [_row(board, "a", 1.0), _row(board, "e", 50.0, 50.0), _row(board, "d", 66.0, 66.0),
            _row("host", "plain 1 thread", 10.0, rounds=[10.0, 12.0, 9.0]),
            _row("host", "plain 2 threads", 16.0, rounds=[16.0, 18.0, 12.0]),
            _row("host", "edgecap caption", 15.0, rounds=[15.0, 16.0, 11.0])]
    board_goal, host_goal = goals(rows)
    assert board_goal["fps_met"] and board_goal["speedup_met"] and board_goal["d_over_e_met"]
    assert board_goal["d_over_e"] == pytest.approx(1.32)
    # Over one thread round by round 1.5, 1.33, 1.22; over two threads 0.94, 0.89, 0.92: median 0.92.
    assert host_goal["every_round_met"] and host_goal["over_two_threads_median"] == pytest.approx(11 / 12)
    assert host_goal["two_threads_met"]
    rows[1].fps = 60.0  # the plan now 1.1x the equal split; edgecap below one thread in a round
    rows[5].fps_rounds = [15.0, 11.0, 10.0]  # over two threads 0.94, 0.61, 0.83: median 0.83
    board_goal, host_goal = goals(rows)
    assert not board_goal["d_over_e_met"] and not host_goal["every_round_met"]
    assert not host_goal["two_threads_met"]


def test_published_figures_carry_their_source(tmp_path):
    (paper,) = load_published()
    assert (paper.fps, paper.speedup) == (59.0, 54.9) and "TACO 2022" in paper.source
    bad = tmp_path / "published.json"
    doc = json.loads(PUBLISHED.read_text())
    del doc["rows"][0]["source"]
    bad.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="source"):
        load_published(bad)


def test_startup_measures_the_child_caption_run(shipped_bundle, tmp_path):
    clip = write_noise_clip(tmp_path / "clip.mp4", 16, 64, fps=8.0)
    st = bench_startup(shipped_bundle, str(clip))
    # 16 frames at the bundle's 8 fps: two 8-frame windows, each a JSON line.
    assert st.captions == 2
    assert 0 < st.first_caption_s <= st.total_s
    # A Python process with numpy, OpenCV and TFLite is tens of MB at least.
    assert 20 < st.peak_rss_mb < 2000
