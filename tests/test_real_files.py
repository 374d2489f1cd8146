"""tools/real_files.py: every real model file through edgecap's steps, a crash or a hang recorded, not fatal."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"
CORAL = Path(__file__).resolve().parent / "data" / "coral"
sys.path.insert(0, str(TOOLS))

import real_files  # noqa: E402

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")


def _child(tmp_path: Path, code: str, timeout: float = 60.0) -> real_files.Outcome:
    outcome, _ = real_files.run_child([sys.executable, "-c", code], timeout, {}, {str(tmp_path): "HERE"})
    return outcome


def test_a_native_crash_a_hang_a_refusal_and_a_traceback_are_each_recorded(tmp_path) -> None:
    crashed = _child(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert (crashed.status, crashed.detail) == ("crashed", "SIGSEGV")

    # The hung child's own child is killed with it: the child's session goes.
    pid_file = tmp_path / "grandchild.pid"
    hung = _child(tmp_path, "import subprocess, sys, time; "
                            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                            f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)", timeout=3)
    assert hung.status == "timeout" and "3 s" in hung.detail
    assert hung.seconds < 30  # not held until the grandchild's sleep ends (it keeps the pipes open)
    grandchild = Path(f"/proc/{pid_file.read_text()}/stat")

    def alive() -> bool:
        try:
            return grandchild.read_text().split()[2] != "Z"
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 10  # SIGKILL is delivered, not awaited: give the kernel a moment
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive()

    refused = _child(tmp_path, f"import sys; print('edgecap: warning', file=sys.stderr); "
                               f"print('edgecap: error: {tmp_path}/m.tflite: bad; re-export it', file=sys.stderr); "
                               "sys.exit(2)")
    assert (refused.status, refused.detail) == ("refused", "HERE/m.tflite: bad; re-export it")

    error = _child(tmp_path, "raise KeyError('x')")
    assert error.status == "error" and error.detail == "traceback: KeyError: 'x'"


def _commit_all(repo: Path) -> None:
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "t"],
                   check=True)


@needs_git
def test_a_blob_the_mirror_lacks_and_an_lfs_pointer_are_listed_as_not_available(tmp_path) -> None:
    repo = tmp_path / "mirror"
    (repo / "tools").mkdir(parents=True)
    shutil.copy(CORAL / "split_concat.tflite", repo / "tools" / "split_concat.tflite")
    (repo / "big.tflite").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 9\n")
    (repo / "gone.tflite").write_bytes(b"not fetched")
    (repo / "labels.txt").write_text("cat\n")
    _commit_all(repo)
    sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD:gone.tflite"], check=True,
                         capture_output=True, text=True).stdout.strip()
    (repo / ".git" / "objects" / sha[:2] / sha[2:]).unlink()  # as a partial mirror lacks a large blob

    _, files = real_files.mirror_files(repo, tmp_path / "out")

    by_path = {f.path: f for f in files}
    assert set(by_path) == {"big.tflite", "gone.tflite", "tools/split_concat.tflite"}
    assert by_path["big.tflite"].available == "not available (LFS pointer)"
    assert by_path["gone.tflite"].available == "not available (blob absent from the mirror)"
    present = by_path["tools/split_concat.tflite"]
    assert present.available == "" and present.size == (CORAL / "split_concat.tflite").stat().st_size
    assert present.local.read_bytes() == (CORAL / "split_concat.tflite").read_bytes()


@pytest.mark.slow  # eight child processes, each importing TFLite: ~20 s on a loaded 2-core host
@needs_git
def test_coral_files_run_through_every_step_that_applies(tmp_path) -> None:
    repo = tmp_path / "mirror"
    (repo / "tools").mkdir(parents=True)
    for name in ("split_concat.tflite", "split_concat_edgetpu.tflite"):
        shutil.copy(CORAL / name, repo / "tools" / name)
    _commit_all(repo)
    data = tmp_path / "data"
    shutil.copytree(CORAL, data / "coral")  # README naming the source, and copies of the same two files
    (data / "own").mkdir()
    shutil.copy(CORAL / "split_concat.tflite", data / "own" / "made_here.tflite")  # no README: not listed
    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"

    assert real_files.main(["--mirror", str(repo), "--tests-data", str(data), "--json", str(out_json),
                            "--md", str(out_md)]) == 0

    report = json.loads(out_json.read_text())
    files = {f["path"]: f for f in report["files"]}
    cpu, compiled = files["tools/split_concat.tflite"], files["tools/split_concat_edgetpu.tflite"]
    # tests/data/coral holds copies of the same two files: listed, not run twice.
    assert {files[f"coral/{n}"]["same_as"] for n in ("split_concat.tflite", "split_concat_edgetpu.tflite")} == {
        "tools/split_concat.tflite", "tools/split_concat_edgetpu.tflite"}
    assert not any(p.startswith("own/") for p in files)
    assert cpu["kind"] == "CPU" and compiled["kind"] == "EdgeTPU-compiled"
    assert (len(cpu["inputs"]), len(cpu["outputs"])) == (3, 5)  # as Coral's README says
    assert {t["dtype"] for t in cpu["inputs"]} == {"uint8"}
    assert [cpu["steps"][s]["status"] for s in ("inspect", "open", "invoke")] == ["ok"] * 3
    assert compiled["steps"]["invoke"]["status"] == "n/a"
    assert compiled["steps"]["compile"]["status"] == "refused"
    assert "already compiled by edgetpu_compiler" in compiled["steps"]["compile"]["detail"]
    assert compiled["steps"]["plan import"]["status"] == "ok"
    assert compiled["steps"]["plan import"]["detail"].endswith("compute from tools/split_concat.tflite")
    assert report["tally"]["files"] == {"listed": 4, "run": 2, "copies": 2, "not available": {},
                                        "kinds": {"CPU": 1, "EdgeTPU-compiled": 1}}
    page = out_md.read_text()
    assert "| `tools/split_concat_edgetpu.tflite` |" in page
    assert "edgecap-real-files-" not in page  # messages name files as their source does, not this run's copies


def test_bad_input_is_one_line_and_exit_2(tmp_path) -> None:
    run = subprocess.run([sys.executable, str(TOOLS / "real_files.py"), "--mirror", str(tmp_path / "none")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.strip() == (f"python tools/real_files.py: error: --mirror {tmp_path / 'none'}: no such "
                                  "directory; pass a clone or bare mirror of google-coral/test_data")


MIRROR = Path("/work/.mirror/google-coral+test_data/repo")


@pytest.mark.slow
@pytest.mark.skipif(not MIRROR.is_dir(), reason="google-coral/test_data mirror not present")
def test_coral_deeplab_compiled_imports_with_its_int64_argmax_output(tmp_path) -> None:
    # Found by tools/real_files.py: `plan import` died in a msgspec traceback on this file.
    from edgecap.plans.plan import load_plan

    model = tmp_path / "deeplabv3_mnv2_dm05_pascal_quant_edgetpu.tflite"
    model.write_bytes(subprocess.run(["git", "-C", str(MIRROR), "show", f"HEAD:{model.name}"], check=True,
                                     capture_output=True, timeout=60).stdout)
    run = subprocess.run([sys.executable, "-c", real_files._EDGECAP, "plan", "import", str(model),
                          "--board", "devboard", "-o", str(tmp_path / "plan")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    plan = load_plan(tmp_path / "plan")
    assert [(t.name, t.dtype) for t in plan.outputs] == [("ArgMax", "int64")]
