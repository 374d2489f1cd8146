"""Issue 28's "Elsewhere" findings outside the service, each fixed where it lives; one test each.

The symlinked corrections file is tests/test_state_files.py; close() from
another thread is tests/test_close_from_another_thread.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from edgecap.plans import coral_pipeline
from edgecap.cli import main
from edgecap.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "models" / "demo" / "bundle"


def test_a_command_with_stdout_closed_ends_without_a_traceback() -> None:
    # Before (since a5a173c): `edgecap validate models/demo/bundle >&-` ended in
    # "AttributeError: 'NoneType' object has no attribute 'flush'" and exit 1.
    for argv in (["validate", str(DEMO)], ["devices"]):
        proc = subprocess.run([sys.executable, "-m", "edgecap.cli", *argv], stdin=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, timeout=120, cwd=REPO,
                              preexec_fn=lambda: os.close(1))
        assert "Traceback" not in proc.stderr and proc.returncode == 0, (argv, proc.stderr)


def test_validate_reads_each_bundled_plan_and_a_corrupt_one_is_no_ok(tmp_path, capfd) -> None:
    # Before: "ok" for a bundle whose plans/<board>/plan.json was torn.
    bundle = tmp_path / "bundle"
    shutil.copytree(DEMO, bundle)
    (bundle / "plans" / "devboard").mkdir(parents=True)
    (bundle / "plans" / "devboard" / "plan.json").write_text('{"plan_version": 1, "board": ')
    assert main(["validate", str(bundle)]) == 2
    err = capfd.readouterr().err.strip()
    assert err.count("\n") == 0 and "plans/devboard/plan.json: not valid JSON" in err, err


def test_plan_import_of_a_segment_the_interpreter_refuses_is_one_line(tmp_path, monkeypatch, capfd) -> None:
    # Before: the interpreter's ValueError came out of coral_pipeline.py as a traceback.
    segment = tmp_path / "net_segment_0_of_1_edgetpu.tflite"
    segment.write_bytes(b"\0" * 64)

    def refuses(path, error):
        raise ValueError("Model provided has model identifier 'abcd', should be 'TFL3'\n")

    monkeypatch.setattr(coral_pipeline, "open_model", refuses)
    assert main(["plan", "import", str(segment), "-o", str(tmp_path / "out")]) == 2
    err = capfd.readouterr().err.strip()
    assert err.count("\n") == 0 and "the TFLite interpreter refuses it (Model provided has model identifier" in err


@pytest.mark.parametrize("truth, says", [
    ("emu-tpu:0=speed:0.5", "EDGECAP_EMULATE: this run emulates no board (its plan runs on cpu)"),
    ("cpu=speed:0.5", "EDGECAP_EMULATE: this run emulates no board"),
])
def test_a_truth_for_devices_the_run_lacks_is_refused_not_ignored(monkeypatch, capfd, truth, says) -> None:
    # Before: the demo ran on the CPU as if the variable were not set.
    monkeypatch.setenv("EDGECAP_EMULATE", truth)
    assert main(["caption"]) == 2
    err = [line for line in capfd.readouterr().err.splitlines() if not line.startswith("BUNDLE")]
    assert len(err) == 1 and says in err[0], err


def test_a_truth_naming_an_emulated_tpu_past_the_plans_is_refused(monkeypatch, capfd) -> None:
    monkeypatch.setenv("EDGECAP_EMULATE", "emu-tpu:7=speed:0.5")
    assert main(["caption", "--board", "devboard-usb"]) == 2
    err = [line for line in capfd.readouterr().err.splitlines() if not line.startswith("BUNDLE")]
    assert len(err) == 1 and "emu-tpu:7 is no EdgeTPU of this run" in err[0], err


def test_history_search_help_promises_no_prefix_search(capsys) -> None:
    # Before: "(word* is a prefix)", a search that no longer exists (fts_query: whole words).
    with pytest.raises(SystemExit):
        main(["history", "search", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "prefix" not in text.replace("no prefixes", "") and "whole words: no prefixes" in text


def test_history_search_with_since_after_until_is_one_line(tmp_path, capfd) -> None:
    # Before: it printed "0 events", as if the history had none.
    from edgecap.service.history import HistorySink

    HistorySink(tmp_path / "h.db").close(timeout=10)
    assert main(["history", "search", "--db", str(tmp_path / "h.db"), "--since", "1h", "--until", "2h"]) == 2
    err = capfd.readouterr().err.strip()
    assert err == ("edgecap: error: history search: --since is after --until, so no event can match; "
                   "give --since the earlier time")


def _feeds_forever(path: Path) -> threading.Thread:
    """A writer that keeps a FIFO open and never finishes: a reader that waits for its end hangs."""
    def write() -> None:
        try:
            with open(path, "wb") as f:
                f.write(b"VideoID,Start,End")
                time.sleep(10)
        except OSError:
            pass

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("loader", ["msvd", "msrvtt"])
@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_the_corpus_loaders_refuse_a_fifo_or_a_device_at_once(tmp_path, loader, kind) -> None:
    # Before: both loaders read until the end of what they were given: a FIFO or /dev/zero hung them.
    from models.video_datasets import read_msrvtt, read_msvd

    path = tmp_path / "index"
    if kind == "fifo":
        os.mkfifo(path)
        _feeds_forever(path)
    else:
        path = Path("/dev/zero")
    (tmp_path / "videos").mkdir()
    read = read_msvd if loader == "msvd" else read_msrvtt
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as info:
        read(path, tmp_path / "videos")
    assert time.monotonic() - t0 < 5.0
    message = str(info.value)
    assert "\n" not in message and ("FIFO" in message or "character device" in message), message


def test_msrvtt_json_nested_too_deep_is_one_line(tmp_path) -> None:
    # Before: json's RecursionError came out as a traceback.
    from models.video_datasets import read_msrvtt

    path = tmp_path / "train_val_videodatainfo.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "videos").mkdir()
    with pytest.raises(ConfigError, match="nested too deep") as info:
        read_msrvtt(path, tmp_path / "videos")
    assert "\n" not in str(info.value)
    json.loads("[]")  # the parser itself is unharmed
