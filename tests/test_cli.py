"""The edgecap CLI: exit code 0 on success, 2 with one line on stderr for bad input."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import write_noise_clip
from edgecap.cli import main
from edgecap.command import Terminated, run_command
from edgecap.errors import ConfigError


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_noise_clip(tmp_path_factory.mktemp("clip") / "clip.mp4", 40, 96)


def _one_line_error(capsys: pytest.CaptureFixture, code: int, *needles: str) -> None:
    out, err = capsys.readouterr()
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgecap: error: "), err
    for n in needles:
        assert n in lines[0]


def test_caption_prints_windows_and_table(clip: Path, shipped_bundle: Path, capsys) -> None:
    assert main(["caption", str(clip), "--bundle", str(shipped_bundle)]) == 0
    out = capsys.readouterr().out
    assert out.count("s] ") == 2 and "rnn_step" in out and "decode" in out


def test_caption_json_lines(clip: Path, shipped_bundle: Path, capsys) -> None:
    assert main(["caption", str(clip), "--bundle", str(shipped_bundle), "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["window"] for r in rows] == [0, 1]
    assert {"text", "start_time", "end_time", "start_frame", "end_frame", "stage_ms"} <= set(rows[0])


def test_missing_video(tmp_path: Path, shipped_bundle: Path, capsys) -> None:
    code = main(["caption", str(tmp_path / "none.mp4"), "--bundle", str(shipped_bundle)])
    _one_line_error(capsys, code, "none.mp4", "no such video file")


def test_not_a_video(tmp_path: Path, shipped_bundle: Path, capsys) -> None:
    bad = tmp_path / "x.mp4"
    bad.write_bytes(b"\x00garbage" * 100)
    code = main(["caption", str(bad), "--bundle", str(shipped_bundle)])
    _one_line_error(capsys, code, "x.mp4", "not a video")


def test_bad_bundle(clip: Path, bundle_copy: Path, capsys) -> None:
    (bundle_copy / "vocab.txt").write_text("just\nthree\nwords\n")
    code = main(["caption", str(clip), "--bundle", str(bundle_copy)])
    _one_line_error(capsys, code, "vocab.txt")


def test_missing_camera(shipped_bundle: Path, capsys) -> None:
    code = main(["camera", "/dev/video93", "--bundle", str(shipped_bundle)])
    _one_line_error(capsys, code, "/dev/video93")


def test_bad_dataset_for_eval(tmp_path: Path, shipped_bundle: Path, capsys) -> None:
    code = main(["eval", "--bundle", str(shipped_bundle), "--data", str(tmp_path)])
    _one_line_error(capsys, code, "captions.json")


def test_validate(shipped_bundle: Path, capsys) -> None:
    assert main(["validate", str(shipped_bundle)]) == 0
    assert ": ok: " in capsys.readouterr().out


def test_console_script_exit_code_and_no_traceback(tmp_path: Path, shipped_bundle: Path) -> None:
    # The installed entry point, in a fresh process: what a user's shell sees.
    r = subprocess.run([sys.executable, "-m", "edgecap.cli", "caption", str(tmp_path / "no.mp4"),
                        "--bundle", str(shipped_bundle)], capture_output=True, text=True)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_caption_on_emulated_board_writes_trace(clip: Path, shipped_bundle: Path, tmp_path: Path,
                                                capsys) -> None:
    trace = tmp_path / "run.json"
    assert main(["caption", str(clip), "--bundle", str(shipped_bundle),
                 "--board", "devboard-usb", "--trace", str(trace)]) == 0
    assert "emu-tpu:0" in capsys.readouterr().out
    events = json.loads(trace.read_text())["traceEvents"]
    tracks = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert {"emu-tpu:0", "cpu"} <= tracks


def test_unknown_board(clip: Path, shipped_bundle: Path, capsys) -> None:
    code = main(["caption", str(clip), "--bundle", str(shipped_bundle), "--board", "nosuch"])
    _one_line_error(capsys, code, "unknown board 'nosuch'")


def test_eval_split_names_unknown_clip(tmp_path: Path, shipped_bundle: Path, capsys) -> None:
    (tmp_path / "captions.json").write_text(json.dumps(
        {"clips": {"a": ["a red circle grows"]}, "splits": {"test": ["a", "zzz"]}}))
    code = main(["eval", "--bundle", str(shipped_bundle), "--data", str(tmp_path)])
    _one_line_error(capsys, code, "'zzz'")


def test_eval_limit_must_be_positive(tmp_path: Path, shipped_bundle: Path, capsys) -> None:
    code = main(["eval", "--bundle", str(shipped_bundle), "--data", str(tmp_path), "--limit", "0"])
    _one_line_error(capsys, code, "--limit: 0: use a whole number from 1 to")


def test_help_lists_every_command(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    for command in ("caption", "camera", "eval", "validate", "devices", "bench", "compile",
                    "calibrate"):
        assert command in out


@pytest.mark.parametrize("index, named", [
    ({"clips": ["a red circle grows"]}, "malformed dataset index"),
    ({"clips": {"a": ["a red circle grows"]}}, "no file for clip 'a'"),
])
def test_eval_bad_dataset_index_or_missing_clip(tmp_path: Path, shipped_bundle: Path, capsys,
                                                index, named) -> None:
    (tmp_path / "captions.json").write_text(json.dumps(index))
    code = main(["eval", "--bundle", str(shipped_bundle), "--data", str(tmp_path)])
    _one_line_error(capsys, code, named)


def test_eval_without_pycocoevalcap_names_the_extra(tmp_path: Path, shipped_bundle: Path, capsys,
                                                    hide_module) -> None:
    hide_module("pycocoevalcap")
    code = main(["eval", "--bundle", str(shipped_bundle), "--data", str(tmp_path)])
    _one_line_error(capsys, code, "pip install pycocoevalcap")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_long_commands_show_progress_on_a_terminal_only(tmp_path: Path, monkeypatch, capsys) -> None:
    model = Path(__file__).parent / "data" / "compile" / "tiny_mobilenet.tflite"
    args = ["calibrate", str(model), "--board", "host", "--segments", "8", "--repeats", "1",
            "-o", str(tmp_path / "cal.json")]
    assert main(args) == 0
    assert capsys.readouterr().err == ""
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(args) == 0
    assert "calibrate" in terminal.getvalue() and "0/8 " in terminal.getvalue()


@pytest.mark.parametrize("argv", [["compile", "m.tflite", "--board", "host", "-o", "out"],
                                  ["calibrate", "m.tflite", "--board", "host", "-o", "c.json"]])
def test_compiler_commands_without_the_compiler_are_one_line(capsys, monkeypatch, argv) -> None:
    for name in [m for m in sys.modules if m.startswith("edgecap_compile")] + ["edgecap_compile"]:
        monkeypatch.setitem(sys.modules, name, None)  # None: importing it raises ImportError
    _one_line_error(capsys, main(argv), "the compiler is not installed")


def test_compiler_commands_are_in_the_one_tree() -> None:
    # Parsing them imports nothing of the compiler: it loads only when they run.
    code = ("import sys\n"
            "from edgecap.cli import build_parser\n"
            "a = build_parser().parse_args(['compile', 'm.tflite', '--board', 'host', '-o', 'o',"
            " '--tpus', '2'])\n"
            "assert a.tpus == 2 and a.func.__name__ == '_cmd_compile'\n"
            "assert not [m for m in sys.modules if m.startswith('edgecap_compile')]\n")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("raised, code, line", [
    (None, 0, None),
    (ConfigError("--out x: no directory"), 2, "edgecap soak: error: --out x: no directory"),
    (KeyboardInterrupt(), 130, None),
    (Terminated(), 143, None),
])
def test_every_command_shares_the_exit_policy(capsys, raised, code, line):
    # `edgecap`, the soak, the isolation bench and the compiler's benchmarks all run through it.
    def body() -> int:
        if raised is not None:
            raise raised
        return 0

    assert run_command("edgecap soak", body) == code
    err = capsys.readouterr().err
    assert err.splitlines() == ([line] if line else []) and "Traceback" not in err
