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
from edgecap_compile.compiler import compile_model
from edgecap_compile.edgetpu import parse_log

DATA = Path(__file__).parent / "data" / "compile"
MODEL = DATA / "tiny_mobilenet.tflite"

# The stand-in prints what edgetpu_compiler 16 prints with -s (summary, then the
# operator table) and writes <stem>_edgetpu.tflite and <stem>_edgetpu.log to -o.
STAND_IN = textwrap.dedent('''\
    #!{python}
    import json, os, shutil, sys
    from pathlib import Path
    args = sys.argv[1:]
    out = Path(args[args.index("-o") + 1])
    model = Path(args[-1])
    with open(os.environ["STAND_IN_CALLS"], "a") as f:
        f.write(json.dumps(args) + "\\n")
    compiled = out / (model.stem + "_edgetpu.tflite")
    shutil.copy(model, compiled)
    fallback = os.environ.get("STAND_IN_FALLBACK") == "1"
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
    print("On-chip memory used for caching model parameters: 66.25KiB")
    print("On-chip memory remaining for caching model parameters: 7.86MiB")
    print("Off-chip memory used for streaming uncached model parameters: 1.50MiB")
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


def _written(result) -> dict:
    """The plan.json the compile wrote, as JSON."""
    return json.loads(result.plan_path.read_text())


def test_compiles_each_tpu_segment_and_records_the_log(stand_in, tmp_path):
    board = _slow_cpu_board(tmp_path, "devboard-usb")
    plan = _written(compile_model(MODEL, board, tmp_path / "out", sram=20_000,
                                  min_runtime_version=13))
    calls = [json.loads(line) for line in stand_in.read_text().splitlines()]
    tpu_stages = [s for s in plan["stages"] if s["device"].startswith("tpu") and s["segment"]]
    assert len(calls) == len(tpu_stages) >= 1
    for args in calls:
        assert args[args.index("-m") + 1] == "13" and "-s" in args
    for stage in tpu_stages:
        et = stage["edgetpu"]
        assert et["compiled"] and et["compiled_segment"] == stage["segment"].replace(
            ".tflite", "_edgetpu.tflite")
        assert (tmp_path / "out" / et["compiled_segment"]).is_file()
        assert et["on_chip_bytes"] == round(66.25 * 1024)
        assert et["off_chip_bytes"] == round(1.5 * 2**20)
        assert et["cpu_ops"] == [] and "Compilation succeeded" in et["log"]


def test_warns_when_ops_fall_back_to_the_cpu(stand_in, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("STAND_IN_FALLBACK", "1")
    with caplog.at_level(logging.WARNING, logger="edgecap_compile"):
        plan = _written(compile_model(MODEL, _slow_cpu_board(tmp_path, "devboard"),
                                      tmp_path / "out", sram=20_000))
    stage = plan["stages"][0]
    assert stage["edgetpu"]["cpu_ops"][0]["op"] == "FULLY_CONNECTED"
    assert "left 1x FULLY_CONNECTED" in caplog.text


def test_without_the_compiler_segments_stay_uncompiled(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("PATH", str(tmp_path))
    board = _slow_cpu_board(tmp_path, "devboard-usb")
    with caplog.at_level(logging.WARNING, logger="edgecap_compile"):
        plan = _written(compile_model(MODEL, board, tmp_path / "out", sram=20_000))
    assert plan["stages"][0]["segment"]
    for stage in plan["stages"][:2]:
        assert stage["edgetpu"]["compiled"] is False
        assert stage["edgetpu"]["reason"] == ("edgetpu_compiler not on PATH" if stage["segment"]
                                              else "empty stage")
    assert plan["stages"][2]["edgetpu"] is None
    assert caplog.text.count("edgetpu_compiler not on PATH") == 1
