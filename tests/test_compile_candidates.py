"""`edgecap compile --into-bundle`'s candidate plans: which, how stored, how capped, how listed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from edgecap.bundle import load_bundle
from edgecap.cli import main as cli_main
from edgecap.cli import run as main
from edgecap.plans.plan import CpuFrame, load_plan
from edgecap.plans.pricing import CPU, price
from edgecap_compile import scenario_plans, schedules
from edgecap_compile.boards import BOARDS_DIR, PRICES, load_board
from edgecap_compile.cost_model import CostModel
from edgecap_compile.graph import read_graph
from edgecap_compile.plan import plan_devices

from test_compile_edgetpu import stand_in  # noqa: F401 (a fixture: edgetpu_compiler on PATH)

BOARD = "slow-tpus"


def _profile(tmp_path: Path, name: str = BOARD, change=None) -> Path:
    # devboard-usb with TPUs slow enough that the demo CNN spans both.
    doc = json.loads((BOARDS_DIR / "devboard-usb.json").read_text())
    doc["name"] = BOARD
    for tpu in doc["tpus"]:
        tpu["macs_per_s"] = tpu["elements_per_s"] = 4e9
    if change is not None:
        change(doc)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    return path


def _compile(bundle: Path, board: Path, *flags: str, capsys, pipeline_only: bool = True) -> dict:
    # Pipelines: the profile below makes the demo CNN span both TPUs, with many
    # near-optimal cuts to rank (copies of the whole CNN would leave one candidate).
    capsys.readouterr()
    assert main(["compile", str(bundle), "--board", str(board), "--into-bundle", "--json", *flags,
                 *(["--pipeline-only"] if pipeline_only else [])]) == 0
    return json.loads(capsys.readouterr().out)


def test_candidates_with_replicas_load_and_cover_a_missing_tpu(bundle_copy, tmp_path, capsys):
    from edgecap.plans.plan import load_plan

    doc = _compile(bundle_copy, _profile(tmp_path), "--candidates", "4", capsys=capsys, pipeline_only=False)
    best = load_plan(bundle_copy / "plans" / BOARD)
    assert any(s.replicas for s in best.stages)  # the CNN copied on both TPUs (and the CPU)
    written = [load_plan(bundle_copy / "plans" / BOARD / "candidates" / w["name"])
               for w in doc["candidates"]["written"]]
    # A plan for the board with a TPU missing is among them.
    assert any(p.board_tpus == 1 for p in written), [w["why"] for w in doc["candidates"]["written"]]


def _files(folder: Path):
    return [p for p in sorted(folder.rglob("*")) if p.is_file()]


def test_candidates_are_written_ranked_and_identical_files_are_stored_once(bundle_copy, tmp_path, capsys):
    doc = _compile(bundle_copy, _profile(tmp_path), "--candidates", "8", capsys=capsys)["candidates"]
    plans = bundle_copy / "plans" / BOARD
    written = [w["name"] for w in doc["written"]]
    assert len(written) == 8 and written == sorted(written)
    assert [p.name for p in load_bundle(bundle_copy).candidates[BOARD]] == written
    # Every TPU count of the board is served, also where the best plan needs both TPUs.
    assert {w["tpus"] for w in doc["written"]} == {1, 2}
    assert all(load_plan(plans / "candidates" / name).board_tpus == w["tpus"]
               for name, w in zip(written, doc["written"]))
    # Files with the same bytes anywhere under plans/<board>/ are one file (hard links).
    by_sha = {}
    for path in _files(plans):
        by_sha.setdefault(hashlib.sha256(path.read_bytes()).hexdigest(), []).append(path.stat().st_ino)
    assert all(len(set(inodes)) == 1 for inodes in by_sha.values())
    assert any(len(inodes) > 1 for inodes in by_sha.values())  # the demo's plans do share segments
    # What they add is their distinct files beyond the best plan's; copied, every file.
    best = {p.stat().st_ino for p in plans.iterdir() if p.is_file()}
    theirs = {p.stat().st_ino: p.stat().st_size for p in _files(plans / "candidates")}
    assert doc["added_bytes"] == sum(size for ino, size in theirs.items() if ino not in best)
    assert doc["copied_bytes"] == sum(p.stat().st_size for p in _files(plans / "candidates"))
    assert doc["added_bytes"] < doc["copied_bytes"]
    assert sum(w["added_bytes"] for w in doc["written"]) == doc["added_bytes"]


def test_the_caps_bound_the_count_and_the_bytes_and_zero_removes_them(bundle_copy, tmp_path, capsys):
    board = _profile(tmp_path)
    doc = _compile(bundle_copy, board, "--candidates", "3", capsys=capsys)["candidates"]
    assert len(doc["written"]) == 3
    assert doc["left_out"] and all(w["why"] == "over --candidates 3" for w in doc["left_out"])
    folder = bundle_copy / "plans" / BOARD / "candidates"
    first = sorted(p.name for p in folder.iterdir())
    # Bytes: every candidate of the demo adds about 0.9 MB, so 2 MB holds two.
    doc = _compile(bundle_copy, board, "--candidates", "8", "--candidates-max-mb", "2", capsys=capsys)
    doc = doc["candidates"]
    assert doc["added_bytes"] <= 2e6 and len(doc["written"]) >= 2
    assert any(w["why"] == "over --candidates-max-mb 2" for w in doc["left_out"])
    # A compile replaces the folder whole: nothing of the earlier candidates is left.
    assert sorted(p.name for p in folder.iterdir()) == [w["name"] for w in doc["written"]]
    assert set(first) - {w["name"] for w in doc["written"]}
    assert _compile(bundle_copy, board, "--candidates", "0", capsys=capsys)["candidates"]["written"] == []
    assert not folder.exists() and BOARD not in load_bundle(bundle_copy).candidates
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no staging left


def test_compile_prints_the_growth_and_validate_lists_the_candidates(bundle_copy, tmp_path, capsys):
    assert main(["compile", str(bundle_copy), "--board", str(_profile(tmp_path)), "--into-bundle",
                 "--candidates", "4", "--pipeline-only"]) == 0
    out = capsys.readouterr().out
    assert "candidates: 4 in " in out and " MB to the bundle (" in out and "--candidates 4" in out
    assert out.count("TPU(s), predicted ") == 4
    # A broken candidate is listed as skipped, with its reason; the bundle still validates.
    folders = sorted((bundle_copy / "plans" / BOARD / "candidates").iterdir())
    (folders[-1] / "plan.json").write_text("{")
    assert main(["validate", str(bundle_copy)]) == 0
    out = capsys.readouterr().out
    assert f"candidates for {BOARD}: 3 usable, 1 skipped, adding " in out
    rows = [line for line in out.splitlines() if line.startswith(f"  {BOARD}/")]
    assert len(rows) == 4 and "TPU(s), " in rows[0] and "fps, " in rows[0] and rows[0].endswith(" MB")
    assert rows[-1].startswith(f"  {BOARD}/{folders[-1].name}: skipped: unreadable (")


def test_each_distinct_segment_goes_through_edgetpu_compiler_once(stand_in, bundle_copy, tmp_path,  # noqa: F811
                                                                   capsys):
    # Eight candidates: some run a segment another plan runs on the other TPU.
    doc = _compile(bundle_copy, _profile(tmp_path), "--candidates", "8", capsys=capsys)["candidates"]
    calls = stand_in.read_text().splitlines()
    plans = [load_plan(bundle_copy / "plans" / BOARD),
             *(load_plan(bundle_copy / "plans" / BOARD / "candidates" / w["name"]) for w in doc["written"])]
    tpu_stages = [s for p in plans for s in p.active_stages if s.spec.kind == "tpu"]
    assert all(s.edgetpu.compiled and s.compiled_segment.is_file() for s in tpu_stages)
    distinct = {hashlib.sha256(s.segment.read_bytes()).hexdigest() for s in tpu_stages}
    assert len(calls) == len(distinct) < len(tpu_stages)
    # The same compiled bytes are one file too.
    compiled = {}
    for s in tpu_stages:
        compiled.setdefault(hashlib.sha256(s.segment.read_bytes()).hexdigest(), set()).add(
            s.compiled_segment.stat().st_ino)
    assert all(len(inodes) == 1 for inodes in compiled.values())


def _changed_profile(tmp_path: Path, board, case: scenario_plans.Scenario) -> Path:
    """The board's profile with the scenario's corrections written into it, as a board that really differs."""
    names = plan_devices(board)

    def change(doc):
        for key, c in case.corrections.items():
            device = doc["cpu"] if key == CPU else doc["tpus"][names.index(key)]
            for _, field in PRICES:  # every price but the link's: rates times the speed, times divided
                if field != "link_bytes_per_s" and device.get(field) is not None:
                    device[field] = (device[field] * c.speed if field.endswith("_per_s")
                                     else device[field] / c.speed)
            if c.link_bytes_per_s:
                device["link_bytes_per_s"] = c.link_bytes_per_s
        doc["tpus"] = doc["tpus"][:case.tpus]
    return _profile(tmp_path, "changed", change)


def test_every_scenario_is_served_within_the_gain_that_ends_the_list(shipped_bundle, tmp_path):
    # Uncapped, the list ends only where no plan speeds a scenario up by MIN_GAIN:
    # so for every scenario, best or candidate is within that of the optimum of a
    # profile that really differs so (found by the search over pipelines, not by candidates).
    bundle = load_bundle(shipped_bundle)
    from edgecap_compile.compiler import compile_model

    board = load_board(str(_profile(tmp_path)))
    best = compile_model(bundle, board, tmp_path / "best", replicas=False).plan
    graph = read_graph(bundle.encoder)
    window = (bundle.window.frames, bundle.window.stride)
    chosen = [best, *(c.plan for c in scenario_plans.choose(graph, "encoder.tflite", board, best, window,
                                                            replicas=False))]
    cases = scenario_plans.scenarios(board)
    # As profiled, each TPU at 3 speeds and on a slower link, the CPU at 2 speeds; one TPU only.
    assert len(cases) == 1 + 2 * 4 + 2 + 1
    for case in cases:
        changed = load_board(str(_changed_profile(tmp_path, board, case)))
        cpu_speed = case.corrections.get(CPU).speed if CPU in case.corrections else 1.0
        model = CostModel(graph, [*changed.tpus, changed.cpu], best.rnn_ms / cpu_speed, window=window)
        # The CPU's own work a frame, as profiled, at the scenario's CPU speed (as the pricing charges it).
        frame = CpuFrame(best.cpu_frame.preprocess_ms / cpu_speed, best.cpu_frame.handoff_ms / cpu_speed)
        optimum = schedules.search([model.matrix(k) for k in range(len(model.devices))], len(changed.tpus),
                                   frame=frame, copies=False).bottleneck_ms
        runs = [p for p in chosen if all(s.device in plan_devices(board)[:case.tpus]
                                         for s in p.active_stages if s.spec.kind == "tpu")]
        served = min(price(p, case.corrections).period_ms for p in runs)
        # The board as the scenario says it runs is the profile that really differs so.
        corrected = scenario_plans.corrected_board(board.with_tpus(case.tpus), case.corrections)
        for ours, theirs in zip([*corrected.tpus, corrected.cpu], [*changed.tpus, changed.cpu]):
            assert ours.coefficients() == pytest.approx(theirs.coefficients(), rel=1e-12), case.label
        assert served >= optimum * (1 - 1e-6), case.label
        assert served * (1 - scenario_plans.MIN_GAIN) <= optimum * (1 + 1e-6), case.label


@pytest.mark.parametrize("args,message", [
    (["-o", "OUT", "--candidates", "2"], "--candidates and --candidates-max-mb go with --into-bundle"),
    (["--into-bundle", "--candidates", "65"], "--candidates: 65: use a whole number from 0 to 64"),
    (["--into-bundle", "--candidates", "-1"], "--candidates: -1: use a whole number from 0 to 64"),
    (["--into-bundle", "--candidates-max-mb", "nan"], "--candidates-max-mb: nan: use a number from 0"),
])
def test_bad_candidate_options_are_one_line(bundle_copy, tmp_path, capfd, args, message):
    args = [str(tmp_path / "out") if a == "OUT" else a for a in args]
    assert cli_main(["compile", str(bundle_copy), "--board", "devboard", *args]) == 2
    err = capfd.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("edgecap: error: ")
    assert not (bundle_copy / "plans").exists() and not (tmp_path / "out").exists()
