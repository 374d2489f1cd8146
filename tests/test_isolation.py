"""Process isolation: stages in worker processes, their crashes and hangs as DeviceFailed."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from edgecap import captioner, faults, isolation, stages
from edgecap.captioner import EdgeCaptioner
from edgecap.bundle import load_bundle
from edgecap.devices import parse_device
from edgecap.isolation import IsolatedSegment
from edgecap.errors import DeviceFailed, EdgecapError, PlanError
from edgecap.plans.compiler import plan_for_board
from edgecap.scheduler import Pipeline, Step
from edgecap.stages import open_stage
from runtime_plans import write_plan
from tests.pipeline_boards import pipeline_board

pytestmark = pytest.mark.skipif(os.name != "posix", reason="process isolation is POSIX only")

REPO = Path(__file__).resolve().parent.parent



def open_isolated(stage, device, deadline_s=2.0, **options):
    """A stage in a worker process, with the deadline the planner would give a slow one."""
    return IsolatedSegment(stage, parse_device(device), deadline_s=deadline_s, **options)

@pytest.fixture(scope="module")
def plan(shipped_bundle):
    """The demo bundle's plan for devboard-usb: a TPU segment, then the CPU tail."""
    plan = plan_for_board(load_bundle(shipped_bundle), pipeline_board("devboard-usb"))
    assert len(plan.active_stages) >= 2
    return plan


def _frame(plan, seed: int) -> dict:
    spec = plan.stages[0].inputs[0]
    return {spec.name: np.random.default_rng(seed).integers(-128, 128, spec.shape, dtype=spec.dtype)}


def _children() -> set:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _blocks(pid: str = "self") -> list:
    """The shared blocks a process maps (its isolated stages' tensors), as /proc names them."""
    lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return [line.split(None, 5)[5] for line in lines if "edgecap-isolation" in line or "/dev/shm/" in line]


@pytest.fixture
def no_leaks():
    """Fails a test that leaves a worker process, a shared block or a file descriptor behind.

    The spare worker process (started after a stage opens, kept for the next) is
    stopped before and after: it is no leak.
    """
    # No gc.collect(): what a test opened must be released when it is done, not when collected.
    isolation.close_spares()
    before = (_children(), psutil.Process().num_fds(), _blocks())
    yield
    isolation.close_spares()
    assert (_children(), psutil.Process().num_fds(), _blocks()) == before


@pytest.mark.usefixtures("no_leaks")
def test_isolated_stages_equal_in_process_ones_bit_for_bit(plan) -> None:
    stages = plan.active_stages
    devices = [f"emu-tpu:{i}" for i in range(len(stages))]
    isolated = [open_isolated(s, d) for s, d in zip(stages, devices)]
    local = []
    try:
        local += [open_stage(s, d) for s, d in zip(stages, devices)]
        for seed in range(4):
            a = b = _frame(plan, seed)
            for iso, loc in zip(isolated, local):
                a, b = iso(a), loc(b)
                assert list(a) == list(b)
                for name in a:
                    assert a[name].dtype == b[name].dtype
                    np.testing.assert_array_equal(a[name], b[name])
        assert isolated[0].isolated and not local[0].isolated
        # An injected error is raised and leaves the worker up for the next invoke.
        with pytest.raises(DeviceFailed, match="emu-tpu:0: error: injected fail") as err:
            isolated[0](_frame(plan, 0), fault=faults.Fault("emu-tpu:0", "fail", 0))
        assert err.value.kind == "error"
        assert isolated[0](_frame(plan, 0)).keys() == local[0](_frame(plan, 0)).keys()
    finally:
        for segment in isolated + local:  # err's traceback holds this frame: close, not collect
            segment.close()


@pytest.mark.usefixtures("no_leaks", "no_leaked_threads")
def test_a_captioner_on_isolated_stages_captions_as_in_process(shipped_bundle, tmp_path, monkeypatch) -> None:
    # Stage 1 is one op inside a residual block: the skip tensor passes it by, and the parent hands it on.
    encoder = shipped_bundle / "encoder.tflite"
    plan = write_plan(encoder, [8, 9], ["tpu:0", "tpu:1", "cpu"], tmp_path, [0.3] * 3)
    clip = np.random.default_rng(5).integers(0, 255, (16, 72, 88, 3), dtype=np.uint8)

    def captions(isolate=None) -> list:
        with EdgeCaptioner(shipped_bundle, plan=plan, num_threads=1, frames=4, stride=2,
                           isolate=isolate) as cap:
            assert any({t.name for t in s.inputs} & {t.name for t in s.outputs} for s in cap.plan.active_stages)
            return [(c.window, c.tokens) for c in cap.caption_frames(clip)]

    reference = captions()
    assert len(reference) >= 3
    opened = []

    def recording(real):
        def open_(*args, **kwargs):
            opened.append(real(*args, **kwargs))
            return opened[-1]
        return open_

    monkeypatch.setattr(stages, "open_stage", recording(stages.open_stage))
    monkeypatch.setattr(captioner, "IsolatedSegment", recording(captioner.IsolatedSegment))
    assert captions(isolate=True) == reference
    # EdgeTPU stages only: a CPU stage has no delegate to abort.
    assert sorted(s.isolated for s in opened) == [False, True, True]
    assert not any(psutil.pid_exists(s.pid) for s in opened if s.isolated)  # closed with their pipeline
    # One deadline: the worker is killed when the captioner's watchdog calls the invoke hung
    # (CaptionerOptions' floor 0.5 s over 20 x 0.3 ms; the first invoke that plus loading the
    # EdgeTPU's whole SRAM, the plan recording no on-chip bytes: planner.deadlines).
    from edgecap.failover import load_recovery
    first = 0.5 + load_recovery().first_invoke.load_s(0)
    assert {(s.deadline_s, s.first_deadline_s) for s in opened if s.isolated} == {(0.5, first)}
    del opened[:]


@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize("action,signame", [("abort", "SIGABRT"), ("segv", "SIGSEGV")])
def test_a_crashing_worker_is_a_device_failure_here(plan, action, signame) -> None:
    stage = plan.active_stages[0]
    seg = open_isolated(stage, "emu-tpu:0")
    pid = seg.pid
    seg(_frame(plan, 1))
    with pytest.raises(DeviceFailed, match=f"emu-tpu:0: crashed: worker process killed by {signame}") as err:
        seg(_frame(plan, 1), fault=faults.Fault("emu-tpu:0", action, 1))
    assert (err.value.device, err.value.kind) == ("emu-tpu:0", "crashed")
    assert not psutil.pid_exists(pid)
    with pytest.raises(DeviceFailed, match="crashed"):  # the device stays failed
        seg(_frame(plan, 1))
    seg.close()


@pytest.mark.usefixtures("no_leaks")
def test_a_hung_worker_is_killed_at_its_deadline(plan) -> None:
    seg = open_isolated(plan.active_stages[0], "emu-tpu:0", deadline_s=0.3)
    pid = seg.pid
    t0 = time.perf_counter()
    with pytest.raises(DeviceFailed, match=r"emu-tpu:0: hung: no answer within 0.3 s; worker process killed") as err:
        seg(_frame(plan, 2), fault=faults.Fault("emu-tpu:0", "hang", 0))
    assert 0.3 <= time.perf_counter() - t0 < 2.0
    assert err.value.kind == "hung"
    assert not psutil.pid_exists(pid)
    seg.close()


@pytest.mark.usefixtures("no_leaks")
def test_opening_failures_come_back_as_the_same_one_line_error(plan, tmp_path, monkeypatch) -> None:
    stage = plan.active_stages[0]
    broken = tmp_path / stage.segment.name
    broken.write_bytes(stage.segment.read_bytes()[:200])  # truncated
    corrupt = dataclasses.replace(stage, segment=broken)
    with pytest.raises(PlanError) as local:
        open_stage(corrupt, "emu-tpu:0")
    with pytest.raises(PlanError) as isolated:
        open_isolated(corrupt, "emu-tpu:0")
    assert str(isolated.value) == str(local.value) and "\n" not in str(isolated.value)

    # No libedgetpu: the message test_devices checks in-process (its probe costs a second more here).
    monkeypatch.setenv("EDGECAP_EDGETPU_LIBRARY", str(tmp_path / "libedgetpu.so.1"))
    on_tpu = dataclasses.replace(stage, compiled_segment=stage.segment)
    with pytest.raises(EdgecapError, match=r"^tpu:0: \S+libedgetpu.so.1 not found; install") as isolated:
        open_isolated(on_tpu, "tpu:0")
    assert type(isolated.value) is EdgecapError and "\n" not in str(isolated.value)


@pytest.mark.usefixtures("no_leaks", "no_leaked_threads")
def test_stopping_a_pipeline_ends_a_long_isolated_invoke_and_its_worker(plan, capfd) -> None:
    stage = dataclasses.replace(plan.active_stages[0], predicted_ms=60_000.0)
    opened = []
    is_open = threading.Event()
    closed_at = []

    def open_() -> object:
        opened.append(open_isolated(stage, "emu-tpu:0", timing_only=True))
        is_open.set()
        return opened[-1]

    def close_mid_invoke() -> None:
        # Timed from the stage's open, not from here: late in a suite, starting the
        # worker process (a fork of a large pytest) can take longer than the delay.
        is_open.wait(60.0)
        time.sleep(0.3)
        closed_at.append(time.perf_counter())
        pipe.close()

    pipe = Pipeline([Step("stage", "emu-tpu:0", open_)])
    frames = [_frame(plan, 0)] * 3
    run = pipe.run(frames)
    threading.Thread(target=close_mid_invoke, daemon=True).start()
    with pytest.raises(EdgecapError, match="cancelled|closed|stopped"):
        list(run)
    assert closed_at and time.perf_counter() - closed_at[0] < 2.0
    for thread in threading.enumerate():
        if thread.name.startswith("edgecap-"):
            thread.join(2.0)  # it notices the stop within _RECHECK_S
    # The worker thread closed its step as it ended: no collection needed.
    assert not psutil.pid_exists(opened[0].pid)
    assert "Traceback" not in capfd.readouterr().err  # the worker, stopped mid-invoke, says nothing


_SCRIPT = """
import pickle, sys, threading, time
import numpy as np
from edgecap.faults import Fault
from edgecap.devices import parse_device
from edgecap.isolation import IsolatedSegment, spare_pids

with open(sys.argv[1], "rb") as f:
    stage = pickle.load(f)
x = {stage.inputs[0].name: np.zeros(stage.inputs[0].shape, stage.inputs[0].dtype)}
seg = IsolatedSegment(stage, parse_device("emu-tpu:0"), deadline_s=2.0)
try:
    print(seg.pid, *spare_pids(), flush=True)
    time.sleep(30)
except KeyboardInterrupt:
    seg(x)  # the worker saw no SIGINT
    print("interrupted", flush=True)
# Hung in an invoke, the worker reads no request: only its lifeline tells it that we died.
threading.Thread(target=seg, args=(x,), kwargs={"fault": Fault("emu-tpu:0", "hang", 0)}, daemon=True).start()
time.sleep(0.2)
print("hanging", flush=True)
time.sleep(30)
"""


def test_sigint_to_the_group_and_the_parents_death(plan, tmp_path) -> None:
    pickled = tmp_path / "stage.pickle"
    pickled.write_bytes(pickle.dumps(plan.active_stages[0]))
    with subprocess.Popen([sys.executable, "-c", _SCRIPT, str(pickled)], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        try:
            line = proc.stdout.readline()
            if not line:
                pytest.fail(f"the script died: {proc.communicate(timeout=10)[1]}")
            pid, spare = map(int, line.split())
            # The block the tensors cross has no name: nothing to leave in /dev/shm.
            assert _blocks(pid) == ["/memfd:edgecap-isolation (deleted)"], _blocks(pid)
            os.kill(pid, signal.SIGINT)  # the worker runs in a session of its own, and ignores it
            os.killpg(proc.pid, signal.SIGINT)
            assert proc.stdout.readline().strip() == "interrupted"
            assert proc.stdout.readline().strip() == "hanging"
            assert psutil.pid_exists(pid) and psutil.pid_exists(spare)
        finally:
            proc.kill()  # no close(), no finalizer: the worker and the spare must notice on their own
            _, err = proc.communicate(timeout=10)
    for child in (pid, spare):
        try:
            psutil.Process(child).wait(5)
        except psutil.NoSuchProcess:
            pass
    assert "KeyboardInterrupt" not in err and "Traceback" not in err, err


def test_a_stage_in_a_worker_checks_its_deadline() -> None:
    from edgecap.errors import ConfigError
    from edgecap.isolation import IsolatedSegment
    from edgecap.devices import parse_device

    stage = type("S", (), {"predicted_ms": 1000.0})()
    with pytest.raises(ConfigError, match="deadline_s"):
        IsolatedSegment(stage, parse_device("emu-tpu:0"), deadline_s=0)


@pytest.mark.usefixtures("no_leaks")
def test_a_spare_worker_waits_for_the_next_stage_and_is_replaced(plan) -> None:
    stage = plan.active_stages[0]
    first = open_isolated(stage, "emu-tpu:0")
    try:
        # The first stage starts its own worker; a spare is started once it is open.
        assert not first.spare and isolation.spare_pids() != [] and first.pid not in isolation.spare_pids()
        (spare,) = isolation.spare_pids()
        second = open_isolated(stage, "emu-tpu:1")
        try:
            assert second.spare and second.pid == spare
            (replacement,) = isolation.spare_pids()
            assert replacement not in (first.pid, spare)
            for seed in range(2):  # the spare opened the stage as a fresh worker would
                np.testing.assert_array_equal(*(list(seg(_frame(plan, seed)).values())[0]
                                                for seg in (first, second)))
        finally:
            second.close()
    finally:
        first.close()
    assert not psutil.pid_exists(spare)


@pytest.mark.usefixtures("no_leaks")
def test_a_spare_started_under_another_environment_is_not_used(plan, monkeypatch) -> None:
    stage = plan.active_stages[0]
    open_isolated(stage, "emu-tpu:0").close()
    (spare,) = isolation.spare_pids()
    # The worker reads the environment as it opens the stage (the backend, libedgetpu's path).
    monkeypatch.setenv("EDGECAP_SPARE_TEST", "1")
    seg = open_isolated(stage, "emu-tpu:0")
    seg.close()
    assert not seg.spare and seg.pid != spare and not psutil.pid_exists(spare)


@pytest.mark.usefixtures("no_leaks")
def test_as_many_spares_are_kept_as_asked_for(plan) -> None:
    with pytest.raises(EdgecapError, match="spare worker processes: -1; use 0 or more"):
        isolation.set_spares(-1)
    try:
        isolation.set_spares(0)
        open_isolated(plan.active_stages[0], "emu-tpu:0").close()
        assert isolation.spare_pids() == []
        isolation.set_spares(2)
        open_isolated(plan.active_stages[0], "emu-tpu:0").close()
        spares = isolation.spare_pids()
        seg = open_isolated(plan.active_stages[0], "emu-tpu:0")
        seg.close()
        # One taken, the other kept, and one started in its place.
        assert len(spares) == 2 and seg.pid == spares[0] and isolation.spare_pids()[0] == spares[1]
        assert len(isolation.spare_pids()) == 2
    finally:
        isolation.set_spares(1)


@pytest.mark.usefixtures("no_leaks", "no_leaked_threads")
def test_a_failover_opens_its_isolated_stage_in_the_spare(shipped_bundle, monkeypatch) -> None:
    clip = np.random.default_rng(3).integers(0, 255, (120, 72, 88, 3), dtype=np.uint8)
    opened = []

    def recording(*args, **kwargs):
        opened.append(IsolatedSegment(*args, **kwargs))
        return opened[-1]

    monkeypatch.setattr(captioner, "IsolatedSegment", recording)
    with EdgeCaptioner(shipped_bundle, board=pipeline_board("devboard-usb"), num_threads=1, isolate=True) as cap:
        assert list(cap.devices.values()) == ["emu-tpu:0", "cpu"]
        (spare,) = isolation.spare_pids()  # started once the first stage was open
        faults.inject("emu-tpu:0=fail@20")
        try:
            assert len(list(cap.caption_frames(clip))) > 0
        finally:
            faults.inject("")
        (record,) = cap.stats().failovers
        assert record.device == "emu-tpu:0" and list(cap.devices.values()) == ["emu-tpu:1", "cpu"]
    assert [(s.device, s.spare) for s in opened] == [("emu-tpu:0", False), ("emu-tpu:1", True)]
    assert opened[1].pid == spare and isolation.spare_pids() not in ([], [spare])
    del opened[:]


@pytest.fixture(scope="module")
def bench_script():
    """tools/isolation_bench.py, loaded as a module."""
    import importlib.util

    # tools/ is scripts, not a package: load the benchmark's command line from its file.
    spec = importlib.util.spec_from_file_location("tools_isolation_bench", REPO / "tools" / "isolation_bench.py")
    script = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = script  # its dataclasses look their module up
    spec.loader.exec_module(script)
    return script


@pytest.mark.parametrize("argv", [["--failover", "0"], ["--failover", "5", "--load", "65"],
                                  ["--failover", "1", "--settle", "-1"], ["--frames", "0"]])
def test_the_isolation_benchmark_refuses_bad_counts_in_one_line(bench_script, argv, capsys) -> None:
    assert bench_script.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error: --" in err and "use " in err, err


@pytest.mark.slow
def test_the_isolation_benchmark_measures_every_case(bench_script, shipped_bundle, tmp_path) -> None:
    from edgecap_lab.bench import bench_isolation, format_isolation

    result = bench_isolation(load_bundle(shipped_bundle), frames=20, repeats=1)
    assert len(result.rows) == 3 and all(r.isolated_ms > 0 and r.in_process_ms > 0 for r in result.rows)
    # A worker for each of the three single-stage cases, and one per TPU stage of the plan (at least one).
    assert result.pipeline_fps["isolated"] > 0 and len(result.startup_s) >= 4
    assert "CNN stages pipelined" in format_isolation(result)
    assert bench_script.main(["--frames", "5", "--json", str(tmp_path / "no" / "x.json")]) == 2


@pytest.mark.slow
def test_the_failover_benchmark_times_each_setting_under_load(bench_script, shipped_bundle, tmp_path) -> None:
    out = tmp_path / "failover.json"
    assert bench_script.main(["--bundle", str(shipped_bundle), "--failover", "2", "--load", "1",
                        "--settle", "1", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["load"] == 1 and [r["spares"] for r in figures["results"]] == [0, 1]
    for r in figures["results"]:
        assert r["runs"] == len(r["took_s"]) == 2 and all(t > 0 for t in r["took_s"])
        assert r["p50_s"] <= r["p99_s"] <= r["max_s"] == max(r["took_s"])
        assert r["over_1s"] == sum(t > 1.0 for t in r["took_s"])
    assert isolation.spare_pids() == [] or len(isolation.spare_pids()) == 1  # the default is back
    assert isolation._SPARES.size == 1
