"""A fixed split through ``compile_model(ranges=...)`` and the runtime's plan cache built on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgecap.plans import compiler as planning
from edgecap.bundle import load_bundle
from edgecap.plans.plan import load_plan
import edgecap_compile
from edgecap_compile import compiler
from edgecap_compile.errors import CompileError

MODEL = Path(__file__).parent / "data" / "compile" / "tiny_inception.tflite"


@pytest.fixture(autouse=True)
def plan_cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "edgecap" / "plans"


@pytest.fixture(scope="module")
def bundle(shipped_bundle):
    return load_bundle(shipped_bundle)


def test_fixed_ranges_replace_the_search(tmp_path):
    result = compiler.compile_model(MODEL, "rpi4-2usb", tmp_path, tpus=1,
                                    ranges=[(0, 21), (21, 21)])
    stages = [(s.device, s.ops) for s in result.plan.stages]
    assert stages == [("usb:0", (0, 21)), ("cpu", (21, 21))]
    best = compiler.compile_model(MODEL, "rpi4-2usb", tmp_path / "best", tpus=1)
    # The search would not have chosen it.
    assert [(s.device, s.ops, s.replicas) for s in best.plan.stages] != [(d, o, ()) for d, o in stages]


@pytest.mark.parametrize("ranges", [[(0, 21)], [(0, 10), (11, 21)], [(0, 10), (10, 20)],
                                    [(0, 12), (12, 10)], [(1, 10), (10, 21)]])
def test_ranges_that_do_not_split_the_model_are_one_line(tmp_path, ranges):
    with pytest.raises(CompileError) as e:
        compiler.compile_model(MODEL, "rpi4-2usb", tmp_path, tpus=1, ranges=ranges)
    assert "contiguous stages from op 0 to 21" in str(e.value) and "\n" not in str(e.value)


def test_whole_on_tpu_plan_is_the_compilers_plan(bundle):
    plan = planning.plan_for_board(bundle, "devboard-usb", whole_on_tpu=True)
    n = plan.stages[0].ops[1]
    assert [(s.device, s.ops) for s in plan.stages] == [("pci:0", (0, n)), ("cpu", (n, n))]
    assert plan.model_file == "encoder.tflite" and plan.rnn_ms > 0


def test_a_failed_compile_leaves_no_staging_folder(bundle, plan_cache, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(edgecap_compile, "compile_model", interrupted)  # the runtime's door
    with pytest.raises(KeyboardInterrupt):
        planning.plan_for_board(bundle, "devboard-usb")
    assert plan_cache.is_dir() and list(plan_cache.iterdir()) == []


@pytest.mark.parametrize("change", ["edgetpu_compiler", "plan_version", "edgecap_version"])
def test_the_cache_key_covers_the_tools(bundle, monkeypatch, change):
    first = planning.plan_for_board(bundle, "devboard-usb").path.parent
    assert planning.plan_for_board(bundle, "devboard-usb").path.parent == first
    if change == "edgetpu_compiler":
        monkeypatch.setattr(edgecap_compile, "find_compiler", lambda: "/usr/bin/edgetpu_compiler")
    elif change == "plan_version":
        monkeypatch.setattr(planning, "PLAN_VERSION", planning.PLAN_VERSION + 1)
    else:
        monkeypatch.setattr(planning.metadata, "version", lambda name: "99.0")
    # The compile itself runs without edgetpu_compiler: only the key sees the change.
    assert planning.plan_for_board(bundle, "devboard-usb").path.parent != first


def test_a_plan_is_made_for_the_window_it_runs(bundle):
    import dataclasses

    # The bundle's own window, and one at a quarter of its stride: four RNN steps a frame.
    default = planning.plan_for_board(bundle, "devboard")
    small = dataclasses.replace(bundle.window, stride=bundle.window.stride // 4)
    planned = planning.plan_for_board(bundle, "devboard", window=small)
    assert planned.path != default.path  # a plan of its own in the cache
    assert planned.rnn_steps_per_frame == 4 * default.rnn_steps_per_frame
    # The heavier RNN on the CPU moves CNN work off it (its ops a frame, a copy's for its share).
    def cpu_ops(plan):
        return sum(c.share * (c.ops[1] - c.ops[0]) for s in plan.stages for c in s.copies if c.spec.kind == "cpu")
    assert cpu_ops(planned) < cpu_ops(default)


def test_the_captioner_plans_for_the_stride_it_runs(shipped_bundle):
    from edgecap.captioner import EdgeCaptioner

    with EdgeCaptioner(shipped_bundle, board="devboard-usb", stride=2, num_threads=1) as cap:
        assert cap.plan.rnn_steps_per_frame == 4  # 8-frame windows at stride 2
    # A window that differs only in its sampling rate is the same plan, not a recompile.
    bundle = load_bundle(shipped_bundle)
    import dataclasses
    faster = dataclasses.replace(bundle.window, sample_fps=bundle.window.sample_fps * 2)
    assert planning.plan_for_board(bundle, "devboard-usb", window=faster).path == \
        planning.plan_for_board(bundle, "devboard-usb").path


def test_each_stage_records_what_its_prediction_is_made_of(bundle, tmp_path):
    # The running board re-prices a stage from these parts (issue 16): they must add up.
    plan = compiler.compile_model(bundle, "devboard-usb", tmp_path).plan
    reread = load_plan(tmp_path)
    assert [s.cost for s in reread.stages] == [s.cost for s in plan.stages]
    for stage in reread.stages:
        assert stage.cost.total_ms == pytest.approx(stage.predicted_ms, abs=1e-5)
        assert (stage.cost.link is None) == (stage.spec.kind == "cpu")
    tpu = reread.active_stages[0]
    assert tpu.cost.link_bytes > 0 and tpu.cost.link_ms > 0
    assert reread.stages[-1].cost.extra_ms == pytest.approx(reread.rnn_frame_ms, abs=1e-5)
