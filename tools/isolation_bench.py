"""The per-frame cost of process isolation on this host, with the bundle's plan for a board.

    python tools/isolation_bench.py --frames 300 --json PATH

What it measures is ``edgecap.bench.bench_isolation``'s (a null stage, the
encoder on an emulated TPU and on the CPU, and the plan's CNN stages
pipelined, each in-process and in worker processes); this script is its
command line. It prints a table and writes the figures as JSON; bad input
exits 2 with one line, Ctrl-C 130 and SIGTERM 143.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional, Sequence

from edgecap.bench import bench_isolation, format_isolation
from edgecap.bundle import default_bundle, load_bundle
from edgecap.command import run_command
from edgecap.errors import ConfigError
from edgecap.outputs import check_output, write_text

PROG = "python tools/isolation_bench.py"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the isolation benchmark from the command line.

    Args:
      argv: Arguments without the program name (default: ``sys.argv[1:]``).

    Returns:
      The exit code: 0, or 2 on bad input.
    """
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, help="bundle directory (default: the shipped demo)")
    parser.add_argument("--board", default="devboard-usb")
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)

    def body() -> int:
        if args.json is not None:
            check_output(args.json, "--json")
        if args.frames < 1:
            raise ConfigError(f"--frames {args.frames}: use 1 or more")
        result = bench_isolation(load_bundle(args.bundle or default_bundle()), args.board, args.frames)
        print(format_isolation(result))
        if args.json is not None:
            write_text(args.json, json.dumps(result.to_json(), indent=2) + "\n")
        return 0

    return run_command(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
