"""Device strings, stage runners on cpu / emu-tpu, EdgeTPU enumeration."""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence
import json
from unittest import mock
import time
from pathlib import Path

import numpy as np
import pytest

from edgecap import devices, stages
from edgecap.cli import format_devices
from edgecap.devices import DeviceSpec, list_devices, parse_device
from edgecap.stages import open_stage
from edgecap.errors import ConfigError, EdgecapError, PlanError
from edgecap.interpreter import make_cpu_interpreter
from edgecap.plans.plan import load_plan
from runtime_plans import write_plan
from tpu_compare import MIN_CAPTION_AGREEMENT, assert_close_in_steps, caption_agreement, step_diff

TINY = Path(__file__).resolve().parent / "data" / "runtime" / "tiny_encoder.tflite"


@pytest.mark.parametrize("text,spec,option", [
    ("tpu:0", DeviceSpec("tpu", 0), ":0"),
    ("tpu", DeviceSpec("tpu", 0), ":0"),
    (":1", DeviceSpec("tpu", 1), ":1"),
    ("usb", DeviceSpec("tpu", None, "usb"), "usb"),
    ("USB:1", DeviceSpec("tpu", 1, "usb"), "usb:1"),
    ("pci", DeviceSpec("tpu", None, "pci"), "pci"),
    ("pci:0", DeviceSpec("tpu", 0, "pci"), "pci:0"),
])
def test_coral_device_strings(text: str, spec: DeviceSpec, option: str) -> None:
    assert parse_device(text) == spec
    assert spec.delegate_option == option


@pytest.mark.parametrize("text,spec", [
    ("cpu", DeviceSpec("cpu")), ("cpu:1", DeviceSpec("cpu", 1)), ("emu-tpu:1", DeviceSpec("emu-tpu", 1)),
])
def test_cpu_and_emulated_device_strings(text: str, spec: DeviceSpec) -> None:
    assert parse_device(text) == spec
    assert str(spec) == text


@pytest.mark.parametrize("text", ["gpu", "tpu:x", "", "tpu:-1", "usb0", "emu-tpu:"])
def test_bad_device_strings(text: str) -> None:
    with pytest.raises(ConfigError, match="not understood"):
        parse_device(text)


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan")
    write_plan(TINY, [1, 2], ["tpu:0", "tpu:1", "cpu"], out, [30.0, 20.0, 1.0])
    return load_plan(out)


def _frame(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(-128, 128, (1, 16, 16, 3), dtype=np.int8)


def _full_model(x: np.ndarray) -> np.ndarray:
    interp = make_cpu_interpreter(TINY)
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"])


def test_chained_stages_equal_the_whole_model_exactly(plan) -> None:
    runners = [open_stage(s, "cpu") for s in plan.stages]
    for seed in range(3):
        x = _frame(seed)
        tensors = {plan.inputs[0].name: x}
        for runner in runners:
            tensors = runner(tensors)
        assert list(tensors) == [plan.outputs[0].name]
        np.testing.assert_array_equal(tensors[plan.outputs[0].name], _full_model(x))


def test_stage_forwards_the_tensors_that_pass_it_by(plan) -> None:
    stage = plan.stages[1]
    tensors = open_stage(plan.stages[0], "cpu")({plan.inputs[0].name: _frame(0)})
    out = open_stage(stage, "cpu")(tensors)
    assert set(out) == {t.name for t in stage.outputs} and len(out) == 2
    passing = ({t.name for t in stage.inputs} & set(out)).pop()
    assert out[passing] is tensors[passing]


def test_emulated_tpu_is_exact_and_never_faster_than_predicted(plan) -> None:
    stage = plan.stages[0]
    emu, cpu = open_stage(stage, "emu-tpu:0"), open_stage(stage, "cpu")
    x = {plan.inputs[0].name: _frame(1)}
    for _ in range(3):
        t0 = time.perf_counter()
        out = emu(x)
        assert time.perf_counter() - t0 >= stage.predicted_ms / 1000
    name = stage.outputs[0].name
    np.testing.assert_array_equal(out[name], cpu(x)[name])


def test_timing_only_emulation_outputs_zeros_at_the_predicted_pace(plan) -> None:
    stage = plan.stages[1]
    runner = open_stage(stage, "emu-tpu:1", timing_only=True)
    t0 = time.perf_counter()
    out = runner({})
    elapsed = time.perf_counter() - t0
    # Paced, not computed: never early, and late by no more than a loaded host's sleep overshoot.
    assert stage.predicted_ms / 1000 <= elapsed < stage.predicted_ms / 1000 + 0.02
    for spec in stage.outputs:
        assert out[spec.name].shape == spec.shape and out[spec.name].dtype == np.dtype(spec.dtype)
        assert not out[spec.name].any()


def test_pacing_a_cpu_stage_for_board_emulation(plan) -> None:
    stage = plan.stages[2]
    runner = open_stage(stage, "cpu", pace_ms=stage.predicted_ms)
    tensors = open_stage(plan.stages[1], "cpu")(open_stage(plan.stages[0], "cpu")({plan.inputs[0].name: _frame(2)}))
    t0 = time.perf_counter()
    runner(tensors)
    assert time.perf_counter() - t0 >= stage.predicted_ms / 1000


def test_emulation_needs_a_prediction(tmp_path: Path) -> None:
    write_plan(TINY, [], ["cpu"], tmp_path)
    (stage,) = load_plan(tmp_path).stages
    with pytest.raises(ConfigError, match="predicted_ms"):
        open_stage(stage, "emu-tpu:0")


@pytest.fixture
def libedgetpu(monkeypatch):
    """Pretends libedgetpu.so.1 is installed (only the child probe; the delegate is stubbed per test)."""
    monkeypatch.setattr(stages.edgetpu_runtime, "check", lambda *args: None)


def test_missing_libedgetpu_is_one_line_before_load_delegate(monkeypatch) -> None:
    def load_delegate(library, options, backend=None):
        raise AssertionError("load_delegate must not run without the library")

    monkeypatch.setenv("EDGECAP_EDGETPU_LIBRARY", "libedgetpu.so.1")
    monkeypatch.setattr(stages.edgetpu_runtime, "resolve_library", lambda library: None)
    monkeypatch.setattr(stages.edgetpu_runtime, "_run_probe", lambda *args: stages.edgetpu_runtime.ProbeResult(
        "no-library", "libedgetpu.so.1: cannot open shared object file"))
    monkeypatch.setattr(stages.interpreter, "load_delegate", load_delegate)
    with pytest.raises(EdgecapError, match="usb:1: libedgetpu.so.1 not found; install") as err:
        stages.load_edgetpu_delegate(parse_device("usb:1"))
    assert "\n" not in str(err.value)


def test_delegate_failure_is_a_one_line_error(libedgetpu, monkeypatch) -> None:
    seen = {}

    def no_device(library, options, backend=None):
        seen.update(options)
        raise ValueError(f"Failed to load delegate from {library}\n")

    monkeypatch.setattr(stages.interpreter, "load_delegate", no_device)
    with pytest.raises(EdgecapError, match="tpu:1: cannot open the EdgeTPU") as err:
        stages.load_edgetpu_delegate(parse_device("tpu:1"))
    assert "\n" not in str(err.value)
    assert seen == {"device": ":1"}


def test_delegate_interpreter_failure_is_a_one_line_error(plan, libedgetpu, monkeypatch) -> None:
    def interpreter_fails(model, delegates, backend=None):
        raise RuntimeError("Encountered unresolved custom op: edgetpu-custom-op")

    monkeypatch.setattr(stages.interpreter, "load_delegate", lambda library, options, backend=None: object())
    monkeypatch.setattr(stages.interpreter, "make_delegate_interpreter", interpreter_fails)
    stage = dataclasses.replace(plan.stages[0], compiled_segment=plan.stages[0].segment)
    with pytest.raises(EdgecapError, match="tpu:0: cannot run .* on the EdgeTPU") as err:
        open_stage(stage)
    assert "\n" not in str(err.value)


def _fake_tree(root: Path, usb: dict, apex: dict, model: Optional[str] = None,
               trips: Optional[dict] = None, compatible: Sequence[str] = ()) -> Path:
    """A fake device tree: USB devices (name -> vendor, product[, speed in Mbit/s]), PCIe TPUs
    (index -> milli-°C), the apex driver's trip points (index -> three milli-°C values), and the
    device tree's model and compatible strings."""
    for name, ids in usb.items():
        dev = root / "sys" / "bus" / "usb" / "devices" / name
        dev.mkdir(parents=True)
        (dev / "idVendor").write_text(ids[0] + "\n")
        (dev / "idProduct").write_text(ids[1] + "\n")
        if len(ids) > 2:
            (dev / "speed").write_text(f"{ids[2]}\n")
    for n, temp in apex.items():
        (root / "dev").mkdir(parents=True, exist_ok=True)
        (root / "dev" / f"apex_{n}").touch()
        (root / "sys" / "class" / "apex" / f"apex_{n}").mkdir(parents=True)
        (root / "sys" / "class" / "apex" / f"apex_{n}" / "temp").write_text(f"{temp}\n")
    for n, points in (trips or {}).items():
        for i, milli in enumerate(points):
            (root / "sys" / "class" / "apex" / f"apex_{n}" / f"trip_point{i}_temp").write_text(f"{milli}\n")
    if model is not None or compatible:
        (root / "proc" / "device-tree").mkdir(parents=True)
    if model is not None:
        (root / "proc" / "device-tree" / "model").write_bytes(model.encode() + b"\0")
    if compatible:
        (root / "proc" / "device-tree" / "compatible").write_bytes(b"".join(c.encode() + b"\0" for c in compatible))
    return root


def test_enumeration_probes_pcie_and_coral_usb_ids(tmp_path: Path) -> None:
    root = _fake_tree(tmp_path, {"1-1": ("18d1", "9302"), "1-2": ("046d", "0825"), "2-1": ("1a6e", "089a")},
                      {0: 47250})
    infos = list_devices(root)
    assert [(i.device, i.kind) for i in infos] == [("cpu", "cpu"), ("tpu:0", "pci"), ("tpu:1", "usb"), ("tpu:2", "usb")]
    assert infos[1].temperature_c == pytest.approx(47.25)
    # libedgetpu's order: PCIe, then USB TPUs still in their bootloader, then loaded ones.
    assert infos[2].path.endswith("2-1") and infos[3].path.endswith("1-1")
    assert [i.state for i in infos] == [None, None, "dfu", "loaded"]
    assert [i.throttled for i in infos] == [None, False, None, None]  # USB TPUs report no temperature
    table = format_devices(infos)
    assert table.splitlines()[0].split()[:5] == ["DEVICE", "KIND", "PATH", "TEMP", "THROTTLED"]
    assert "47.2C" in table and len(table.splitlines()) == 5
    assert table.splitlines()[2].split()[3:5] == ["47.2C", "no"]


def test_usb_tpus_are_listed_as_libedgetpu_indexes_them(tmp_path: Path) -> None:
    # The case: 1-1 loaded, 1-2 still in DFU. libedgetpu's :0 is 1-2 (DFU devices first);
    # edgecap listed 1-1 as tpu:0 before.
    root = _fake_tree(tmp_path, {"1-1": ("18d1", "9302", "5000"), "1-2": ("1a6e", "089a", "480")}, {})
    infos = list_devices(root)[1:]
    assert [(i.device, Path(i.path).name, i.state, i.speed_mbps) for i in infos] == [
        ("tpu:0", "1-2", "dfu", 480), ("tpu:1", "1-1", "loaded", 5000)]


def test_throttling_follows_the_apex_trip_points(tmp_path: Path) -> None:
    # apex_0 below the default 85 C; apex_1 past 90 C; apex_2's driver lowered its trip points.
    root = _fake_tree(tmp_path, {}, {0: 84900, 1: 91000, 2: 70000},
                      trips={2: (65000, 75000, 80000)})
    states = devices.tpu_thermals(root / "sys")
    assert [(t.name, t.level, t.throttled) for t in states] == [
        ("apex_0", 0, False), ("apex_1", 2, True), ("apex_2", 1, True)]
    assert states[0].trip_points_c == devices.APEX_TRIP_POINTS_C == (85.0, 90.0, 95.0)
    assert states[2].trip_points_c == (65.0, 75.0, 80.0)
    assert devices.thermal("/dev/apex_1", root / "sys") == states[1]
    assert devices.thermal("/sys/bus/usb/devices/1-1", root / "sys") is None
    table = format_devices(list_devices(root))
    assert [line.split()[4] for line in table.splitlines()[2:]] == ["no", "yes", "yes"]
    assert devices.tpu_thermals(tmp_path / "nowhere") == []


def test_throttling_warns_once_per_transition(tmp_path: Path, caplog) -> None:
    import logging

    watch = devices.ThrottleWatch(logging.getLogger("edgecap"))
    apex = _fake_tree(tmp_path, {}, {0: 80000}) / "sys" / "class" / "apex" / "apex_0"
    seen = []
    with caplog.at_level(logging.INFO, logger="edgecap"):
        for milli in (80000, 86000, 91000, 86000, 70000, 96000):
            (apex / "temp").write_text(f"{milli}\n")
            seen.append(watch.update("tpu:0", devices.apex_thermal(apex)))
        assert watch.update("tpu:1", None) is False
    assert seen == [False, True, True, True, False, True]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "\n" not in warnings[0]
    assert "tpu:0 (apex_0) is throttling at 86.0 C (trip point 85 C)" in warnings[0]
    assert "1/8" in warnings[1]
    assert sum("no longer throttled" in r.getMessage() for r in caplog.records) == 1


def _noisy(x: np.ndarray, rng, share: float, steps: int) -> np.ndarray:
    """``x`` with ``share`` of its values moved ``steps`` quantization steps, as an EdgeTPU might."""
    moved = x.astype(np.int64).ravel()
    hit = rng.permutation(moved.size)[:round(share * moved.size)]
    moved[hit] += np.where(moved[hit] >= 0, -steps, steps)  # away from the edge: never clipped
    return moved.reshape(x.shape).astype(x.dtype)


def test_step_comparison_accepts_the_edgetpus_rounding_and_nothing_more() -> None:
    rng = np.random.default_rng(0)
    cpu = np.concatenate([_full_model(_frame(seed)) for seed in range(16)])
    assert step_diff(cpu, np.concatenate([_full_model(_frame(seed)) for seed in range(16)])) == step_diff(cpu, cpu)
    assert step_diff(cpu, cpu).max_steps == 0 and step_diff(cpu, cpu).within_one == 1.0
    off_by_one = _noisy(cpu, rng, 0.5, 1)
    d = assert_close_in_steps(off_by_one, cpu)
    assert d.max_steps == 1 and d.within_one == 1.0 and not np.array_equal(off_by_one, cpu)
    # A few values further off pass; too many, or one far off, do not.
    assert_close_in_steps(_noisy(cpu, rng, 0.05, 3), cpu)
    with pytest.raises(AssertionError, match="within 1 step"):
        assert_close_in_steps(_noisy(cpu, rng, 0.3, 2), cpu)
    far = cpu.copy()
    far.flat[0] = far.flat[0] - 11 if far.flat[0] >= 0 else far.flat[0] + 11
    with pytest.raises(AssertionError, match="max 11 steps"):
        assert_close_in_steps(far, cpu)
    with pytest.raises(ValueError, match="one shape and dtype"):
        step_diff(cpu, cpu.astype(np.float32))


def test_caption_agreement_counts_identical_windows() -> None:
    assert caption_agreement(["a man walks", "a dog runs"], ["a man walks", "a dog sits"]) == 0.5
    assert caption_agreement([], []) == 1.0
    with pytest.raises(ValueError, match="different windows"):
        caption_agreement(["a"], [])


def test_this_machine_lists_its_cpu() -> None:
    infos = list_devices()
    assert infos[0].device == "cpu" and "ai-edge-litert" in infos[0].runtime


# Needs no EdgeTPU (no delegate may load), so it runs in the default suite.
def test_uncompiled_segment_is_refused_on_a_real_edgetpu(plan, monkeypatch) -> None:
    def load_delegate(library, options):
        raise AssertionError("no delegate may be loaded for an uncompiled segment")

    monkeypatch.setattr(stages.interpreter, "load_delegate", load_delegate)
    with pytest.raises(PlanError, match="stage 0 on tpu:0: .* not compiled by edgetpu_compiler") as err:
        open_stage(plan.stages[0])
    assert "\n" not in str(err.value)
    open_stage(plan.stages[0], "emu-tpu:0")  # the way out the message names


@pytest.mark.tpu
def test_real_edgetpu_runs_a_compiled_segment_like_the_cpu(plan) -> None:
    from edgecap_compile.edgetpu import compile_segment, find_compiler

    if not any(i.kind in ("pci", "usb") for i in list_devices()) or find_compiler() is None:
        pytest.skip("needs a Coral EdgeTPU and edgetpu_compiler")
    stage = plan.stages[0]
    report = compile_segment(find_compiler(), stage.segment)
    assert report.compiled, report.reason
    compiled = dataclasses.replace(stage, compiled_segment=stage.segment.parent / report.compiled_segment)
    tpu, cpu = open_stage(compiled, "tpu:0"), open_stage(stage, "cpu")
    name = stage.outputs[0].name
    for seed in range(4, 12):
        x = {plan.inputs[0].name: _frame(seed)}
        # Not bit-equal: the EdgeTPU rounds differently (google-coral/edgetpu#503, #382).
        assert_close_in_steps(tpu(x)[name], cpu(x)[name])


# edgetpu_compiler runs only on x86-64, so on a board this uses the plans the bundle carries.
@pytest.mark.tpu
def test_real_edgetpu_captions_like_the_cpu(shipped_bundle) -> None:
    from conftest import SAMPLE_CLIP
    from edgecap.bundle import load_bundle
    from edgecap.captioner import EdgeCaptioner
    from edgecap.options import CaptionerOptions
    from edgecap.plans.plan import single_cpu_plan
    from edgecap.planner import choose, tpus_used

    bundle = load_bundle(shipped_bundle)
    choice = choose(bundle, CaptionerOptions(), devices.detect_hardware())
    if not tpus_used(choice.plan):
        pytest.skip(f"no bundle plan runs on the attached EdgeTPUs: {choice.reason}")
    with EdgeCaptioner(bundle, plan=choice.plan, emulate=False) as cap:
        tpu = [c.text for c in cap.stream(str(SAMPLE_CLIP))]
    with EdgeCaptioner(bundle, plan=single_cpu_plan(bundle.encoder_model)) as cap:
        cpu = [c.text for c in cap.stream(str(SAMPLE_CLIP))]
    assert caption_agreement(tpu, cpu) >= MIN_CAPTION_AGREEMENT, list(zip(tpu, cpu))


def _edited_stage(tmp_path: Path, edit, index: int = 0):
    write_plan(TINY, [1, 2], ["tpu:0", "tpu:1", "cpu"], tmp_path, [30.0, 20.0, 1.0])
    path = tmp_path / "plan.json"
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    # load_plan refuses such a plan itself (tests/test_bad_plan.py); open_stage's own
    # check, which covers plans built in memory, is what these tests are about.
    with mock.patch("edgecap.plans.plan._check_files"), mock.patch("edgecap.plans.plan._check_chain"):
        return load_plan(path).stages[index]


@pytest.mark.parametrize("edit,message", [
    (lambda d: d["stages"][0].update(segment=d["stages"][1]["segment"]), "reads .*, which the plan's inputs"),
    (lambda d: d["stages"][0]["inputs"][0].update(name="renamed"), "reads .*, which the plan's inputs"),
    (lambda d: d["stages"][0]["inputs"][0].update(dtype="uint8"), r"input .* is int8\[1, 16, 16, 3\], the plan says uint8"),
    (lambda d: d["stages"][0]["outputs"][0].update(shape=[1, 2]), r"output .* the plan says int8\[1, 2\]"),
])
def test_segment_that_does_not_match_its_stage_is_a_plan_error(tmp_path: Path, edit, message) -> None:
    stage = _edited_stage(tmp_path, edit)
    with pytest.raises(PlanError, match=message) as err:
        open_stage(stage, "cpu")
    assert "\n" not in str(err.value) and "re-run `edgecap compile`" in str(err.value)


def test_stage_output_neither_computed_nor_forwarded_is_a_plan_error(tmp_path: Path) -> None:
    def edit(doc):
        extra = dict(doc["stages"][2]["outputs"][0], name="ghost")
        doc["stages"][2]["outputs"].append(extra)

    with pytest.raises(PlanError, match="does not output ghost"):
        open_stage(_edited_stage(tmp_path, edit, 2), "cpu")


def test_devices_command_prints_the_table_and_json(capsys) -> None:
    from edgecap.cli import main

    assert main(["devices"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("DEVICE") and lines[1].startswith("cpu")
    assert main(["devices", "--json"]) == 0
    first = json.loads(capsys.readouterr().out.splitlines()[0])
    assert first["device"] == "cpu" and first["temperature_c"] is None and first["throttled"] is None


def test_devices_command_shows_what_the_board_learned(capsys, tmp_path: Path, caplog) -> None:
    from edgecap.adapt import save_corrections
    from edgecap.plans.pricing import Correction
    from edgecap.cli import main

    path = tmp_path / "corrections.json"
    assert main(["devices", "--corrections", str(path)]) == 0
    assert f"learned corrections ({path}): none" in capsys.readouterr().out
    save_corrections(path, "devboard-usb", {"pci:0": Correction(0.5, 37e6)}, {"pci:0": (1.4, 2.8)})
    assert main(["devices", "--corrections", str(path)]) == 0
    out = capsys.readouterr().out
    assert "devboard-usb pci:0: speed x0.50, link 37.0 MB/s; last measured 2.80 ms a frame, predicted 1.40" in out
    assert main(["devices", "--json", "--corrections", str(path)]) == 0
    (learned,) = json.loads(capsys.readouterr().out.splitlines()[-1])["corrections"]
    assert (learned["device"], learned["speed"], learned["measured_ms"]) == ("pci:0", 0.5, 2.8)
    assert learned["compute_scale"] == 2.0  # what this output said before speeds, kept for its readers
    # A corrupt file: one warning line, and the command still answers.
    path.write_text("{")
    assert main(["devices", "--corrections", str(path)]) == 0
    assert f"learned corrections ({path}): none" in capsys.readouterr().out
    assert len([r for r in caplog.records if "ignoring learned corrections" in r.getMessage()]) == 1


def test_bus_named_tpus_emulate_on_distinct_workers(tmp_path: Path) -> None:
    from edgecap import planner
    from edgecap.options import CaptionerOptions

    write_plan(TINY, [1, 2], ["pci:0", "usb:0", "cpu"], tmp_path, [30.0, 20.0, 1.0])
    # Emulated: the host rule (the one use of the bundle) does not apply.
    choice = planner._settle(None, CaptionerOptions(emulate=True), load_plan(tmp_path), how="plan", reason="")
    assert {k: str(w) for k, w in choice.workers.items()} == {"pci:0": "emu-tpu:0", "usb:0": "emu-tpu:1",
                                                              "cpu": "cpu"}
    # On real TPUs each stage opens its bus's device: libedgetpu's "pci:0" and "usb:0".
    assert [parse_device(d).delegate_option for d in ("pci:0", "usb:0")] == ["pci:0", "usb:0"]
