"""Malformed board profiles and calibration files: one line naming the file and the field."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edgecap_compile.boards import BOARDS_DIR, load_board
from edgecap_compile.calibration import apply_calibration
from edgecap.cli import run as main
from edgecap_compile.errors import CompileError

DATA = Path(__file__).parent / "data" / "compile"


def _board_file(tmp_path: Path, edit) -> Path:
    doc = json.loads((BOARDS_DIR / "devboard-usb.json").read_text())
    edit(doc)
    path = tmp_path / "board.json"
    # allow_nan: write NaN and Infinity as a hand-edited or buggy file would.
    path.write_text(json.dumps(doc, allow_nan=True))
    return path


def _said(field: str, problem: str) -> str:
    """How edgecap.schema words a problem with ``field``: ``field 'cpu.cores' must be int``."""
    for prefix, kind in (("object missing required field ", "is missing"),
                         ("object contains unknown field ", "is unknown")):
        if problem.startswith(prefix):
            name = problem[len(prefix):]
            return f"field '{field + '.' if field else ''}{name}' {kind}"
    if problem.startswith("expected "):
        return f"field '{field}' must be {problem[len('expected '):]}"
    return problem


@pytest.mark.parametrize("edit, field, problem", [
    (lambda d: d["cpu"].update(cores="4"), "cpu.cores", "expected int"),
    (lambda d: d["cpu"].update(cores=4.5), "cpu.cores", "expected int"),
    (lambda d: d["cpu"].pop("macs_per_s"), "cpu", "object missing required field macs_per_s"),
    (lambda d: d.pop("name"), "", "object missing required field name"),
    (lambda d: d["tpus"][1].update(link_bytes_per_s=-3.2e8), "tpus[1].link_bytes_per_s",
     "expected float > 0.0"),
    (lambda d: d["tpus"][0].update(macs_per_s=0), "tpus[0].macs_per_s", "expected float > 0.0"),
    (lambda d: d["cpu"].update(elements_per_s=1e300), "cpu.elements_per_s", "expected float <="),
    (lambda d: d["cpu"].update(op_overhead_ms=-0.02), "cpu.op_overhead_ms", "expected float >="),
    (lambda d: d["tpus"][0].update(sram_bytes=0), "tpus[0].sram_bytes", "expected int >= 1"),
    (lambda d: d["tpus"][0].update(sram_bytes_typo=8), "tpus[0]", "object contains unknown field sram_bytes_typo"),
    (lambda d: d.update(tpu=[]), "", "object contains unknown field tpu"),
    (lambda d: d.update(sources={"cpu": 3}), "sources[...]", "expected str"),
])
def test_a_malformed_board_profile_is_one_line_naming_file_and_field(tmp_path, edit, field,
                                                                     problem):
    path = _board_file(tmp_path, edit)
    with pytest.raises(CompileError) as e:
        load_board(path)
    message = str(e.value)
    assert message.startswith(f"{path}: {_said(field, problem)}"), message
    assert "docs/compiler.md" in message and "\n" not in message


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_board_rate_that_is_not_finite_is_refused(tmp_path, value):
    path = _board_file(tmp_path, lambda d: d["cpu"].update(macs_per_s=value))
    with pytest.raises(CompileError, match=f"^{path}: .*; fix the board profile") as e:
        load_board(path)
    assert "\n" not in str(e.value)


def test_a_board_file_that_is_not_json_or_is_missing_is_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{\"name\": ")
    with pytest.raises(CompileError, match=f"^{bad}: not valid JSON"):
        load_board(bad)
    with pytest.raises(CompileError, match="unknown board .*missing.json"):
        load_board(tmp_path / "missing.json")


def test_a_board_profile_from_a_file_compiles(tmp_path):
    path = _board_file(tmp_path, lambda d: d.update(name="my-board", version=3))
    board = load_board(path)
    assert (board.name, board.version, len(board.tpus)) == ("my-board", 3, 2)
    assert main(["compile", str(DATA / "tiny_mobilenet.tflite"), "--board", str(path),
                 "-o", str(tmp_path / "plan")]) == 0
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert plan["board"] == {"name": "my-board", "version": 3, "tpus": 2}


def _calibration(tmp_path: Path, **changes) -> Path:
    doc = {"calibration_version": 1, "board": "devboard", "device": "tpu:0", "threads": 1,
           "coefficients": {"macs_per_s": 5e11, "elements_per_s": 4e11, "op_overhead_ms": 0.0,
                            "invoke_overhead_ms": 1.5, "link_bytes_per_s": 3e8},
           "error": {}, "samples": []}
    for key, value in changes.items():
        if key in doc["coefficients"] or key == "typo_per_s":
            doc["coefficients"][key] = value
        elif value is None:
            doc.pop(key)
        else:
            doc[key] = value
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(doc, allow_nan=True))
    return path


def test_a_calibration_sets_the_named_devices_coefficients(tmp_path):
    board = apply_calibration(load_board("devboard"), _calibration(tmp_path))
    tpu = board.tpus[0]
    assert (tpu.macs_per_s, tpu.elements_per_s, tpu.invoke_overhead_ms, tpu.link_bytes_per_s) \
        == (5e11, 4e11, 1.5, 3e8)
    assert board.cpu == load_board("devboard").cpu


@pytest.mark.parametrize("changes, field, problem", [
    (dict(macs_per_s="fast"), "coefficients.macs_per_s", "expected float"),
    # NaN and Infinity are no JSON, but Python writes them: the message names the field.
    (dict(macs_per_s=float("nan")), "coefficients.macs_per_s", "expected float > 0.0"),
    (dict(link_bytes_per_s=float("inf")), "coefficients.link_bytes_per_s", "expected float <="),
    (dict(elements_per_s=-1.0), "coefficients.elements_per_s", "expected float > 0.0"),
    (dict(invoke_overhead_ms=-0.5), "coefficients.invoke_overhead_ms", "expected float >= 0.0"),
    (dict(invoke_overhead_ms=1e9), "coefficients.invoke_overhead_ms", "expected float <="),
    (dict(typo_per_s=1.0), "coefficients", "object contains unknown field typo_per_s"),
    (dict(device=None), "", "object missing required field device"),
    (dict(calibration_version="1"), "calibration_version", "expected int"),
    (dict(boards="devboard"), "", "object contains unknown field boards"),
    (dict(threads=0), "threads", "expected int >= 1"),
])
def test_a_malformed_calibration_is_one_line_naming_file_and_field(tmp_path, changes, field,
                                                                   problem):
    path = _calibration(tmp_path, **changes)
    with pytest.raises(CompileError) as e:
        apply_calibration(load_board("devboard"), path)
    message = str(e.value)
    assert message.startswith(f"{path}: {_said(field, problem)}"), message
    assert message.endswith("write it with `edgecap calibrate`") and "\n" not in message


def test_a_calibration_of_another_version_or_device_or_missing_is_refused(tmp_path):
    board = load_board("devboard")
    with pytest.raises(CompileError, match="has version 2; this compiler reads 1"):
        apply_calibration(board, _calibration(tmp_path, calibration_version=2))
    with pytest.raises(CompileError, match="for device tpu:1, which board devboard lacks"):
        apply_calibration(board, _calibration(tmp_path, device="tpu:1"))
    with pytest.raises(CompileError, match="cannot read calibration .*none.json: No such file"):
        apply_calibration(board, tmp_path / "none.json")
    # Through the compiler's CLI: one line on stderr, exit 2, no traceback.
    run = subprocess.run(
        [sys.executable, "-m", "edgecap.cli", "compile",
         str(DATA / "tiny_mobilenet.tflite"), "--board", "devboard",
         "--calibration", str(_calibration(tmp_path, macs_per_s=-1.0)),
         "-o", str(tmp_path / "plan")], capture_output=True, text=True)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines() == [
        f"edgecap: error: {tmp_path / 'cal.json'}: field 'coefficients.macs_per_s' must be float > 0.0; "
        "write it with `edgecap calibrate`"]


_BUS = {"name": "lane", "link": "pcie", "bytes_per_s": 4e8, "tpus": [0, 1]}


@pytest.mark.parametrize("edit, said", [
    # A fitted rate above what the wire can carry (the USB fit used to be 521 MB/s).
    (lambda d: d["tpus"][1].update(link_bytes_per_s=5.21e8),
     "tpus[1].link_bytes_per_s 5.21e+08 exceeds the usb3 line rate 5e+08 bytes/s "
     "(edgecap/data/links.json links.usb3.source); lower it"),
    (lambda d: d["tpus"][0].update(link="thunderbolt"),
     "tpus[0].link 'thunderbolt' is not a link kind; use one of pcie, pcie3, usb3, usb2"),
    (lambda d: d.update(buses=[dict(_BUS, bytes_per_s=6e8)]),
     "buses[0].bytes_per_s 6e+08 exceeds the pcie line rate 5e+08"),
    (lambda d: d.update(buses=[dict(_BUS, link="usb4")]), "buses[0].link 'usb4' is not a link kind"),
    (lambda d: d.update(buses=[dict(_BUS, tpus=[0, 2])]), "buses[0].tpus names TPU 2 but the profile has 2"),
    (lambda d: d.update(buses=[dict(_BUS, tpus=[1, 1])]), "buses[0].tpus names TPU 1 twice"),
    (lambda d: d.update(buses=[dict(_BUS, tpus=[])]), "buses[0].tpus is empty"),
    (lambda d: d.update(buses=[dict(_BUS, tpus=[0]), dict(_BUS, name="b", tpus=[1])]),
     "buses lists 2 buses; the partitioner models one shared bus per board"),
])
def test_a_link_or_bus_past_its_line_rate_or_malformed_is_one_line(tmp_path, edit, said):
    path = _board_file(tmp_path, edit)
    with pytest.raises(CompileError) as e:
        load_board(path)
    assert str(e.value).startswith(f"{path}: {said}"), str(e.value)
    assert "\n" not in str(e.value)
    # The CLI: exit 2, one line, no traceback.
    run = subprocess.run([sys.executable, "-m", "edgecap.cli", "compile",
                          str(DATA / "tiny_mobilenet.tflite"), "--board", str(path),
                          "-o", str(tmp_path / "out")], capture_output=True, text=True)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and said in run.stderr


def test_every_shipped_tpu_names_its_link_within_the_line_rate_and_figures_are_sourced():
    from edgecap_compile.boards import board_names, link_kinds

    kinds = link_kinds()
    for kind in kinds.values():
        assert kind.usable_bytes_per_s <= kind.line_bytes_per_s and kind.source
    for name in board_names():
        board = load_board(name)
        doc = json.loads((BOARDS_DIR / f"{name}.json").read_text())
        for tpu in board.tpus:
            assert tpu.link in kinds, (name, tpu.name)
            assert tpu.link_bytes_per_s <= kinds[tpu.link].line_bytes_per_s
        for j, bus in enumerate(board.buses):
            assert any(k.startswith(f"buses[{j}]") for k in doc["sources"]), (name, bus)
            assert bus.bytes_per_s <= kinds[doc["buses"][j]["link"]].line_bytes_per_s
    # The corrected Pi 4: both USB 3 ports behind the VL805's one PCIe lane.
    pi4 = load_board("rpi4-2usb")
    assert [t.bus for t in pi4.tpus] == ["vl805", "vl805"]
    assert pi4.buses[0].bytes_per_s <= kinds["pcie"].line_bytes_per_s
    assert [len(load_board(b).tpus) for b in ("rpi3bplus-usb2", "rpi5-dualtpu", "pc-4tpu-pcie")] \
        == [1, 2, 4]
    assert load_board("rpi3bplus-usb2").tpus[0].link == "usb2"
