"""edgetpu_compiler driver: log parsing, a stand-in compiler on PATH, and its absence."""

from __future__ import annotations

import json
import logging
import os
import stat
import sys
import textwrap
from pathlib import Path

import pytest

from edgecap_compile.boards import BOARDS_DIR
from edgecap_compile.compiler import RESPLITS, STREAM_TOLERANCE, compile_model
from edgecap_compile.boards import load_board
from edgecap_compile.edgetpu import count_custom_ops, parse_log
from edgecap_compile.graph import read_graph
from edgecap_compile.plan import plan_devices

DATA = Path(__file__).parent / "data" / "compile"
MODEL = DATA / "tiny_mobilenet.tflite"

# The stand-in prints what edgetpu_compiler 16 prints with -s (summary, then the
# operator table) and writes <stem>_edgetpu.tflite and <stem>_edgetpu.log to -o.
# Its .tflite has one edgetpu-custom-op in place of the mapped ops, as the
# compiler's does (STAND_IN_FALLBACK=1 keeps FULLY_CONNECTED ops beside it);
# STAND_IN_NO_TPU=1 writes the model unchanged: nothing mapped. It reports no
# off-chip bytes unless STAND_IN_CACHE_BYTES is set: then it caches that many
# bytes of the segment file on chip and streams the rest, as a compiler whose
# usable SRAM is smaller than the profile's would.
STAND_IN = textwrap.dedent('''\
    #!{python}
    import json, os, shutil, sys
    from pathlib import Path
    from ai_edge_litert import schema_py_generated as schema
    from ai_edge_litert.tools import flatbuffer_utils
    args = sys.argv[1:]
    out = Path(args[args.index("-o") + 1])
    model = Path(args[-1])
    with open(os.environ["STAND_IN_CALLS"], "a") as f:
        f.write(json.dumps(args) + "\\n")
    compiled = out / (model.stem + "_edgetpu.tflite")
    fallback = os.environ.get("STAND_IN_FALLBACK") == "1"
    m = flatbuffer_utils.read_model(str(model))
    if os.environ.get("STAND_IN_NO_TPU") != "1":
        code = schema.OperatorCodeT()
        code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.CUSTOM
        code.customCode = "edgetpu-custom-op"
        m.operatorCodes.append(code)
        g = m.subgraphs[0]
        fc = schema.BuiltinOperator.FULLY_CONNECTED
        kept = [op for op in g.operators if fallback and flatbuffer_utils.get_builtin_code_from_operator_code(
            m.operatorCodes[op.opcodeIndex]) == fc]
        tpu_op = schema.OperatorT()
        tpu_op.opcodeIndex = len(m.operatorCodes) - 1
        tpu_op.inputs, tpu_op.outputs = list(g.inputs), list(g.outputs)
        g.operators = [tpu_op] + kept
    flatbuffer_utils.write_model(m, str(compiled))
    table = ("Operator                       Count      Status\\n\\n"
             "CONV_2D                        9          Mapped to Edge TPU\\n"
             "DEPTHWISE_CONV_2D              4          Mapped to Edge TPU\\n")
    if fallback:
        table += ("FULLY_CONNECTED                1          Operation is otherwise supported, "
                  "but not mapped due to some unspecified limitation\\n")
    compiled.with_suffix(".log").write_text(
        "Edge TPU Compiler version 16.0.384591198\\nInput: %s\\nOutput: %s\\n\\n%s"
        % (model, compiled, table))
    print("Edge TPU Compiler version 16.0.384591198")
    print("Started a compilation timeout timer of 180 seconds.\\n")
    print("Model compiled successfully in 412 ms.\\n")
    print("Input model: %s" % model)
    print("Input size: 71.23KiB")
    print("Output model: %s" % compiled)
    print("Output size: 120.50KiB")
    cache = os.environ.get("STAND_IN_CACHE_BYTES")
    off_chip = max(0, model.stat().st_size - int(cache)) if cache else 0
    print("On-chip memory used for caching model parameters: 66.25KiB")
    print("On-chip memory remaining for caching model parameters: 7.86MiB")
    print("Off-chip memory used for streaming uncached model parameters: %.2fKiB"
          % (off_chip / 1024))
    print("Number of Edge TPU subgraphs: 1")
    print("Total number of operations: 14")
    print("Operation log: %s" % compiled.with_suffix(".log"))
    if fallback:
        print("\\nModel successfully compiled but not all operations are supported by the "
              "Edge TPU. A percentage of the model will instead run on the CPU, which is "
              "slower.")
        print("Number of operations that will run on Edge TPU: 13")
        print("Number of operations that will run on CPU: 1")
    print()
    print(table)
    print("Compilation child process completed within timeout period.")
    print("Compilation succeeded!")
''')


def _slow_cpu_board(tmp_path: Path, name: str) -> str:
    # The fixture is tiny: on the real profiles its best plan is CPU-only. A slow
    # CPU makes the TPUs worth their invoke overhead.
    profile = json.loads((BOARDS_DIR / f"{name}.json").read_text())
    profile["cpu"]["macs_per_s"] = 1e7
    path = tmp_path / f"{name}-slow-cpu.json"
    path.write_text(json.dumps(profile))
    return str(path)


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "edgetpu_compiler"
    exe.write_text(STAND_IN.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STAND_IN_CALLS", str(calls))
    return calls


def test_parse_log_reads_sizes_and_cpu_ops():
    text = ("On-chip memory used for caching model parameters: 1.92MiB\n"
            "On-chip memory remaining for caching model parameters: 1.75KiB\n"
            "Off-chip memory used for streaming uncached model parameters: 3.23MiB\n"
            "Operator                       Count      Status\n\n"
            "RESHAPE                        15         Mapped to Edge TPU\n"
            "CUSTOM                         1          Operation is working on an unsupported "
            "data type\n"
            "ADD                            10         Mapped to Edge TPU\n")
    report = parse_log(text)
    assert report.on_chip_bytes == round(1.92 * 2**20)
    assert report.off_chip_bytes == round(3.23 * 2**20)
    assert report.cpu_ops == [{"op": "CUSTOM", "count": 1,
                               "reason": "Operation is working on an unsupported data type"}]
    assert parse_log("Off-chip memory used for streaming uncached model parameters: 0.00B"
                     ).off_chip_bytes == 0


def _written_dir(folder: Path) -> dict:
    return json.loads((folder / "plan.json").read_text())


def _written(result) -> dict:
    """The plan.json the compile wrote, as JSON."""
    return json.loads(result.plan_path.read_text())


def test_compiles_each_tpu_segment_and_records_the_log(stand_in, tmp_path):
    board = _slow_cpu_board(tmp_path, "devboard-usb")
    plan = _written(compile_model(MODEL, board, tmp_path / "out", sram=20_000, replicas=False,
                                  min_runtime_version=13))
    calls = [json.loads(line) for line in stand_in.read_text().splitlines()]
    assert [s["device"] for s in plan["stages"]] == ["pci:0", "usb:0", "cpu"]
    tpu_stages = [s for s in plan["stages"] if s["device"] != "cpu" and s["segment"]]
    assert len(calls) == len(tpu_stages) >= 1
    for args in calls:
        assert args[args.index("-m") + 1] == "13" and "-s" in args
    for stage in tpu_stages:
        et = stage["edgetpu"]
        assert et["compiled"] and et["compiled_segment"] == stage["segment"].replace(
            ".tflite", "_edgetpu.tflite")
        assert (tmp_path / "out" / et["compiled_segment"]).is_file()
        assert et["on_chip_bytes"] == round(66.25 * 1024)
        assert et["off_chip_bytes"] == 0
        assert et["cpu_ops"] == [] and et["cpu_ops_ms"] is None and "Compilation succeeded" in et["log"]
        assert count_custom_ops(tmp_path / "out" / et["compiled_segment"]) == 1


def test_a_segment_streaming_more_than_predicted_is_resplit(stand_in, tmp_path, monkeypatch,
                                                            caplog):
    # The profile lets each TPU cache 60 kB over a slow link; the stand-in caches
    # only 2 kB of a segment and streams the rest: the compiler lowers the budgets
    # by what each segment streamed beyond the prediction and re-splits.
    profile = json.loads(Path(_slow_cpu_board(tmp_path, "devboard-usb")).read_text())
    for tpu in profile["tpus"]:
        tpu["link_bytes_per_s"] = 1e6
    board = tmp_path / "slow-link.json"
    board.write_text(json.dumps(profile))
    monkeypatch.setenv("STAND_IN_CACHE_BYTES", "2000")
    with caplog.at_level(logging.WARNING, logger="edgecap_compile"):
        compile_model(MODEL, str(board), tmp_path / "out", sram=60_000, replicas=False)
    calls = [json.loads(line) for line in stand_in.read_text().splitlines()]
    plan = _written_dir(tmp_path / "out")
    tpu_stages = [s for s in plan["stages"] if s["device"] != "cpu" and s["segment"]]
    # The new split moved the cuts, so its segments were compiled again.
    assert 1 <= len(tpu_stages) < len(calls) <= (RESPLITS + 1) * 2
    assert "more than predicted; lowering every TPU's SRAM budget" in caplog.text
    assert plan["sram_bytes"] < 60_000
    for stage in tpu_stages:
        size = (tmp_path / "out" / stage["segment"]).stat().st_size
        observed = stage["edgetpu"]["off_chip_bytes"]
        # The observed bytes are recorded as the compiler reported them, and the
        # plan's prediction now streams as much.
        assert observed == pytest.approx(max(0, size - 2000), abs=8)
        assert stage["param_bytes"]["streamed"] + STREAM_TOLERANCE >= observed
    # Only the last attempt's files are left, beside plan.json.
    kept = {p.name for p in (tmp_path / "out").iterdir()}
    expected = {"plan.json"} | {n for s in tpu_stages for n in (
        s["segment"], s["edgetpu"]["compiled_segment"],
        s["edgetpu"]["compiled_segment"].replace(".tflite", ".log"))}
    expected |= {s["segment"] for s in plan["stages"] if s["segment"]}
    assert kept == expected


def _slow_pcie_board(tmp_path: Path, link_bytes_per_s: float = None) -> str:
    # The slow-CPU devboard-usb with its PCIe TPU (tpus[0]) computing at a
    # hundredth of the USB one's rate: the split runs the USB TPU first.
    profile = json.loads(Path(_slow_cpu_board(tmp_path, "devboard-usb")).read_text())
    pcie, usb = profile["tpus"]
    pcie["macs_per_s"] = pcie["elements_per_s"] = usb["macs_per_s"] / 100
    if link_bytes_per_s is not None:
        for tpu in profile["tpus"]:
            tpu["link_bytes_per_s"] = link_bytes_per_s
    path = tmp_path / "slow-pcie.json"
    path.write_text(json.dumps(profile))
    return str(path)


def test_the_plan_names_the_tpus_in_the_order_the_split_runs_them(tmp_path):
    from edgecap.plans.plan import load_plan

    result = compile_model(MODEL, _slow_pcie_board(tmp_path), tmp_path / "out", sram=20_000, replicas=False)
    plan = load_plan(result.plan_path)  # the runtime reads it
    assert [s.device for s in plan.stages] == ["usb:0", "pci:0", "cpu"]
    assert not plan.stages[0].empty and plan.board_tpus == 2
    # The same cuts in the profile's order (a fixed split keeps it) are slower.
    fixed = compile_model(MODEL, _slow_pcie_board(tmp_path), tmp_path / "fixed", sram=20_000,
                          ranges=[s.ops for s in plan.stages], replicas=False).plan
    assert [s.device for s in fixed.stages] == ["pci:0", "usb:0", "cpu"]
    assert fixed.predicted.bottleneck_ms > plan.predicted.bottleneck_ms


def test_a_resplit_lowers_the_budget_of_the_tpu_that_ran_the_segment(stand_in, tmp_path,
                                                                     monkeypatch, caplog):
    # The USB TPU (the profile's tpus[1], usb:0) runs stage 0 first. What its
    # segment streamed beyond the prediction caps both TPUs' budgets: the
    # segment streams as much on either, and every plan's prediction says so.
    monkeypatch.setenv("STAND_IN_CACHE_BYTES", "2000")
    with caplog.at_level(logging.WARNING, logger="edgecap_compile"):
        result = compile_model(MODEL, _slow_pcie_board(tmp_path, 1e6), tmp_path / "out",
                               sram=60_000, replicas=False)
    warned = [r.getMessage().split(": ")[0] for r in caplog.records
              if "more than predicted" in r.getMessage()]
    assert warned[0] == "tpu:1"
    for stage in result.plan.stages[:2]:
        if not stage.empty:
            assert stage.param_bytes.streamed + STREAM_TOLERANCE >= stage.edgetpu.off_chip_bytes


def test_a_fixed_split_is_not_resplit(stand_in, tmp_path, monkeypatch):
    board = _slow_cpu_board(tmp_path, "devboard")
    n = len(read_graph(MODEL).ops)
    monkeypatch.setenv("STAND_IN_CACHE_BYTES", "1000")
    plan = _written(compile_model(MODEL, board, tmp_path / "out", ranges=[(0, n), (n, n)], replicas=False))
    assert len(stand_in.read_text().splitlines()) == 1
    assert plan["stages"][0]["edgetpu"]["off_chip_bytes"] > 0


def test_parse_log_keeps_mixed_case_custom_ops():
    text = ("Operator                       Count      Status\n\n"
            "CONV_2D                        9          Mapped to Edge TPU\n"
            "TFLite_Detection_PostProcess   1          Operation not supported\n"
            "edgetpu-custom-op              1          Mapped to Edge TPU\n"
            "Number of operations that will run on CPU: 1\n")
    assert parse_log(text).cpu_ops == [{"op": "TFLite_Detection_PostProcess", "count": 1,
                                        "reason": "Operation not supported"}]


def test_ops_left_on_the_cpu_are_reported_and_priced(stand_in, tmp_path, monkeypatch, caplog):
    # Every op on the TPU stage: its last op, FULLY_CONNECTED, is the one the stand-in leaves.
    board = _slow_cpu_board(tmp_path, "devboard")
    graph = read_graph(MODEL)
    n = len(graph.ops)
    assert graph.ops[-1].type == "FULLY_CONNECTED"
    clean = _written(compile_model(MODEL, board, tmp_path / "clean", ranges=[(0, n), (n, n)], replicas=False))
    monkeypatch.setenv("STAND_IN_FALLBACK", "1")
    with caplog.at_level(logging.WARNING, logger="edgecap_compile"):
        plan = _written(compile_model(MODEL, board, tmp_path / "out", ranges=[(0, n), (n, n)], replicas=False))
    stage = plan["stages"][0]
    assert stage["device"] == "pci:0" and stage["edgetpu"]["compiled"]
    assert stage["edgetpu"]["cpu_ops"][0]["op"] == "FULLY_CONNECTED"
    assert "left 1x FULLY_CONNECTED" in caplog.text
    fc, cpu = graph.ops[-1], load_board(board).cpu
    expected = fc.macs * 1e3 / cpu.macs_per_s + fc.elements * 1e3 / cpu.elements_per_s + cpu.op_overhead_ms
    assert stage["edgetpu"]["cpu_ops_ms"] == pytest.approx(expected, rel=1e-5) and expected > 0
    assert stage["predicted_ms"] == pytest.approx(
        clean["stages"][0]["predicted_ms"] + expected, rel=1e-5)
    assert plan["predicted"]["latency_ms"] == pytest.approx(
        clean["predicted"]["latency_ms"] + expected, rel=1e-5)


def test_compiled_file_without_the_custom_op_is_refused(stand_in, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("STAND_IN_NO_TPU", "1")
    with caplog.at_level(logging.WARNING, logger="edgecap_compile"):
        plan = _written(compile_model(MODEL, _slow_cpu_board(tmp_path, "devboard"),
                                      tmp_path / "out", sram=20_000, replicas=False))
    et = plan["stages"][0]["edgetpu"]
    assert et["compiled"] is False and et["compiled_segment"] is None
    assert "mapped no op to the Edge TPU" in et["reason"] and "edgetpu-custom-op" in et["reason"]
    assert "mapped no op" in caplog.text


@pytest.mark.parametrize("name,devices", [
    ("devboard", ["pci:0"]), ("devboard-usb", ["pci:0", "usb:0"]), ("rpi4-2usb", ["usb:0", "usb:1"]),
    ("host", []),
])
def test_plans_name_tpus_by_bus(name, devices):
    assert plan_devices(load_board(name)) == devices


def test_a_tpu_without_a_link_keeps_tpu_n(tmp_path):
    profile = json.loads((BOARDS_DIR / "devboard-usb.json").read_text())
    del profile["tpus"][1]["link"]
    path = tmp_path / "nolink.json"
    path.write_text(json.dumps(profile))
    assert plan_devices(load_board(path)) == ["pci:0", "tpu:1"]
    assert plan_devices(load_board("rpi4-2usb").with_tpus(3)) == ["usb:0", "usb:1", "usb:2"]


def test_without_the_compiler_segments_stay_uncompiled(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("PATH", str(tmp_path))
    board = _slow_cpu_board(tmp_path, "devboard-usb")
    with caplog.at_level(logging.WARNING, logger="edgecap_compile"):
        plan = _written(compile_model(MODEL, board, tmp_path / "out", sram=20_000, replicas=False))
    assert plan["stages"][0]["segment"]
    for stage in plan["stages"][:2]:
        assert stage["edgetpu"]["compiled"] is False
        assert stage["edgetpu"]["reason"] == ("edgetpu_compiler not on PATH" if stage["segment"]
                                              else "empty stage")
    assert plan["stages"][2]["edgetpu"] is None
    assert caplog.text.count("edgetpu_compiler not on PATH") == 1


def test_counting_the_custom_op_refuses_what_is_not_a_model(tmp_path):
    assert count_custom_ops(MODEL) == 0  # an uncompiled model: every op on the CPU
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"not a model")
    with pytest.raises(ValueError, match="not a TFLite file"):
        count_custom_ops(bad)
    bad.write_bytes(MODEL.read_bytes()[:64])
    with pytest.raises(ValueError, match="bad.tflite"):
        count_custom_ops(bad)
