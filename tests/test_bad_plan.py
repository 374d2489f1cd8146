"""Bad plans and plan segments are refused by load_plan, in one line, before any worker opens a file.

Each class of issue #10 item 4 (docs/bad-input.md, "Models, bundles, plans and files").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgecap import interpreter, modelfile
from edgecap.errors import PlanError
from edgecap.plans.plan import load_plan
from runtime_plans import write_plan

TINY = Path(__file__).resolve().parent / "data" / "runtime" / "tiny_encoder.tflite"


@pytest.fixture
def plan_dir(tmp_path: Path, monkeypatch) -> Path:
    out = tmp_path / "plan"
    write_plan(TINY, [1, 2], ["tpu:0", "tpu:1", "cpu"], out, [1.0, 1.5, 0.5])
    # No interpreter may see a segment while a plan is loaded: load_plan reads the bytes itself.
    for module in (interpreter, modelfile):
        monkeypatch.setattr(module, "make_cpu_interpreter",
                            lambda *a, **k: pytest.fail("load_plan opened an interpreter"))
    return out


def _doc(plan_dir: Path) -> dict:
    return json.loads((plan_dir / "plan.json").read_text())


def _edit(plan_dir: Path, edit) -> None:
    doc = _doc(plan_dir)
    edit(doc)
    (plan_dir / "plan.json").write_text(json.dumps(doc))


def _older(plan_dir: Path) -> None:
    """Drops what plans before segment hashes lacked, so the bytes themselves are checked."""
    def drop(doc):
        doc["board"].pop("tpus", None)
        for s in doc["stages"]:
            s.pop("segment_sha256", None)
            s.pop("segment_bytes", None)
    _edit(plan_dir, drop)


def _segment(plan_dir: Path, i: int) -> Path:
    return plan_dir / _doc(plan_dir)["stages"][i]["segment"]


def _refused(plan_dir: Path, match: str) -> str:
    with pytest.raises(PlanError, match=match) as err:
        load_plan(plan_dir)
    msg = str(err.value)
    assert "\n" not in msg and "edgecap compile" in msg or "plan directory" in msg, msg
    return msg


def test_the_plan_records_each_segment_and_the_board(plan_dir: Path) -> None:
    doc = _doc(plan_dir)
    for s in doc["stages"]:
        assert s["segment_bytes"] == _segment(plan_dir, s["index"]).stat().st_size
        assert len(s["segment_sha256"]) == 64
    assert load_plan(plan_dir).stages[1].device == "tpu:1"


def test_a_truncated_segment(plan_dir: Path) -> None:
    seg = _segment(plan_dir, 1)
    seg.write_bytes(seg.read_bytes()[:500])
    _refused(plan_dir, rf"stages\[1\]: {seg.name} has 500 bytes, plan.json recorded \d+: the file changed")


def test_a_truncated_segment_of_an_older_plan(plan_dir: Path) -> None:
    _older(plan_dir)
    seg = _segment(plan_dir, 1)
    seg.write_bytes(seg.read_bytes()[:500])
    _refused(plan_dir, rf"{seg.name}: corrupt or truncated TFLite model \(.*\); re-run `edgecap compile`")


def test_random_bytes_for_a_segment(plan_dir: Path) -> None:
    _older(plan_dir)
    seg = _segment(plan_dir, 0)
    seg.write_bytes(os.urandom(3000))
    _refused(plan_dir, rf"{seg.name}: not a TFLite model \(no TFL3 identifier")


def test_a_tensor_name_that_is_not_utf8(plan_dir: Path) -> None:
    _older(plan_dir)
    seg = _segment(plan_dir, 0)
    data = bytearray(seg.read_bytes())
    name = _doc(plan_dir)["stages"][0]["inputs"][0]["name"].encode()
    data[data.find(name)] = 0xFF
    seg.write_bytes(bytes(data))
    _refused(plan_dir, r"name: not valid UTF-8")


def test_a_segment_rewritten_with_the_same_size(plan_dir: Path) -> None:
    seg = _segment(plan_dir, 2)
    data = bytearray(seg.read_bytes())
    data[-1] ^= 0x01
    seg.write_bytes(bytes(data))
    _refused(plan_dir, rf"{seg.name} is not the file plan.json was written with \(sha256 differs\)")


def test_segments_swapped_in_an_older_plan(plan_dir: Path) -> None:
    _older(plan_dir)
    a, b = _segment(plan_dir, 0), _segment(plan_dir, 2)
    data = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(data)
    _refused(plan_dir, r"stages\[0\]: .* reads '.*', which the stage's inputs do not list: the segment "
                       r"does not match plan.json")


@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_float_tensors_on_a_tpu_stage(plan_dir: Path, dtype: str) -> None:
    _edit(plan_dir, lambda d: d["stages"][0]["inputs"][0].update(dtype=dtype, scale=None, zero_point=None))
    _refused(plan_dir, rf"stages\[0\] on tpu:0 has {dtype} tensor .*: an EdgeTPU runs only int8")


@pytest.mark.parametrize("value, match", [
    (1e6, r"field 'stages\[1\].predicted_ms' must be float <= 60000.0"),
    (float("inf"), r"field 'stages\[1\].predicted_ms' must be float <= 60000.0"),
    (float("nan"), r"field 'stages\[1\].predicted_ms' must be float >= 0"),
    (-1.0, r"field 'stages\[1\].predicted_ms' must be float >= 0"),
    ("1.5", r"field 'stages\[1\].predicted_ms' must be float \| null, got str"),
])
def test_absurd_predicted_times(plan_dir: Path, value, match: str) -> None:
    _edit(plan_dir, lambda d: d["stages"][1].update(predicted_ms=value))
    _refused(plan_dir, match)


@pytest.mark.parametrize("edit, match", [
    (lambda d: d["stages"][0].pop("ops"), r"field 'stages\[0\].ops' is missing"),
    (lambda d: d.update(stages="all"), r"field 'stages' must be array, got str"),
    (lambda d: d["stages"][0].update(macs=-1), r"field 'stages\[0\].macs' must be int >= 0"),
    (lambda d: d["stages"][0].update(segment_bytes=-5), r"segment_bytes' must be int >= 0"),
    (lambda d: d.update(sram_bytes=10**30), r"field 'sram_bytes' must be int <= "),
    (lambda d: d["board"].update(tpus=10**6), r"field 'board.tpus' must be int <= 64"),
])
def test_wrong_types_missing_keys_and_absurd_sizes(plan_dir: Path, edit, match: str) -> None:
    _edit(plan_dir, edit)
    _refused(plan_dir, match)


def test_two_stages_on_one_tpu(plan_dir: Path) -> None:
    _edit(plan_dir, lambda d: d["stages"][1].update(device=":0"))
    _refused(plan_dir, r"stages\[0\] and stages\[1\] both run on tpu:0; one stage per device")


def test_a_tpu_index_the_board_lacks(plan_dir: Path) -> None:
    _edit(plan_dir, lambda d: (d["board"].update(tpus=2), d["stages"][1].update(device="emu-tpu:2")))
    _refused(plan_dir, r"stages\[1\] runs on emu-tpu:2, but board 'test' has 2 EdgeTPU\(s\); name a device")


def test_a_tpu_index_no_board_has(plan_dir: Path) -> None:
    _edit(plan_dir, lambda d: d["stages"][1].update(device="tpu:99999999999999999999"))
    _refused(plan_dir, r"runs on tpu:99999999999999999999, but no board has more than 64 EdgeTPUs")


def test_a_segment_path_out_of_the_directory(plan_dir: Path) -> None:
    _edit(plan_dir, lambda d: d["stages"][0].update(segment="../plan/" + d["stages"][0]["segment"]))
    load_plan(plan_dir)  # ../plan/ comes back in: allowed
    _edit(plan_dir, lambda d: d["stages"][0].update(segment="../../etc/passwd"))
    _refused(plan_dir, r"stages\[0\]: '../../etc/passwd' resolves outside the plan directory")


def test_a_segment_symlinked_out_of_the_directory(plan_dir: Path, tmp_path: Path) -> None:
    seg = _segment(plan_dir, 0)
    outside = tmp_path / "elsewhere.tflite"
    seg.rename(outside)
    seg.symlink_to(outside)
    _refused(plan_dir, rf"'{seg.name}' resolves outside the plan directory")


def test_a_directory_where_a_segment_belongs(plan_dir: Path) -> None:
    seg = _segment(plan_dir, 0)
    seg.unlink()
    seg.mkdir()
    _refused(plan_dir, rf"segment '{seg.name}' is a directory, not a .tflite file")


def test_a_directory_where_plan_json_belongs(plan_dir: Path) -> None:
    (plan_dir / "plan.json").unlink()
    (plan_dir / "plan.json").mkdir()
    for given in (plan_dir, plan_dir / "plan.json"):
        with pytest.raises(PlanError, match=r"plan/plan.json: is a directory, not a plan; re-run"):
            load_plan(given)


@pytest.mark.parametrize("which", ["plan.json", "segment"])
def test_unreadable_files_are_named_as_such(plan_dir: Path, monkeypatch, which: str) -> None:
    # Tests run as root here, where chmod does not deny a read: the read itself is made to fail.
    target = plan_dir / "plan.json" if which == "plan.json" else _segment(plan_dir, 1)
    real = os.open

    def denied(path, *a, **k):
        if Path(path) == target:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(os, "open", denied)  # every file is opened by edgecap.files
    what = "plan" if which == "plan.json" else "segment"
    with pytest.raises(PlanError, match=rf"{target.name}: permission denied; make the {what} readable"):
        load_plan(plan_dir)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads a mode-000 file anyway")
def test_unreadable_segment_for_real(plan_dir: Path) -> None:
    seg = _segment(plan_dir, 1)
    seg.chmod(0)
    with pytest.raises(PlanError, match="permission denied"):
        load_plan(plan_dir)


def test_the_cli_prints_one_line_and_writes_nothing(plan_dir: Path, tmp_path: Path) -> None:
    seg = _segment(plan_dir, 1)
    seg.write_bytes(seg.read_bytes()[:500])
    trace = tmp_path / "trace.json"
    proc = subprocess.run([sys.executable, "-m", "edgecap.cli", "caption", "--plan", str(plan_dir),
                           "--emulate", "--trace", str(trace)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "has 500 bytes, plan.json recorded" in lines[0], proc.stderr
    assert not trace.exists()


def test_a_plan_built_in_memory_is_checked_by_check_segments(plan_dir: Path) -> None:
    from edgecap.plans.plan import check_segments

    plan = load_plan(plan_dir)
    check_segments(plan)  # intact: nothing to say
    plan.stages[2].segment.write_bytes(b"\x00" * 64)
    with pytest.raises(PlanError, match=r"not a TFLite model \(no TFL3 identifier"):
        check_segments(plan)


def test_a_plan_path_no_system_call_takes(tmp_path: Path) -> None:
    # The service's `plan` key may hold any string; a NUL in it reached open() before.
    with pytest.raises(PlanError, match=r"not a usable file name \(it contains a NUL byte\)"):
        load_plan(str(tmp_path / "p\x00lan.json"))
