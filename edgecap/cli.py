"""The ``edgecap`` command line: exit code 0 on success, 2 on bad input, one line per error."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from edgecap import __version__
from edgecap.bundle import DEMO_DIR, default_bundle
from edgecap.errors import EdgecapError


# Subcommands implemented by the host-side compiler; it parses its own
# arguments, and importing it lazily keeps it off the runtime's import path.
_COMPILER_COMMANDS = {
    "compile": "split a full-integer TFLite CNN into EdgeTPU segments and a CPU tail",
    "calibrate": "fit a board profile's cost model to measured segment timings",
}

# Subcommands in modules of their own: name -> (module, help). Each module
# has add_arguments(parser) and run(args) -> int.
_MODULE_COMMANDS: Dict[str, tuple] = {
    "devices": ("edgecap.devices", "list the CPU and the Coral EdgeTPUs present"),
    "bench": ("edgecap.bench", "compare schedules: CPU only, one TPU, placement, full pipeline"),
}


def _add_window_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bundle", type=Path, default=None,
                   help="model bundle directory (default: $EDGECAP_BUNDLE or the shipped demo)")
    p.add_argument("--frames", type=int, help="sampled frames per window (default: bundle's)")
    p.add_argument("--stride", type=int, help="sampled frames between windows (default: bundle's)")
    p.add_argument("--sample-fps", type=float, help="sampling rate, 0 = every frame")
    p.add_argument("--threads", type=int, help="CPU threads of the CNN (default: the physical cores)")
    p.add_argument("--json", action="store_true", help="print one JSON object per caption")
    p.add_argument("--plan", type=Path, help="plan.json (or its directory) from `edgecap compile`")
    p.add_argument("--board", default="auto",
                   help="with no --plan: auto (whole CNN on the CPU) or a board profile to plan "
                        "for, e.g. devboard-usb (TPUs it lacks are emulated)")
    p.add_argument("--emulate", action="store_true", default=None,
                   help="run TPU stages on emulated EdgeTPUs even when TPUs are attached")
    p.add_argument("--trace", type=Path,
                   help="write a Chrome trace-event JSON of the run (opens in ui.perfetto.dev)")
    p.add_argument("--batch", type=int, default=1,
                   help="frames of a video file handed between devices at once; more than 1 "
                        "pays off only when stages take well under a millisecond")


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


def _cmd_caption(args: argparse.Namespace) -> int:
    from edgecap.captioner import EdgeCaptioner

    bundle = args.bundle or default_bundle()
    source = args.source
    expected: Optional[List[str]] = None
    if source is None:  # the demo: the shipped sample clip and its ground truth
        source = str(DEMO_DIR / "sample.mp4")
        truth = DEMO_DIR / "sample.json"
        if truth.is_file():
            expected = [w["caption"] for w in json.loads(truth.read_text())["windows"]]
    captions = []
    with EdgeCaptioner(bundle, plan=args.plan, board=args.board, emulate=args.emulate,
                       trace=args.trace, frames=args.frames, stride=args.stride,
                       sample_fps=args.sample_fps, num_threads=args.threads,
                       batch=args.batch) as cap:
        for c in cap.stream(source):
            captions.append(c)
            if args.json:
                print(json.dumps(c.to_dict()), flush=True)
            else:
                line = f"[{c.start_time:7.2f}s - {c.end_time:7.2f}s] {c.text}"
                if expected is not None and c.window < len(expected):
                    ok = "ok" if c.text == expected[c.window] else "MISS"
                    line += f"   (truth: {expected[c.window]}; {ok})"
                print(line, flush=True)
    if not captions:
        print(f"edgecap: {source}: shorter than one window; no caption", file=sys.stderr)
    elif not args.json:
        print(_timing_table(captions, cap.window.frames, cap.stats()))
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from edgecap.evaluate import evaluate, format_report, report_json

    report = evaluate(args.bundle or default_bundle(), args.data, args.split, args.limit)
    print(format_report(report))
    if args.out:
        Path(args.out).write_text(report_json(report))
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from edgecap.bundle import load_bundle

    b = load_bundle(args.bundle or default_bundle())
    print(f"{b.root}: ok: {b.name}, input {b.input.height}x{b.input.width}x{b.input.channels}, "
          f"{b.feature_size} features, vocabulary {len(b.vocab)}, window {b.window.frames} "
          f"frames / stride {b.window.stride} @ {b.window.sample_fps} fps")
    return 0


def build_parser(selected: Sequence[str] = tuple(_MODULE_COMMANDS)) -> argparse.ArgumentParser:
    """Returns the argument parser of the ``edgecap`` command.

    Args:
      selected: Module-backed subcommands whose modules to import and whose
        arguments to add (default: all of them).
    """
    parser = argparse.ArgumentParser(
        prog="edgecap", description="Caption video on ARM boards with Coral EdgeTPUs.",
        epilog="Bad input exits with code 2 and one line on stderr.")
    parser.add_argument("--version", action="version", version=f"edgecap {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("caption", help="caption a video file (default: the shipped sample clip)")
    p.add_argument("source", nargs="?", help="video file (default: models/demo/sample.mp4)")
    _add_window_args(p)
    p.set_defaults(func=_cmd_caption)

    p = sub.add_parser("camera", help="caption a live camera, e.g. /dev/video0 or 0")
    p.add_argument("source", help="camera device path or index")
    _add_window_args(p)
    p.set_defaults(func=_cmd_caption)

    p = sub.add_parser("eval", help="score a bundle on a dataset split (BLEU-4, CIDEr-D, ...)")
    p.add_argument("--bundle", type=Path, help="bundle directory (default: the shipped demo)")
    p.add_argument("--data", type=Path, required=True, help="dataset directory (captions.json)")
    p.add_argument("--split", default="test")
    p.add_argument("--limit", type=int, help="score only the first N clips")
    p.add_argument("--out", type=Path, help="also write the report as JSON here")
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("validate", help="check a model bundle")
    p.add_argument("bundle", type=Path, nargs="?", help="bundle directory")
    p.set_defaults(func=_cmd_validate)

    for name, (module, help_text) in _MODULE_COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        # Only the chosen command's module is imported: `edgecap validate`
        # should not pay for the benchmark's imports.
        if name in selected:
            mod = importlib.import_module(module)
            mod.add_arguments(p)
            p.set_defaults(func=mod.run)

    for name, help_text in _COMPILER_COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def _run(argv: Sequence[str]) -> int:
    if argv and argv[0] in _COMPILER_COMMANDS:
        try:
            compiler = importlib.import_module("edgecap_compile.cli")
        except ImportError as e:
            raise EdgecapError(f"the compiler is not installed ({e}): pip install edgecap "
                               "from a source checkout") from None
        main_: Callable[[List[str]], int] = compiler.main
        return main_(list(argv))
    parser = build_parser(selected=[a for a in argv[:1] if a in _MODULE_COMMANDS])
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return args.func(args)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the ``edgecap`` command.

    Args:
      argv: Arguments without the program name (default: ``sys.argv[1:]``).

    Returns:
      The exit code: 0 on success, 2 on bad input, 130 on Ctrl-C.
    """
    try:
        return _run(sys.argv[1:] if argv is None else argv)
    except EdgecapError as e:
        print(f"edgecap: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `edgecap caption clip.mp4 | head -1`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
