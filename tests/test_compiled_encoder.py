"""A bundle may carry an EdgeTPU-compiled encoder beside or instead of the CPU one (issue 17 item 1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from compiled_models import write_compiled
from edgecap import planner
from edgecap.plans import compiled_encoder
from edgecap.bundle import load_bundle
from edgecap.devices import DeviceInfo, Hardware
from edgecap.errors import BundleError, EdgecapError, PlanError
from edgecap.modelfile import open_model
from edgecap.options import CaptionerOptions
from edgecap.plans.plan import single_cpu_plan

CORAL = Path(__file__).resolve().parent / "data" / "coral"
MIRROR = Path("/work/.mirror/google-coral+test_data/repo")


def _twin(bundle: Path, name: str = "encoder_edgetpu.tflite") -> Path:
    """Writes a compiled twin of the bundle's encoder: same boundary, one edgetpu-custom-op."""
    enc, _ = open_model(bundle / "encoder.tflite")
    spec = [[(t.name, t.shape, t.dtype, t.scale, t.zero_point) for t in ts] for ts in (enc.inputs, enc.outputs)]
    return write_compiled(bundle / name, *spec)


def _edit(bundle: Path, **fields) -> None:
    doc = json.loads((bundle / "bundle.json").read_text())
    doc.update(fields)
    (bundle / "bundle.json").write_text(json.dumps(doc))


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgecap.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


@pytest.fixture
def with_twin(bundle_copy: Path) -> Path:
    _twin(bundle_copy)
    _edit(bundle_copy, edgetpu_encoder="encoder_edgetpu.tflite")
    return bundle_copy


@pytest.fixture
def compiled_only(bundle_copy: Path) -> Path:
    _twin(bundle_copy)
    _edit(bundle_copy, encoder="encoder_edgetpu.tflite")
    (bundle_copy / "encoder.tflite").unlink()
    return bundle_copy


def _hardware(tpus: int) -> Hardware:
    return Hardware(model=None, family=None,
                    tpus=tuple(DeviceInfo(f"usb:{i}", "usb", f"/sys/usb{i}", "libedgetpu") for i in range(tpus)))


def test_a_compiled_twin_loads_and_validate_says_the_bundle_has_both(with_twin: Path) -> None:
    b = load_bundle(with_twin)
    assert b.cpu_encoder.path.name == "encoder.tflite"
    assert b.compiled_encoder.path.name == "encoder_edgetpu.tflite" and b.compiled_encoder.edgetpu
    assert compiled_encoder.describe(b) == "encoder: CPU encoder.tflite + EdgeTPU-compiled encoder_edgetpu.tflite"


def test_a_compiled_only_bundle_loads_where_it_was_refused_as_corrupt(compiled_only: Path) -> None:
    # Before: "corrupt or truncated TFLite model (Encountered unresolved custom op: edgetpu-custom-op.)".
    b = load_bundle(compiled_only)
    assert b.cpu_encoder is None and b.compiled_encoder.path.name == "encoder_edgetpu.tflite"
    assert compiled_encoder.describe(b).endswith("(compiled only: needs an EdgeTPU)")


def test_with_a_tpu_the_compiled_encoder_runs_on_it_and_without_one_the_cpu_twin(with_twin: Path) -> None:
    b = load_bundle(with_twin)
    on_tpu = planner.choose(b, CaptionerOptions(), _hardware(1))
    stage = on_tpu.plan.active_stages[0]
    assert (str(stage.spec), stage.compiled_segment.name, stage.segment.name) == \
        ("tpu:0", "encoder_edgetpu.tflite", "encoder.tflite")
    assert on_tpu.fallback is None and "EdgeTPU-compiled encoder on tpu:0" in on_tpu.reason
    on_cpu = planner.choose(b, CaptionerOptions(), _hardware(0))
    assert [(str(s.spec), s.segment.name) for s in on_cpu.plan.active_stages] == [("cpu", "encoder.tflite")]


def test_a_compiled_only_bundle_on_a_cpu_only_host_is_refused_in_one_line(compiled_only: Path) -> None:
    b = load_bundle(compiled_only)
    with pytest.raises(EdgecapError, match=r"is EdgeTPU-compiled and no EdgeTPU is attached .*: attach an "
                                           r"EdgeTPU, or add the CPU model it was compiled from") as err:
        planner.choose(b, CaptionerOptions(), _hardware(0))
    assert "\n" not in str(err.value)
    assert planner.choose(b, CaptionerOptions(), _hardware(1)).plan.active_stages[0].compiled_segment.name == \
        "encoder_edgetpu.tflite"


def test_caption_of_a_compiled_only_bundle_on_a_cpu_only_host_exits_2_in_one_line(compiled_only: Path,
                                                                                   tmp_path: Path) -> None:
    r = _cli("caption", "--bundle", str(compiled_only), cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "no EdgeTPU is attached" in lines[0] and "Traceback" not in r.stderr


def test_validate_prints_which_encoders_the_bundle_has(with_twin: Path, tmp_path: Path) -> None:
    r = _cli("validate", str(with_twin), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "encoder: CPU encoder.tflite + EdgeTPU-compiled encoder_edgetpu.tflite" in r.stdout


@pytest.mark.parametrize("setup, match", [
    (lambda b: _edit(b, edgetpu_encoder="encoder_float.tflite"),
     r"field 'edgetpu_encoder' of .* names a model edgetpu_compiler did not compile"),
    (lambda b: (_twin(b, "other_edgetpu.tflite"), _edit(b, encoder="other_edgetpu.tflite")),
     r"fields 'encoder' and 'edgetpu_encoder' both name EdgeTPU-compiled models"),
    (lambda b: (write_compiled(b / "encoder_edgetpu.tflite", [("x", (1, 64, 64, 3), "uint8", 0.5, 128)],
                               [("y", (1, 128), "uint8", 0.5, 0)])),
     r"encoder_edgetpu.tflite: input is uint8\[1, 64, 64, 3\] scale 0.5 zero point 128 but the encoder's is "
     r"int8\[1, 64, 64, 3\].*compile 'edgetpu_encoder' from the bundle's own encoder"),
    (lambda b: (_twin(b, "step_edgetpu.tflite"),
                _edit(b, rnn=dict(json.loads((b / "bundle.json").read_text())["rnn"],
                                  encoder_step="step_edgetpu.tflite"))),
     r"field 'rnn.encoder_step' names an EdgeTPU-compiled model, but the RNN step models run on the CPU"),
])
def test_a_wrong_compiled_encoder_is_refused_in_one_line(with_twin: Path, setup, match: str) -> None:
    setup(with_twin)
    with pytest.raises(BundleError, match=match) as err:
        load_bundle(with_twin)
    assert "\n" not in str(err.value)


def test_a_compiled_model_never_goes_to_a_cpu_interpreter(with_twin: Path) -> None:
    with pytest.raises(PlanError, match=r"EdgeTPU-compiled \(edgetpu-custom-op\), so it cannot run on the CPU"):
        single_cpu_plan(with_twin / "encoder_edgetpu.tflite")


def test_compile_of_a_compiled_model_is_refused_in_one_line(with_twin: Path, tmp_path: Path) -> None:
    # Before: "has only 1 ops; use --tpus 0", and following that wrote a plan that could never run.
    r = _cli("compile", str(with_twin / "encoder_edgetpu.tflite"), "--board", "devboard",
             "-o", str(tmp_path / "out"), cwd=tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "is already compiled by edgetpu_compiler" in lines[0]
    assert "--tpus" not in lines[0] and not (tmp_path / "out" / "plan.json").exists()


def test_coral_compiled_file_is_recognised_not_called_corrupt() -> None:
    # tests/data/coral/: google-coral/test_data, Apache-2.0 (README there).
    model, _ = open_model(CORAL / "split_concat_edgetpu.tflite")
    cpu, _ = open_model(CORAL / "split_concat.tflite")
    assert model.edgetpu and not cpu.edgetpu
    assert [(t.name, t.shape, t.dtype, t.quantization) for t in model.inputs + model.outputs] == \
        [(t.name, t.shape, t.dtype, t.quantization) for t in cpu.inputs + cpu.outputs]


@pytest.mark.slow
@pytest.mark.skipif(not MIRROR.is_dir(), reason="google-coral/test_data mirror not present")
def test_coral_embedding_extractor_and_its_compiled_twin_agree(tmp_path: Path) -> None:
    from edgecap.bundle import _check_twin

    paths = {}
    for name in ("mobilenet_v1_1.0_224_quant_embedding_extractor.tflite",
                 "mobilenet_v1_1.0_224_quant_embedding_extractor_edgetpu.tflite"):
        paths[name] = tmp_path / name
        paths[name].write_bytes(subprocess.run(["git", "-C", str(MIRROR), "show", f"HEAD:{name}"],
                                               capture_output=True, check=True).stdout)
    cpu, compiled = (open_model(p)[0] for p in paths.values())
    assert compiled.edgetpu and not cpu.edgetpu
    _check_twin(tmp_path / "bundle.json", cpu, compiled)  # same boundary: accepted as twins


@pytest.mark.tpu
@pytest.mark.skipif(not MIRROR.is_dir(), reason="google-coral/test_data mirror not present")
def test_real_edgetpu_runs_the_compiled_twin_close_to_the_cpu(tmp_path: Path) -> None:
    import dataclasses

    from edgecap.devices import list_devices
    from edgecap.stages import open_stage

    if not any(i.kind in ("pci", "usb") for i in list_devices()):
        pytest.skip("needs a Coral EdgeTPU")
    names = ["mobilenet_v1_1.0_224_quant_embedding_extractor.tflite",
             "mobilenet_v1_1.0_224_quant_embedding_extractor_edgetpu.tflite"]
    for name in names:
        (tmp_path / name).write_bytes(subprocess.run(["git", "-C", str(MIRROR), "show", f"HEAD:{name}"],
                                                     capture_output=True, check=True).stdout)
    stage = single_cpu_plan(tmp_path / names[0]).stages[0]
    on_tpu = dataclasses.replace(stage, compiled_segment=tmp_path / names[1])
    x = {stage.inputs[0].name: np.random.default_rng(0).integers(0, 256, stage.inputs[0].shape, dtype=np.uint8)}
    name = stage.outputs[0].name
    tpu, cpu = open_stage(on_tpu, "tpu:0")(x)[name].astype(int), open_stage(stage, "cpu")(x)[name].astype(int)
    assert np.abs(tpu - cpu).max() <= 3  # the EdgeTPU rounds differently (google-coral/edgetpu#503)


def test_a_compiled_encoder_runs_on_the_tpu_when_the_bundles_plans_do_not_fit(with_twin: Path,
                                                                                tmp_path: Path) -> None:
    from edgecap_compile.compiler import compile_model

    # A plan for a two-TPU board, on a host with one TPU: the whole compiled encoder beats the CPU.
    compile_model(with_twin / "encoder.tflite", "rpi4-2usb", with_twin / "plans" / "rpi4-2usb",
                  ranges=[(0, 5), (5, 10), (10, load_bundle(with_twin).encoder_model.ops)])
    choice = planner.choose(load_bundle(with_twin), CaptionerOptions(), _hardware(1))
    stage = choice.plan.active_stages[0]
    assert (str(stage.spec), stage.compiled_segment.name) == ("tpu:0", "encoder_edgetpu.tflite")
    assert choice.reason.endswith("whole EdgeTPU-compiled encoder on tpu:0")


def test_the_compiled_encoders_stage_opens_through_libedgetpus_delegate(with_twin: Path, monkeypatch) -> None:
    from edgecap import stages

    opened = []

    def load_edgetpu_delegate(spec, model=None, backend=None):
        opened.append((str(spec), Path(model).name))
        raise EdgecapError(f"{spec}: no Edge TPU here")

    monkeypatch.setattr(stages, "load_edgetpu_delegate", load_edgetpu_delegate)
    plan = compiled_encoder.tpu_plan(load_bundle(with_twin))
    with pytest.raises(EdgecapError, match="tpu:0: no Edge TPU here"):
        stages.open_stage(plan.stages[0])
    assert opened == [("tpu:0", "encoder_edgetpu.tflite")]
    # The same stage emulated runs the CPU twin, exactly.
    emulated = stages.open_stage(plan.stages[0], "emu-tpu:0", pace_ms=0.0)
    cpu = stages.open_stage(compiled_encoder.cpu_plan(load_bundle(with_twin)).stages[0], "cpu")
    x = {t.name: np.zeros(t.shape, t.dtype) for t in plan.inputs}
    name = plan.outputs[0].name
    np.testing.assert_array_equal(emulated(x)[name], cpu(x)[name])
