"""The soak: a long pipelined run on an emulated board, with faults injected as it goes.

    python tools/soak.py --frames 50000 --fault-every 4000 --back 2 --warmup 5000 \\
        --json results/soak.json --md results/soak.md

What it runs and measures is ``edgecap_lab.soak``'s (``run_soak``); this script is
its command line. It prints a table, writes the figures as JSON and Markdown,
and exits 0 when every goal is met, 1 when one is not, 2 on bad input, 130 on
Ctrl-C and 143 on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Optional, Sequence

from edgecap import outputs
from edgecap.command import run_command
from edgecap_lab.soak import run_soak, table

PROG = "python tools/soak.py"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the soak from the command line.

    Args:
      argv: Arguments without the program name (default: ``sys.argv[1:]``).

    Returns:
      The exit code: 0 when every goal is met, else 1; 2 on bad input.
    """
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=50_000, help="sampled frames to caption")
    p.add_argument("--fault-every", type=int, default=4_000, help="frames between two faults")
    p.add_argument("--back", type=float, default=2.0, help="seconds until a failed device answers again")
    p.add_argument("--warmup", type=int, default=5_000, help="frames before the first memory reading")
    p.add_argument("--bundle", help="bundle directory (default: the shipped demo)")
    p.add_argument("--board", default="devboard-usb", help="board profile to emulate")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.add_argument("--md", type=Path, help="write the table here (Markdown)")
    args = p.parse_args(argv)

    def body() -> int:
        for out, what in ((args.json, "--json"), (args.md, "--md")):
            if out is not None:
                outputs.check_output(out, what)  # before the run, not after it
        result = run_soak(args.frames, args.fault_every, args.back, args.warmup, args.bundle, args.board,
                          progress=lambda line: print(line, file=sys.stderr, flush=True))
        text = table(result)
        print(text)
        print("soak: all goals met" if result.ok else "soak: goals NOT met: " + "; ".join(result.missed))
        command = f"{PROG} " + " ".join(argv if argv is not None else sys.argv[1:])
        if args.json is not None:
            outputs.write_text(args.json, json.dumps({"command": command, **asdict(result), "ok": result.ok},
                                                     indent=2) + "\n")
        if args.md is not None:
            outputs.write_text(args.md, f"# Soak\n\n`{command}`\n\n{text}\n")
        return 0 if result.ok else 1

    return run_command(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
