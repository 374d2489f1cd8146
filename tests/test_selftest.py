"""`edgecap selftest` and `edgecap devices --root`: a board's files replayed here, and this machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgecap import edgetpu_runtime, selftest
from edgecap.cli import main
from test_devices import _fake_tree

PI5 = "Raspberry Pi 5 Model B Rev 1.0"


@pytest.fixture
def pi5(tmp_path) -> Path:
    """A Raspberry Pi 5's files: a Dual Edge TPU (two apex devices), one hot."""
    return _fake_tree(tmp_path / "pi5", {}, {0: 41000, 1: 91000}, PI5)


def test_devices_reads_another_root(pi5, capsys) -> None:
    assert main(["devices", "--root", str(pi5)]) == 0
    out = capsys.readouterr().out
    assert "board: Raspberry Pi 5 (Raspberry Pi 5 Model B Rev 1.0); profile: rpi5-dualtpu" in out
    assert f"{pi5}/dev/apex_1" in out and "91.0C" in out
    assert main(["devices", "--root", str(pi5), "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    (auto,) = [line["auto"] for line in lines if "auto" in line]
    assert (auto["profile"], auto["nearest"]) == ("rpi5-dualtpu", None)
    assert [line["device"] for line in lines if "device" in line] == ["cpu", "tpu:0", "tpu:1"]


def test_devices_refuses_a_root_that_is_not_a_directory(tmp_path, capsys) -> None:
    assert main(["devices", "--root", str(tmp_path / "absent")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--root" in err[0] and "not a directory" in err[0]


def test_selftest_replays_a_board_and_says_why_it_skips(pi5) -> None:
    checks = {c.name: c for c in selftest.run(root=pi5)}
    assert checks["board"].result == "ok" and "profile rpi5-dualtpu" in checks["board"].detail
    assert checks["tpu:0 temperature"].result == "ok"
    assert checks["tpu:1 temperature"].result == "warn" and "throttled to 1/4" in checks["tpu:1 temperature"].detail
    assert checks["tpu:0 open"].result == "skip" and "another root" in checks["tpu:0 open"].detail
    assert all(c.detail for c in checks.values())  # every result says why


def test_selftest_on_this_machine_prints_a_table_and_json(capsys) -> None:
    code = main(["selftest"])
    out = capsys.readouterr().out
    table, _, last = out.rstrip().rpartition("\n")
    report = json.loads(last)
    assert table.splitlines()[0].split() == ["CHECK", "RESULT", "DETAIL"]
    names = [c["name"] for c in report["checks"]]
    assert names[:3] == ["platform", "interpreter", "numpy, OpenCV"] and "libedgetpu" in names
    assert code == (1 if any(c["result"] == "fail" for c in report["checks"]) else 0)


def test_selftest_opens_each_tpu_with_the_probe_and_a_compiled_model(tmp_path, monkeypatch) -> None:
    # A fake USB TPU and libedgetpu: the probe runs for the shipped model and for the bundle's
    # compiled model (here any model file named *_edgetpu.tflite: the stub runs it on the CPU).
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the fake libedgetpu")
    library = tmp_path / "libedgetpu.so.1"
    fakes = Path(__file__).parent / "fake_libedgetpu"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(library), str(fakes / "reorder.c")], check=True)
    usb = tmp_path / "usb"
    (usb / "2-1").mkdir(parents=True)
    for name, value in (("idVendor", "1a6e"), ("idProduct", "089a"), ("speed", "480")):
        (usb / "2-1" / name).write_text(value + "\n")
    monkeypatch.setenv("FAKE_EDGETPU_USB", str(usb))
    monkeypatch.setenv(edgetpu_runtime.ENV_LIBRARY, str(library))
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    shutil.copy(Path(__file__).parent / "data" / "compile" / "tiny_float.tflite", bundle / "x_edgetpu.tflite")
    edgetpu_runtime._CACHE.clear()
    checks = {c.name: c for c in selftest.run(bundle)}
    assert checks["tpu:0 probe model"].result == "ok"
    assert checks["tpu:0 compiled x_edgetpu.tflite"].result == "ok"
    # Woken before it was listed: its firmware "loaded", so it runs at its USB 2 port's speed.
    assert checks["tpu:0 USB link"].detail.endswith("; loaded") and checks["tpu:0 USB link"].result == "warn"
