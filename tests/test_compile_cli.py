"""`edgecap compile` end to end: plan.json per docs/plan.md, report, bundles, and bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgecap.interpreter import make_cpu_interpreter
from edgecap.plans.plan import load_plan
from edgecap_compile.boards import BOARDS_DIR, load_board
from edgecap.cli import run as main
from edgecap.errors import EdgecapError
from edgecap_compile.errors import CompileError

DATA = Path(__file__).parent / "data" / "compile"
MODEL = DATA / "tiny_inception.tflite"
DEMO_BUNDLE = Path(__file__).parent.parent / "models" / "demo" / "bundle"


def _compile(*args) -> dict:
    assert main(["compile", *map(str, args)]) == 0
    out = Path(args[args.index("-o") + 1])
    plan = json.loads((out / "plan.json").read_text())
    # The runtime's reader takes back exactly what the compiler wrote.
    loaded = load_plan(out)
    assert len(loaded.stages) == len(plan["stages"])
    for stage, written in zip(loaded.stages, plan["stages"]):
        assert (stage.device, list(stage.ops)) == (written["device"], written["ops"])
        assert [t.to_json() for t in stage.inputs] == written["inputs"]
        assert [t.to_json() for t in stage.outputs] == written["outputs"]
    return plan


def _slow_cpu_board(tmp_path: Path) -> Path:
    # The fixture is tiny: on the real profiles its best plan is CPU-only. A slow
    # CPU makes the TPUs worth their invoke overhead.
    profile = json.loads((BOARDS_DIR / "devboard-usb.json").read_text())
    profile["cpu"]["macs_per_s"] = 1e7
    path = tmp_path / "slow-cpu.json"
    path.write_text(json.dumps(profile))
    return path


def _assert_stages_cover_the_model_in_order(plan: dict) -> None:
    """The stages chain op ranges from 0 to the model's end; only an empty stage has no segment."""
    assert plan["stages"][0]["ops"][0] == 0 and plan["stages"][-1]["ops"][1] == 21
    for prev, cur in zip(plan["stages"], plan["stages"][1:]):
        assert cur["ops"][0] == prev["ops"][1]
    for s in plan["stages"]:
        assert (s["segment"] is None) == (s["ops"][0] == s["ops"][1])
        assert set(s) >= {"index", "device", "segment", "ops", "param_bytes", "macs", "inputs",
                          "outputs", "predicted_ms", "edgetpu"}


def _assert_prediction_is_the_stages(plan: dict) -> None:
    """The plan's bottleneck, latency and fps are the max, the sum and the rate of its stages' times,
    the CPU's (the last stage's) with its own work a frame: preprocessing and a hand-off per stage run."""
    pred = plan["predicted"]
    ms = [s["predicted_ms"] for s in plan["stages"]]
    frame = plan.get("cpu_frame", {"preprocess_ms": 0.0, "handoff_ms": 0.0})
    stages = sum(1 for s in plan["stages"][:-1] if s["ops"][1] > s["ops"][0]) + 1
    ms[-1] += frame["preprocess_ms"] + frame["handoff_ms"] * stages
    assert pred["bottleneck_ms"] == pytest.approx(max(ms), abs=1e-3)
    assert pred["latency_ms"] == pytest.approx(sum(ms), abs=1e-3)
    assert pred["fps"] == pytest.approx(1e3 / max(ms), rel=1e-3)


def _assert_segments_reproduce_the_model(out: Path, plan: dict) -> None:
    """Runs the plan the way the runtime does (tensors travel by name) against the whole model."""
    rng = np.random.default_rng(0)
    feeds = {}
    interp = make_cpu_interpreter(str(MODEL))
    d = interp.get_input_details()[0]
    x = rng.integers(-128, 128, size=d["shape"], dtype=np.int8)
    feeds[d["name"]] = x
    interp.set_tensor(d["index"], x)
    interp.invoke()
    out_detail = interp.get_output_details()[0]
    expected = interp.get_tensor(out_detail["index"])
    for s in plan["stages"]:
        if not s["segment"]:
            continue
        seg = make_cpu_interpreter(str(out / s["segment"]))
        for d in seg.get_input_details():
            spec = next(t for t in s["inputs"] if t["name"] == d["name"])
            assert spec["shape"] == list(d["shape"]) and spec["dtype"] == "int8"
            seg.set_tensor(d["index"], feeds[d["name"]])
        seg.invoke()
        feeds.update({d["name"]: seg.get_tensor(d["index"]) for d in seg.get_output_details()})
        assert {t["name"] for t in s["outputs"]} <= set(feeds)
    assert np.array_equal(feeds[out_detail["name"]], expected)


def test_plan_follows_the_contract_and_its_segments_reproduce_the_model(tmp_path):
    out = tmp_path / "out"
    plan = _compile(MODEL, "--board", _slow_cpu_board(tmp_path), "--sram", "20000", "--pipeline-only",
                    "-o", out)
    assert plan["plan_version"] == 1
    assert plan["model"]["file"] == MODEL.name and plan["model"]["ops"] == 21
    assert plan["board"] == {"name": "devboard-usb", "version": load_board("devboard-usb").version, "tpus": 2}
    assert plan["sram_bytes"] == 20000
    # devboard-usb: the PCIe TPU, then the USB Accelerator, named by bus.
    assert [s["device"] for s in plan["stages"]] == ["pci:0", "usb:0", "cpu"]
    _assert_stages_cover_the_model_in_order(plan)
    _assert_prediction_is_the_stages(plan)
    assert sum(1 for s in plan["stages"] if s["segment"]) >= 2
    _assert_segments_reproduce_the_model(out, plan)


def test_cpu_only_and_more_tpus_than_the_profile(tmp_path):
    plan = _compile(MODEL, "--board", "devboard-usb", "--tpus", "0", "-o", tmp_path / "a")
    assert [(s["device"], s["ops"]) for s in plan["stages"]] == [("cpu", [0, 21])]
    assert plan["sram_bytes"] is None
    plan = _compile(MODEL, "--board", "rpi4-2usb", "--tpus", "4", "--pipeline-only", "-o", tmp_path / "b")
    # TPUs beyond the profile copy its last one, a USB Accelerator.
    assert [s["device"] for s in plan["stages"]] == ["usb:0", "usb:1", "usb:2", "usb:3", "cpu"]


def test_report_writes_a_table_and_a_picture(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    _compile(MODEL, "--board", "rpi4-2usb", "--report", "-o", tmp_path)
    table = (tmp_path / "report.md").read_text()
    assert "| stage | device |" in table and "of bottleneck" in table
    assert (tmp_path / "split.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Predicted:" in capsys.readouterr().out


def _bundle(tmp_path: Path, encoder: str = "encoder.tflite") -> Path:
    bundle = tmp_path / "bundle"
    shutil.copytree(DEMO_BUNDLE, bundle)
    meta = json.loads((bundle / "bundle.json").read_text())
    meta["encoder"] = encoder
    (bundle / "bundle.json").write_text(json.dumps(meta))
    return bundle


@pytest.mark.parametrize("board", ["devboard-usb", "host"])
def test_a_bundle_charges_its_rnn_step_to_the_cpu_stage(tmp_path, board):
    plan = _compile(_bundle(tmp_path), "--board", board, "-o", tmp_path / "out")
    assert plan["model"]["file"] == "encoder.tflite"
    assert plan["rnn_ms"] > 0
    assert plan["stages"][-1]["predicted_ms"] >= plan["rnn_ms"]


def test_a_model_with_an_unknown_op_still_compiles(tmp_path, caplog):
    schema = pytest.importorskip("ai_edge_litert.schema_py_generated")
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model(str(MODEL))
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.CUSTOM
    code.customCode = b"MysteryOp"
    model.operatorCodes.append(code)
    model.subgraphs[0].operators[5].opcodeIndex = len(model.operatorCodes) - 1
    path = tmp_path / "mystery.tflite"
    flatbuffer_utils.write_model(model, str(path))
    plan = _compile(path, "--board", "rpi4-2usb", "-o", tmp_path / "out")
    assert plan["model"]["ops"] == 21 and "MysteryOp" in caplog.text


BAD = [
    (lambda d: [DATA / "tiny_float.tflite", "--board", "devboard"], "full-integer quantization"),
    (lambda d: [MODEL, "--board", "jetson"], "unknown board 'jetson'"),
    (lambda d: [d / "missing.tflite", "--board", "devboard"], "cannot read model"),
    (lambda d: [DATA / "make_fixtures.py", "--board", "devboard"], "not a TFLite flatbuffer"),
    (lambda d: [_bundle(d, "../escape.tflite"), "--board", "devboard"], "leaves the bundle"),
    (lambda d: [_bundle(d, "missing.tflite"), "--board", "devboard"], "'encoder' of"),
    (lambda d: [d, "--board", "devboard"], "bundle.json: missing"),
    (lambda d: [MODEL, "--board", "host", "--calibration", d / "none.json"],
     "cannot read calibration"),
]


@pytest.mark.parametrize("args, message", BAD)
def test_bad_input_is_one_line(tmp_path, args, message):
    with pytest.raises(CompileError) as e:
        main(["compile", *map(str, args(tmp_path)), "-o", str(tmp_path / "out")])
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("options, message", [
    (dict(sram=0), "--sram must be a positive"),
    (dict(sram=-5), "--sram must be a positive"),
    (dict(tpus=21), "only 21 ops"),
    (dict(tpus=-1), "--tpus must be >= 0"),
])
def test_the_library_checks_tpus_and_sram_too(tmp_path, options, message):
    # The command line refuses these before any work (test_bad_input_cli); the API, here.
    from edgecap_compile.compiler import compile_model

    with pytest.raises(CompileError, match=message):
        compile_model(MODEL, "devboard", tmp_path / "out", **options)


def test_module_entry_point_exits_2_with_one_line(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "edgecap.cli", "compile", str(MODEL), "--board", "nano",
         "-o", str(tmp_path)], capture_output=True, text=True)
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0 and "unknown board 'nano'" in run.stderr


def test_report_without_matplotlib_fails_before_writing_anything(tmp_path, hide_module):
    hide_module("matplotlib")
    with pytest.raises(CompileError, match=r"edgecap\[plot\]") as e:
        main(["compile", str(MODEL), "--board", "devboard", "--report", "-o", str(tmp_path / "out")])
    assert "\n" not in str(e.value) and not (tmp_path / "out").exists()


def test_a_compile_that_fails_at_plan_json_writes_nothing(tmp_path, monkeypatch):
    from edgecap.errors import PlanError
    from edgecap_compile import compiler

    out = tmp_path / "out"
    _compile(MODEL, "--board", "devboard", "-o", out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def refuse(plan, directory):
        raise PlanError("plan.json refused")

    monkeypatch.setattr(compiler, "write_plan", refuse)
    for target in (out, tmp_path / "new"):
        with pytest.raises(PlanError):
            main(["compile", str(MODEL), "--board", "rpi4-2usb", "--tpus", "2", "-o", str(target)])
    # The earlier compile's files are untouched, the new folder never appeared,
    # and no staging folder is left beside either.
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("make, message", [
    (lambda d: (d / "file").write_text("x") and d / "file", "is a file, not a folder"),
    (lambda d: (d / "file").write_text("x") and d / "file" / "sub", "is a file, not a directory"),
])
def test_an_output_that_cannot_be_a_folder_fails_before_any_work(tmp_path, make, message):
    target = make(tmp_path)
    with pytest.raises(EdgecapError, match=message) as e:
        main(["compile", str(MODEL), "--board", "devboard", "-o", str(target)])
    assert "\n" not in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
