"""The ``edgecap`` command line: exit code 0 on success, 2 on bad input, one line per error.

One argparse tree; each handler is thin and calls the library. The host-side
compiler (``compile``, ``calibrate``) is imported only when those commands
run, so the runtime's commands never load it; the lab (``edgecap_lab``: ``bench``,
``eval``), which a board does not install, only through ``_lab``. SIGINT and SIGTERM stop any
command with the exit policy every edgecap command shares
(``edgecap.command.run_command``): the run in progress is closed on the way
out, and the exit code is 130 for SIGINT and 143 for SIGTERM (0 for ``serve``,
which a stop ends normally).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Iterator, List, Optional, Sequence

from edgecap import __version__, files
from edgecap.argtypes import Parser, float_in, int_in, int_list_in, int_or_auto
from edgecap.bundle import DEMO_DIR, default_bundle
from edgecap.command import EXIT_SIGTERM, run_command
from edgecap.domain import notices
from edgecap.errors import EdgecapError, RunFailure
from edgecap.limits import (DEFAULT_BEAM, DEFAULT_CANDIDATES, DEFAULT_CANDIDATES_MB, DEFAULT_HOST_ROUNDS,
                            MAX_BEAM, MAX_CANDIDATES, MAX_CANDIDATES_MB, MAX_HOST_ROUNDS, MAX_QUEUE,
                            MAX_SAMPLE_FPS, MAX_THREADS, MAX_WINDOW_FRAMES)
from edgecap.outputs import atomic_path, check_output, write_text

if TYPE_CHECKING:
    from edgecap.options import CaptionerOptions

# The range of every numeric flag, checked by argparse before any work
# (docs/bad-input.md lists them). Those the Python API shares are in edgecap.limits.
WINDOW = int_in(1, MAX_WINDOW_FRAMES)
THREADS = int_in(1, MAX_THREADS)
BATCH = int_in(1, MAX_QUEUE)
BEAM = int_in(1, MAX_BEAM)
MAX_CLIPS = 1_000_000  # eval --limit
MAX_BENCH_FRAMES = 1_000_000  # bench --frames: a run, not a soak (tools/soak.py)
MAX_ADAPT_SECONDS = 3600.0  # bench --adapt --seconds: an hour per truth is past any table
MAX_TPUS = 8  # compile --tpus: no board carries more EdgeTPUs
MAX_SRAM = 1 << 30  # compile --sram, bytes per TPU: an EdgeTPU has 8 MiB
RUNTIME_VERSIONS = (10, 99)  # compile --min-runtime-version: edgetpu_compiler -m knows 10 and up
MAX_CALIBRATION_SEGMENTS = 10_000  # calibrate --segments
MAX_REPEATS = 10_000  # calibrate --repeats
MAX_HISTORY_LIMIT = 100_000  # history search --limit


def _add_window_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bundle", type=Path, default=None,
                   help="model bundle directory (default: $EDGECAP_BUNDLE or the shipped demo)")
    p.add_argument("--frames", type=WINDOW, help="sampled frames per window (default: bundle's)")
    p.add_argument("--stride", type=WINDOW, help="sampled frames between windows (default: bundle's)")
    p.add_argument("--sample-fps", type=float_in(0, MAX_SAMPLE_FPS), help="sampling rate, 0 = every frame")
    p.add_argument("--threads", type=THREADS, help="CPU threads of the CNN (default: the physical cores)")
    _add_beam(p)
    p.add_argument("--float-rnn", action="store_true",
                   help="run the bundle's float RNN step models even where it ships int8-weight ones")
    p.add_argument("--json", action="store_true", help="print one JSON object per caption")
    p.add_argument("--plan", type=Path, help="plan.json (or its directory) from `edgecap compile`")
    p.add_argument("--board", default="auto",
                   help="with no --plan: auto (the bundle's plan for the attached EdgeTPUs, else the "
                        "CPU; see `edgecap devices`) or a board profile to plan "
                        "for, e.g. devboard-usb (TPUs it lacks are emulated)")
    p.add_argument("--emulate", action="store_true", default=None,
                   help="run TPU stages on emulated EdgeTPUs even when TPUs are attached")
    p.add_argument("--trace", type=Path,
                   help="write a Chrome trace-event JSON of the run (opens in ui.perfetto.dev); "
                        "only a run that reaches the end of its source writes it")
    p.add_argument("--batch", type=BATCH, default=None,
                   help="frames of a video file handed between devices at once; more than 1 "
                        "pays off only when stages take well under a millisecond")


def _add_beam(p: argparse.ArgumentParser) -> None:
    p.add_argument("--beam", type=BEAM, default=DEFAULT_BEAM,
                   help=f"beam width of the caption decoder: 1 is greedy, each more costs about a "
                        f"decoder step per word (default {DEFAULT_BEAM})")


@contextlib.contextmanager
def _progress(total: Optional[int], desc: str, unit: str) -> Iterator[Any]:
    """A progress bar on stderr when it is a terminal; silent (and never imported) otherwise."""
    if not sys.stderr.isatty():
        yield None
        return
    from tqdm import tqdm

    with tqdm(total=total, desc=desc, unit=unit, leave=False, file=sys.stderr,
              dynamic_ncols=True) as bar:
        yield bar


def _updater(bar: Any) -> Any:
    return None if bar is None else bar.update


# ---------------------------------------------------------------- caption, camera


def _timing_table(captions: list, frames_per_window: int, stats: Any) -> str:
    """Mean milliseconds per stage: per sampled frame for the per-frame stages, per window for decode."""
    n = len(captions)
    per_frame = n * frames_per_window
    rows = [(stage, sum(c.stage_ms[stage] for c in captions) / per_frame, "frame")
            for stage in ("preprocess", "cnn", "rnn_step")]
    rows.append(("decode", sum(c.stage_ms["decode"] for c in captions) / n, "window"))
    lat = sorted(c.latency_ms for c in captions)
    rows.append(("latency p50", lat[len(lat) // 2], "window"))
    out = ["", f"{'stage':<12}{'ms':>9}  per", "-" * 28]
    out += [f"{name:<12}{ms:>9.2f}  {unit}" for name, ms, unit in rows]
    out.append(f"({n} windows of {frames_per_window} sampled frames)")
    if stats is not None:
        util = ", ".join(f"{w} {u:.0%}" for w, u in stats.worker_utilization().items())
        out.append(f"{stats.fps_out:.1f} frames/s through the pipeline; busy: {util}; "
                   f"dropped {stats.dropped}")
    return "\n".join(out)


def _caption_line(c: Any, expected: Optional[List[str]]) -> str:
    """A caption as ``caption`` and ``camera`` print it: times, text, an unknown scene marked, the demo's truth."""
    line = f"[{c.start_time:7.2f}s - {c.end_time:7.2f}s] {c.text}"
    if c.scene == "unknown":
        line += "   (unknown scene)"
    if expected is not None and c.window < len(expected):
        ok = "ok" if c.text == expected[c.window] else "MISS"
        line += f"   (truth: {expected[c.window]}; {ok})"
    return line


def _captioner_options(args: argparse.Namespace) -> "CaptionerOptions":
    """The one ``CaptionerOptions`` record of ``caption``/``camera``'s flags (checked when made)."""
    from edgecap.options import CaptionerOptions

    return CaptionerOptions(plan=args.plan, board=args.board, emulate=args.emulate, trace=args.trace,
                            frames=args.frames, stride=args.stride, sample_fps=args.sample_fps,
                            num_threads=args.threads, batch=args.batch, beam=args.beam,
                            float_rnn=args.float_rnn)


def _cmd_caption(args: argparse.Namespace) -> int:
    from edgecap.captioner import EdgeCaptioner

    if args.trace is not None:
        check_output(args.trace, "--trace")
    bundle = args.bundle or default_bundle()
    source = args.source
    expected: Optional[List[str]] = None
    if source is None:  # the demo: the shipped sample clip and its ground truth
        source = str(DEMO_DIR / "sample.mp4")
        truth = DEMO_DIR / "sample.json"
        if truth.is_file():
            doc = json.loads(files.read_bytes(truth, what="ground truth", fix="reinstall edgecap"))
            expected = [w["caption"] for w in doc["windows"]]
    if args.command == "camera":  # opened here, to say why its frames ended
        from edgecap.sources import ReconnectingSource, open_source

        source = ReconnectingSource(source) if args.reconnect else open_source(source)
    captions = []
    with EdgeCaptioner(bundle, _captioner_options(args)) as cap:
        weights = cap.bundle.weights
        if weights != "trained":  # a paper-scale bundle's captions are noise by design
            print(f"BUNDLE: {weights} weights — captions measure speed and exactness, "
                  "not quality", file=sys.stderr)
        notes = notices(cap.bundle.name, cap.bundle.domain, cap.bundle.calibration)
        for c in cap.stream(source):
            captions.append(c)
            # Once, with the first caption: what the model knows heads the text on stdout (stderr keeps
            # to one line for an error); beside JSON lines it goes to stderr, after the first record.
            first = notes if len(captions) == 1 else []
            if args.json:
                print(json.dumps({**c.to_dict(), "weights": weights}), flush=True)
                if first:
                    print(*first, sep="\n", file=sys.stderr, flush=True)
            else:
                print(*first, _caption_line(c, expected), sep="\n", flush=True)
    if captions and not args.json:
        print(_timing_table(captions, cap.window.frames, cap.stats()))
    if args.command == "camera":  # a camera has no end of its own: Ctrl-C ends it, or this
        raise RunFailure(f"{source.name}: {getattr(source, 'ended', '') or 'no more frames'}; start it again, "
                         "or pass --reconnect to wait for it")
    if not captions:
        print(f"edgecap: {source}: shorter than one window; no caption", file=sys.stderr)
    return 0


# ---------------------------------------------------------------- eval, validate, devices


def _cmd_eval(args: argparse.Namespace) -> int:
    evaluate = _lab("evaluate", "eval")
    if args.out is not None:
        check_output(args.out, "--out")
    with _progress(args.limit, "eval", "clip") as bar:
        report = evaluate.evaluate(args.bundle or default_bundle(), args.data, args.split, args.limit,
                                   progress=_updater(bar), beam=args.beam)
    print(evaluate.format_report(report))
    if args.out:
        write_text(args.out, evaluate.report_json(report))
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from edgecap.bundle import load_bundle
    from edgecap.plans.compiled_encoder import describe
    from edgecap.plans.plan import load_plan

    b = load_bundle(args.bundle or default_bundle())

    for board in sorted(b.plans):  # each board's plan read as `auto` reads it: a corrupt one is no "ok"
        load_plan(b.plans[board])
    print(f"{b.root}: ok: {b.name}, input {b.input.height}x{b.input.width}x{b.input.channels}, "
          f"{b.feature_size} features, vocabulary {len(b.vocab)}, window {b.window.frames} "
          f"frames / stride {b.window.stride} @ {b.window.sample_fps} fps, {describe(b)}")
    print(_knows_line(b))
    for line in _candidate_lines(b):
        print(line)
    return 0


def _knows_line(bundle: Any) -> str:
    """``edgecap validate``'s line on what the model knows and how its captions' scene is judged."""
    d, c = bundle.domain, bundle.calibration
    knows = f"knows: {d.kind} ({d.about})" if d.kind != "unknown" else "knows: not declared (no 'domain')"
    if c is None:
        return f"{knows}; no calibration: captions carry scene null (not judged)"
    rule = f"confidence < {c.confidence.unknown_below:g}"
    if c.feature is not None:
        rule += f" or feature cosine < {c.feature.unknown_below:g}"
    return f"{knows}; a window is an unknown scene when {rule}"


def _candidate_lines(bundle: Any) -> List[str]:
    """``edgecap validate``'s list of each board's candidate plans: TPUs, predicted fps, size."""
    from edgecap.plans.bundled import bundle_plans, plan_files

    lines = []
    for board in sorted(bundle.candidates):
        found = bundle_plans(bundle, bundle.window, board, best=False, candidates=True)
        best = bundle.plans.get(board)
        # Files the best plan holds too (hard links) are not the candidates' cost.
        ours = {(st.st_dev, st.st_ino) for st in (p.stat() for p in (best.iterdir() if best else ())
                                                   if p.is_file())}
        inodes = {}
        rows = []
        for name, plan in found.usable:
            paths = plan_files(plan)
            inodes.update({(st.st_dev, st.st_ino): st.st_size for st in (p.stat() for p in paths)
                           if (st.st_dev, st.st_ino) not in ours})
            size = sum(p.stat().st_size for p in paths)
            devices = " ".join(s.describe() for s in plan.active_stages)
            rows.append(f"  {name}: {plan.board_tpus} TPU(s), {devices}, predicted "
                        f"{plan.predicted.fps if plan.predicted else '-'} fps, {size / 1e6:.2f} MB")
        lines.append(f"candidates for {board}: {len(found.usable)} usable, {len(found.skipped)} "
                     f"skipped, adding {sum(inodes.values()) / 1e6:.2f} MB to the bundle (a hard-linked "
                     "file once)")
        lines += rows
        lines += [f"  {name}: skipped: {why}" for name, why in found.skipped]
    return lines


def format_devices(infos: Sequence[Any]) -> str:
    """Formats ``edgecap.devices.list_devices()`` as the table ``edgecap devices`` prints.

    THROTTLED is ``yes`` when the apex driver has slowed a TPU's clock (its
    stage times then exceed the plan's), ``no``, or ``-`` when unknown (CPU, USB).
    LINK is a USB TPU's link speed and, before its firmware loads, ``dfu``.
    """
    rows = [("DEVICE", "KIND", "PATH", "TEMP", "THROTTLED", "LINK", "RUNTIME")]
    for i in infos:
        temp = "-" if i.temperature_c is None else f"{i.temperature_c:.1f}C"
        throttled = "-" if i.throttled is None else ("yes" if i.throttled else "no")
        speed = getattr(i, "speed_mbps", None)
        link = " ".join(x for x in (f"{speed}M" if speed else "", "dfu" if getattr(i, "state", None) == "dfu"
                                    else "") if x) or "-"
        rows.append((i.device, i.kind, i.path, temp, throttled, link, i.runtime))
    widths = [max(len(r[c]) for r in rows) for c in range(6)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r[:6], widths)) + "  " + r[6] for r in rows
    )


def format_learned(learned: Sequence[Any], path: Path) -> List[str]:
    """``edgecap devices``' lines of the corrections the running board learned (``edgecap.adapt.Learned``)."""
    lines = [f"learned corrections ({path}): " + ("none" if not learned else f"{len(learned)}")]
    for l in learned:
        c = l.correction
        link = f", link {c.link_bytes_per_s / 1e6:.1f} MB/s" if c.link_bytes_per_s else ""
        seen = (f"; last measured {l.measured_ms:.2f} ms a frame, predicted {l.predicted_ms:.2f}"
                if l.measured_ms is not None and l.predicted_ms is not None else "")
        when = f" ({l.updated})" if l.updated else ""
        lines.append(f"  {l.board} {l.device}: speed x{c.speed:.2f}{link}{seen}{when}")
    return lines


def _cmd_devices(args: argparse.Namespace) -> int:
    from edgecap.adapt import corrections_path, read_learned
    from edgecap.bundle import load_bundle
    from edgecap.devices import detect_hardware, list_devices
    from edgecap.edgetpu_runtime import usb_clock
    from edgecap.options import CaptionerOptions
    from edgecap.planner import choose, tpus_used

    root = args.root or Path("/")
    if not root.is_dir():
        raise EdgecapError(f"--root {root}: not a directory; give a copy of a board's files "
                          "(proc/device-tree, sys, dev)")
    hardware = detect_hardware(root)  # first: it brings USB TPUs out of DFU, so the list below holds
    infos = list_devices(root)
    choice = choose(load_bundle(args.bundle or default_bundle()), CaptionerOptions(), hardware)
    found = hardware.recognised
    clock = usb_clock()
    auto = {"board": hardware.family, "model": hardware.model, "profile": hardware.profile,
            "nearest": found.nearest if found else None, "usb_clock_mhz": clock.mhz,
            "plan": choice.board or "cpu", "tpus": tpus_used(choice.plan), "reason": choice.reason,
            "fallback": choice.fallback}
    path = args.corrections or corrections_path()
    learned = read_learned(path)
    if args.json:
        for info in infos:
            print(json.dumps(dataclasses.asdict(info)))
        print(json.dumps({"auto": auto}))
        print(json.dumps({"corrections": [
            # compute_scale (1 / speed): the field this output has carried since it began.
            {"board": l.board, "device": l.device, **dataclasses.asdict(l.correction),
             "compute_scale": round(1.0 / l.correction.speed, 6),
             "predicted_ms": l.predicted_ms, "measured_ms": l.measured_ms, "updated": l.updated}
            for l in learned]}))
    else:
        print(format_devices(infos))
        print(f"\nboard: {hardware.family or 'not a known board'}"
              + (f" ({hardware.model})" if hardware.model else "")
              + f"; profile: {hardware.profile or '-'}" + (" (nearest)" if found and found.nearest else ""))
        print(f"libedgetpu: {clock.describe()}")
        print(f"auto runs: {auto['plan']} — {choice.reason}")
        for board, why in choice.skipped:
            print(f"  skipped plan {board}: {why}")
        print("\n".join(format_learned(learned, path)))
    return 0


def _cmd_edgetpu_runtime(args: argparse.Namespace) -> int:
    from edgecap.edgetpu_runtime import installed

    print(json.dumps(installed()))
    return 0


def _cmd_selftest(args: argparse.Namespace) -> int:
    from edgecap import selftest

    checks = selftest.run(args.bundle, args.root or "/")
    print(selftest.format_table(checks))
    print("\n" + selftest.dumps(checks))
    return 1 if any(c.result == "fail" for c in checks) else 0


# ---------------------------------------------------------------- serve


def _cmd_serve(args: argparse.Namespace) -> int:
    try:
        from edgecap.service.config import load_config
        from edgecap.service.service import Service
        from edgecap.service.sinks import JournalFormatter, is_journal
    except ImportError as exc:
        raise EdgecapError(f"`edgecap serve` needs the service extra ({exc}): pip install "
                           "'edgecap[service]'") from None
    config = load_config(args.config, {
        "bundle": args.bundle, "plan": args.plan, "board": args.board,
        "on_missing_tpu": args.on_missing_tpu, "http.address": args.http_address,
        "http.port": args.http_port})
    handler = logging.StreamHandler(sys.stderr)
    if is_journal(sys.stderr):
        handler.setFormatter(JournalFormatter())
    log = logging.getLogger("edgecap")
    log.addHandler(handler)
    log.setLevel(config.log_level.upper())
    log.propagate = False
    return Service(config).run()


# ---------------------------------------------------------------- history


def _history_time(text: str) -> float:
    from edgecap.service.history import parse_time

    try:
        return parse_time(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _cmd_history_search(args: argparse.Namespace) -> int:
    from edgecap.service.history import History

    if args.db is not None:
        path = args.db
    else:
        from edgecap.service.config import load_config

        path = Path(load_config(args.config).history.path)
        if not str(path) or path == Path():
            raise EdgecapError(f"{args.config}: [history] path is \"\": this service keeps no history; "
                               "set it, or give the database with --db")
    if not path.is_file():
        raise EdgecapError(f"history: no history database at {path}; give the service's with --db PATH or "
                           "--config FILE (its [history] path)")
    if args.since is not None and args.until is not None and args.since > args.until:
        raise EdgecapError("history search: --since is after --until, so no event can match; give --since "
                           "the earlier time")
    events = History(path).search(args.query, camera=args.camera, since=args.since, until=args.until,
                                  limit=args.limit)
    if args.json:
        print(json.dumps({"events": [e.to_dict() for e in events]}, ensure_ascii=False))
    else:
        print(format_events(events))
    return 0


def format_events(events: Sequence[Any]) -> str:
    """Returns events as a table: local start time, camera, duration, confidence, text."""
    import time

    rows = [("time", "camera", "duration", "confidence", "text")]
    for e in events:
        rows.append((time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.start_time)), e.camera,
                     f"{e.end_time - e.start_time:.1f}s", f"{e.confidence:.3f}",
                     " ".join(e.text.split()) + ("" if e.closed else " (open)")))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4] for r in rows]
    return "\n".join(lines + [f"{len(events)} event{'s' if len(events) != 1 else ''}"])


def _add_history(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="history_command", metavar="COMMAND", required=True)
    s = sub.add_parser("search", help="find events by their words, camera and time, newest first",
                       description="Search the service's event history (read-only: it runs beside "
                                   "the service).")
    s.add_argument("query", nargs="?", default="",
                   help='words and "quoted phrases" that must all be in the caption (whole words: no '
                        'prefixes); empty: every event')
    where = s.add_mutually_exclusive_group(required=True)
    where.add_argument("--db", type=Path, help="the history database file")
    where.add_argument("--config", type=Path, help="the service's TOML config (its [history] path)")
    s.add_argument("--camera", default="", help="only this camera's events")
    s.add_argument("--since", type=_history_time,
                   help="events that started at or after: ISO-8601 or how long ago (30m, 1h, 2d)")
    s.add_argument("--until", type=_history_time, help="events that started at or before; as --since")
    s.add_argument("--limit", type=int_in(1, MAX_HISTORY_LIMIT), default=50, help="at most N events (50)")
    s.add_argument("--json", action="store_true", help='print {"events": [...]} as JSON')
    s.set_defaults(func=_cmd_history_search)


# ---------------------------------------------------------------- bench


def _cmd_bench(args: argparse.Namespace) -> int:
    if args.adapt or args.truth is not None or args.truth_table:
        return _cmd_bench_adapt(args)
    bench = _lab("bench", "bench")

    profiles = [p.strip() for p in args.profiles.split(",") if p.strip()]
    timeline = _check_bench_outputs(args)
    trace = args.trace
    if args.plot is not None and trace is None:
        trace = Path(tempfile.mkdtemp(prefix="edgecap-bench-")) / "trace.json"
    strides = args.strides or None
    runs = bench.runs(profiles, args.timing_only, len(strides or [None]), len(args.board.split(",")),
                      args.host_rounds)
    done: List[dict] = []

    def on_row(row: "bench.Row") -> None:
        # Each row is printed and written as it finishes: a failure later keeps the rows done.
        print(bench.format_row(row), flush=True)
        done.append(bench.row_json(row))
        if args.json is not None:
            write_text(args.json, json.dumps({"argv": sys.argv[1:], "complete": False, "rows": done},
                                             indent=2) + "\n")

    def on_round(host_round: Any) -> None:
        print(f"[host, measured] {bench.host_bench.format_round(host_round)}", flush=True)

    with _progress(runs * max(args.frames, 1), "bench", "frame") as bar:
        result = bench.run_bench(
            args.bundle, args.clips, args.frames, args.board, profiles, args.timing_only,
            args.threads, args.batch, strides, trace, progress=_updater(bar), beam=args.beam,
            on_row=on_row, host_rounds=args.host_rounds, on_round=on_round, host_seconds=args.host_seconds)
    print(bench.format_table(result.rows, result.overhead, result.scaling, result))
    doc = dict(result.to_json(), complete=True)
    if args.json is not None:
        write_text(args.json, json.dumps(doc, indent=2) + "\n")
    if args.plot is not None:
        plots = _lab("plots", "bench --plot")
        # One bar per schedule: the rows at the first stride.
        first = {}
        for row in doc["rows"]:
            first.setdefault(row["profile"], row["stride"])
        plots.plot_bench(dict(doc, rows=[r for r in doc["rows"] if r["stride"] == first[r["profile"]]]),
                         args.plot)
        if trace.is_file():
            plots.plot_timeline(trace, timeline)
    return 0


def _cmd_bench_adapt(args: argparse.Namespace) -> int:
    from edgecap.bundle import load_bundle

    truth_bench = _lab("truth_bench", "bench --adapt")

    if not args.adapt:
        raise EdgecapError("--truth and --truth-table are options of --adapt; add --adapt")
    if (args.truth is None) == (not args.truth_table):
        raise EdgecapError("--adapt runs one truth or the table: pass --truth SPEC or --truth-table")
    if "," in args.board:
        raise EdgecapError(f"--board {args.board}: --adapt emulates one board; name one, e.g. devboard-usb")
    if args.json is not None:
        check_output(args.json, "--json")
    bundle = load_bundle(args.bundle or default_bundle())
    truths = truth_bench.truth_table(args.board) if args.truth_table else [(args.truth, "")]
    truth_bench.bench_adapt(bundle, truths, args.board, args.seconds, args.clips, args.json,
                            table=args.truth_table)
    return 0


def _check_bench_outputs(args: argparse.Namespace) -> Optional[Path]:
    """Checks every path ``bench`` will write; returns where the timeline goes (with --plot)."""
    for path, what in ((args.json, "--json"), (args.trace, "--trace")):
        if path is not None:
            check_output(path, what)
    if args.plot is None:
        if args.timeline is not None:
            raise EdgecapError(f"--timeline {args.timeline}: draws the run --plot draws; "
                               "add --plot PNG")
        return None
    plots = _lab("plots", "bench --plot")
    plots.check_plot(args.plot, "--plot")
    timeline = args.timeline or args.plot.with_name(args.plot.stem + "-timeline.png")
    return plots.check_plot(timeline, "--timeline")


def _add_bench(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bundle", type=Path, help="bundle directory (default: the shipped demo)")
    p.add_argument("--clips", nargs="+", help="video files (default: the shipped sample clip)")
    p.add_argument("--frames", type=int_in(1, MAX_BENCH_FRAMES), default=480,
                   help="frames per run (clips repeat)")
    p.add_argument("--board", default="devboard-usb",
                   help="board profile to emulate, or a comma list of them")
    p.add_argument("--profiles", default="board,host",
                   help="comma list of: board (the emulated --board), host, startup (memory and "
                        "time to first caption of `edgecap caption`)")
    p.add_argument("--timing-only", action="store_true",
                   help="emulated stages compute nothing (all board rows)")
    p.add_argument("--strides", type=int_list_in(1, MAX_WINDOW_FRAMES),
                   help="comma list of window strides to run the board rows at, e.g. 8,4,2 "
                        "(default: the bundle's)")
    p.add_argument("--threads", type=THREADS, default=1,
                   help="threads of each CPU encoder interpreter (default 1)")
    _add_beam(p)
    p.add_argument("--batch", type=BATCH, default=8,
                   help="unused: the host rows compare edgecap caption with plain loops (kept so "
                        "older command lines still run)")
    p.add_argument("--host-rounds", type=int_in(1, MAX_HOST_ROUNDS), default=DEFAULT_HOST_ROUNDS,
                   help=f"rounds of the host loops (edgecap caption and plain loops over a long "
                        f"file), interleaved; each row is its median round (default {DEFAULT_HOST_ROUNDS})")
    p.add_argument("--host-seconds", type=float_in(1.0, MAX_ADAPT_SECONDS), default=20.0,
                   help="about how long each host loop's rounds take together at the one-thread loop's "
                        "rate: it sets the length of the long file they caption (default 20)")
    p.add_argument("--json", type=Path, help="write the results here, each row as it finishes")
    p.add_argument("--plot", type=Path, help="write a bar chart PNG here (needs matplotlib)")
    p.add_argument("--timeline", type=Path, help="with --plot: PNG of the pipelined board run's "
                   "timeline (default: PLOT-timeline.png)")
    p.add_argument("--trace", type=Path,
                   help="write the Chrome trace of the pipelined board run here")
    p.add_argument("--adapt", action="store_true",
                   help="instead: stream on the emulated --board under a hidden truth and compare its fps "
                        "with the best plan under the true costs (docs/emulation.md; modelled)")
    p.add_argument("--truth", help="with --adapt: the board's truth, as EDGECAP_EMULATE takes it, "
                                   "e.g. 'emu-tpu:0=speed:0.5' ('' is the profile)")
    p.add_argument("--truth-table", action="store_true",
                   help="with --adapt: run every truth of lab/edgecap_lab/data/truths.json for --board")
    p.add_argument("--seconds", type=float_in(1.0, MAX_ADAPT_SECONDS), default=10.0,
                   help="with --adapt: seconds each truth streams (default 10)")
    p.set_defaults(func=_cmd_bench)


# ---------------------------------------------------------------- the lab's door


def _lab(module: str, command: str) -> ModuleType:
    """Imports a module of edgecap's lab (what measures the product), or says in one line that it is missing.

    The lab is a distribution of its own (lab/ in the source checkout) that a
    board does not install: this is the one place edgecap imports it.
    """
    import importlib

    try:
        return importlib.import_module(f"edgecap_lab.{module}")
    except ImportError as e:
        missing = "" if e.name in ("edgecap_lab", f"edgecap_lab.{module}") else f" ({e.name} is missing)"
        raise EdgecapError(f"edgecap {command} is part of edgecap's lab, which is not installed{missing}: "
                           "pip install -e lab/ from a source checkout") from None


# ---------------------------------------------------------------- compile, calibrate


def _compiler(module: str) -> ModuleType:
    """Imports a module of the host-side compiler, or says in one line that it is missing."""
    import importlib

    try:
        return importlib.import_module(f"edgecap_compile.{module}")
    except ImportError as e:
        raise EdgecapError(f"the compiler is not installed ({e}): pip install edgecap "
                           "from a source checkout") from None


def _cmd_compile(args: argparse.Namespace) -> int:
    if not args.into_bundle and (args.candidates, args.candidates_max_mb) != (None, None):
        raise EdgecapError("--candidates and --candidates-max-mb go with --into-bundle (candidate "
                           "plans live in a bundle); drop them or compile --into-bundle")
    compiler = _compiler("compiler")
    out = args.out
    if out is not None:
        check_output(out, "-o", directory=True)
    if args.into_bundle:
        from edgecap.bundle import PLANS_DIR, load_bundle

        if not Path(args.model).is_dir():
            raise EdgecapError(f"{args.model}: --into-bundle needs a bundle directory, not a model "
                               "file; pass BUNDLE_DIR or use -o OUT_DIR")
        bundle = load_bundle(args.model)
        board = compiler.make_board(args.board)
        # The plans/ folder is the output created if missing: the bundle itself must be writable.
        check_output(bundle.root / PLANS_DIR, "--into-bundle", directory=True)
        out = bundle.root / PLANS_DIR / board.name
        args.model, args.board = bundle, board
    result = compiler.compile_model(args.model, args.board, out, tpus=args.tpus,
                                    sram=args.sram, calibration=args.calibration,
                                    report=args.report,
                                    min_runtime_version=args.min_runtime_version,
                                    replicas=not args.pipeline_only)
    candidates = None
    if args.into_bundle:
        count = DEFAULT_CANDIDATES if args.candidates is None else args.candidates
        mb = DEFAULT_CANDIDATES_MB if args.candidates_max_mb is None else args.candidates_max_mb
        candidates = compiler.compile_candidates(
            args.model, args.board, result.plan, count, int(mb * 1e6), tpus=args.tpus,
            sram=args.sram, calibration=args.calibration,
            min_runtime_version=args.min_runtime_version, replicas=not args.pipeline_only)
    pred = result.plan.predicted
    if args.json:
        print(json.dumps(_compile_json(result, candidates)))
        return 0
    if result.report:
        print(result.report)
    devices = ", ".join(s.describe() for s in result.plan.stages)
    print(f"wrote {result.plan_path}: {devices}; predicted {pred.fps} fps, "
          f"latency {pred.latency_ms:.2f} ms")
    if candidates is not None:
        print(_candidates_summary(candidates, count, mb))
    return 0


def _compile_json(result: Any, candidates: Any) -> dict:
    """``edgecap compile --json``: the plan written and, with --into-bundle, its candidates."""
    doc = {"plan": str(result.plan_path), "predicted": dataclasses.asdict(result.plan.predicted),
           "candidates": None}
    if candidates is not None:
        doc["candidates"] = {
            "directory": str(candidates.directory),
            "added_bytes": candidates.added_bytes, "copied_bytes": candidates.copied_bytes,
            "written": [{"name": w.name, "tpus": w.plan.board_tpus,
                         "stages": [[s.device, list(s.ops)] for s in w.plan.active_stages],
                         "predicted_fps": w.plan.predicted.fps, "file_bytes": w.file_bytes,
                         "added_bytes": w.added_bytes, "why": w.why} for w in candidates.written],
            "left_out": [{"name": name, "why": why} for name, why in candidates.left_out],
        }
    return doc


def _candidates_summary(candidates: Any, count: int, mb: float) -> str:
    """The lines ``edgecap compile --into-bundle`` prints about the candidate plans it wrote."""
    lines = [f"candidates: {len(candidates.written)} in {candidates.directory}, adding "
             f"{candidates.added_bytes / 1e6:.2f} MB to the bundle ({candidates.copied_bytes / 1e6:.2f} MB "
             f"with shared segments copied; caps --candidates {count}, --candidates-max-mb {mb:g})"]
    for w in candidates.written:
        lines.append(f"  {w.name}: {w.plan.board_tpus} TPU(s), predicted {w.plan.predicted.fps} fps, "
                     f"+{w.added_bytes / 1e6:.2f} MB; for {w.why}")
    if candidates.left_out:
        lines.append(f"  left out {len(candidates.left_out)}: {candidates.left_out[0][1]}")
    return "\n".join(lines)


def _cmd_calibrate(args: argparse.Namespace) -> int:
    check_output(args.out, "-o")
    calibration = _compiler("calibration")
    boards, graph, model_source = (_compiler(m) for m in ("boards", "graph", "model_source"))
    graphs = [graph.read_graph(model_source.resolve_source(m).encoder) for m in args.models]
    board = boards.load_board(args.board)
    segments = sum(min(args.segments, len(g.ops) * (len(g.ops) + 1) // 2) for g in graphs)
    with _progress(segments, "calibrate", "segment") as bar:
        result = calibration.calibrate(graphs, board, device=args.device, threads=args.threads,
                                       segments=args.segments, repeats=args.repeats,
                                       seed=args.seed, progress=_updater(bar))
    try:
        with atomic_path(args.out) as tmp:
            calibration.save_calibration(result, tmp)
    except OSError as e:  # e.g. the disk is full
        raise EdgecapError(f"-o {args.out}: cannot write ({e.strerror}); nothing was written") from None
    d, err = result.device, result.error
    print(f"{result.board} {d.name}: {d.macs_per_s / 1e9:.1f} GMAC/s, "
          f"{d.elements_per_s / 1e9:.2f} G elements/s, {d.op_overhead_ms * 1e3:.2f} us/op, "
          f"{d.invoke_overhead_ms * 1e3:.2f} us/invoke"
          + (f", link {d.link_bytes_per_s / 1e6:.0f} MB/s" if d.is_tpu else ""))
    print(f"fit error over {err['samples']} segments: mean |rel| "
          f"{100 * err['all']['mean_abs_rel']:.1f}% (held-out half "
          f"{100 * err['holdout']['mean_abs_rel']:.1f}%), rms {err['all']['rms_ms']:.3f} ms; "
          f"wrote {args.out}")
    if err["kept_from_profile"]:
        print(f"the timings could not determine {', '.join(err['kept_from_profile'])}; "
              f"kept the {result.board} profile's value (calibrate on larger models or "
              "more segments to fit it)")
    return 0


_BOARD_HELP = ("board profile: a shipped name (devboard-usb, ...; an unknown name lists them) "
               "or a profile .json file")


def _add_compile(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="MODEL.tflite or BUNDLE_DIR")
    p.add_argument("--board", required=True, help=_BOARD_HELP)
    p.add_argument("--tpus", type=int_or_auto(0, MAX_TPUS),
                   help="number of EdgeTPUs, or auto (default): every TPU the board has")
    p.add_argument("--sram", type=int_in(1, MAX_SRAM), help="usable parameter cache per TPU in bytes "
                                            "(default: the board profile's sram_usable_bytes)")
    p.add_argument("--calibration", help="coefficients file from `edgecap calibrate`")
    p.add_argument("--pipeline-only", action="store_true",
                   help="one device per stage: search pipelines only, no copies of a stage on several "
                        "devices (docs/plan.md, Replicas)")
    p.add_argument("--report", action="store_true",
                   help="also write report.md and split.png (needs matplotlib)")
    p.add_argument("--min-runtime-version", type=int_in(*RUNTIME_VERSIONS),
                   help="edgetpu_compiler -m: oldest Edge TPU runtime to support")
    p.add_argument("--candidates", type=int_in(0, MAX_CANDIDATES),
                   help="with --into-bundle: most candidate plans to write beside the best, for a "
                        f"running board to switch to (default {DEFAULT_CANDIDATES}; 0 removes them)")
    p.add_argument("--candidates-max-mb", type=float_in(0, MAX_CANDIDATES_MB),
                   help="with --into-bundle: most megabytes the candidate plans may add to the "
                        f"bundle (default {DEFAULT_CANDIDATES_MB:g})")
    p.add_argument("--json", action="store_true",
                   help="print what was written (plan, candidates, bytes) as one JSON object")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("-o", "--out", help="output folder")
    where.add_argument("--into-bundle", action="store_true",
                       help="write into BUNDLE_DIR/plans/<board>/, where `--board auto` on the "
                            "board finds it (compile on an x86-64 host, ship the bundle)")
    p.set_defaults(func=_cmd_compile)


def _cmd_plan_import(args: argparse.Namespace) -> int:
    from edgecap.plans import coral_pipeline

    check_output(args.out, "-o", directory=True)
    board = _compiler("boards").load_board(args.board)
    prices = [coral_pipeline.TpuPrice(t.invoke_overhead_ms, t.link_bytes_per_s, t.sram_bytes, t.link)
              for t in board.tpus]
    if not prices:
        raise EdgecapError(f"--board {args.board}: the profile has no EdgeTPU to price the segments on; "
                           "name a board with EdgeTPUs (devboard, devboard-usb, rpi4-2usb)")
    compute = None
    if args.source is not None:
        work = _compiler("segment_work")

        def compute(segments):
            return work.compute_ms(args.source, board, [
                ([(t.name, t.shape) for t in s.model.inputs], [(t.name, t.shape) for t in s.model.outputs],
                 s.cpu_ops)
                for s in segments], [s.path.name for s in segments])
    plan = coral_pipeline.import_pipeline([Path(p) for p in args.segments], Path(args.out), board.name,
                                          board.version, prices, compute)
    print(f"wrote {plan.path}: {len(plan.active_stages)} compiled segment(s) of {plan.model_file} "
          f"priced on {plan.board}")
    print(coral_pipeline.describe(plan))
    return 0


def _add_plan(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="plan_command", metavar="COMMAND", required=True)
    i = sub.add_parser(
        "import", help="turn Coral's *_segment_K_of_N_edgetpu.tflite files into a plan",
        description="Check that edgetpu_compiler --num_segments N output chains (tensor names, shapes, "
                    "quantization) and write plan.json with the segments to OUT_DIR: segment K on tpu:K, "
                    "tensors that skip a segment forwarded. Times are modelled (docs/plan.md).")
    i.add_argument("segments", nargs="+", help="SEG_0 ... SEG_N-1, in order")
    i.add_argument("-o", "--out", required=True, help="output folder")
    i.add_argument("--board", default="rpi4-2usb",
                   help="board profile whose EdgeTPU figures price the segments (default rpi4-2usb)")
    i.add_argument("--source", help="the model the segments were compiled from: prices each segment's "
                                    "operators (MACs) too; without it the times have no compute term")
    i.set_defaults(func=_cmd_plan_import)


def _add_calibrate(p: argparse.ArgumentParser) -> None:
    p.add_argument("models", nargs="+", help="int8 .tflite models or bundle dirs to time")
    p.add_argument("--board", required=True, help="board profile the device belongs to")
    p.add_argument("--device", default="cpu", help="cpu (this machine) or tpu:N")
    p.add_argument("--threads", type=THREADS, help="CPU threads (default: the board's cores)")
    p.add_argument("--segments", type=int_in(1, MAX_CALIBRATION_SEGMENTS), default=24,
                   help="random segments per model")
    p.add_argument("--repeats", type=int_in(1, MAX_REPEATS), default=15,
                   help="timed invokes per segment")
    p.add_argument("--seed", type=int_in(0, 2**32 - 1), default=0)
    p.add_argument("-o", "--out", required=True, help="calibration .json to write")
    p.set_defaults(func=_cmd_calibrate)


# ---------------------------------------------------------------- the tree


def build_parser() -> argparse.ArgumentParser:
    """Returns the argument parser of the ``edgecap`` command (imports no handler's modules)."""
    parser = Parser(
        prog="edgecap", description="Caption video on ARM boards with Coral EdgeTPUs.",
        epilog="Bad input exits with code 2 and one line on stderr; a failure at run time with 1 "
               "and one line (EDGECAP_DEBUG=1 adds its traceback); SIGINT exits with 130, SIGTERM with 143.")
    parser.add_argument("--version", action="version", version=f"edgecap {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("caption", help="caption a video file (default: the shipped sample clip)")
    p.add_argument("source", nargs="?", help="video file (default: models/demo/sample.mp4)")
    _add_window_args(p)
    p.set_defaults(func=_cmd_caption)

    p = sub.add_parser("camera", help="caption a live camera, e.g. /dev/video0, 0 or rtsp://host/stream")
    p.add_argument("source", help="camera device path, index (0 to 9999) or network stream URL "
                                  "(rtsp, rtmp, http, https, udp, tcp, srt)")
    p.add_argument("--reconnect", action="store_true",
                   help="when the camera or stream stops, open it again (1 s, 2 s ... 30 s apart) "
                        "instead of exiting 1")
    _add_window_args(p)
    p.set_defaults(func=_cmd_caption)

    p = sub.add_parser("eval", help="score a bundle on a dataset split (BLEU-4, CIDEr-D, ...)")
    p.add_argument("--bundle", type=Path, help="bundle directory (default: the shipped demo)")
    p.add_argument("--data", type=Path, required=True, help="dataset directory (captions.json)")
    p.add_argument("--split", default="test")
    p.add_argument("--limit", type=int_in(1, MAX_CLIPS), help="score only the first N clips")
    _add_beam(p)
    p.add_argument("--out", type=Path, help="also write the report as JSON here")
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("validate", help="check a model bundle")
    p.add_argument("bundle", type=Path, nargs="?", help="bundle directory")
    p.set_defaults(func=_cmd_validate)

    p = sub.add_parser("devices", help="list the CPU and the Coral EdgeTPUs present, and the "
                                       "plan --board auto would run")
    p.add_argument("--json", action="store_true", help="print one JSON object per device")
    p.add_argument("--bundle", type=Path, help="bundle whose plans auto chooses among "
                                               "(default: $EDGECAP_BUNDLE or the shipped demo)")
    p.add_argument("--corrections", type=Path, metavar="FILE",
                   help="the learned corrections to show (default: $STATE_DIRECTORY/corrections.json, "
                        "else ~/.cache/edgecap/corrections.json)")
    p.add_argument("--root", type=Path, metavar="DIR",
                   help="read the device tree, sysfs and /dev under DIR, e.g. a copy of a board's "
                        "files (default: /; another root opens no TPU)")
    p.set_defaults(func=_cmd_devices)

    p = sub.add_parser("edgetpu-runtime",
                       help="print the installed libedgetpu as JSON: its package, build, version "
                            "and whether it loads (read in a child process)")
    p.set_defaults(func=_cmd_edgetpu_runtime)

    p = sub.add_parser("selftest", help="check this machine's interpreter, libedgetpu, board and each "
                                        "TPU; print a table and JSON for a bug report")
    p.add_argument("--bundle", type=Path, help="a bundle whose EdgeTPU-compiled model each TPU also runs")
    p.add_argument("--root", type=Path, metavar="DIR", help=argparse.SUPPRESS)
    p.set_defaults(func=_cmd_selftest)

    p = sub.add_parser("serve", help="run as a service: cameras, status page, metrics, MQTT",
                       description="Caption one or more cameras for as long as it runs, as the "
                                   "config file says (deploy/edgecap.toml); flags override its keys.")
    p.add_argument("--config", type=Path, required=True, help="the TOML config file")
    p.add_argument("--bundle", help="model bundle directory (key: bundle)")
    p.add_argument("--plan", help="plan.json or its directory (key: plan)")
    p.add_argument("--board", help="auto or a board profile (key: board)")
    p.add_argument("--on-missing-tpu", choices=("cpu", "fail"), help="key: on_missing_tpu")
    p.add_argument("--http-address", help="key: http.address")
    p.add_argument("--http-port", type=int_in(0, 65535), help="key: http.port")
    p.set_defaults(func=_cmd_serve)

    _add_history(sub.add_parser("history", help="search the event history `edgecap serve` keeps"))

    _add_bench(sub.add_parser(
        "bench", help="compare schedules: CPU only, one TPU, placement, full pipeline"))
    _add_compile(sub.add_parser(
        "compile", help="split a full-integer TFLite CNN into EdgeTPU segments and a CPU tail",
        description="Split an int8 TFLite CNN (or a bundle's encoder) into EdgeTPU segments and "
                    "a CPU tail balanced for pipelined throughput; write the segments and "
                    "plan.json to OUT_DIR."))
    _add_plan(sub.add_parser("plan", help="work with plans: import Coral's pipelined segments"))
    _add_calibrate(sub.add_parser(
        "calibrate", help="fit a board profile's cost model to measured segment timings",
        description="Time random segments of the given models on a device and fit its cost "
                    "coefficients by least squares; write them for `edgecap compile "
                    "--calibration`."))
    return parser


def run(argv: Sequence[str]) -> int:
    """Parses ``argv`` and runs the command, raising what it raises.

    Args:
      argv: Arguments without the program name, e.g. ``["validate", "my_bundle"]``.

    Returns:
      The exit code (0, or 2 when no command is given).

    Raises:
      EdgecapError: On bad input (``main`` prints it as one line).
      SystemExit: On bad usage (argparse's exit code 2) and for ``--help``.
    """
    parser = build_parser()
    args = parser.parse_args(list(argv))
    if args.command is None:
        parser.print_help()
        return 2
    return args.func(args)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the ``edgecap`` command.

    Args:
      argv: Arguments without the program name (default: ``sys.argv[1:]``).

    Returns:
      The exit code: 0 on success, 2 on bad input, 1 on a failure at run
      time, 130 on SIGINT (Ctrl-C), 143 on SIGTERM; ``serve`` exits 0 on
      SIGTERM.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    # SIGTERM is how systemd stops a service, at any point of its life: for serve it
    # is the normal end (0), also during the start, before READY=1, where 143 would
    # count as a failure. serve's own handler takes over once it runs (Service.run).
    sigterm_exit = 0 if argv[:1] == ["serve"] else EXIT_SIGTERM
    return run_command("edgecap", lambda: run(argv), sigterm_exit)


if __name__ == "__main__":
    sys.exit(main())
