"""Every loader refuses a FIFO and a link to /dev/zero in one line, without blocking or reading.

A FIFO used to block ``open`` forever and ``/dev/zero`` to read until
MemoryError (issue 19). The loads run in a child process with a per-load
alarm and a cap on its address space, so a regression fails as "hung" or
"escaped" instead of hanging the suite or eating the machine's memory.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import pytest

from conftest import write_noise_clip
from runtime_plans import write_plan

HERE = Path(__file__).resolve().parent
TINY = HERE / "data" / "runtime" / "tiny_encoder.tflite"
MODEL = HERE / "data" / "compile" / "tiny_mobilenet.tflite"
SECONDS = 10  # per load; a refused one takes milliseconds


def _config(d: Path, token_file: bool = False) -> Path:
    clip = write_noise_clip(d / "clip.mp4", 8, 32)
    token = '[http]\ntoken_file = "token"\n' if token_file else ""
    (d / "edgecap.toml").write_text(f'{token}[[cameras]]\nname = "cam"\nsource = "{clip}"\n')
    return d / "edgecap.toml"


def _plan(d: Path) -> Path:
    write_plan(TINY, [1], ["tpu:0", "cpu"], d / "p", [1.0, 1.0])
    return d / "p"


# kind -> (lay out the files in a scratch dir and return the one to make special, what to load)
SETUPS: Dict[str, Callable[[Path, Path], Tuple[Path, Path]]] = {
    "bundle.json": lambda d, b: (shutil.copytree(b, d / "b") and d / "b" / "bundle.json", d / "b"),
    "vocab": lambda d, b: (shutil.copytree(b, d / "b") and d / "b" / "vocab.txt", d / "b"),
    "bundle model": lambda d, b: (shutil.copytree(b, d / "b") and d / "b" / "encoder.tflite", d / "b"),
    "model (open_model)": lambda d, b: (d / "m.tflite", d / "m.tflite"),
    "plan.json": lambda d, b: (_plan(d) / "plan.json", d / "p"),
    "plan segment": lambda d, b: (next(_plan(d).glob("*_segment_1_*.tflite")), d / "p"),
    "serve TOML": lambda d, b: (_config(d), _config(d)),
    "token file": lambda d, b: (d / "token", _config(d, token_file=True)),
    "board profile": lambda d, b: (d / "board.json", d / "board.json"),
    "calibration": lambda d, b: (d / "calibration.json", d / "calibration.json"),
    "compiler model": lambda d, b: (d / "m.tflite", d / "m.tflite"),
    "dataset index": lambda d, b: (d / "captions.json", d),
    "trace": lambda d, b: (d / "trace.json", d / "trace.json"),
}


def _load(kind: str, path: str) -> None:
    """What each kind's loader is called with; runs in the child."""
    if kind in ("bundle.json", "vocab", "bundle model"):
        from edgecap.bundle import load_bundle
        load_bundle(path)
    elif kind == "model (open_model)":
        from edgecap.modelfile import open_model
        open_model(path)
    elif kind in ("plan.json", "plan segment"):
        from edgecap.plans.plan import load_plan
        load_plan(path)
    elif kind in ("serve TOML", "token file"):
        from edgecap.service.config import load_config
        load_config(path, {})
    elif kind == "board profile":
        from edgecap_compile.boards import load_board
        load_board(path)
    elif kind == "calibration":
        from edgecap_compile.boards import load_board
        from edgecap_compile.calibration import apply_calibration
        apply_calibration(load_board("host"), path)
    elif kind == "compiler model":
        from edgecap_compile.graph import read_graph
        read_graph(path)
    elif kind == "dataset index":
        from edgecap.dataset import read_dataset
        read_dataset(path)
    elif kind == "trace":
        from edgecap.trace import load_slices
        load_slices(path)
    else:
        raise AssertionError(kind)


class Hung(BaseException):
    """Raised by the alarm: not an OSError, which a loader would turn into its own line."""


def _alarm(signum, frame):
    raise Hung()


def _vm_bytes() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))


def child(cases: List[Tuple[str, str]]) -> None:
    """Loads each case under an alarm and an address-space cap; prints one JSON result a line."""
    from edgecap.errors import EdgecapError

    signal.signal(signal.SIGALRM, _alarm)
    for kind, path in cases:
        try:  # warm the imports first, so that the cap and alarm measure the load alone
            _load(kind, "/nonexistent/edgecap-warm-up")
        except Exception:  # noqa: BLE001
            pass
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (_vm_bytes() + (1 << 30), hard))
        signal.alarm(SECONDS)
        try:
            _load(kind, path)
            outcome, text = "loaded", ""
        except EdgecapError as exc:
            outcome, text = "refused", str(exc)
        except Hung:
            outcome, text = "hung", ""
        except BaseException as exc:  # noqa: BLE001 (MemoryError and the like: the bug)
            outcome, text = "escaped", "".join(traceback.format_exception_only(type(exc), exc))
        finally:
            signal.alarm(0)
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        print(json.dumps({"kind": kind, "outcome": outcome, "text": text}), flush=True)


def _make_special(target: Path, special: str) -> None:
    if target.exists() or target.is_symlink():
        target.unlink()
    if special == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to("/dev/zero")


@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_every_loader_refuses_a_special_file_in_one_line(special: str, shipped_bundle: Path,
                                                         tmp_path: Path) -> None:
    cases = []
    for i, (kind, setup) in enumerate(SETUPS.items()):
        scratch = tmp_path / str(i)
        scratch.mkdir()
        target, load = setup(scratch, shipped_bundle)
        _make_special(target, special)
        cases.append((kind, str(load)))
    code = f"import sys; sys.path.insert(0, {str(HERE)!r}); import test_special_files as t; t.child({cases!r})"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=SECONDS * len(cases) + 120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["kind"] for r in results] == list(SETUPS)
    bad = [r for r in results if r["outcome"] != "refused" or "\n" in r["text"]]
    assert not bad, bad


@pytest.mark.fast
@pytest.mark.parametrize("special, says", [("fifo", "a FIFO (named pipe), not a regular file"),
                                           ("/dev/zero", "a character device, not a regular file")])
def test_the_line_names_what_the_file_is(special: str, says: str, tmp_path: Path) -> None:
    from edgecap.errors import PlanError
    from edgecap.files import read_bytes

    target = tmp_path / "plan.json"
    _make_special(target, special)
    with pytest.raises(PlanError) as err:
        read_bytes(target, what="plan", fix="re-run `edgecap compile`", error=PlanError)
    assert str(err.value) == (f"{target}: {says}: give the plan as a regular file; "
                              "re-run `edgecap compile`")


@pytest.mark.fast
def test_a_file_over_its_kinds_bound_is_refused(tmp_path: Path, monkeypatch) -> None:
    from edgecap import files
    from edgecap.errors import ConfigError

    path = tmp_path / "edgecap.toml"
    path.write_bytes(b"# " + b"x" * 2000 + b"\n")
    monkeypatch.setitem(files.LIMITS, "toml", 1024)
    with pytest.raises(ConfigError, match=r"edgecap.toml: too large for a config file \(2003 bytes, more "
                                          r"than the 1 KiB allowed\); fix it"):
        files.read_bytes(path, what="config file", fix="fix it", kind="toml", error=ConfigError)
    assert files.read_bytes(path, what="config file", fix="fix it", kind="json") == path.read_bytes()
