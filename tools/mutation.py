"""Mutation check of the timing and stop paths: cosmic-ray over a fixed sample of mutants.

Reproduces the table in docs/testing.md. For each module it makes cosmic-ray's
mutants (in a copy of the checkout, never in it), keeps a fixed random sample
(``--sample`` per module, ``--seed``), and runs the fast tier's tests that
concern the module against each mutant, twice:

* before: without the test files written for issue 15 (``NEW_TESTS``), i.e.
  the tests main had;
* after: with them. The after tests are the before tests plus the new files,
  so a mutant killed before is killed after; only the survivors of the
  before run are run again (``--full-after`` runs all of them again).

A mutant counts as killed when the tests fail or time out; "incompetent"
mutants (the test run cannot even start, e.g. a syntax error) are left out of
the score. Needs cosmic-ray in the test venv, not in pyproject:

    .venv-test/bin/pip install cosmic-ray
    nice -n 19 .venv-test/bin/python tools/mutation.py --sample 30 --seed 15 --json /tmp/mutation.json

One mutant costs one pytest start (about 3 s) plus its tests; the default
sample takes 20-40 minutes on two shared cores.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

REPO = Path(__file__).resolve().parent.parent

# The fast tier's tests that concern each module (run with -m fast).
TESTS: Dict[str, List[str]] = {
    "edgecap/scheduler.py": ["tests/test_scheduler.py", "tests/test_stopping.py", "tests/test_failover.py",
                             "tests/test_deadlines.py"],
    "edgecap/isolation.py": ["tests/test_isolation.py", "tests/test_failover.py", "tests/test_deadlines.py",
                             "tests/test_crash_isolation.py"],
    # New in issue 15 (their code was spread over autoplan, placement, failover and the captioner):
    # run with --modules; "before" is the tests main had, less those NEW_TESTS lists.
    "edgecap/supervisor.py": ["tests/test_failover.py", "tests/test_window_state.py", "tests/test_replay.py",
                              "tests/test_supervisor.py"],
    "edgecap/planner.py": ["tests/test_planner.py", "tests/test_failover.py", "tests/test_devices.py"],
    # test_serve.py runs the service as a subprocess and has no fast test.
    "edgecap/service/service.py": ["tests/test_service_devices.py", "tests/test_serve_exit.py"],
}
# Written for issue 15: left out of the "before" run.
NEW_TESTS = ["tests/test_deadlines.py", "tests/test_crash_isolation.py", "tests/test_serve_exit.py",
             "tests/test_replay.py", "tests/test_supervisor.py"]
TIMEOUT_S = 60.0  # the tests of one module take 5-15 s here; a hung mutant counts as killed


def _copy_checkout(dst: Path) -> None:
    """Tracked and untracked (not ignored) files of the checkout, as they are on disk."""
    files = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / name)


def _command(tests: List[str], python: str) -> str:
    # -x: the first failure kills the mutant; -p no:randomly keeps the order fixed.
    return (f"{python} -m pytest -q -x -p no:randomly -p no:cacheprovider "
            f"-m 'fast and not slow and not tf and not tpu' {' '.join(tests)}")


def _config(module: str, command: str) -> str:
    return "\n".join([
        "[cosmic-ray]",
        f'module-path = "{module}"',
        f"timeout = {TIMEOUT_S}",
        "excluded-modules = []",
        f'test-command = "{command}"',
        "",
        "[cosmic-ray.distributor]",
        'name = "local"',
        "",
    ])


def _cosmic(args: List[str], cwd: Path) -> None:
    tool = Path(sys.executable).with_name("cosmic-ray")
    subprocess.run([str(tool), *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL)


def _key(item) -> str:
    """A mutant's name: where it mutates, with which operator, which occurrence."""
    spec = item.mutations[0]
    return f"{spec.start_pos[0]}:{spec.start_pos[1]}:{spec.operator_name}:{spec.occurrence}"


def _sampled(module: str, copy: Path, sample: int, seed: int) -> tuple:
    """cosmic-ray's mutants of ``module`` and a fixed sample of them: sorted by place, ``Random(seed).sample``."""
    from cosmic_ray.work_db import WorkDB, use_db

    stem = module.replace("/", "_").replace(".py", "")
    config, db = copy / f"{stem}.toml", copy / f"{stem}.sqlite"
    # The test command is given to mutate_and_test per run; the session only lists the mutants.
    config.write_text(_config(module, "true"))
    _cosmic(["init", str(config), str(db)], copy)
    with use_db(str(db), WorkDB.Mode.open) as work_db:
        items = sorted(work_db.work_items, key=_key)
    chosen = items if sample <= 0 or sample >= len(items) else random.Random(seed).sample(items, sample)
    return len(items), sorted(chosen, key=lambda w: w.mutations[0].start_pos)


def _test(items: list, command: str) -> Dict[str, dict]:
    from cosmic_ray.mutating import mutate_and_test

    out = {}
    for item in items:
        t0 = time.monotonic()
        result = mutate_and_test(item.mutations, command, TIMEOUT_S)
        outcome = getattr(result.test_outcome, "value", None) or getattr(result.worker_outcome, "value", "?")
        out[_key(item)] = {"line": item.mutations[0].start_pos[0], "operator": item.mutations[0].operator_name,
                           "outcome": outcome, "seconds": round(time.monotonic() - t0, 1)}
        print(f"  {_key(item)}: {outcome} ({out[_key(item)]['seconds']} s)", flush=True)
    return out


def _score(results: Dict[str, dict]) -> tuple:
    competent = {k for k, r in results.items() if r["outcome"] in ("killed", "survived")}
    killed = {k for k in competent if results[k]["outcome"] == "killed"}
    return competent, killed


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modules", nargs="+", help="files to mutate (keys of TESTS; default: the table's three)",
                   default=["edgecap/scheduler.py", "edgecap/isolation.py", "edgecap/service/service.py"])
    p.add_argument("--sample", type=int, default=30, help="mutants per module (0: all)")
    p.add_argument("--seed", type=int, default=15)
    p.add_argument("--full-after", action="store_true", help="run every sampled mutant again after")
    p.add_argument("--json", type=Path, help="write the per-mutant results here")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="edgecap-mutation-"))
    copy = work / "checkout"
    _copy_checkout(copy)
    # Tests and their subprocesses import the copy, which cosmic-ray mutates in place.
    os.environ["PYTHONPATH"] = str(copy)
    os.chdir(copy)
    rows, report = [], {"seed": args.seed, "sample": args.sample, "timeout_s": TIMEOUT_S, "modules": {}}
    for module in args.modules:
        tests = TESTS[module]
        before_tests = [t for t in tests if t not in NEW_TESTS]
        for command in (_command(before_tests, sys.executable), _command(tests, sys.executable)):
            if subprocess.run(command, shell=True, stdout=subprocess.DEVNULL).returncode != 0:
                print(f"{module}: the tests fail without a mutant: {command}", file=sys.stderr)
                return 1
        total, items = _sampled(module, copy, args.sample, args.seed)
        print(f"{module}: {total} mutants, {len(items)} sampled; before ({' '.join(before_tests)})", flush=True)
        t0 = time.monotonic()
        before = _test(items, _command(before_tests, sys.executable))
        took_b = time.monotonic() - t0
        comp_b, killed_b = _score(before)
        again = [w for w in items if args.full_after or (_key(w) in comp_b and _key(w) not in killed_b)]
        print(f"{module}: after ({' '.join(tests)}), {len(again)} mutants", flush=True)
        t0 = time.monotonic()
        after = {**before, **_test(again, _command(tests, sys.executable))}
        took_a = time.monotonic() - t0
        comp_a, killed_a = _score(after)
        rows.append((module, total, len(comp_b), len(killed_b), len(killed_a)))
        report["modules"][module] = {"mutants": total, "sampled": len(items), "before_tests": before_tests,
                                     "after_tests": tests, "before": before, "after": after,
                                     "seconds": [round(took_b), round(took_a)]}
        print(f"{module}: {len(comp_b)} competent; killed {len(killed_b)} before, {len(killed_a)} after "
              f"({took_b:.0f} s + {took_a:.0f} s)", flush=True)
    print("\n| module | mutants (sampled) | killed before | killed after | score before | score after |")
    print("|---|---|---|---|---|---|")
    for module, total, n, kb, ka in rows:
        print(f"| {module} | {total} ({n}) | {kb} | {ka} | {kb / max(n, 1):.0%} | {ka / max(n, 1):.0%} |")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
