"""A flapping EdgeTPU: the cost of a device that fails every N invokes, against one fault.

    python tools/flapping.py --frames 2000 --fail-every 50 --json PATH

Captions ``--frames`` sampled frames (the demo clip, repeated) on the
emulated ``devboard-usb`` three times: with no fault, with one fault
(``emu-tpu:0`` fails at its ``--fail-every``-th invoke), and with
``emu-tpu:0`` failing at every ``--fail-every``-th invoke of its life and
answering probes again at once (a flapping device). It prints, per run, the
plan switches (failovers and returns), the run time and whether the captions
equal the fault-free run's, and writes them as JSON. With ``--isolate`` each
EdgeTPU stage runs in a worker process, so every switch starts one. The TPUs are emulated:
switch counts follow the runtime's re-probe policy (``data/recovery.json``),
times are *measured* on this host, under its load. Bad input exits 2 with
one line, Ctrl-C 130 and SIGTERM 143.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from edgecap import faults
from edgecap.bundle import default_bundle
from edgecap.captioner import EdgeCaptioner
from edgecap.command import run_command
from edgecap.errors import ConfigError
from edgecap.outputs import check_output, write_text
from edgecap.sources import open_source

PROG = "python tools/flapping.py"
DEVICE = "emu-tpu:0"


def _run(bundle: str, board: str, frames: List[Any], plan: str, isolate: bool) -> Dict[str, Any]:
    faults.inject(plan)
    try:
        with EdgeCaptioner(bundle, board=board, num_threads=1, isolate=isolate) as cap:
            t0 = time.perf_counter()
            texts = [c.text for c in cap.caption_frames(frames)]
            elapsed = time.perf_counter() - t0
            stats = cap.stats()
    finally:
        faults.inject("")
    kinds: Dict[str, int] = {}
    for record in stats.failovers:
        kinds[record.kind] = kinds.get(record.kind, 0) + 1
    return {"faults": plan.count("=") if plan else 0, "switches": len(stats.failovers), "kinds": kinds,
            "seconds": round(elapsed, 2), "texts": texts}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the flapping benchmark from the command line.

    Args:
      argv: Arguments without the program name (default: ``sys.argv[1:]``).

    Returns:
      The exit code: 0, or 2 on bad input.
    """
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=2000, help="sampled frames per run (1..1000000)")
    parser.add_argument("--fail-every", type=int, default=50,
                        help=f"{DEVICE} fails at every this many of its invokes (1..1000000)")
    parser.add_argument("--board", default="devboard-usb", help="board profile to emulate")
    parser.add_argument("--isolate", action="store_true",
                        help="run the EdgeTPU stages in worker processes (each switch starts one)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)

    def body() -> int:
        if args.json is not None:
            check_output(args.json, "--json")
        for name, value in (("--frames", args.frames), ("--fail-every", args.fail_every)):
            if not 1 <= value <= 1_000_000:
                raise ConfigError(f"{name} {value}: use 1 to 1000000")
        bundle = str(default_bundle())
        images = [f.image for f in open_source(str(default_bundle().parent / "sample.mp4"))]
        frames = (images * (args.frames // len(images) + 1))[:args.frames]
        every = args.fail_every
        plans = {
            "no fault": "",
            "one fault": f"{DEVICE}=fail@{every}+0s",
            "flapping": ",".join(f"{DEVICE}=fail@{every * k}+0s" for k in range(1, args.frames // every + 1)),
        }
        runs = {name: _run(bundle, args.board, frames, plan, args.isolate) for name, plan in plans.items()}
        reference = runs["no fault"]["texts"]
        where = ", isolated" if args.isolate else ""
        print(f"| run ({args.frames} frames, {args.board}, emulated{where}) | faults planned | plan switches "
              "| run time, s (measured) | captions equal the fault-free run's |")
        print("|---|---|---|---|---|")
        for name, r in runs.items():
            r["captions_equal"] = r.pop("texts") == reference
            kinds = ", ".join(f"{k} {n}" for k, n in sorted(r["kinds"].items()))
            print(f"| {name} | {r['faults']} | {r['switches']}{f' ({kinds})' if kinds else ''} "
                  f"| {r['seconds']} | {'yes' if r['captions_equal'] else 'NO'} |")
        if args.json is not None:
            command = f"{PROG} " + " ".join(argv if argv is not None else sys.argv[1:])
            write_text(args.json, json.dumps({"command": command, "runs": runs,
                                              "host": {"python": platform.python_version(),
                                                       "machine": platform.machine()}}, indent=2) + "\n")
        return 0

    return run_command(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
