"""`edgecap plan import`: Coral's own pipelined segments as a plan (issue 17 item 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from compiled_models import write_compiled
from edgecap.plans import coral_pipeline
from edgecap.errors import PlanError
from edgecap.plans.plan import load_plan, single_cpu_plan
from edgecap.stages import open_stage

CORAL = Path(__file__).resolve().parent / "data" / "coral"
MIRROR = Path("/work/.mirror/google-coral+test_data/repo")
PRICES = [coral_pipeline.TpuPrice(invoke_ms=1.5, link_bytes_per_s=5e8, sram_bytes=6_553_600, link="usb3")] * 2

# Shaped as Coral's ssd_mobilenet_v1_coco_quant_postprocess_segment_K_of_3: segment 0 writes two
# tensors, segment 1 reads one of them (the other skips it), segment 2 reads three and writes floats.
IMAGE = ("normalized_input_image_tensor", (1, 32, 32, 3), "uint8", 0.0078125, 128)
A = ("FeatureExtractor/Conv2d_13_depthwise/Relu6", (1, 4, 4, 64), "uint8", 0.2317, 138)
SKIP = ("FeatureExtractor/Conv2d_11_pointwise/Relu6", (1, 8, 8, 32), "uint8", 0.1036, 140)
B = ("FeatureExtractor/Conv2d_13_pointwise/Relu6", (1, 4, 4, 64), "uint8", 0.4988, 141)
C = ("FeatureExtractor/Conv2d_2_1x1_256/Relu6", (1, 4, 4, 16), "uint8", 0.0543, 128)
BOXES = ("TFLite_Detection_PostProcess", (1, 20, 4), "float32", 0.0, 0)
SCORES = ("TFLite_Detection_PostProcess:2", (1, 20), "float32", 0.0, 0)
SEGMENTS = [([IMAGE], [A, SKIP]), ([A], [B, C]), ([C, B, SKIP], [BOXES, SCORES])]


def _name(k: int, n: int = 3, stem: str = "ssd") -> str:
    return f"{stem}_segment_{k}_of_{n}_edgetpu.tflite"


def _pipeline(folder: Path, segments=SEGMENTS, stem: str = "ssd") -> list:
    folder.mkdir(parents=True, exist_ok=True)
    return [write_compiled(folder / _name(k, len(segments), stem), ins, outs)
            for k, (ins, outs) in enumerate(segments)]


def _names(tensors) -> list:
    return [t.name for t in tensors]


def test_a_three_segment_pipeline_becomes_a_plan_with_the_skipping_tensor_forwarded(tmp_path: Path) -> None:
    plan = coral_pipeline.import_pipeline(_pipeline(tmp_path / "in"), tmp_path / "plan", "b", 1, PRICES)
    again = load_plan(tmp_path / "plan")  # what was written loads under the reader's rules
    assert [s.device for s in again.stages] == ["tpu:0", "tpu:1", "tpu:2", "cpu"] and again.stages[3].empty
    s0, s1, s2 = again.active_stages
    assert _names(s0.outputs) == [A[0], SKIP[0]]
    assert _names(s1.inputs) == [A[0], SKIP[0]] and _names(s1.outputs) == [B[0], C[0], SKIP[0]]
    assert _names(s2.inputs) == [C[0], B[0], SKIP[0]] and [t.dtype for t in s2.outputs] == ["float32"] * 2
    assert s2.edgetpu.cpu_ops == [{"op": "DEQUANTIZE", "count": 2, "reason": "left on the CPU by edgetpu_compiler"}]
    assert all(s.compiled_segment == s.segment and s.segment.parent == tmp_path / "plan" for s in (s0, s1, s2))
    # Three segments priced on a board with two TPUs: the plan says so.
    assert again.board == "b with 3 EdgeTPUs" and again.board_tpus == 3
    assert plan.predicted.latency_ms == pytest.approx(sum(s.predicted_ms for s in (s0, s1, s2)), abs=1e-3)


def test_the_estimate_is_invoke_plus_link_bytes_with_no_compute_term(tmp_path: Path) -> None:
    paths = _pipeline(tmp_path / "in")
    plan = coral_pipeline.import_pipeline(paths, tmp_path / "plan", "b", 1, PRICES)
    s1 = plan.active_stages[1]
    # Segment 1 reads A and writes B and C (the forwarded tensor does not cross its link).
    tensor_bytes = 4 * 4 * 64 + 4 * 4 * 64 + 4 * 4 * 16
    assert s1.cost.compute_ms == 0.0 and s1.cost.invoke_ms == 1.5 and s1.cost.link_bytes == tensor_bytes
    assert s1.predicted_ms == pytest.approx(1.5 + tensor_bytes * 1e3 / 5e8, abs=1e-4)
    assert s1.param_bytes.on_chip == paths[1].stat().st_size and s1.param_bytes.streamed == 0


def test_an_imported_plan_runs_emulated_timing_only_and_says_so_otherwise(tmp_path: Path) -> None:
    plan = load_plan(coral_pipeline.import_pipeline(_pipeline(tmp_path / "in"), tmp_path / "plan", "b", 1,
                                                    PRICES).path)
    with pytest.raises(PlanError, match=r"stage 0 on emu-tpu:0: ssd_segment_0_of_3_edgetpu.tflite is "
                                        r"EdgeTPU-compiled .* an emulated run of it is timing-only"):
        open_stage(plan.stages[0], "emu-tpu:0")
    runners = [open_stage(s, f"emu-tpu:{s.index}", timing_only=True) for s in plan.active_stages]
    tensors = {IMAGE[0]: np.zeros(IMAGE[1], np.uint8)}
    for runner, stage in zip(runners, plan.active_stages):
        tensors = runner(tensors)
        assert {k: (v.shape, v.dtype.name) for k, v in tensors.items()} == \
            {t.name: (t.shape, t.dtype) for t in stage.outputs}
    assert list(tensors) == [BOXES[0], SCORES[0]]


@pytest.mark.parametrize("order, match", [
    ([1, 0, 2], r"ssd: segments given in order 1, 0, 2; pass them in order 0..2"),
    ([0, 2], r"ssd: segment\(s\) 1 of 3 missing \(ssd_segment_1_of_3_edgetpu.tflite\); pass all 3"),
    ([0, 1, 1, 2], r"ssd: segment 1 of 3 given twice"),
])
def test_missing_repeated_and_misordered_segments_are_refused_in_one_line(tmp_path: Path, order, match) -> None:
    paths = _pipeline(tmp_path / "in")
    with pytest.raises(PlanError, match=match) as err:
        coral_pipeline.import_pipeline([paths[k] for k in order], tmp_path / "plan", "b", 1, PRICES)
    assert "\n" not in str(err.value) and not (tmp_path / "plan" / "plan.json").exists()


def test_segments_of_two_pipelines_are_refused(tmp_path: Path) -> None:
    a, b = _pipeline(tmp_path / "a"), _pipeline(tmp_path / "b", stem="other")
    with pytest.raises(PlanError, match=r"other_segment_1_of_3_edgetpu.tflite: segment 1 of 3 of 'other', but "
                                        r"ssd_segment_0_of_3_edgetpu.tflite is of 3 of 'ssd'"):
        coral_pipeline.read_segments([a[0], b[1], a[2]])


@pytest.mark.parametrize("segments, match", [
    # The skipping tensor requantized in another compilation.
    ([([IMAGE], [A, SKIP]), ([A], [B, C]), ([C, B, SKIP[:3] + (0.5, 140)], [BOXES])],
     r"ssd_segment_2_of_3_edgetpu.tflite: segment 2 reads 'FeatureExtractor/Conv2d_11_pointwise/Relu6' as "
     r"uint8\[1, 8, 8, 32\] scale 0.5 zero point 140, segment 0 writes uint8\[1, 8, 8, 32\] scale 0.1036 "
     r"zero point 140: the segments come from different compilations"),
    ([([IMAGE], [A, SKIP]), ([A], [B, C]), ([C, B, SKIP[:1] + ((1, 8, 8, 16),) + SKIP[2:]], [BOXES])],
     r"segment 2 reads 'FeatureExtractor/Conv2d_11_pointwise/Relu6' as uint8\[1, 8, 8, 16\]"),
    # Contents swapped under the right names: segment 1 reads what segment 2 writes.
    ([([IMAGE], [A, SKIP]), ([C, B, SKIP], [BOXES]), ([A], [B, C])],
     r"ssd_segment_1_of_3_edgetpu.tflite: segment 1 reads '.*Conv2d_2_1x1_256/Relu6', which segment 2 "
     r"writes after it: the files are out of order"),
    ([([IMAGE], [A, SKIP]), ([("unknown", (1, 4), "uint8", 0.1, 0)], [B, C]), ([C, B, SKIP], [BOXES])],
     r"segment 1 reads 'unknown', which no earlier segment writes: the segments are not from one model"),
])
def test_a_chain_that_does_not_match_names_the_segment_and_tensor(tmp_path: Path, segments, match) -> None:
    with pytest.raises(PlanError, match=match) as err:
        coral_pipeline.import_pipeline(_pipeline(tmp_path / "in", segments), tmp_path / "plan", "b", 1, PRICES)
    assert "\n" not in str(err.value)


def test_an_uncompiled_segment_is_refused(tmp_path: Path) -> None:
    target = tmp_path / _name(0, 1)
    target.write_bytes((CORAL / "split_concat.tflite").read_bytes())
    with pytest.raises(PlanError, match=r"has no edgetpu-custom-op, so edgetpu_compiler did not compile it"):
        coral_pipeline.read_segments([target])


def test_coral_compiled_file_with_three_uint8_inputs_and_five_outputs_imports(tmp_path: Path) -> None:
    # A real edgetpu_compiler output (tests/data/coral/, Apache-2.0): one file, one stage.
    plan = coral_pipeline.import_pipeline([CORAL / "split_concat_edgetpu.tflite"], tmp_path / "plan", "b", 1,
                                          PRICES)
    (stage,) = plan.active_stages
    assert [t.dtype for t in stage.inputs] == ["uint8"] * 3 and len(stage.outputs) == 5
    assert plan.model_file == "split_concat_edgetpu.tflite" and stage.compiled_segment.name == plan.model_file


def test_its_uncompiled_twin_runs_on_the_cpu_with_several_uint8_inputs_and_outputs() -> None:
    plan = single_cpu_plan(CORAL / "split_concat.tflite")
    runner = open_stage(plan.stages[0], "cpu")
    rng = np.random.default_rng(0)
    x = {t.name: rng.integers(0, 256, t.shape, dtype=np.uint8) for t in plan.inputs}
    out = runner(x)
    assert set(out) == {t.name for t in plan.outputs}
    # Coral's test model concatenates its inputs' 6 channels and splits them again (same quantization).
    channels = np.concatenate([x["input1"], x["inputs/rnn1"], x["inputs/rnn2"]], axis=-1)
    np.testing.assert_array_equal(out["concat/split0"], channels[..., 0:1])
    np.testing.assert_array_equal(out["outputs/rnn1"], channels[..., 1:2])
    np.testing.assert_array_equal(out["concat/split4"], channels[..., 4:5])
    np.testing.assert_array_equal(out["outputs/rnn2"], channels[..., [3, 5]])


def test_plan_import_cli_writes_the_plan_and_refuses_bad_input_in_one_line(tmp_path: Path) -> None:
    paths = _pipeline(tmp_path / "in")

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "edgecap.cli", "plan", "import", *map(str, args)],
                              capture_output=True, text=True, cwd=tmp_path, timeout=300)

    ok = cli(*paths, "-o", tmp_path / "plan", "--board", "devboard-usb")
    assert ok.returncode == 0, ok.stderr
    assert "priced on devboard-usb with 3 EdgeTPUs" in ok.stdout and "timing-only" in ok.stdout
    assert json.loads((tmp_path / "plan" / "plan.json").read_text())["stages"][1]["outputs"][2]["name"] == SKIP[0]
    bad = cli(paths[1], paths[0], paths[2], "-o", tmp_path / "plan2")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "in order 0..2" in bad.stderr
    host = cli(*paths, "-o", tmp_path / "plan3", "--board", "host")
    assert host.returncode == 2 and "has no EdgeTPU to price the segments on" in host.stderr


def _from_mirror(tmp_path: Path, names) -> list:
    out = []
    for name in names:
        out.append(tmp_path / Path(name).name)
        out[-1].write_bytes(subprocess.run(["git", "-C", str(MIRROR), "show", f"HEAD:{name}"],
                                           capture_output=True, check=True).stdout)
    return out


@pytest.mark.slow
@pytest.mark.skipif(not MIRROR.is_dir(), reason="google-coral/test_data mirror not present")
@pytest.mark.parametrize("version, n", [(1, 2), (1, 3), (1, 4), (2, 2), (2, 3), (2, 4)])
def test_coral_ssd_mobilenet_pipelines_import_and_run_emulated_timing_only(tmp_path: Path, version, n) -> None:
    stem = f"ssd_mobilenet_v{version}_coco_quant_postprocess"
    (tmp_path / "in").mkdir()
    paths = _from_mirror(tmp_path / "in", [f"pipeline/{stem}_segment_{k}_of_{n}_edgetpu.tflite" for k in range(n)])
    plan = load_plan(coral_pipeline.import_pipeline(paths, tmp_path / "plan", "b", 1, PRICES).path)
    assert len(plan.active_stages) == n and plan.inputs[0].dtype == "uint8"
    assert [t.dtype for t in plan.outputs] == ["float32"] * 4
    if n > 2:  # a tensor of segment 0 skips segment 1
        assert any(t.name in {o.name for o in plan.active_stages[1].outputs}
                   for t in plan.active_stages[1].inputs)
    tensors = {plan.inputs[0].name: np.zeros(plan.inputs[0].shape, np.uint8)}
    for stage in plan.active_stages:
        tensors = open_stage(stage, f"emu-tpu:{stage.index}", timing_only=True)(tensors)
    assert set(tensors) == {t.name for t in plan.outputs}


def test_a_plan_json_whose_stages_disagree_on_a_tensors_quantization_is_refused(tmp_path: Path) -> None:
    coral_pipeline.import_pipeline(_pipeline(tmp_path / "in"), tmp_path / "plan", "b", 1, PRICES)
    path = tmp_path / "plan" / "plan.json"
    doc = json.loads(path.read_text())
    doc["stages"][2]["inputs"][2]["zero_point"] = 0  # the skipping tensor, as stage 2 reads it
    path.write_text(json.dumps(doc))
    with pytest.raises(PlanError, match=r"stages\[2\] reads 'FeatureExtractor/Conv2d_11_pointwise/Relu6' as "
                                        r"uint8\[1, 8, 8, 32\] scale 0.1036 zero point 0, stages\[1\] writes "
                                        r"uint8\[1, 8, 8, 32\] scale 0.1036 zero point 140") as err:
        load_plan(path)
    assert "\n" not in str(err.value)


def _attached_tpus() -> int:
    from edgecap.devices import list_devices

    return sum(1 for i in list_devices() if i.kind in ("pci", "usb"))


@pytest.mark.tpu
@pytest.mark.skipif(not MIRROR.is_dir(), reason="google-coral/test_data mirror not present")
def test_real_edgetpu_runs_coral_segments_through_libedgetpu(tmp_path: Path) -> None:
    # Each segment opens through libedgetpu's delegate (edgecap.edgetpu_runtime), on one TPU in turn.
    if not _attached_tpus():
        pytest.skip("needs a Coral EdgeTPU")
    stem = "ssd_mobilenet_v1_coco_quant_postprocess"
    (tmp_path / "in").mkdir()
    paths = _from_mirror(tmp_path / "in", [f"pipeline/{stem}_segment_{k}_of_2_edgetpu.tflite" for k in range(2)])
    plan = load_plan(coral_pipeline.import_pipeline(paths, tmp_path / "plan", "b", 1, PRICES).path)
    tensors = {plan.inputs[0].name: np.full(plan.inputs[0].shape, 128, np.uint8)}
    for stage in plan.active_stages:
        tensors = open_stage(stage, "tpu:0")(tensors)
    count = float(tensors["TFLite_Detection_PostProcess:3"][0])
    assert 0 <= count <= 20 and np.all(np.isfinite(tensors["TFLite_Detection_PostProcess"]))


def _segments_of_own_plan(tmp_path: Path):
    """The project's own plan of tiny_inception on devboard-usb, and its TPU stages as compiled files."""
    from edgecap_compile.compiler import compile_model

    source = Path(__file__).resolve().parent / "data" / "compile" / "tiny_inception.tflite"
    own = load_plan(compile_model(source, "devboard-usb", tmp_path / "own", ranges=[(0, 5), (5, 21), (21, 21)])
                    .plan_path)
    tpu = [s for s in own.active_stages if s.spec.kind == "tpu"]
    paths = []
    for k, s in enumerate(tpu):
        passing = {t.name for t in s.inputs} & {t.name for t in s.outputs}
        spec = [[(t.name, t.shape, t.dtype, t.scale, t.zero_point) for t in ts if t.name not in passing]
                for ts in (s.inputs, s.outputs)]
        paths.append(write_compiled(tmp_path / _name(k, len(tpu), "inc"), *spec))
    return source, own, tpu, paths


def test_with_the_source_model_each_segment_is_priced_as_the_compiler_prices_its_own(tmp_path: Path) -> None:
    from edgecap_compile.boards import load_board
    from edgecap_compile.segment_work import compute_ms

    source, own, tpu, paths = _segments_of_own_plan(tmp_path)
    board = load_board("devboard-usb")
    prices = [coral_pipeline.TpuPrice(t.invoke_overhead_ms, t.link_bytes_per_s, t.sram_bytes, t.link)
              for t in board.tpus]

    def compute(segments):
        return compute_ms(source, board, [([(t.name, t.shape) for t in s.model.inputs],
                                           [(t.name, t.shape) for t in s.model.outputs], s.cpu_ops)
                                          for s in segments], [s.path.name for s in segments])

    imported = coral_pipeline.import_pipeline(paths, tmp_path / "imported", board.name, board.version, prices,
                                              compute)
    for mine, theirs in zip(imported.active_stages, tpu):
        assert mine.cost.compute_ms == pytest.approx(theirs.cost.compute_ms, abs=1e-5) and mine.cost.compute_ms > 0
        assert mine.cost.invoke_ms == theirs.cost.invoke_ms
    assert "compute from the source model's operators" in coral_pipeline.describe(imported)


def test_a_source_model_the_segments_were_not_compiled_from_is_refused_in_one_line(tmp_path: Path) -> None:
    _, _, _, paths = _segments_of_own_plan(tmp_path)
    other = Path(__file__).resolve().parent / "data" / "compile" / "tiny_mobilenet.tflite"
    r = subprocess.run([sys.executable, "-m", "edgecap.cli", "plan", "import", *map(str, paths), "--source",
                        str(other), "-o", str(tmp_path / "plan")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "inc_segment_0_of_2_edgetpu.tflite: tensor" in r.stderr and "pass the model the segments were " \
        "compiled from" in r.stderr
    assert not (tmp_path / "plan" / "plan.json").exists()


@pytest.mark.slow
@pytest.mark.skipif(not MIRROR.is_dir(), reason="google-coral/test_data mirror not present")
def test_coral_compiled_extractor_priced_on_its_source_matches_the_compilers_own_plan(tmp_path: Path) -> None:
    from edgecap_compile.compiler import compile_model

    names = ["mobilenet_v1_1.0_224_quant_embedding_extractor.tflite",
             "mobilenet_v1_1.0_224_quant_embedding_extractor_edgetpu.tflite"]
    source, compiled = _from_mirror(tmp_path, names)
    own = load_plan(compile_model(source, "rpi4-2usb", tmp_path / "own", tpus=1).plan_path)
    r = subprocess.run([sys.executable, "-m", "edgecap.cli", "plan", "import", str(compiled), "--source",
                        str(source), "--board", "rpi4-2usb", "-o", str(tmp_path / "imported")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    imported = load_plan(tmp_path / "imported")
    # Coral compiled it whole: one segment, priced as the compiler's own one-TPU plan.
    assert imported.active_stages[0].predicted_ms == pytest.approx(own.active_stages[0].predicted_ms, rel=0.01)
