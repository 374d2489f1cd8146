"""What the first invoke in a child process (edgecap.trial_invoke) costs at startup, measured.

    .venv-test/bin/python tools/trial_invoke_bench.py [--runs 3] [--json results/trial-invoke.json]

Times, on this host: each demo model's check with an empty cache (the first
includes starting the checker process), the same check once its hash is
cached (a SHA-256 of the file and a stat), and ``edgecap validate`` of the demo
bundle in a fresh process with an empty cache and with a warm one. Medians of
``--runs``. Prints a table and writes it as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from edgecap import trial_invoke  # noqa: E402

DEMO = REPO / "models" / "demo" / "bundle"
MODELS = ["encoder.tflite", "rnn_encoder_step.tflite", "rnn_decoder_step.tflite"]


def _checks(runs: int) -> Dict[str, Dict[str, float]]:
    out: Dict[str, Dict[str, List[float]]] = {}
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as cache:
            os.environ["XDG_CACHE_HOME"] = cache
            trial_invoke.close()
            trial_invoke._passed.clear()
            for name in MODELS:
                data = (DEMO / name).read_bytes()
                start = time.perf_counter()
                assert trial_invoke.check(data, DEMO / name).kind == "ok"
                cold = time.perf_counter() - start
                trial_invoke._passed.clear()  # as a new process: only the disk remembers
                start = time.perf_counter()
                trial_invoke.check(data, DEMO / name)
                warm = time.perf_counter() - start
                row = out.setdefault(name, {"first_check_ms": [], "cached_check_ms": []})
                row["first_check_ms"].append(cold * 1e3)
                row["cached_check_ms"].append(warm * 1e3)
    trial_invoke.close()
    return {name: {k: round(statistics.median(v), 1) for k, v in row.items()} for name, row in out.items()}


def _validate(runs: int) -> Dict[str, float]:
    cold, warm = [], []
    cmd = [sys.executable, "-m", "edgecap.cli", "validate", str(DEMO)]
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, XDG_CACHE_HOME=cache)
            for into in (cold, warm):
                start = time.perf_counter()
                subprocess.run(cmd, env=env, check=True, capture_output=True, cwd=REPO)
                into.append(time.perf_counter() - start)
    return {"validate_empty_cache_s": round(statistics.median(cold), 2),
            "validate_warm_cache_s": round(statistics.median(warm), 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    checks = _checks(args.runs)
    validate = _validate(args.runs)
    print(f"{'model':<28}{'first check ms':>16}{'cached ms':>12}   (measured, this host)")
    for name, row in checks.items():
        print(f"{name:<28}{row['first_check_ms']:>16.1f}{row['cached_check_ms']:>12.1f}")
    print(f"edgecap validate (demo): {validate['validate_empty_cache_s']} s with an empty cache, "
          f"{validate['validate_warm_cache_s']} s warm")
    if args.json:
        doc = {"about": "edgecap.trial_invoke's cost at startup (tools/trial_invoke_bench.py). Measured.",
               "command": " ".join(["tools/trial_invoke_bench.py", *sys.argv[1:]]),
               "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                        "load_1min": round(os.getloadavg()[0], 1)},
               "runs": args.runs, "checks": checks, **validate}
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
