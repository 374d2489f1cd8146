"""Command line of the compiler: ``edgecap compile`` and ``edgecap calibrate``.

edgecap's CLI imports this module lazily and calls ``main`` with the arguments
from the subcommand name on; bad input raises ``CompileError`` (an
``EdgecapError``), which the caller prints as one line and turns into exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from edgecap_compile.boards import board_names, load_board
from edgecap_compile.calibration import calibrate, save_calibration
from edgecap_compile.compiler import compile_model
from edgecap_compile.errors import CompileError
from edgecap_compile.graph import read_graph
from edgecap_compile.model_source import resolve_source


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edgecap")
    commands = parser.add_subparsers(dest="command", required=True)

    comp = commands.add_parser(
        "compile", help="split an int8 model into EdgeTPU segments and a CPU tail",
        description="Split an int8 TFLite CNN (or a bundle's encoder) into EdgeTPU segments and "
                    "a CPU tail balanced for pipelined throughput; write the segments and "
                    "plan.json to OUT_DIR.")
    comp.add_argument("model", help="MODEL.tflite or BUNDLE_DIR")
    comp.add_argument("--board", required=True,
                      help=f"board profile: {', '.join(board_names())} or a .json file")
    comp.add_argument("--tpus", type=int, help="number of EdgeTPUs (default: the board's)")
    comp.add_argument("--sram", type=int, help="parameter SRAM per TPU in bytes "
                                               "(default: the board's, 8 MiB)")
    comp.add_argument("--calibration", help="coefficients file from `edgecap calibrate`")
    comp.add_argument("--report", action="store_true",
                      help="also write report.md and split.png (needs matplotlib)")
    comp.add_argument("--min-runtime-version", type=int,
                      help="edgetpu_compiler -m: oldest Edge TPU runtime to support")
    comp.add_argument("-o", "--out", required=True, help="output folder")

    cal = commands.add_parser(
        "calibrate", help="fit a device's cost coefficients to measured segment times",
        description="Time random segments of the given models on a device and fit its cost "
                    "coefficients by least squares; write them for `edgecap compile "
                    "--calibration`.")
    cal.add_argument("models", nargs="+", help="int8 .tflite models or bundle dirs to time")
    cal.add_argument("--board", required=True, help="board profile the device belongs to")
    cal.add_argument("--device", default="cpu", help="cpu (this machine) or tpu:N")
    cal.add_argument("--threads", type=int, help="CPU threads (default: the board's cores)")
    cal.add_argument("--segments", type=int, default=24, help="random segments per model")
    cal.add_argument("--repeats", type=int, default=15, help="timed invokes per segment")
    cal.add_argument("--seed", type=int, default=0)
    cal.add_argument("-o", "--out", required=True, help="calibration .json to write")
    return parser


def _compile(args: argparse.Namespace) -> int:
    result = compile_model(args.model, args.board, args.out, tpus=args.tpus, sram=args.sram,
                           calibration=args.calibration, report=args.report,
                           min_runtime_version=args.min_runtime_version)
    pred = result.plan.predicted
    if result.report:
        print(result.report)
    devices = ", ".join(f"{s.device} ops [{s.ops[0]}, {s.ops[1]})" for s in result.plan.stages)
    print(f"wrote {result.plan_path}: {devices}; predicted {pred.fps} fps, "
          f"latency {pred.latency_ms:.2f} ms")
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    graphs = [read_graph(resolve_source(m).encoder) for m in args.models]
    result = calibrate(graphs, load_board(args.board), device=args.device,
                       threads=args.threads, segments=args.segments, repeats=args.repeats,
                       seed=args.seed)
    save_calibration(result, args.out)
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


def main(argv: Optional[List[str]] = None) -> int:
    """Runs ``compile`` or ``calibrate``.

    Args:
      argv: Arguments starting with the subcommand, e.g.
        ``['compile', 'model.tflite', '--board', 'devboard-usb', '-o', 'out']``.

    Returns:
      The exit code (0).

    Raises:
      CompileError: On bad input.
      SystemExit: On bad usage (argparse's exit code 2).
    """
    args = _parser().parse_args(argv)
    return _compile(args) if args.command == "compile" else _calibrate(args)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except CompileError as error:
        print(f"edgecap: {error}", file=sys.stderr)
        sys.exit(2)
