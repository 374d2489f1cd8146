"""plan.json reading and validation (docs/plan.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from edgecap.errors import PlanError
from edgecap.plans.plan import load_plan, single_cpu_plan
from runtime_plans import write_plan

TINY = Path(__file__).resolve().parent / "data" / "runtime" / "tiny_encoder.tflite"


@pytest.fixture
def plan_dir(tmp_path: Path) -> Path:
    write_plan(TINY, [1, 2], ["tpu:0", "tpu:1", "cpu"], tmp_path / "plan", [1.0, 1.5, 0.5])
    return tmp_path / "plan"


def _edit(plan_dir: Path, edit) -> Path:
    path = plan_dir / "plan.json"
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    return path


def test_reads_stages_in_order(plan_dir: Path) -> None:
    plan = load_plan(plan_dir)  # the directory is accepted too
    assert [s.device for s in plan.stages] == ["tpu:0", "tpu:1", "cpu"]
    assert [s.ops for s in plan.stages] == [(0, 1), (1, 2), (2, 6)]
    assert all(s.segment.is_absolute() and s.segment.parent == plan_dir.resolve() for s in plan.stages)
    assert [s.predicted_ms for s in plan.stages] == [1.0, 1.5, 0.5]
    assert plan.inputs[0].dtype == "int8" and plan.inputs[0].shape == (1, 16, 16, 3)
    assert plan.outputs[0].shape == (1, 8)
    # The skip connection's first tensor passes stage 1 by: listed in its inputs and outputs.
    passing = {t.name for t in plan.stages[1].inputs} & {t.name for t in plan.stages[1].outputs}
    assert len(passing) == 1


def test_tensor_json_round_trips_as_written(plan_dir: Path) -> None:
    plan = load_plan(plan_dir)
    written = json.loads((plan_dir / "plan.json").read_text())["stages"]
    for stage, raw in zip(plan.stages, written):
        assert [t.to_json() for t in stage.inputs + stage.outputs] == raw["inputs"] + raw["outputs"]


def test_empty_stage_is_skipped(tmp_path: Path) -> None:
    write_plan(TINY, [0, 3], ["tpu:0", "tpu:1", "cpu"], tmp_path, [0.0, 1.0, 1.0])
    plan = load_plan(tmp_path / "plan.json")
    assert plan.stages[0].empty and plan.stages[0].segment is None
    assert [s.index for s in plan.active_stages] == [1, 2]


def test_single_cpu_plan_runs_the_whole_model() -> None:
    plan = single_cpu_plan(TINY)
    (stage,) = plan.stages
    assert stage.device == "cpu" and stage.ops == (0, 6) and stage.segment == TINY.resolve()
    assert stage.inputs[0].shape == (1, 16, 16, 3) and stage.outputs[0].shape == (1, 8)
    assert stage.inputs[0].scale > 0


def test_single_cpu_plan_of_a_non_model(tmp_path: Path) -> None:
    bad = tmp_path / "x.tflite"
    bad.write_bytes(b"not a model")
    with pytest.raises(PlanError, match="not a TFLite model"):
        single_cpu_plan(bad)


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.update(plan_version=2), "plan_version is 2"),
    (lambda d: d.update(stages=[]), "stages is empty"),
    (lambda d: d.pop("board"), "field 'board' is missing"),
    (lambda d: d["stages"][0].update(device="gpu:0"), r"stages\[0\]: device 'gpu:0' not understood"),
    (lambda d: d["stages"][1].update(index=5), "index is 5, expected 1"),
    (lambda d: d["stages"].reverse(), "index is 2, expected 0"),
    (lambda d: (d["stages"][1].update(device="cpu")), "only the last stage may run on the cpu"),
    (lambda d: d["stages"][1].update(ops=[1, 3]), "must be contiguous"),
    (lambda d: d["stages"][1].update(ops=[2, 1]), "ops must be"),
    (lambda d: d["stages"][1].update(segment="missing.tflite"), "'missing.tflite' not found"),
    (lambda d: d["stages"][1].update(segment="../../etc/passwd"), "outside the plan directory"),
    (lambda d: d["stages"][1].update(ops=[1, 1]), "must have segment null"),
    (lambda d: d["stages"][2]["inputs"][0].update(name="renamed"), "reads 'renamed' which stages"),
    (lambda d: d["stages"][0]["inputs"][0].update(dtype="bfloat16"), "dtype': invalid enum value 'bfloat16'"),
    (lambda d: d["stages"][0].update(predicted_ms=-1), "predicted_ms' must be float >= 0"),
    (lambda d: d["stages"][0].update(predicted_ms=float("nan")), "predicted_ms' must be float >= 0"),
    (lambda d: d.update(rnn_ms="1"), "field 'rnn_ms' must be float"),
    (lambda d: d["model"].pop("sha256"), "field 'model.sha256' is missing"),
    (lambda d: d["stages"][1].update(index=True), r"field 'stages\[1\].index' must be int, got bool"),
    (lambda d: d["stages"][0].update(ops=[False, 1]), r"ops\[0\]' must be int, got bool"),
    (lambda d: d["stages"][0]["inputs"][0].update(shape=["a"]), r"shape\[0\]' must be int, got str"),
    (lambda d: d["stages"][0]["inputs"][0].update(shape=[1, True]), r"shape\[1\]' must be int, got bool"),
    (lambda d: d["stages"][0]["inputs"][0].update(scale="abc"), r"inputs\[0\].scale' must be float"),
    (lambda d: d["stages"][0]["outputs"][0].update(zero_point=1.5), "zero_point' must be int"),
    (lambda d: d["stages"][0].update(edgetpu="yes"), r"edgetpu' must be object \| null"),
    (lambda d: d["stages"][0].update(edgetpu={"compiled": "yes"}), "edgetpu.compiled' must be bool"),
    (lambda d: d["stages"][0].update(edgetpu={"compiled": True, "compiled_segment": 3}),
     "edgetpu.compiled_segment' must be str"),
    # Ranges, not only types (issue #7): absurd sizes and times, one device per stage.
    (lambda d: d["stages"][0].update(predicted_ms=1e9), "predicted_ms' must be float <= 60000"),
    (lambda d: d["stages"][0].update(predicted_ms=float("inf")), "predicted_ms' must be float <= 60000"),
    (lambda d: d["stages"][0]["inputs"][0].update(shape=[1, 10**9]), r"shape\[1\]' must be int <= 1048576"),
    (lambda d: d.update(sram_bytes=-1), "sram_bytes' must be int >= 0"),
    (lambda d: d["stages"][1].update(device="tpu:0"), "both run on tpu:0; one stage per device"),
    (lambda d: d["stages"][0].update(colour="red"), r"field 'stages\[0\].colour' is unknown"),
    (lambda d: d["model"].update(ops=3), "the model has 3 ops"),
])
def test_bad_plans_are_rejected_in_one_line(plan_dir: Path, edit, message: str) -> None:
    path = _edit(plan_dir, edit)
    with pytest.raises(PlanError, match=message) as err:
        load_plan(path)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("edit,field", [
    (lambda d: d["board"].update(version="x"), "board.version"),
    (lambda d: d.update(sram_bytes="x"), "sram_bytes"),
    (lambda d: d.update(predicted=[1]), "predicted"),
    (lambda d: d["stages"][0].update(param_bytes="x"), r"stages\[0\].param_bytes"),
    (lambda d: d["stages"][0].update(macs=-5), r"stages\[0\].macs"),
])
def test_fields_the_compiler_writes_are_checked_too(plan_dir: Path, edit, field: str) -> None:
    # The runtime's Plan carries every field now (the compiler builds it), so none goes unchecked.
    with pytest.raises(PlanError, match=f"field '{field}'"):
        load_plan(_edit(plan_dir, edit))


def test_a_written_plan_reads_back_equal(plan_dir: Path, tmp_path: Path) -> None:
    from edgecap.plans.plan import write_plan as write_plan_file

    plan = load_plan(plan_dir)
    again = load_plan(write_plan_file(plan, plan_dir).path)
    assert again == plan


def test_compiled_segment_is_read_when_compiled(plan_dir: Path) -> None:
    def edit(doc):
        doc["stages"][0]["edgetpu"] = {"compiled": True, "compiled_segment": doc["stages"][0]["segment"]}
        doc["stages"][1]["edgetpu"] = {"compiled": False, "compiled_segment": None}

    plan = load_plan(_edit(plan_dir, edit))
    assert plan.stages[0].compiled_segment == plan.stages[0].segment
    assert plan.stages[1].compiled_segment is None


def test_missing_and_unreadable_plans(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="no such plan"):
        load_plan(tmp_path / "nope.json")
    bad = tmp_path / "plan.json"
    bad.write_text("{not json")
    with pytest.raises(PlanError, match="not valid JSON"):
        load_plan(bad)


def test_single_cpu_plan_needs_no_schema_bindings(monkeypatch) -> None:
    # Coral boards have tflite_runtime, which ships no schema_py_generated.
    monkeypatch.setitem(sys.modules, "ai_edge_litert.schema_py_generated", None)
    assert single_cpu_plan(TINY).stages[0].ops == (0, 6)


@pytest.mark.parametrize("change, field", [
    (dict(rnn_ms=1e12), "rnn_ms"),
    (dict(rnn_ms=float("nan")), "rnn_ms"),
    (dict(rnn_steps_per_frame=float("inf")), "rnn_steps_per_frame"),
])
def test_the_writer_refuses_what_the_reader_would(plan_dir: Path, change, field) -> None:
    import dataclasses

    from edgecap.plans.plan import write_plan as write_plan_file

    before = (plan_dir / "plan.json").read_text()
    with pytest.raises(PlanError, match=f"field '{field}'"):
        write_plan_file(dataclasses.replace(load_plan(plan_dir), **change), plan_dir)
    assert (plan_dir / "plan.json").read_text() == before  # nothing written


def test_the_writer_names_a_tensor_type_plan_json_cannot_carry(plan_dir: Path) -> None:
    # `edgecap plan import` of a compiled model whose last op writes a type the
    # format lacked died in a traceback (tools/real_files.py, Coral's DeepLab: int64).
    import dataclasses

    from edgecap.plans.plan import write_plan as write_plan_file

    plan = load_plan(plan_dir)
    last = plan.stages[-1]
    odd = dataclasses.replace(last.outputs[0], dtype="bool", scale=0.0, zero_point=0)
    changed = dataclasses.replace(plan, stages=(*plan.stages[:-1], dataclasses.replace(last, outputs=(odd,))))
    with pytest.raises(PlanError, match=f"stage {last.index}: tensor '{odd.name}' is bool; plan.json carries "
                                        "int8, uint8, int16, int32, int64, float32 tensors"):
        write_plan_file(changed, plan_dir)
