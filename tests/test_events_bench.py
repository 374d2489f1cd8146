"""`python tools/events_bench.py`: event boundaries scored against the synthetic truth, and a short real run."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tools" / "events_bench.py"


def _load():
    spec = importlib.util.spec_from_file_location("events_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["events_bench"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _windows(texts, first=0):
    """Caption records of consecutive aligned one-second windows (16 source frames each)."""
    return [{"start_frame": first + 16 * n, "end_frame": first + 16 * n + 14, "text": t} for n, t in enumerate(texts)]


@pytest.mark.fast
def test_boundaries_are_scored_against_the_true_changes_across_the_loop():
    bench = _load()
    truth = [bench.Segment(0, 48, "a"), bench.Segment(48, 80, "b")]  # 3 s of a, 2 s of b, then a again
    texts = ["a", "a", "a", "b", "b"] * 2 + ["a"]
    right = [{"windows": 3}, {"windows": 2}, {"windows": 3}, {"windows": 2}, {"windows": 1}]
    score = bench.evaluate(_windows(texts), right, truth, tolerance=16)
    assert (score["true_changes"], score["boundaries"], score["matched"]) == (4, 4, 4)  # the wrap included
    assert (score["precision"], score["recall"], score["windows_wrong"]) == (1.0, 1.0, 0)
    # A one-window wrong caption that split an event: two false boundaries; the truth is still all found.
    texts[1] = "c"
    split = [{"windows": 1}, {"windows": 1}, {"windows": 1}] + right[1:]
    score = bench.evaluate(_windows(texts), split, truth, tolerance=16)
    assert (score["boundaries"], score["matched"], score["false_boundaries"], score["windows_wrong"]) == (6, 4, 2, 1)
    assert score["precision"] == round(4 / 6, 4) and score["recall"] == 1.0
    # A boundary a window late still matches within one window, not within none.
    late = [{"windows": 4}, {"windows": 1}] + right[2:]
    assert bench.evaluate(_windows(["a"] * 11), late, truth, tolerance=16)["matched"] == 4
    assert bench.evaluate(_windows(["a"] * 11), late, truth, tolerance=0)["matched"] == 3


@pytest.mark.fast
def test_a_window_shifted_off_the_clips_is_counted_as_such():
    bench = _load()
    truth = [bench.Segment(0, 64, "a"), bench.Segment(64, 128, "b")]
    captions = _windows(["a", "a", "a", "b", "b", "b"], first=4)
    score = bench.evaluate(captions, [{"windows": 3}, {"windows": 3}], truth, tolerance=16)
    assert (score["windows_shifted"], score["windows_straddling"], score["matched"]) == (6, 1, 1)


@pytest.mark.fast
def test_the_rendered_video_has_the_truth_it_reports(tmp_path):
    from models.dataset import read_video

    bench = _load()
    truth = bench.render_video(tmp_path / "v.mp4", segments=3, seed=5)
    video, fps = read_video(tmp_path / "v.mp4")
    assert fps == 16.0 and len(video) == truth[-1].end and truth[0].start == 0
    assert all(a.end == b.start and a.caption != b.caption for a, b in zip(truth, truth[1:]))
    assert truth[-1].caption != truth[0].caption  # the loop's wrap is a change too
    assert all(2 <= (s.end - s.start) // 16 <= 8 and (s.end - s.start) % 16 == 0 for s in truth)


@pytest.mark.parametrize("args, needle", [
    (["--minutes", "0"], "--minutes"),
    (["--segments", "1"], "--segments"),
    (["--minutes", "0.05", "--segments", "2", "--config-extra", "bundle = 7"], "did not become ready"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle):
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr, proc.stderr


def test_a_short_run_scores_the_services_events(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--minutes", "0.25", "--segments", "3", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["exit_code"] == 0 and set(result["cameras"]) == {"cam0", "cam1"}
    for camera in result["cameras"].values():
        assert camera["windows"] >= 5 and camera["windows_in_events"] == camera["windows"]  # events tile the windows
        assert camera["true_changes"] >= 1 and camera["events"] >= 1
    assert 0 < result["rss_mb_peak"] < 1000
    assert result["precision"] is not None and 0 <= result["recall"] <= 1
    # The history the service keeps by default, in the bench's own state directory, holds every event.
    closed = sum(camera["events"] for camera in result["cameras"].values())
    assert result["history"]["events"] >= closed and result["history"]["bytes_per_event"] > 0
    assert proc.stdout.splitlines()[0].split()[0] == "camera" and "precision" in proc.stdout


@pytest.mark.fast
def test_recorded_captions_replay_through_other_rules_and_dropped_frames_are_counted():
    bench = _load()
    truth = [bench.Segment(0, 48, "a red star grows"), bench.Segment(48, 96, "a blue square moves up")]
    captions = _windows(["a red star grows", "a white circle shrinks", "a red star grows",
                         "a blue square moves up", "a blue square moves up", "a blue square moves up"])
    for c in captions:
        c.update(window=0, start_time=0.0, end_time=0.0)
    captions[4]["end_frame"] += 2  # a frame dropped inside window 4
    at_once = bench.replay(captions, "c", bench.REPLAYED_RULES["service rule"])
    assert [e["windows"] for e in at_once] == [1, 1, 1, 3]  # sure captions (0.0): the flicker splits
    confirmed = bench.replay(captions, "c", bench.REPLAYED_RULES["confirm 2 always"])
    assert [(e["text"], e["windows"]) for e in confirmed] == [("a red star grows", 3), ("a blue square moves up", 3)]
    assert bench.evaluate(captions, confirmed, truth, 16)["precision"] == 1.0
    score = bench.evaluate(captions, at_once, truth, 16)
    assert (score["precision"], score["recall"], score["windows_gapped"]) == (round(1 / 3, 4), 1.0, 1)


@pytest.mark.fast
def test_extra_config_lines_may_open_a_table_without_swallowing_the_rest(tmp_path):
    from edgecap.service.config import tomllib

    bench = _load()
    path = bench._config(tmp_path, 8080, [tmp_path / "a.mp4", tmp_path / "b.mp4"], ["[history]", 'path = ""'])
    config = tomllib.loads(path.read_text())
    assert config["history"] == {"path": ""}  # the table holds only the extra line
    assert "bundle" in config and config["http"]["port"] == 8080 and len(config["cameras"]) == 2
