"""Closed-loop planning on the running board (edgecap.adapt): measure, refit, re-choose, switch, remember."""

from __future__ import annotations

import json
import logging
import time
from typing import Dict, List

import pytest

from edgecap import adapt, planner
from edgecap.adapt import Adapter, Observation, Policy, RunningMedian, load_policy, refit
from edgecap.bundle import load_bundle
from edgecap.captioner import EdgeCaptioner
from edgecap.emulation import ENV as TRUTH
from edgecap.options import CaptionerOptions
from edgecap.planner import choose, choose_measured
from edgecap.plans.bundled import BundlePlans
from edgecap.plans.compiler import plan_for_board
from edgecap.plans.pricing import Correction, price
from edgecap.sources import open_source
from edgecap.supervisor import _board_workers
from tests.pipeline_boards import pipeline_board


@pytest.fixture(scope="module")
def frames(shipped_bundle) -> List:
    return list(open_source(str(shipped_bundle.parent / "sample.mp4")))


def _run(cap: EdgeCaptioner, frames: List, n: int) -> int:
    clip = (frames * (n // len(frames) + 1))[:n]
    return sum(1 for _ in cap.run_frames(((None, f) for f in clip), live=False))


def _fast_policy(**changes) -> Policy:
    values = dict(about="test", window=5, rel_threshold=0.10, abs_floor_ms=0.05, dwell_s=0.15,
                  check_s=0.0, margin=0.05, cooldown_s=0.0)
    values.update(changes)
    return Policy(**values)


# ---------------------------------------------------------------------------
# Measuring and refitting.


def test_the_running_median_ignores_outliers_and_follows_a_step():
    m = RunningMedian(5)
    assert m.value() is None
    for x in (2.0, 2.0, 90.0, 2.0, 2.0):  # a first invoke that loads its parameters
        m.add(x)
    assert m.full and m.value() == 2.0
    for x in (6.0, 6.0, 6.0):
        m.add(x)
    assert m.value() == 6.0


def test_one_observation_splits_the_error_in_proportion_to_the_parts():
    # 3 ms of compute and invoke, 1 ms of link bytes at 1 MB/s: expected 4 ms, measured 8.
    obs = Observation(work_ms=3.0, link_bytes=1000, fixed_ms=0.0, measured_ms=8.0)
    c = refit(Correction(), 1e6, [obs])
    assert c.speed == pytest.approx(0.5)
    assert c.link_bytes_per_s == pytest.approx(0.5e6)
    # Starting from a correction already learned, the factor applies to it.
    c2 = refit(Correction(0.5, 0.5e6), 0.5e6, [Observation(3.0, 1000, 0.0, 16.0)])
    assert c2.speed == pytest.approx(0.25) and c2.link_bytes_per_s == pytest.approx(0.25e6)


def test_two_differently_made_stages_separate_compute_from_link():
    # The truth: compute at 2/3 the speed, the link at 37 MB/s (USB 2) instead of 521.
    speed, rate = 2 / 3, 37e6

    def seen(work_ms: float, link_bytes: int) -> Observation:
        return Observation(work_ms, link_bytes, 0.2, work_ms / speed + link_bytes * 1e3 / rate + 0.2)

    c = refit(Correction(), 521e6, [seen(1.4, 15_000), seen(0.8, 600_000)])
    assert c.speed == pytest.approx(speed, rel=1e-6)
    assert c.link_bytes_per_s == pytest.approx(rate, rel=1e-6)


def test_a_device_without_a_link_scales_its_compute_only():
    c = refit(Correction(), None, [Observation(2.0, 0, 0.0, 3.0)])
    assert c == Correction(2.0 / 3.0, None)


def test_the_policy_is_read_from_its_data_file_with_its_reasons():
    policy = load_policy()
    assert policy.window >= 5 and 0 < policy.margin < policy.rel_threshold < 1
    assert policy.dwell_s > policy.check_s > 0 and policy.cooldown_s > 0
    fields = {"window", "rel_threshold", "abs_floor_ms", "dwell_s", "check_s", "margin", "cooldown_s"}
    assert set(policy.why) == fields


# ---------------------------------------------------------------------------
# The corrections file.


def test_corrections_are_kept_per_board_and_device(tmp_path):
    path = tmp_path / "state" / "corrections.json"
    adapt.save_corrections(path, "devboard-usb", {"pci:0": Correction(0.5), "cpu": Correction(0.9)},
                           {"pci:0": (1.4, 2.8)})
    adapt.save_corrections(path, "rpi4-2usb", {"usb:1": Correction(1.0, 37e6)}, {})
    # Refitting one device of a board keeps the others and the other board.
    adapt.save_corrections(path, "devboard-usb", {"pci:0": Correction(0.25), "cpu": Correction(0.9)},
                           {"pci:0": (1.4, 4.2)})
    assert adapt.load_corrections(path, "devboard-usb") == {"pci:0": Correction(0.25), "cpu": Correction(0.9)}
    assert adapt.load_corrections(path, "rpi4-2usb") == {"usb:1": Correction(1.0, 37e6)}
    assert adapt.load_corrections(path, "devboard") == {}
    (pci,) = [l for l in adapt.read_learned(path) if l.device == "pci:0"]
    assert (pci.predicted_ms, pci.measured_ms) == (1.4, 4.2) and pci.updated.endswith("Z")


def test_a_corrections_file_of_version_1_reads_as_the_speeds_it_meant(tmp_path):
    # Version 1 kept compute_scale, the inverse of a speed (2.0: half as fast); files
    # written then still load, and the next save writes them as speeds (version 2).
    path = tmp_path / "corrections.json"
    path.write_text('{"version": 1, "boards": {"devboard-usb": {'
                    '"pci:0": {"compute_scale": 2.0, "link_bytes_per_s": 37000000.0, "predicted_ms": 1.4, '
                    '"measured_ms": 2.8, "updated": "2025-01-01T00:00:00Z"}, '
                    '"cpu": {"compute_scale": 0.8, "link_bytes_per_s": null, "predicted_ms": null, '
                    '"measured_ms": null, "updated": null}}}}')
    assert adapt.load_corrections(path, "devboard-usb") == {"pci:0": Correction(0.5, 37e6),
                                                            "cpu": Correction(1.25)}
    adapt.save_corrections(path, "rpi4-2usb", {"usb:1": Correction(1.0, 37e6)}, {})
    doc = json.loads(path.read_text())
    assert doc["version"] == 2 and doc["boards"]["devboard-usb"]["pci:0"]["speed"] == 0.5
    assert "compute_scale" not in doc["boards"]["devboard-usb"]["pci:0"]
    assert adapt.load_corrections(path, "devboard-usb")["pci:0"] == Correction(0.5, 37e6)
    (pci,) = [l for l in adapt.read_learned(path) if l.device == "pci:0"]
    assert (pci.predicted_ms, pci.measured_ms, pci.updated) == (1.4, 2.8, "2025-01-01T00:00:00Z")


@pytest.mark.parametrize("text", ["{not json", '{"version": 1, "boards": {"b": {"pci:0": {"compute_scale": -1}}}}',
                                  '{"version": 2, "boards": {"b": {"pci:0": {"compute_scale": 2.0}}}}',
                                  '{"version": 1, "boards": {"b": {"pci:0": {"speed": 0.5}}}}',
                                  '{"version": 7}', "[]"])
def test_a_corrupt_corrections_file_is_one_warning_and_ignored(tmp_path, caplog, text):
    path = tmp_path / "corrections.json"
    path.write_text(text)
    with caplog.at_level(logging.WARNING, logger="edgecap"):
        assert adapt.load_corrections(path, "devboard-usb") == {}
    (record,) = caplog.records
    assert str(path) in record.getMessage() and "\n" not in record.getMessage()
    assert "delete it" in record.getMessage()


def test_the_default_file_is_in_the_services_state_directory_or_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("STATE_DIRECTORY", f"{tmp_path / 'state'}:{tmp_path / 'other'}")
    assert adapt.corrections_path() == tmp_path / "state" / "corrections.json"
    monkeypatch.delenv("STATE_DIRECTORY")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert adapt.corrections_path() == tmp_path / "cache" / "edgecap" / "corrections.json"


def test_an_adapt_option_that_is_not_a_switch_is_one_line():
    from edgecap.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^adapt 'yes': use true, false, or leave it out"):
        CaptionerOptions(adapt="yes")


# ---------------------------------------------------------------------------
# Re-choosing.


@pytest.fixture(scope="module")
def bundle(shipped_bundle):
    return load_bundle(shipped_bundle)


@pytest.fixture(scope="module")
def start(bundle):
    return choose(bundle, CaptionerOptions(board=pipeline_board("devboard-usb"), timing_only=True))


def test_a_plan_split_under_corrections_keeps_the_profiles_predictions(bundle):
    nominal = plan_for_board(bundle, pipeline_board("devboard-usb"))
    slow = {"pci:0": Correction(0.25)}
    corrected = plan_for_board(bundle, pipeline_board("devboard-usb"), corrections=slow)
    assert [s.device for s in corrected.active_stages] != [s.device for s in nominal.active_stages]
    # Its predictions are the profile's: what is measured is compared with them, and emulation paces to them.
    for stage in corrected.active_stages:
        assert stage.predicted_ms == pytest.approx(stage.cost.total_ms, abs=1e-5)
    import edgecap_compile

    profile = edgecap_compile.make_board("devboard-usb")
    rates = dict(zip(edgecap_compile.plan.plan_devices(profile), (t.link_bytes_per_s for t in profile.tpus)))
    assert all(s.cost.link_bytes_per_s == rates[s.device] for s in corrected.stages if s.spec.kind == "tpu")
    # ... and under the corrections it is the better plan.
    assert price(corrected, slow).period_ms < price(nominal, slow).period_ms / 1.05
    assert price(corrected).prediction() == corrected.predicted
    # No correction at all is the plan as compiled for the profile.
    assert plan_for_board(bundle, pipeline_board("devboard-usb"), corrections={}).stages == nominal.stages


def test_the_plan_best_under_the_corrections_runs_on_the_devices_own_workers(bundle, start):
    workers = _board_workers(start, planner.board_tpus(start))
    options = CaptionerOptions(board=pipeline_board("devboard-usb"), timing_only=True)
    assert choose_measured(bundle, options, start, {}, BundlePlans(), workers, 0.05) is None
    # Measured as the model says (within the margin): no switch.
    assert choose_measured(bundle, options, start, {"pci:0": Correction(1 / 1.03)}, BundlePlans(), workers,
                           0.05) is None
    found = choose_measured(bundle, options, start, {"pci:0": Correction(0.25)}, BundlePlans(), workers, 0.05)
    assert found is not None
    choice, why = found
    assert choice.how == "measured" and "under the corrections" in why
    assert "pci:0" not in {s.stage.device for s in choice.stages}
    # usb:0 is the board's second TPU: it runs on emu-tpu:1, as it would have before.
    assert choice.workers["usb:0"].index == 1 and choice.workers["usb:0"].kind == "emu-tpu"


def test_on_real_tpus_only_plans_edgetpu_compiler_compiled_are_chosen(bundle, start):
    from edgecap.devices import DeviceSpec

    real = {DeviceSpec("tpu", 0, bus): DeviceSpec("tpu", 0, bus) for bus in ("pci", "usb")}
    options = CaptionerOptions(board=pipeline_board("devboard-usb"))
    # The re-partition made here has no compiled segments (no edgetpu_compiler): not for a real TPU.
    assert choose_measured(bundle, options, start, {"pci:0": Correction(0.25)}, BundlePlans(), real, 0.05) is None


class _Recorder:
    def __init__(self, answer=None) -> None:
        self.calls: List[Dict[str, Correction]] = []
        self.answer = answer

    def __call__(self, choice, corrections):
        self.calls.append(dict(corrections))
        return self.answer


def _feed(adapter: Adapter, start, seconds: float, scale: Dict[str, float]) -> None:
    predicted = {str(r.worker): r.stage.predicted_ms for r in start.stages}
    rnn = start.plan.rnn_frame_ms
    cpu = next((r.stage for r in start.stages if r.stage.device == "cpu"), None)
    if cpu is not None:  # a CNN stage on the CPU; its predicted time includes the RNN steps
        predicted["cpu"] = cpu.predicted_ms - rnn
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        times = {w: ms * scale.get(w, 1.0) for w, ms in predicted.items()}
        times["rnn_step"] = rnn * scale.get("cpu", 1.0)
        adapter.observe(times)
        time.sleep(0.002)


def _wait(adapter: Adapter, recorder: _Recorder, calls: int) -> None:
    deadline = time.monotonic() + 10
    while len(recorder.calls) < calls and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_healthy_board_refits_nothing(start):
    recorder = _Recorder()
    adapter = Adapter("devboard-usb", {}, recorder, True, None, _fast_policy())
    adapter.started(start)
    _feed(adapter, start, 0.5, {})
    adapter.close()
    assert recorder.calls == [] and adapter.corrections == {}


def test_a_burst_shorter_than_the_dwell_refits_nothing(start):
    recorder = _Recorder()
    adapter = Adapter("devboard-usb", {}, recorder, True, None, _fast_policy(dwell_s=0.6))
    adapter.started(start)
    _feed(adapter, start, 0.3, {"emu-tpu:0": 3.0})
    _feed(adapter, start, 0.3, {})  # back within the threshold: the dwell starts again
    _feed(adapter, start, 0.3, {"emu-tpu:0": 3.0})
    adapter.close()
    assert recorder.calls == []


def test_a_device_that_stays_off_gets_its_correction_refitted_and_saved(start, tmp_path):
    store = tmp_path / "corrections.json"
    recorder = _Recorder()
    adapter = Adapter("devboard-usb", {}, recorder, True, store, _fast_policy())
    adapter.started(start)
    _feed(adapter, start, 0.4, {"emu-tpu:0": 3.0})
    _wait(adapter, recorder, 1)
    adapter.close()
    (corrections,) = recorder.calls[:1]
    assert set(corrections) == {"pci:0"}
    assert corrections["pci:0"].speed == pytest.approx(1 / 3, rel=0.02)
    assert adapt.load_corrections(store, "devboard-usb")["pci:0"].speed == pytest.approx(1 / 3, rel=0.02)
    # Once refitted, what it measures is what it expects: no second refit.
    assert len(recorder.calls) == 1


def _one_refit(board: str, start, slow: Dict[str, float]) -> Dict[str, Correction]:
    """Runs an adapter on ``start`` with workers ``slow`` times their paced time; returns its one refit."""
    recorder = _Recorder()
    adapter = Adapter(board, {}, recorder, True, None, _fast_policy())
    adapter.started(start)
    _feed(adapter, start, 0.4, slow)
    _wait(adapter, recorder, 1)
    adapter.close()
    (corrections,) = recorder.calls
    return corrections


def test_the_cpus_rnn_steps_are_its_time_when_it_runs_no_cnn_stage(bundle):
    # Coral's default, the whole CNN on pci:0: the CPU runs the RNN steps only.
    plan = plan_for_board(bundle, pipeline_board("devboard-usb"), whole_on_tpu=True)
    start = choose(bundle, CaptionerOptions(plan=plan, emulate=True, timing_only=True))
    assert "cpu" not in start.workers
    corrections = _one_refit("devboard-usb", start, {"cpu": 3.0})
    assert corrections["cpu"].speed == pytest.approx(1 / 3, rel=0.02)
    # ... and a plan's period counts them.
    assert price(start.plan, {"cpu": Correction(0.1)}).period_ms == pytest.approx(10 * start.plan.rnn_frame_ms)


def test_an_older_plan_without_cost_parts_is_corrected_by_its_time_alone(shipped_bundle, bundle, tmp_path):
    from runtime_plans import write_plan

    path = write_plan(shipped_bundle / "encoder.tflite", [20], ["tpu:0", "cpu"], tmp_path, [4.0, 2.0])
    older = choose(bundle, CaptionerOptions(plan=path, emulate=True, timing_only=True))
    assert all(s.stage.cost is None for s in older.stages)
    corrections = _one_refit("test", older, {"emu-tpu:0": 2.0})
    assert set(corrections) == {"tpu:0"} and corrections["tpu:0"].link_bytes_per_s is None
    assert corrections["tpu:0"].speed == pytest.approx(0.5, rel=0.02)


def test_an_adapter_that_may_not_switch_only_measures(start):
    recorder = _Recorder()
    adapter = Adapter("devboard-usb", {}, recorder, False, None, _fast_policy())
    adapter.started(start)
    _feed(adapter, start, 0.3, {"emu-tpu:0": 3.0})
    adapter.close()
    assert recorder.calls == []


# ---------------------------------------------------------------------------
# The running board.


@pytest.mark.usefixtures("no_leaked_threads")
def test_a_healthy_emulated_board_never_switches(shipped_bundle, frames, monkeypatch, tmp_path):
    monkeypatch.delenv(TRUTH, raising=False)
    store = tmp_path / "corrections.json"
    with EdgeCaptioner(shipped_bundle, board=pipeline_board("devboard-usb"), timing_only=True, corrections=store) as cap:
        assert _run(cap, frames, 1200) == 1200
        stats = cap.stats()
    assert stats.switches == 0 and not stats.failovers and stats.corrections == {}
    assert not store.exists()
    by_name = {s.name: s for s in stats.stages}
    tpu = by_name["stage 0 (pci:0)"]
    assert tpu.predicted_ms == pytest.approx(1.41, abs=0.01)
    # An emulated device's time is its paced time (modelled): what this loaded host adds is not the board's.
    assert tpu.measured_ms == pytest.approx(tpu.predicted_ms, rel=1e-6)
    assert by_name["rnn_step"].measured_ms == pytest.approx(by_name["rnn_step"].predicted_ms, rel=1e-6)


def test_an_isolated_emulated_stage_is_not_measured_by_this_hosts_clock(shipped_bundle, frames, monkeypatch,
                                                                         tmp_path):
    # Its worker process paces it and reports the paced time: the wall time seen here
    # adds this host's load and the IPC, and must not be learned as the board's.
    monkeypatch.delenv(TRUTH, raising=False)
    with EdgeCaptioner(shipped_bundle, board=pipeline_board("devboard-usb"), timing_only=True, isolate=True,
                       corrections=tmp_path / "corrections.json") as cap:
        _run(cap, frames, 200)
        stats = cap.stats()
    by_name = {s.name: s for s in stats.stages}
    tpu = by_name["stage 0 (pci:0)"]
    assert tpu.measured_ms == pytest.approx(tpu.predicted_ms, rel=1e-6)
    assert stats.switches == 0 and stats.corrections == {}


@pytest.mark.usefixtures("no_leaked_threads")
def test_a_slowed_tpu_is_left_for_the_plan_best_for_the_board_and_remembered(shipped_bundle, frames,
                                                                                 monkeypatch, tmp_path):
    monkeypatch.setenv(TRUTH, "pci:0=speed:0.25")
    store = tmp_path / "corrections.json"
    with EdgeCaptioner(shipped_bundle, board=pipeline_board("devboard-usb"), timing_only=True, corrections=store) as cap:
        assert [r.stage.device for r in cap.choice.stages][0] == "pci:0"
        _run(cap, frames, 1200)
        stats = cap.stats()
        final = cap.choice
    assert stats.switches >= 1
    record = next(f for f in stats.failovers if f.kind == "measured")
    assert record.how == "measured" and "pci:0" in record.device and "predicted" in record.detail
    assert "pci:0" not in {r.stage.device for r in final.stages}
    assert stats.corrections["pci:0"]["speed"] < 0.5
    # The service's metric and API keep reading compute_scale, the inverse.
    assert stats.corrections["pci:0"]["compute_scale"] == pytest.approx(1 / stats.corrections["pci:0"]["speed"],
                                                                       rel=1e-3)
    # The next start begins on the plan best under what was learned.
    with EdgeCaptioner(shipped_bundle, board=pipeline_board("devboard-usb"), timing_only=True, corrections=store) as cap:
        assert cap.choice.how == "measured" and cap.choice.reason.startswith("learned corrections")
        assert "pci:0" not in {r.stage.device for r in cap.choice.stages}


@pytest.mark.usefixtures("no_leaked_threads")
def test_captions_across_a_switch_are_those_of_a_run_without_one(shipped_bundle, frames, monkeypatch,
                                                                  two_tpu_board):
    n = 320
    monkeypatch.delenv(TRUTH, raising=False)
    with EdgeCaptioner(shipped_bundle, board=two_tpu_board, num_threads=1, adapt=False) as cap:
        reference = [c.text for c in cap.caption_frames([f.image for f in (frames * 40)[:n]])]
    monkeypatch.setenv(TRUTH, "usb:0=speed:0.2")
    with EdgeCaptioner(shipped_bundle, board=two_tpu_board, num_threads=1, adapt=True) as cap:
        texts = [c.text for c in cap.caption_frames([f.image for f in (frames * 40)[:n]])]
        stats = cap.stats()
    assert stats.switches >= 1, stats.failovers
    assert all(f.lost_windows == 0 for f in stats.failovers) and stats.replayed > 0
    assert texts == reference
