"""``edgecap compile``: read the model, pick the split, write the segments and plan.json."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple, Union

import numpy as np

from edgecap.bundle import Bundle
from edgecap.plans.plan import PLAN_FILE, EdgeTpuReport, Plan, load_plan, write_plan
from edgecap_compile.boards import Board, load_board
from edgecap_compile.calibration import apply_calibration
from edgecap_compile.cost_model import CostModel
from edgecap_compile.edgetpu import compile_segment, find_compiler
from edgecap_compile.errors import CompileError
from edgecap_compile.graph import read_graph
from edgecap_compile.model_source import resolve_source
from edgecap_compile.partitioner import Partition, evaluate
from edgecap_compile.schedules import search
from edgecap_compile.plan import build_plan
from edgecap_compile.segments import Segment, write_segments
from edgecap_compile.timing import measure_invoke_ms

_log = logging.getLogger("edgecap_compile")

# How many times a split is redone when edgetpu_compiler streams more than predicted.
RESPLITS = 3
# Off-chip bytes within this of the prediction are the compiler's rounding, not a
# smaller cache (its summary prints sizes to 0.01 MiB).
STREAM_TOLERANCE = 16 << 10


@dataclass(frozen=True)
class CompileResult:
    """What ``compile_model`` produced.

    Attributes:
      plan: The plan, as written.
      plan_path: Where it was written.
      report: The stage table (markdown) when a report was asked for, else None.
      figure: The PNG of the split when a report was asked for, else None.
    """

    plan: Plan
    plan_path: Path
    report: Optional[str] = None
    figure: Optional[Path] = None


def rnn_step_ms(step_model: Path, board: Board) -> float:
    """Returns the time of one RNN encoder step on the board's CPU.

    On the ``host`` board the step is timed here, on one thread as the runtime
    runs it; elsewhere the cost model estimates it from the step model's work
    at the CPU's coefficients.
    """
    if board.name == "host":
        return measure_invoke_ms(step_model, threads=1)
    graph = read_graph(step_model, require_integer=False, first_subgraph_only=True)
    return CostModel(graph, [board.cpu]).stage(0, 0, len(graph.ops)).total_ms


def make_board(name: Union[str, os.PathLike, Board], tpus: Optional[int] = None,
               sram: Optional[int] = None,
               calibration: Optional[Union[str, os.PathLike]] = None) -> Board:
    """Loads a board profile (unless given one) and applies the calibration, TPU count and SRAM budget."""
    board = name if isinstance(name, Board) else load_board(name)
    if calibration is not None:
        board = apply_calibration(board, calibration)
    if tpus is not None:
        board = board.with_tpus(tpus)
    if sram is not None:
        board = board.with_sram(sram)
    return board


def _clear_old_segments(out_dir: Path, stem: str) -> None:
    # Segment counts change between runs; stale files would look like part of this plan.
    for old in out_dir.glob(f"{stem}_segment_*_of_*"):
        old.unlink()


def compile_model(source: Union[str, os.PathLike, Bundle], board: Union[str, os.PathLike, Board],
                  out_dir: Union[str, os.PathLike],
                  tpus: Optional[int] = None, sram: Optional[int] = None,
                  calibration: Optional[Union[str, os.PathLike]] = None, report: bool = False,
                  min_runtime_version: Optional[int] = None,
                  ranges: Optional[Sequence[Tuple[int, int]]] = None,
                  replicas: bool = True) -> CompileResult:
    """Splits an int8 model into TPU segments and a CPU tail and writes them with plan.json.

    The split is the schedule search's optimum (``edgecap_compile.schedules``:
    pipelines over the cut points and the order the board's TPUs run in, whole-model
    copies and hybrids); plan.json's stages name the TPUs in that order, and a
    replicated stage its copies.

    Args:
      source: A .tflite model, a bundle directory or a loaded ``Bundle`` (its
        encoder is split and its RNN encoder step's time is charged to the CPU stage).
      board: Board profile name, .json path or a loaded ``Board``.
      out_dir: Folder for the segments, plan.json and the report.
      tpus: Number of TPUs to use (default: the board's).
      sram: SRAM budget per TPU in bytes (default: the profile's).
      calibration: A file from ``edgecap calibrate`` for one of the board's devices.
      report: Also write report.md and split.png.
      min_runtime_version: edgetpu_compiler ``-m`` value.
      ranges: A fixed split instead of the best one: one ``(start, end)`` op
        range per stage (the TPUs in the profile's order, then the CPU),
        contiguous from op 0 to the last.
      replicas: Also search copies of a stage on several devices (hybrids,
        whole-model copies); False: pipelines only, one device per stage.

    Returns:
      The ``CompileResult``.

    Raises:
      CompileError: On bad input (unreadable or float model, unknown board, bad
        budget, more stages than ops, ranges that do not cover the model, ...).
    """
    if report:
        from edgecap_compile.report import pyplot

        pyplot()  # fail before any work, not after the segments
    out = Path(out_dir)
    _check_output(out)
    model_source = resolve_source(source)
    graph = read_graph(model_source.encoder)
    chosen = make_board(board, tpus, sram, calibration)
    stages = len(chosen.tpus) + 1
    if stages > len(graph.ops):
        raise CompileError(
            f"{len(chosen.tpus)} TPUs + CPU make {stages} stages but {model_source.encoder.name} "
            f"has only {len(graph.ops)} ops; use --tpus {len(graph.ops) - 1} or fewer")
    rnn_ms = rnn_step_ms(model_source.rnn_step, chosen) if model_source.rnn_step else 0.0
    replicas = replicas and chosen.replicas
    model = CostModel(graph, [*chosen.tpus, chosen.cpu], rnn_ms, window=model_source.window)
    costs = [model.matrix(k) for k in range(stages)]
    bus = model.bus_matrices(chosen.buses)
    if ranges is None:
        split = search(costs, len(chosen.tpus), bus, frame=model.cpu_frame, copies=replicas)
        model = model.in_order(split.order, split.copies)
    else:
        split = _fixed_split(costs, ranges, graph.name, bus)

    staging = _staging_dir(out)
    try:
        split, chosen, model, segments, edgetpu = _write_and_compile(
            graph, split, chosen, model, staging, min_runtime_version, fixed=ranges is not None,
            replicas=replicas)
        written = write_plan(build_plan(graph, model_source.file, chosen, model, split,
                                        segments, edgetpu), staging)
        table = figure = None
        if report:
            from edgecap_compile.report import plot_split, stage_table

            table = stage_table(written)
            (staging / "report.md").write_text(
                f"# Split of {model_source.file} on {chosen.name}\n\n"
                f"{table}\n\n![split](split.png)\n")
            plot_split(model, split, staging / "split.png")
            figure = out / "split.png"
        _move_into_place(staging, out, graph.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    plan = load_plan(out / PLAN_FILE)
    return CompileResult(plan, plan.path, table, figure)


def _check_output(out: Path) -> Path:
    # Returns the nearest folder of ``out`` that exists, checked writable.
    if out.exists() and not out.is_dir():
        raise CompileError(f"output {out} is not a directory; pass -o a folder")
    existing = out if out.exists() else next(p for p in out.absolute().parents if p.exists())
    if not existing.is_dir():
        raise CompileError(f"output {out}: {existing} is not a directory; pass -o a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise CompileError(f"output {out}: {existing} is not writable; pass -o a folder you "
                           "can write to")
    return existing


def _staging_dir(out: Path) -> Path:
    # Everything is written to a hidden folder and moved into place only once
    # plan.json is written too: a compile that fails leaves nothing. It lives in
    # the target when that exists, else in the nearest folder above it that does,
    # so the final moves are renames on one file system into a folder already
    # checked writable.
    existing = _check_output(out)
    try:
        return Path(tempfile.mkdtemp(prefix=f".{out.absolute().name or 'out'}.",
                                     suffix=".partial", dir=existing))
    except OSError as e:
        raise CompileError(f"output {out}: cannot write in {existing} ({e.strerror or e}); "
                           "pass -o a folder you can write to") from None


def _move_into_place(staging: Path, out: Path, stem: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    _clear_old_segments(out, stem)
    for path in sorted(staging.iterdir()):
        if path.name != PLAN_FILE:
            os.replace(path, out / path.name)
    # plan.json last: a reader never sees a plan whose segments are not there yet.
    os.replace(staging / PLAN_FILE, out / PLAN_FILE)


def _write_and_compile(graph, split: Partition, board: Board, model: CostModel, folder: Path,
                       min_runtime_version: Optional[int], fixed: bool, replicas: bool = True):
    """Writes the segments, compiles the TPU ones, and re-splits while one streams more than predicted.

    edgetpu_compiler reports each segment's on-chip and off-chip parameter bytes.
    A segment that streams more than the cost model predicted had less usable
    SRAM than the profile says: every TPU's budget is capped at that TPU's
    budget less the excess and the model re-partitioned (cuts and TPU order),
    at most ``RESPLITS`` times (not for a fixed split).

    Returns:
      ``(split, board, model, segments, edgetpu)`` as finally written.
    """
    attempt = 0
    while True:
        _clear_old_segments(folder, graph.name)
        segments = write_segments(graph, list(split.ranges), folder)
        # The CPU runs the last stage; every stage before it runs on TPUs.
        edgetpu = _compile_tpu_segments(split.ranges, segments, len(split.ranges) - 1,
                                        min_runtime_version)
        excess = _excess_streaming(model, split, edgetpu)
        if fixed or not excess or attempt == RESPLITS:
            return split, board, model, segments, edgetpu
        # edgetpu_compiler has one target: a segment caches and streams the same
        # bytes whichever TPU runs it, so what one stage showed caps every TPU's
        # budget (else the re-split would move the segment to a TPU still
        # credited with the SRAM the compiler does not use).
        budget = min(max(1, model.devices[k].sram_bytes - extra) for k, extra in excess.items())
        for k, extra in excess.items():
            _log.warning("%s: edgetpu_compiler streams %d bytes more than predicted; lowering "
                         "every TPU's SRAM budget to at most %d bytes and re-splitting",
                         model.devices[k].name, extra, budget)
        tpus = [dataclasses.replace(t, sram_bytes=min(t.sram_bytes, budget)) for t in board.tpus]
        board = dataclasses.replace(board, tpus=tpus)
        model = CostModel(graph, [*board.tpus, board.cpu], model.rnn_ms, window=model.window)
        costs = [model.matrix(k) for k in range(len(model.devices))]
        bus = model.bus_matrices(board.buses)
        resplit = search(costs, len(board.tpus), bus, frame=model.cpu_frame, copies=replicas)
        model = model.in_order(resplit.order, resplit.copies)
        if resplit.cuts == split.cuts:
            # The same segments again: only the predictions change, to the lowered budgets.
            return resplit, board, model, segments, edgetpu
        split = resplit
        attempt += 1


def _excess_streaming(model: CostModel, split: Partition,
                      edgetpu: Dict[int, EdgeTpuReport]) -> Dict[int, int]:
    # Stage k -> bytes edgetpu_compiler streams beyond the cost model's prediction.
    out = {}
    for k, report in edgetpu.items():
        if report.off_chip_bytes is None:
            continue
        start, end = split.ranges[k]
        predicted = model.stage(k, start, end).streamed_bytes
        if report.off_chip_bytes > predicted + STREAM_TOLERANCE:
            out[k] = int(report.off_chip_bytes - predicted)
    return out


def _fixed_split(costs: Sequence[np.ndarray], ranges: Sequence[Tuple[int, int]],
                 model: str, bus: Optional[Sequence[np.ndarray]]) -> Partition:
    n = costs[0].shape[0] - 1
    cuts = [0, *(end for _, end in ranges)]
    contiguous = [start for start, _ in ranges] == cuts[:-1]
    if (len(ranges) != len(costs) or not contiguous or cuts[-1] != n
            or any(b < a for a, b in zip(cuts, cuts[1:]))):
        raise CompileError(f"ranges {list(map(tuple, ranges))} do not split the {n} ops of "
                           f"{model} into {len(costs)} contiguous stages from op 0 to {n}; "
                           "give one (start, end) per TPU and one for the CPU")
    return evaluate(costs, cuts, bus=bus)


def _compile_tpu_segments(ranges: Sequence[Tuple[int, int]], segments: Sequence[Segment],
                          n_tpus: int,
                          min_runtime_version: Optional[int]) -> Dict[int, EdgeTpuReport]:
    by_range = {s.ops: s for s in segments}
    compiler = find_compiler()
    if compiler is None and n_tpus:
        _log.warning("edgetpu_compiler not on PATH: TPU segments are left uncompiled; they run "
                     "on the CPU and on emulated TPUs")
    reports = {}
    for k, (start, end) in enumerate(ranges[:n_tpus]):
        if end == start:
            reports[k] = EdgeTpuReport(compiled=False, reason="empty stage")
        elif compiler is None:
            reports[k] = EdgeTpuReport(compiled=False, reason="edgetpu_compiler not on PATH")
        else:
            reports[k] = compile_segment(compiler, by_range[(start, end)].path,
                                         min_runtime_version)
    return reports


# ---------------------------------------------------------------------------
# Candidate plans: what a running board may switch to (docs/bundle.md).

CANDIDATES_DIR = "candidates"


@dataclass(frozen=True)
class WrittenCandidate:
    """One candidate plan as written.

    Attributes:
      name: Its folder under ``plans/<board>/candidates/``.
      plan: The plan, as written.
      why: The scenario it was chosen for (``edgecap_compile.scenario_plans``).
      file_bytes: Bytes of its files (plan.json, segments, compiled segments).
      added_bytes: Of those, the bytes no plan written before it shares.
    """

    name: str
    plan: Plan
    why: str
    file_bytes: int
    added_bytes: int


@dataclass(frozen=True)
class CandidatesResult:
    """What ``compile_candidates`` wrote, and what it left out.

    Attributes:
      directory: ``plans/<board>/candidates``.
      written: The candidates written, in rank order.
      left_out: ``(name, why)`` of ranked candidates over a cap.
      added_bytes: What the candidates add to the bundle on disk: files a
        hard link shares with the best plan or an earlier candidate count once.
      copied_bytes: What they would add with every file copied (e.g. by a
        copy that does not keep hard links).
    """

    directory: Path
    written: Tuple[WrittenCandidate, ...] = ()
    left_out: Tuple[Tuple[str, str], ...] = ()
    added_bytes: int = 0
    copied_bytes: int = 0


def compile_candidates(source: Union[str, os.PathLike, Bundle], board: Union[str, os.PathLike, Board],
                       best: Plan, count: int, max_bytes: int, tpus: Optional[int] = None,
                       sram: Optional[int] = None,
                       calibration: Optional[Union[str, os.PathLike]] = None,
                       min_runtime_version: Optional[int] = None, replicas: bool = True) -> CandidatesResult:
    """Writes the candidate plans of a board beside its best plan, within a count and a size.

    The candidates are ranked by ``edgecap_compile.scenario_plans.choose`` and
    written in that order into ``candidates/<name>/`` next to ``best``'s
    plan.json, each with its segments, compiled by edgetpu_compiler when it
    is on PATH (a segment identical to one already compiled is compiled
    once). A file identical to one of the best plan or of an earlier
    candidate is a hard link to it (a copy where the file system has none),
    so a segment shared by several plans is stored once; each plan.json
    still names only files in its own folder. A candidate that would pass
    ``count`` plans or ``max_bytes`` added bytes is left out. The folder is
    replaced whole: ``count`` 0 removes the candidates an earlier compile wrote.

    Args:
      source: The bundle (or .tflite) ``best`` was compiled from.
      board: The board profile, as for ``compile_model``.
      best: The best plan, as ``compile_model`` wrote it.
      count: Most candidates to write.
      max_bytes: Most bytes they may add to the bundle.
      tpus: As for ``compile_model``: candidates are made for 1 to this many TPUs.
      sram: As for ``compile_model``.
      calibration: As for ``compile_model``.
      min_runtime_version: As for ``compile_model``.
      replicas: As for ``compile_model``.

    Returns:
      The ``CandidatesResult``.

    Raises:
      CompileError: On bad input, as ``compile_model``.
    """
    from edgecap_compile import scenario_plans

    plans_dir = best.path.parent
    target = plans_dir / CANDIDATES_DIR
    model_source = resolve_source(source)
    graph = read_graph(model_source.encoder)
    chosen = make_board(board, tpus, sram, calibration)
    if best.sram_bytes is not None and chosen.tpus and best.sram_bytes < min(t.sram_bytes for t in chosen.tpus):
        chosen = chosen.with_sram(best.sram_bytes)  # the budget the best plan's re-split settled on
    ranked = scenario_plans.choose(graph, model_source.file, chosen, best, model_source.window,
                                   replicas and chosen.replicas) \
        if count and chosen.tpus else []
    compiler = find_compiler()
    staging = Path(tempfile.mkdtemp(prefix=f".{CANDIDATES_DIR}.", suffix=".partial", dir=plans_dir))
    try:
        stored = _Store(best)
        written, left_out = [], []
        for pick in ranked:
            if len(written) == count:
                left_out.append((pick.name, f"over --candidates {count}"))
                continue
            folder = staging / pick.name
            folder.mkdir()
            segments = write_segments(graph, list(pick.split.ranges), folder)
            edgetpu = stored.compile(compiler, pick.split.ranges, segments, len(pick.split.ranges) - 1,
                                     min_runtime_version)
            plan = write_plan(build_plan(graph, model_source.file, pick.board, pick.model,
                                         pick.split, segments, edgetpu), folder)
            file_bytes, added = stored.share(folder)
            if stored.added + added > max_bytes:
                stored.forget(folder)
                shutil.rmtree(folder)
                left_out.append((pick.name, f"over --candidates-max-mb {max_bytes / 1e6:g}"))
                continue
            stored.added += added
            stored.copied += file_bytes
            written.append(WrittenCandidate(pick.name, plan, pick.why, file_bytes, added))
        _swap_into_place(staging, target, keep=bool(written))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return CandidatesResult(target, tuple(dataclasses.replace(
        w, plan=load_plan(target / w.name)) for w in written), tuple(left_out),
        stored.added, stored.copied)


class _Store:
    """The files written so far by content, so an identical one is linked, not stored again.

    Also what edgetpu_compiler made of each distinct segment, so the same
    bytes are compiled once (the best plan's compiled segments included).
    """

    def __init__(self, best: Plan) -> None:
        self.by_sha: Dict[str, Path] = {}
        self.compiled: Dict[str, Tuple[EdgeTpuReport, Path]] = {}
        self.added = self.copied = 0
        for stage in best.stages:
            for path in (stage.segment, stage.compiled_segment):
                if path is not None:
                    self.by_sha.setdefault(_sha256(path), path)
            if stage.segment is not None and stage.edgetpu is not None:
                self.compiled[_sha256(stage.segment)] = (stage.edgetpu, stage.segment)

    def compile(self, compiler: Optional[str], ranges: Sequence[Tuple[int, int]],
                segments: Sequence[Segment], n_tpus: int,
                min_runtime_version: Optional[int]) -> Dict[int, EdgeTpuReport]:
        """Reports each TPU stage's compile, as ``_compile_tpu_segments``; known bytes are not recompiled."""
        by_range = {s.ops: s for s in segments}
        reports = {}
        for k, (start, end) in enumerate(ranges[:n_tpus]):
            if end == start:
                reports[k] = EdgeTpuReport(compiled=False, reason="empty stage")
                continue
            if compiler is None:
                reports[k] = EdgeTpuReport(compiled=False, reason="edgetpu_compiler not on PATH")
                continue
            segment = by_range[(start, end)].path
            sha = _sha256(segment)
            earlier = self.compiled.get(sha)
            if earlier is None:
                reports[k] = compile_segment(compiler, segment, min_runtime_version)
                self.compiled[sha] = (reports[k], segment)
                continue
            # The same bytes compile to the same file: copy it under this plan's name (``share`` links it).
            report, first = earlier
            reports[k] = dataclasses.replace(report, cpu_ops=[dict(o) for o in report.cpu_ops])
            if report.compiled:
                output = segment.with_name(segment.stem + "_edgetpu.tflite")
                shutil.copyfile(first.with_name(report.compiled_segment), output)
                reports[k].compiled_segment = output.name
        return reports

    def share(self, folder: Path) -> Tuple[int, int]:
        """Links each file of ``folder`` identical to one stored to it; returns (its bytes, bytes added)."""
        total = added = 0
        for path in sorted(folder.iterdir()):
            size = path.stat().st_size
            total += size
            sha = _sha256(path)
            same = self.by_sha.get(sha)
            if same is None:
                self.by_sha[sha] = path
                added += size
                continue
            link = path.with_name(f".{path.name}.link")
            try:
                os.link(same, link)
            except OSError:  # no hard links here (e.g. FAT): keep the copy, and count it
                added += size
                continue
            os.replace(link, path)
        return total, added

    def forget(self, folder: Path) -> None:
        """Drops what a folder about to be removed holds."""
        self.by_sha = {sha: p for sha, p in self.by_sha.items() if p.parent != folder}
        self.compiled = {sha: c for sha, c in self.compiled.items() if c[1].parent != folder}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _swap_into_place(staging: Path, target: Path, keep: bool) -> None:
    # The old candidates go only once the new ones are complete: renamed aside,
    # the new folder renamed in, the old one removed (or just removed, with none to keep).
    old = None
    if target.exists():
        old = staging.with_name(staging.name + ".old")
        os.replace(target, old)
    if keep:
        os.replace(staging, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
