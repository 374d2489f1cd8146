"""Long fuzz run of edgecap's loaders: bundle.json, plan.json, the service's TOML, model bytes.

    .venv-test/bin/python tools/fuzz_loaders.py [--cases 12000] [--seed 1] [--json results/fuzz.json]

Mutates valid documents and models (edgecap_lab.loader_fuzz has the strategies)
and checks that each loader either succeeds or raises edgecap's own error in
one line. Model bytes run in child processes, so a native crash or a hang is
caught and reported with the input it was on. Prints a table of cases and
outcomes per target and writes it, with every finding, as JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from edgecap_lab import loader_fuzz

REPO = Path(__file__).resolve().parent.parent

HANG_S = 5.0  # one load taking longer is reported as a hang
OVERRIDE_KEYS = ["http.port", "cameras[0].fps", "board", "cameras[9].name", "http", "x.y", "..",
                 "cameras[0]", "plan", "sinks.mqtt.port", "cameras.0.source"]


def _run(cases: int, seed_: int, body) -> None:
    @seed(seed_)
    @settings(max_examples=cases, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def one(data) -> None:
        body(data)

    one()


def _timed(tally: loader_fuzz.Tally, slowest: dict, target: str, fn) -> None:
    start = time.perf_counter()
    fn()
    took = time.perf_counter() - start
    slowest[target] = max(slowest.get(target, 0.0), took)
    if took > HANG_S:
        tally.findings.append(loader_fuzz.Finding(target, f"took {took:.1f} s (hang?)", ""))


def _commit() -> str:
    """The commit the run tested, as `git describe` says it (``-dirty`` for uncommitted changes)."""
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def earlier_runs(path: Path) -> list:
    """The runs an existing results file holds: its own run first, then its earlier ones."""
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return [{k: v for k, v in old.items() if k != "earlier_runs"}] + old.get("earlier_runs", [])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=12000, help="cases in all, split across targets")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", default=str(REPO / "results" / "fuzz.json"), help="where to write results")
    args = parser.parse_args(argv)
    per = args.cases // 6
    ws = loader_fuzz.Workspace()
    tally = loader_fuzz.Tally()
    slowest: dict = {}
    started = time.perf_counter()
    try:
        def bundle_doc(data):
            blob = loader_fuzz.json_bytes(data.draw(loader_fuzz.mutated_doc(ws.bundle_doc)))
            _timed(tally, slowest, "bundle.json", lambda: ws.bundle_json(blob, tally))

        def plan_doc(data):
            blob = loader_fuzz.json_bytes(data.draw(loader_fuzz.mutated_doc(ws.plan_doc)))
            _timed(tally, slowest, "plan.json", lambda: ws.plan_json(blob, tally))

        def json_text(data):
            if data.draw(st.booleans()):
                blob = data.draw(loader_fuzz.mutated_text(loader_fuzz.json_bytes(ws.bundle_doc)))
                _timed(tally, slowest, "bundle.json", lambda: ws.bundle_json(blob, tally))
            else:
                blob = data.draw(loader_fuzz.mutated_text(loader_fuzz.json_bytes(ws.plan_doc)))
                _timed(tally, slowest, "plan.json", lambda: ws.plan_json(blob, tally))

        def toml(data):
            if data.draw(st.booleans()):
                blob = loader_fuzz.toml_bytes(data.draw(loader_fuzz.mutated_doc(ws.config_doc)))
            else:
                blob = data.draw(loader_fuzz.mutated_text(ws.config_text))
            overrides = data.draw(st.dictionaries(st.sampled_from(OVERRIDE_KEYS), loader_fuzz.values,
                                                  max_size=2))
            _timed(tally, slowest, "service.toml", lambda: ws.service_toml(blob, overrides, tally))

        for body in (bundle_doc, plan_doc, json_text):
            _run(per, args.seed, body)
        _run(per, args.seed, toml)
        # Model bytes: 2 * per cases in child processes of 500 each.
        remaining, batch = args.cases - 4 * per, 0
        while remaining > 0:
            n = min(500, remaining)
            result = loader_fuzz.fuzz_models_in_child(n, args.seed * 1000 + batch, timeout_s=600)
            for target, outcomes in result["outcomes"].items():
                for outcome, count in outcomes.items():
                    for _ in range(count):
                        tally.count(target, outcome)
            tally.findings += [loader_fuzz.Finding(**f) for f in result["findings"]]
            remaining -= n
            batch += 1
    finally:
        ws.close()
    elapsed = time.perf_counter() - started
    print(f"{'target':20} {'cases':>7} {'loaded':>7} {'refused':>8} {'findings':>8} {'slowest s':>9}")
    for target in sorted(tally.cases):
        o = tally.outcomes[target]
        slow = f"{slowest[target]:.3f}" if target in slowest else "-"
        print(f"{target:20} {tally.cases[target]:7} {o.get('loaded', 0):7} {o.get('refused', 0):8} "
              f"{o.get('finding', 0):8} {slow:>9}")
    total = sum(tally.cases.values())
    print(f"{'all':20} {total:7}  in {elapsed:.0f} s; findings: {len(tally.findings)}")
    for f in tally.findings[:20]:
        print(f"  {f.target}: {f.error}")
    Path(args.json).write_text(json.dumps({
        "command": "python tools/fuzz_loaders.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": _commit(),
        "seed": args.seed, "cases": total, "seconds": round(elapsed, 1),
        "host": f"{platform.machine()} Python {platform.python_version()} (measured)",
        "per_target": {t: {"cases": tally.cases[t], **tally.outcomes[t],
                           "slowest_s": round(slowest.get(t, 0.0), 3) or None} for t in sorted(tally.cases)},
        "findings": [f.__dict__ for f in tally.findings],
        # Runs before this one (their findings fixed since, or not), newest first.
        "earlier_runs": earlier_runs(Path(args.json)),
    }, indent=2) + "\n")
    return 1 if tally.findings else 0


if __name__ == "__main__":
    sys.exit(main())
