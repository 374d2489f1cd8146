"""Device failover: emulated EdgeTPUs that fail, hang or vanish mid-stream, and come back."""

from __future__ import annotations

import json
import shutil
import threading
import time
from typing import List

import numpy as np
import pytest

from edgecap import faults
from edgecap.captioner import EdgeCaptioner
from edgecap.errors import DeviceFailed
from edgecap.failover import Prober, Reprobe, load_recovery
from edgecap.sources import Frame, open_source

FRAMES = 160  # 20 windows of the demo bundle


pytestmark = pytest.mark.usefixtures("no_faults")


@pytest.fixture(scope="module")
def clip(shipped_bundle) -> List[np.ndarray]:
    images = [f.image for f in open_source(str(shipped_bundle.parent / "sample.mp4"))]
    return (images * (FRAMES // len(images) + 1))[:FRAMES]


@pytest.fixture(scope="module")
def reference(shipped_bundle, clip) -> List[str]:
    with EdgeCaptioner(shipped_bundle, board="devboard-usb", num_threads=1) as cap:
        return [c.text for c in cap.caption_frames(clip)]


@pytest.fixture(scope="module")
def two_tpu_reference(shipped_bundle, clip, two_tpu_board) -> List[str]:
    with EdgeCaptioner(shipped_bundle, board=two_tpu_board, num_threads=1) as cap:
        assert sorted(cap.devices.values()) == ["cpu", "emu-tpu:0", "emu-tpu:1"]
        return [c.text for c in cap.caption_frames(clip)]


def _texts(cap: EdgeCaptioner, clip) -> List[str]:
    return [c.text for c in cap.caption_frames(clip)]


@pytest.mark.usefixtures("no_leaked_threads")
@pytest.mark.parametrize("action, kind", [("fail", "error"), ("vanish", "vanished"), ("hang", "hung")])
def test_a_device_that_fails_mid_stream_loses_no_window(shipped_bundle, clip, two_tpu_reference,
                                                        two_tpu_board, tmp_path, action, kind):
    trace = tmp_path / "trace.json"
    with EdgeCaptioner(shipped_bundle, board=two_tpu_board, num_threads=1, trace=trace,
                       deadline_floor_s=0.3) as cap:
        faults.inject(f"emu-tpu:1={action}@50")
        assert _texts(cap, clip) == two_tpu_reference
        stats = cap.stats()
        (record,) = stats.failovers
        assert (record.device, record.kind, record.how) == ("emu-tpu:1", kind, "compiler")
        assert "emu-tpu:1" in record.plan_before and "emu-tpu:1" not in record.plan_after
        assert "emu-tpu:1" not in cap.devices.values()
        assert record.replayed > 0 and stats.replayed == record.replayed
        assert record.took_s is not None and record.took_s < 1.0, record
        assert stats.frames_out >= FRAMES
    events = json.loads(trace.read_text())["traceEvents"]
    (event,) = [e for e in events if e["ph"] == "i"]
    assert event["name"] == "failover" and event["args"]["device"] == "emu-tpu:1"


def test_a_device_that_answers_again_is_taken_back(shipped_bundle, clip, two_tpu_reference, two_tpu_board):
    frames = clip * 4  # long enough for the re-probe (0.25 s, then 0.5 s)
    with EdgeCaptioner(shipped_bundle, board=two_tpu_board, num_threads=1) as cap:
        faults.inject("emu-tpu:0=fail@20+0.2s")
        assert _texts(cap, frames) == two_tpu_reference * 4
        kinds = [(r.device, r.kind, r.how) for r in cap.stats().failovers]
        assert kinds == [("emu-tpu:0", "error", "compiler"), ("emu-tpu:0", "returned", "original")]
        assert sorted(cap.devices.values()) == ["cpu", "emu-tpu:0", "emu-tpu:1"]


def test_losing_every_tpu_runs_the_encoder_on_the_cpu(shipped_bundle, clip, two_tpu_reference, two_tpu_board):
    with EdgeCaptioner(shipped_bundle, board=two_tpu_board, num_threads=1) as cap:
        faults.inject("emu-tpu:0=fail@30,emu-tpu:1=fail@60")
        assert _texts(cap, clip) == two_tpu_reference
        assert [r.device for r in cap.stats().failovers] == ["emu-tpu:0", "emu-tpu:1"]
        assert list(cap.devices.values()) == ["cpu"]


def test_without_a_compiler_the_failed_stage_runs_on_a_cpu_worker(shipped_bundle, clip, two_tpu_reference,
                                                                  two_tpu_board, tmp_path):
    from edgecap.cli import run

    plan = tmp_path / "plan"
    assert run(["compile", str(shipped_bundle), "--board", two_tpu_board, "-o", str(plan)]) == 0
    with EdgeCaptioner(shipped_bundle, plan=plan, emulate=True, num_threads=1) as cap:
        faults.inject("emu-tpu:0=fail@40")
        assert _texts(cap, clip) == two_tpu_reference
        (record,) = cap.stats().failovers
        assert record.how == "cpu" and list(cap.devices.values()) == ["cpu:1", "emu-tpu:1", "cpu"]


def test_a_plan_the_bundle_carries_comes_first(shipped_bundle, clip, tmp_path):
    from edgecap.bundle import load_bundle
    from edgecap_compile import compile_model

    bundle = tmp_path / "bundle"
    shutil.copytree(shipped_bundle, bundle)
    # One of the board's two TPUs (the second stage is empty): the other is spare.
    n = load_bundle(bundle).encoder_model.ops
    compile_model(bundle, "devboard-usb", bundle / "plans" / "devboard-usb",
                  ranges=[(0, n // 2), (n // 2, n // 2), (n // 2, n)])
    with EdgeCaptioner(bundle, plan=bundle / "plans" / "devboard-usb", emulate=True, num_threads=1) as cap:
        expected = _texts(cap, clip)
        assert list(cap.devices.values()) == ["emu-tpu:0", "cpu"]
        faults.inject("emu-tpu:0=fail@40")
        assert _texts(cap, clip) == expected
        (record,) = cap.stats().failovers
        # Onto the board's TPU the plan left idle, not the CPU.
        assert record.how == "bundle" and list(cap.devices.values()) == ["emu-tpu:1", "cpu"]


def test_a_plan_for_another_board_is_not_a_failover_plan(shipped_bundle, clip, tmp_path):
    from test_planner import _compiled_plan

    bundle = tmp_path / "bundle"
    shutil.copytree(shipped_bundle, bundle)
    _compiled_plan(bundle, "devboard-usb", 2)
    _compiled_plan(bundle, "devboard", 1)  # fits the one TPU left, but is timed for another board
    with EdgeCaptioner(bundle, plan=bundle / "plans" / "devboard-usb", emulate=True, num_threads=1) as cap:
        expected = _texts(cap, clip)
        faults.inject("emu-tpu:1=fail@40")
        assert _texts(cap, clip) == expected
        (record,) = cap.stats().failovers
        assert record.how == "cpu" and cap.plan.board == "devboard-usb"
        assert list(cap.devices.values()) == ["emu-tpu:0", "cpu:1", "cpu"]


def test_several_streams_each_keep_every_window(shipped_bundle, clip):
    def frames():
        for i, image in enumerate(clip):
            for key in ("a", "b"):
                yield key, Frame(i, i / 8.0, image)

    def captions(cap):
        out = {"a": [], "b": []}
        for result in cap.run_frames(frames(), live=False):
            out[result.key] += [c.text for c in result.captions]
        return out

    with EdgeCaptioner(shipped_bundle, board="devboard-usb", num_threads=1) as cap:
        expected = captions(cap)
        faults.inject("emu-tpu:0=fail@100")
        assert captions(cap) == expected
        assert len(cap.stats().failovers) == 1


def test_live_mode_counts_what_it_lost(shipped_bundle, clip):
    def camera():  # a frame every 5 ms: the pipeline keeps up, bar the failover
        for i, image in enumerate(clip):
            time.sleep(0.005)
            yield None, Frame(i, i / 8.0, image)

    with EdgeCaptioner(shipped_bundle, board="devboard-usb", num_threads=1) as cap:
        faults.inject("emu-tpu:0=fail@50")
        results = list(cap.run_frames(camera(), live=True))
        stats = cap.stats()
        (record,) = stats.failovers
        assert record.device == "emu-tpu:0"
        windows = [c.window for r in results for c in r.captions]
        assert windows == sorted(set(windows))  # none twice
        # What came out, what was lost in flight and what the live head dropped make up the input.
        assert len([r for r in results if r.frame is not None]) + stats.dropped == FRAMES
        assert record.lost_frames >= 1 and record.lost_windows <= 1
        assert len(windows) + record.lost_windows <= FRAMES // 8


def test_with_failover_off_the_error_reaches_the_caller(shipped_bundle, clip):
    with EdgeCaptioner(shipped_bundle, board="devboard-usb", num_threads=1, failover=False) as cap:
        faults.inject("emu-tpu:0=fail@10")
        with pytest.raises(DeviceFailed, match="emu-tpu:0: error"):
            cap.caption_frames(clip)


def test_the_sequential_schedule_fails_over_too(shipped_bundle, clip, reference):
    with EdgeCaptioner(shipped_bundle, board="devboard-usb", num_threads=1, pipelined=False) as cap:
        faults.inject("emu-tpu:0=fail@30")
        assert _texts(cap, clip) == reference
        assert len(cap.stats().failovers) == 1


def test_the_prober_backs_off_until_the_device_answers():
    calls: List[float] = []
    back = threading.Event()

    def probe(device: str) -> bool:
        calls.append(time.monotonic())
        return len(calls) == 3

    prober = Prober(lambda device: back.set(), probe)
    t0 = time.monotonic()
    prober.watch("emu-tpu:0")
    assert back.wait(10)
    prober.close()
    gaps = np.diff([t0] + calls)
    assert len(calls) == 3 and prober.watched == []
    # 0.25 s, then 0.5 s, then 1 s: each wait at least its backoff, and longer than the one before.
    assert all(g >= load_recovery().reprobe.first_s * 2 ** i - 0.02 for i, g in enumerate(gaps)), gaps
    assert gaps[2] > gaps[1] > gaps[0]


def test_a_flapping_device_waits_longer_after_each_failure_until_it_runs_a_stable_period():
    policy = Reprobe(first_s=0.01, max_s=0.04, stable_s=0.5)
    back = threading.Event()
    prober = Prober(lambda device: back.set(), lambda device: True, policy)

    def fail_and_return() -> float:
        back.clear()
        wait = prober.watch("emu-tpu:0")
        assert back.wait(10)
        return wait

    try:
        # Each failure soon after the device was taken back doubles the first wait, up to max_s.
        assert [fail_and_return() for _ in range(4)] == [0.01, 0.02, 0.04, 0.04]
        assert prober.strikes("emu-tpu:0") == 4
        time.sleep(policy.stable_s + 0.1)  # it runs a stable period: the next failure is a first one
        assert fail_and_return() == 0.01 and prober.strikes("emu-tpu:0") == 1
        assert prober.watch("emu-tpu:1") == 0.01  # each device has its own count
    finally:
        prober.close()


def test_the_reprobe_policy_is_read_from_its_data_file_with_its_reasons():
    policy = load_recovery().reprobe
    assert 0 < policy.first_s < policy.max_s < policy.stable_s
    assert set(policy.why) == {"first_s", "max_s", "stable_s"}
    assert policy.first_wait(1) == policy.first_s and policy.first_wait(2) == 2 * policy.first_s
    assert policy.first_wait(10_000) == policy.max_s


@pytest.mark.parametrize("action", ["abort", "segv"])
def test_a_crash_in_an_isolated_stage_fails_over(shipped_bundle, clip, reference, action):
    import psutil

    from edgecap import isolation

    isolation.close_spares()  # the spare worker process, kept for the next stage, is no leak
    children = {p.pid for p in psutil.Process().children()}
    # The demo's plan on devboard-usb: its one TPU stage aborts or segfaults in its worker process.
    from tests.pipeline_boards import pipeline_board

    with EdgeCaptioner(shipped_bundle, board=pipeline_board("devboard-usb"), num_threads=1, isolate=True) as cap:
        assert list(cap.devices.values()) == ["emu-tpu:0", "cpu"]
        faults.inject(f"emu-tpu:0={action}@40")
        assert _texts(cap, clip) == reference
        (record,) = cap.stats().failovers
        assert (record.device, record.kind, record.how) == ("emu-tpu:0", "crashed", "compiler")
        assert record.replayed > 0 and record.took_s is not None
        # Onto the board's other TPU, which the plan left idle.
        assert list(cap.devices.values()) == ["emu-tpu:1", "cpu"]
    # No collection: the crashed stage's worker went with its pipeline (its block has no name to leave).
    isolation.close_spares()
    assert {p.pid for p in psutil.Process().children()} <= children


def test_the_watchdog_fails_a_run_whose_step_outlives_its_deadline():
    from edgecap.scheduler import Pipeline, Step

    release = threading.Event()

    def stuck(x):
        if x == 3:
            release.wait()
        return x

    pipe = Pipeline([Step("seg", "emu-tpu:0", lambda: stuck, deadline_s=0.2, first_deadline_s=1.0),
                     Step("tail", "cpu", lambda: (lambda x: x))])
    out = []
    t0 = time.perf_counter()
    with pytest.raises(DeviceFailed, match=r"emu-tpu:0: hung: seg did not return within 0.2 s \(item 3\)"):
        for x in pipe.run(range(10)):
            out.append(x)
    assert out == [0, 1, 2] and time.perf_counter() - t0 < 1.0
    assert pipe.stop()
    release.set()
    pipe.join()
    assert pipe.running() == []


@pytest.mark.parametrize("overrides", [{"deadline_factor": 0.5}, {"deadline_floor_s": 0},
                                       {"deadline_floor_s": float("nan")}, {"deadline_factor": True}])
def test_deadline_options_out_of_range_are_one_line(overrides):
    from edgecap.errors import ConfigError
    from edgecap.options import CaptionerOptions

    with pytest.raises(ConfigError, match="deadline"):
        CaptionerOptions(**overrides)


@pytest.mark.parametrize("text", ["emu-tpu:1=explode@3", "emu-tpu:1=fail", "emu-tpu:1=fail@-1", "fail@3"])
def test_a_malformed_fault_is_one_line(text):
    from edgecap.errors import ConfigError

    with pytest.raises(ConfigError, match="DEVICE=ACTION@N"):
        faults.inject(text)


@pytest.mark.parametrize("text, why", [
    ("cpu=fail@100", "cpu is the CPU"),
    ("cpu:1=hang@3", "cpu:1 is the CPU"),
])
def test_a_fault_on_the_cpu_is_refused_in_one_line(text, why):
    from edgecap.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        faults.inject(text)
    message = str(info.value)
    assert "\n" not in message and f"fault {text!r} can never fire" in message and why in message


def test_a_fault_names_its_device_as_the_worker_is_named():
    (fault,) = faults.parse("EMU-TPU:01=fail@3+1s")
    assert (fault.device, str(fault)) == ("emu-tpu:1", "emu-tpu:1=fail@3+1s")


@pytest.mark.parametrize("entry, have", [
    ("emu-tpu:2=fail@10", "its EdgeTPUs are emu-tpu:0, emu-tpu:1"),  # devboard-usb has two
    ("tpu:0=hang@5", "its EdgeTPUs are emu-tpu:0, emu-tpu:1"),       # a real one, on an emulated board
])
def test_the_caption_command_refuses_a_fault_for_a_tpu_the_board_lacks(shipped_bundle, monkeypatch, capsys,
                                                                        entry, have):
    from edgecap.cli import main

    monkeypatch.setenv(faults.ENV, entry)
    monkeypatch.setattr(faults, "_plan", None)  # read $EDGECAP_FAULTS again
    code = main(["caption", "--bundle", str(shipped_bundle), "--board", "devboard-usb"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert f"EDGECAP_FAULTS: fault {entry!r} can never fire" in err[0] and have in err[0], err


def test_the_caption_command_refuses_a_fault_on_the_cpu(shipped_bundle, monkeypatch, capsys):
    from edgecap.cli import main

    monkeypatch.setenv(faults.ENV, "cpu=fail@100")
    monkeypatch.setattr(faults, "_plan", None)
    code = main(["caption", "--bundle", str(shipped_bundle), "--board", "devboard-usb"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "'cpu=fail@100' can never fire" in err[0], err


def test_a_fault_fires_once_at_its_invoke_and_the_device_answers_after_its_delay():
    plan = faults.inject("emu-tpu:0=vanish@2+0.1s")
    assert [plan.take("emu-tpu:0") for _ in range(2)] == [None, None]
    assert plan.take("emu-tpu:1") is None
    fault = plan.take("emu-tpu:0")
    assert (fault.action, fault.at, fault.back_after_s) == ("vanish", 2, 0.1)
    assert plan.take("emu-tpu:0") is None and not plan.answers("emu-tpu:0")
    time.sleep(0.15)
    assert plan.answers("emu-tpu:0")


def _live_frames(clip, n: int, gap_s: float = 0.001):
    for i in range(n):
        time.sleep(gap_s)
        yield None, Frame(i, i / 8.0, clip[i % len(clip)])


def test_live_drops_count_each_frame_once_over_two_failovers(shipped_bundle, clip):
    # emu-tpu:0 fails, the plan moves onto emu-tpu:1, which fails too: two switches, frames
    # arriving faster than the pipeline takes them. Every frame read comes out or is dropped, once.
    n = 600
    with EdgeCaptioner(shipped_bundle, board="devboard-usb", num_threads=1) as cap:
        faults.inject("emu-tpu:0=fail@20,emu-tpu:1=fail@20")
        out = sum(1 for r in cap.run_frames(_live_frames(clip, n), live=True) if r.frame is not None)
        stats = cap.stats()
        assert [(f.device, f.kind) for f in stats.failovers] == [("emu-tpu:0", "error"), ("emu-tpu:1", "error")]
        assert out + stats.dropped == n, (out, stats.dropped, stats.failovers)


def test_a_refused_concurrent_call_keeps_the_running_calls_failover_stats(shipped_bundle, clip):
    from edgecap.errors import PipelineBusy

    with EdgeCaptioner(shipped_bundle, board="devboard-usb", num_threads=1) as cap:
        faults.inject("emu-tpu:0=fail@10")
        it = cap.stream(iter(clip), fps=0)
        next(it)
        while not cap.stats().failovers:
            next(it)
        refused = []

        def other() -> None:
            try:
                next(cap.stream(iter(clip[:16]), fps=0))
            except PipelineBusy as exc:
                refused.append(exc)

        thread = threading.Thread(target=other)
        thread.start()
        thread.join(10)
        assert refused
        assert [f.device for f in cap.stats().failovers] == ["emu-tpu:0"]
        it.close()


@pytest.mark.usefixtures("no_leaked_threads")
def test_close_during_a_failover_closes_the_new_pipeline(shipped_bundle, clip, monkeypatch):
    from edgecap.errors import RunCancelled

    cap = EdgeCaptioner(shipped_bundle, board="devboard-usb", num_threads=1)
    supervisor = cap._supervisor
    real_open = supervisor._open
    started = []

    def open_then_close(choice, released):
        pipeline = real_open(choice, released)
        started.append(pipeline)
        cap.close()  # as another thread (or a signal handler) would, while the failover opens it
        return pipeline

    monkeypatch.setattr(supervisor, "_open", open_then_close)
    faults.inject("emu-tpu:0=fail@10")
    with pytest.raises(RunCancelled, match="closed during a failover"):
        _texts(cap, clip)
    (pipeline,) = started
    assert pipeline.running() == []


def test_a_replaced_runs_reader_reads_no_more_once_a_new_one_starts():
    from edgecap.supervisor import Run as _Run, _Source
    from edgecap.bundle import WindowSpec

    items = iter([(None, Frame(i, i / 8.0, np.zeros((2, 2, 3), np.uint8))) for i in range(5)])
    make = lambda stream, frame, pos: (stream, frame, pos)  # noqa: E731
    source = _Source(items, make, {}, WindowSpec(frames=2, stride=2, sample_fps=8.0), hold=False)
    old = source.jobs(_Run({}), {})
    assert next(old)[2] == 0
    new = source.jobs(_Run({}), {})
    with pytest.raises(StopIteration):  # stale: it must not take frame 1 from the new run
        next(old)
    assert [job[2] for job in new] == [1, 2, 3, 4]


def test_the_prober_survives_a_probe_that_raises(caplog):
    back = threading.Event()
    calls = []

    def probe(device: str) -> bool:
        calls.append(device)
        if len(calls) == 1:
            raise OSError("USB reset")
        return True

    prober = Prober(lambda device: back.set(), probe)
    prober.watch("emu-tpu:0")
    try:
        assert back.wait(5), calls
    finally:
        prober.close()
    assert "probing emu-tpu:0 failed (OSError: USB reset)" in caplog.text


def test_a_stopped_run_in_a_tpu_stage_is_no_device_failure(monkeypatch, shipped_bundle):
    from edgecap import stages
    from edgecap.captioner import _CnnStage, _FrameJob
    from edgecap.errors import RunCancelled

    class Stopped:
        isolated = False

        def __call__(self, tensors):
            raise RunCancelled("stopped")

        def close(self):
            pass

    from edgecap.devices import parse_device
    from edgecap.planner import StageRun

    monkeypatch.setattr(stages, "open_stage", lambda *a, **k: Stopped())
    stage = _CnnStage(StageRun(stage=None, worker=parse_device("emu-tpu:0")), threading.Event())
    job = _FrameJob((None, None), Frame(0, 0.0, None), {}, 0.0, {"cnn": 0.0})
    with pytest.raises(RunCancelled):
        stage(job)


def test_the_tpus_left_are_the_boards_not_only_the_plans(monkeypatch, shipped_bundle):
    import dataclasses

    from edgecap import devices
    from edgecap.bundle import load_bundle
    from edgecap.devices import DeviceInfo
    from edgecap.options import CaptionerOptions
    from edgecap.planner import board_tpus, choose
    from tests.pipeline_boards import pipeline_board

    # The demo's devboard-usb plan uses one of the board's two TPUs.
    emulated = choose(load_bundle(shipped_bundle), CaptionerOptions(board=pipeline_board("devboard-usb"),
                                                                    emulate=True))
    assert [str(d) for d in board_tpus(emulated)] == ["emu-tpu:0", "emu-tpu:1"]
    attached = [DeviceInfo("cpu", "cpu", "", ""), DeviceInfo("tpu:0", "pci", "/dev/apex_0", ""),
                DeviceInfo("tpu:1", "usb", "usb", "")]
    monkeypatch.setattr(devices, "list_devices", lambda root="/": attached)
    real = dataclasses.replace(emulated, stages=tuple(
        dataclasses.replace(s, worker=s.stage.spec) for s in emulated.stages))
    # pci:0 is tpu:0 by another name; the spare opens by its bus and index, as libedgetpu's usb:0.
    assert [str(d) for d in board_tpus(real)] == ["pci:0", "usb:0"]
