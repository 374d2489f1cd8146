"""Bad invocations of every command: exit 2, one line naming the offending path, before any work.

Each row runs ``edgecap.cli.main`` in-process. The functions that do a
command's work (captioning, scoring, benchmarking, compiling, calibrating) are
replaced by ones that fail the test, so a row also proves that its error comes
before the run. Tests run as root here, which permission bits do not stop:
the read-only place is ``/sys``, where not even root may create a file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, List

import pytest

from conftest import write_noise_clip
from test_bad_media import write_damaged_clip
from edgecap.cli import main

READ_ONLY = Path("/sys")
MODEL = Path(__file__).parent / "data" / "compile" / "tiny_mobilenet.tflite"


def _work_started(*args, **kwargs):
    raise AssertionError("the run started before its bad input was found")


@pytest.fixture
def no_work(monkeypatch):
    """Makes every command's work fail the test: bad input must be found before it."""
    import edgecap_lab.bench
    import edgecap.captioner
    import edgecap_lab.evaluate
    import edgecap_compile.calibration
    import edgecap_compile.compiler

    monkeypatch.setattr(edgecap.captioner.EdgeCaptioner, "__init__", _work_started)
    monkeypatch.setattr(edgecap_lab.bench, "run_bench", _work_started)
    monkeypatch.setattr(edgecap_lab.evaluate, "evaluate", _work_started)
    monkeypatch.setattr(edgecap_compile.compiler, "compile_model", _work_started)
    monkeypatch.setattr(edgecap_compile.calibration, "calibrate", _work_started)


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_noise_clip(tmp_path_factory.mktemp("clip") / "clip.mp4", 16, 64)


# Where a file output may point that cannot be written, and what the line says.
# Each builder takes a scratch directory and the output's file name.
FILE_PLACES = {
    "missing directory": (lambda d, name: d / "no" / "such" / name, "no directory"),
    "file used as a directory": (lambda d, name: d / "afile" / name, "is a file, not a directory"),
    "directory where a file belongs": (lambda d, name: d / "adir", "is a directory"),
    "read-only place": (lambda d, name: READ_ONLY / name, "cannot write in /sys"),
}

# Each command with a file output: its argv given the output path.
FILE_OUTPUTS = {
    "caption --trace": lambda out, c: ["caption", str(c), "--trace", str(out)],
    "camera --trace": lambda out, c: ["camera", "/dev/video97", "--trace", str(out)],
    "eval --out": lambda out, c: ["eval", "--data", str(c.parent), "--out", str(out)],
    "bench --json": lambda out, c: ["bench", "--clips", str(c), "--json", str(out)],
    "bench --trace": lambda out, c: ["bench", "--clips", str(c), "--trace", str(out)],
    "bench --plot": lambda out, c: ["bench", "--clips", str(c), "--plot", str(out)],
    "bench --timeline": lambda out, c: ["bench", "--clips", str(c), "--plot",
                                        str(c.parent / "p.png"), "--timeline", str(out)],
    "calibrate -o": lambda out, c: ["calibrate", str(MODEL), "--board", "host", "-o", str(out)],
}


def _scratch(tmp_path: Path) -> Path:
    (tmp_path / "afile").write_text("a file, not a directory\n")
    (tmp_path / "adir").mkdir()
    return tmp_path


def _run(argv: List[str], capfd: pytest.CaptureFixture) -> "tuple[int, str, str]":
    code = main(argv)
    out, err = capfd.readouterr()
    return code, out, err


def _assert_one_line(code: int, err: str, *needles: str) -> str:
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgecap: error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.mark.usefixtures("no_work")
@pytest.mark.parametrize("place", list(FILE_PLACES))
@pytest.mark.parametrize("output", list(FILE_OUTPUTS))
def test_file_output_in_a_bad_place(output: str, place: str, clip: Path, tmp_path: Path,
                                    capfd) -> None:
    build, says = FILE_PLACES[place]
    name = "out.png" if output in ("bench --plot", "bench --timeline") else "out.json"
    out = build(_scratch(tmp_path), name)
    code, stdout, err = _run(FILE_OUTPUTS[output](out, clip), capfd)
    flag = output.split()[1]
    _assert_one_line(code, err, f"{flag} {out}", says)
    assert stdout == ""


@pytest.mark.usefixtures("no_work")
@pytest.mark.parametrize("place, says", [
    (lambda d: d / "afile", "is a file, not a folder"),
    (lambda d: d / "no" / "such" / "plan", "no directory"),
    (lambda d: d / "afile" / "plan", "is a file, not a directory"),
    (lambda d: READ_ONLY / "plan", "cannot write in /sys"),
], ids=["file where the folder belongs", "missing parent", "file used as a directory",
        "read-only place"])
def test_compile_out_folder_in_a_bad_place(place: Callable[[Path], Path], says: str,
                                           tmp_path: Path, capfd) -> None:
    out = place(_scratch(tmp_path))
    code, stdout, err = _run(["compile", str(MODEL), "--board", "host", "-o", str(out)], capfd)
    _assert_one_line(code, err, f"-o {out}", says)
    assert not os.path.lexists(out) or out.is_file()


@pytest.mark.usefixtures("no_work")
def test_compile_into_a_bundle_whose_plans_is_a_file(bundle_copy: Path, capfd) -> None:
    (bundle_copy / "plans").write_text("not a folder\n")
    code, _, err = _run(["compile", str(bundle_copy), "--board", "host", "--into-bundle"], capfd)
    _assert_one_line(code, err, str(bundle_copy / "plans"))


@pytest.mark.usefixtures("no_work")
def test_plot_in_a_format_matplotlib_lacks(clip: Path, tmp_path: Path, capfd) -> None:
    out = tmp_path / "chart.xyz"
    code, _, err = _run(["bench", "--clips", str(clip), "--plot", str(out)], capfd)
    _assert_one_line(code, err, str(out), ".xyz", ".png")


@pytest.mark.parametrize("source, says", [
    (lambda d: d / "none.mp4", "no such video file"),
    (lambda d: d, "not a file"),
    (lambda d: d / "afile", "not a video"),
    (lambda d: Path("/dev/video97"), "no such device"),
], ids=["missing file", "directory", "not a video", "missing camera"])
def test_unreadable_source(source: Callable[[Path], Path], says: str, shipped_bundle: Path,
                           tmp_path: Path, capfd) -> None:
    # The source is opened by the captioner's stream(), after the captioner is built.
    path = source(_scratch(tmp_path))
    command = "camera" if str(path).startswith("/dev/") else "caption"
    code, stdout, err = _run([command, str(path), "--bundle", str(shipped_bundle)], capfd)
    _assert_one_line(code, err, str(path), says)
    assert stdout == ""


@pytest.mark.usefixtures("no_work")
def test_timeline_without_plot(clip: Path, tmp_path: Path, capfd) -> None:
    out = tmp_path / "t.png"
    code, _, err = _run(["bench", "--clips", str(clip), "--timeline", str(out)], capfd)
    _assert_one_line(code, err, f"--timeline {out}", "add --plot")


def test_an_unreadable_video_is_reported_as_such(clip: Path, shipped_bundle: Path, monkeypatch,
                                                 capfd) -> None:
    import edgecap.sources

    # Root reads any file: the check's answer is what a user without permission would get.
    real = os.access
    monkeypatch.setattr(edgecap.sources.os, "access",
                        lambda p, mode: False if Path(p) == clip else real(p, mode))
    code, _, err = _run(["caption", str(clip), "--bundle", str(shipped_bundle)], capfd)
    _assert_one_line(code, err, str(clip), "permission denied")


def test_camera_index_without_a_device(shipped_bundle: Path, capfd) -> None:
    index = next(i for i in range(90, 100) if not os.path.exists(f"/dev/video{i}"))
    code, _, err = _run(["camera", str(index), "--bundle", str(shipped_bundle)], capfd)
    # capfd sees OpenCV's own lines too ("can't open camera by index"): there are none.
    _assert_one_line(code, err, f"camera {index}", f"/dev/video{index}", "no such device")


def test_a_run_that_fails_leaves_no_output_behind(tmp_path: Path, capsys) -> None:
    # capsys, not capfd: in this process FFmpeg's log level was fixed by whichever test opened
    # a video first (test_bad_media checks FFmpeg's silence in a fresh process).
    damaged = write_damaged_clip(tmp_path / "damaged.mp4")
    before = sorted(os.listdir(tmp_path))
    out = tmp_path / "bench.json"
    code, _, err = _run(["bench", "--clips", str(damaged), "--frames", "8", "--json", str(out),
                         "--plot", str(tmp_path / "bench.png")], capsys)
    _assert_one_line(code, err, str(damaged), "damaged at frame")
    assert sorted(os.listdir(tmp_path)) == before  # no results, no temporary or probe file


# Every numeric option of every command: (argv before the flag, the flag, the range the line states).
NUMERIC_OPTIONS = [
    (["caption"], "--frames", "from 1 to 10,000"),
    (["caption"], "--stride", "from 1 to 10,000"),
    (["caption"], "--sample-fps", "from 0 to 10000"),
    (["caption"], "--threads", "from 1 to 256"),
    (["caption"], "--batch", "from 1 to 1,024"),
    (["caption"], "--beam", "from 1 to 64"),
    (["camera", "0"], "--threads", "from 1 to 256"),
    (["camera", "0"], "--beam", "from 1 to 64"),
    (["eval", "--data", "."], "--beam", "from 1 to 64"),
    (["eval", "--data", "."], "--limit", "from 1 to 1,000,000"),
    (["serve", "--config", "x.toml"], "--http-port", "from 0 to 65,535"),
    (["bench"], "--frames", "from 1 to 1,000,000"),
    (["bench"], "--strides", "each from 1 to 10,000"),
    (["bench"], "--threads", "from 1 to 256"),
    (["bench"], "--batch", "from 1 to 1,024"),
    (["bench"], "--beam", "from 1 to 64"),
    (["compile", str(MODEL), "--board", "host", "-o", "out"], "--tpus", "from 0 to 8"),
    (["compile", str(MODEL), "--board", "host", "-o", "out"], "--sram", "from 1 to 1,073,741,824"),
    (["compile", str(MODEL), "--board", "host", "-o", "out"], "--min-runtime-version", "from 10 to 99"),
    (["compile", str(MODEL), "--board", "host", "--into-bundle"], "--candidates", "from 0 to 64"),
    (["compile", str(MODEL), "--board", "host", "--into-bundle"], "--candidates-max-mb", "from 0 to 100000"),
    (["calibrate", str(MODEL), "--board", "host", "-o", "c.json"], "--threads", "from 1 to 256"),
    (["calibrate", str(MODEL), "--board", "host", "-o", "c.json"], "--segments", "from 1 to 10,000"),
    (["calibrate", str(MODEL), "--board", "host", "-o", "c.json"], "--repeats", "from 1 to 10,000"),
    (["calibrate", str(MODEL), "--board", "host", "-o", "c.json"], "--seed", "from 0 to 4,294,967,295"),
]


# Outside every range above; and the values of issue 19 (--threads 32768 crashed TFLite).
OUT_OF_RANGE = ["-1", str(2**40), "1e30", "nan", "x", "1\n2"]
NUMERIC_CASES = [(b, f, says, v) for b, f, says in NUMERIC_OPTIONS for v in OUT_OF_RANGE] + [
    (["caption"], "--threads", "from 1 to 256", "32768"),
    (["compile", str(MODEL), "--board", "host", "-o", "out"], "--tpus", "from 0 to 8", "1000000000"),
]


@pytest.mark.usefixtures("no_work")
@pytest.mark.parametrize("before, flag, says, value", NUMERIC_CASES,
                         ids=[f"{b[0]} {f} {v!r}" for b, f, _, v in NUMERIC_CASES])
def test_every_numeric_option_has_a_range_checked_before_any_work(before: List[str], flag: str, says: str,
                                                                  value: str, tmp_path: Path, monkeypatch,
                                                                  capfd) -> None:
    monkeypatch.chdir(tmp_path)
    code, stdout, err = _run([*before, flag, value], capfd)
    shown = value if value.isprintable() else repr(value)
    _assert_one_line(code, err, f"argument {flag}: {shown}: use ", says, f"edgecap {before[0]} --help")
    assert stdout == "" and os.listdir(tmp_path) == []
