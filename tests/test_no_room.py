"""A full disk and an unusable cache directory are one line and exit 2, never a traceback (issue 19).

``/dev/full`` stands for a full disk: every write to it fails with ENOSPC.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import write_noise_clip
from edgecap.cli import main
from edgecap.errors import ConfigError
from edgecap.trace import Tracer

FULL = Path("/dev/full")
MODEL = Path(__file__).parent / "data" / "compile" / "tiny_mobilenet.tflite"

pytestmark = pytest.mark.skipif(not FULL.exists(), reason="needs /dev/full (Linux)")


def _one_line(err: str, *needles: str) -> None:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgecap: error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, err)


@pytest.mark.parametrize("argv", [["validate"], ["caption", "--json"]], ids=["buffered", "flushed per line"])
def test_stdout_on_a_full_disk(argv, tmp_path: Path, shipped_bundle: Path) -> None:
    if argv[0] == "caption":
        argv = [*argv, str(write_noise_clip(tmp_path / "clip.mp4", 16, 64)), "--bundle", str(shipped_bundle)]
    else:
        argv = [*argv, str(shipped_bundle)]
    with open(FULL, "w") as full:
        proc = subprocess.run([sys.executable, "-m", "edgecap.cli", *argv], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    _one_line(proc.stderr, "cannot write the output (No space left on device)", "free space")


def test_calibrate_out_on_a_full_disk(capsys) -> None:
    code = main(["calibrate", str(MODEL), "--board", "host", "--segments", "8", "--repeats", "1",
                 "-o", str(FULL)])
    assert code == 2
    _one_line(capsys.readouterr().err, "-o /dev/full: cannot write (No space left on device); nothing was written")


def test_a_plot_on_a_full_disk(tmp_path: Path) -> None:
    from edgecap_lab.plots import plot_timeline

    tracer = Tracer()
    tracer.add_tracks(["cpu"])
    for i in range(4):
        tracer.slice("cpu", "tail", i, tracer._origin + i * 1e-3, tracer._origin + i * 1e-3 + 5e-4)
    tracer.write(tmp_path / "trace.json")
    with pytest.raises(ConfigError, match="/dev/full: cannot write \\(No space left on device\\); nothing"):
        plot_timeline(tmp_path / "trace.json", FULL)


@pytest.mark.parametrize("cache, says", [
    (lambda d: d / "afile", "Not a directory"),
    (lambda d: Path("/sys/edgecap-cache"), "not permitted"),  # read-only, even to root
], ids=["a file", "read-only"])
def test_an_unusable_plan_cache(cache, says: str, tmp_path: Path, shipped_bundle: Path, monkeypatch,
                                capfd) -> None:
    (tmp_path / "afile").write_text("a file, not a directory\n")
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache(tmp_path)))
    clip = write_noise_clip(tmp_path / "clip.mp4", 16, 64)
    code = main(["caption", str(clip), "--bundle", str(shipped_bundle), "--board", "devboard-usb"])
    out, err = capfd.readouterr()
    assert code == 2 and out == ""
    _one_line(err, f"plan cache {cache(tmp_path)}/edgecap/plans: cannot write it", says,
              "set XDG_CACHE_HOME to a directory you can write")
