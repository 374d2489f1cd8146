"""``make test-boards``: every configuration of the supported-configurations matrix, run here.

Each check of ``edgecap/data/configurations.json`` runs the runtime's test
subset and captions the demo with the packages a board of that row gets:

* ``native:*``: a venv of that Python on this x86-64 host (``.cache/boards/ID``),
  the check's requirements installed by pip, edgecap from this checkout;
* ``qemu:*``: ``tools/aarch64/check.sh CONFIG`` (an arm64 Debian root under
  qemu-aarch64, the aarch64 wheels pip resolves for a board; slow: minutes).

It prints one table row per check and writes the table (markdown) and the
rows (JSON) to ``--out`` (default ``.cache/boards/test-boards.md`` and ``.json``).

Usage: python tools/test_boards.py [--only ID ...] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache" / "boards"
# The runtime's tests that need neither the compiler nor host tools (as tools/aarch64/check.sh).
TESTS = ["tests/test_bundle.py", "tests/test_captioner.py", "tests/test_scheduler.py", "tests/test_sources.py",
         "tests/test_window_state.py", "tests/test_tflite_verify.py", "tests/test_opencv_versions.py"]
_COUNTS = re.compile(r"(\d+) (passed|failed|skipped|errors?)")


def _matrix() -> Dict:
    return json.loads((REPO / "edgecap" / "data" / "configurations.json").read_text())


def _python(version: str) -> Optional[str]:
    """An interpreter of ``major.minor`` that runs: on PATH, else pyenv's (a shim may not run)."""
    pyenv = sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}"))
    for candidate in [shutil.which(f"python{version}"), *map(str, reversed(pyenv))]:
        if candidate:
            done = subprocess.run([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                  capture_output=True, text=True)
            if done.returncode == 0 and done.stdout.strip() == version:
                return candidate
    return None


def _counts(text: str) -> Dict[str, int]:
    last = [line for line in text.splitlines() if _COUNTS.search(line)]
    found = {k.rstrip("s"): int(v) for v, k in _COUNTS.findall(last[-1])} if last else {}
    return {"passed": found.get("passed", 0), "failed": found.get("failed", 0) + found.get("error", 0),
            "skipped": found.get("skipped", 0)}


def run_native(check: Dict) -> Dict:
    """Builds (once) and runs one ``native:`` check."""
    python = _python(check["python"])
    if python is None:
        return {"result": "skip", "why": f"no Python {check['python']} here (PATH or ~/.pyenv)"}
    venv = CACHE / check["id"].replace(":", "-")
    stamp = venv / ".installed"
    wanted = json.dumps(check["requirements"])
    if not stamp.exists() or stamp.read_text() != wanted:
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        # The requirements resolve together (numpy<2 beside the interpreter), then edgecap without its
        # own dependencies, which would pull numpy 2 back in.
        for args in (check["requirements"], ["--no-deps", "-e", str(REPO)]):
            done = subprocess.run(pip + args, capture_output=True, text=True)
            if done.returncode != 0:
                return {"result": "fail", "why": f"pip install {' '.join(args)}: "
                                                 + (done.stderr.strip().splitlines() or ["failed"])[-1]}
        stamp.write_text(wanted)
    py = str(venv / "bin" / "python")
    env = {**os.environ, "EDGECAP_BACKEND": check["backend"]}
    versions = subprocess.run([py, "-c", "import numpy, cv2; from edgecap import interpreter as i; "
                               "print(numpy.__version__, cv2.__version__, i.BACKEND, i.backend_version(), "
                               "i.backend_version('tflite_runtime'))"],
                              capture_output=True, text=True, cwd=REPO, env=env)
    tests = subprocess.run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS],
                           capture_output=True, text=True, cwd=REPO, env=env)
    demo = subprocess.run([py, "-m", "edgecap.cli", "caption"], capture_output=True, text=True, cwd=REPO, env=env)
    (venv / "pytest.log").write_text(tests.stdout + tests.stderr)
    (venv / "demo.log").write_text(demo.stdout + demo.stderr)
    numpy_v, cv_v, backend, backend_v, tflite_v = (versions.stdout.split() + ["?"] * 5)[:5]
    return {"result": "ok" if tests.returncode == 0 and demo.returncode == 0 else "fail",
            **_counts(tests.stdout), "demo_ok": sum(line.endswith("; ok)") for line in demo.stdout.splitlines()),
            "numpy": numpy_v, "opencv": cv_v,
            "interpreter": f"{backend} {backend_v}" + (f", tflite-runtime {tflite_v}" if tflite_v not in
                                                       ("None", "?") and backend != "tflite_runtime" else "")}


def run_qemu(check: Dict) -> Dict:
    """Runs one ``qemu:`` check with tools/aarch64/check.sh."""
    config = check["id"].split(":", 1)[1]
    done = subprocess.run(["bash", str(REPO / "tools" / "aarch64" / "check.sh"), config],
                          capture_output=True, text=True, cwd=REPO)
    summary = re.search(rf"aarch64-check: {re.escape(config)}: (\d+) passed, (\d+) failed, (\d+) skipped; "
                        r"demo (\d)/3", done.stderr)
    if summary is None:
        return {"result": "fail", "why": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    passed, failed, skipped, demo = (int(g) for g in summary.groups())
    cache = Path(os.environ.get("EDGECAP_AARCH64_CACHE", Path.home() / ".cache" / "edgecap-aarch64"))
    wheels = " ".join(p.name for p in (cache / f"wheels-{config}").glob("*.whl"))
    pick = lambda name: (re.search(rf"{name}-([^-]+)-", wheels) or [None, "?"])[1]  # noqa: E731
    return {"result": "ok" if done.returncode == 0 else "fail", "passed": passed, "failed": failed,
            "skipped": skipped, "demo_ok": demo, "numpy": pick("numpy"), "opencv": pick("opencv_python_headless"),
            "interpreter": " ".join(f"{n} {pick(w)}" for n, w in (("tflite-runtime", "tflite_runtime"),
                                                                    ("ai-edge-litert", "ai_edge_litert"))
                                    if pick(w) != "?")}


def table(rows: List[Dict]) -> str:
    """The rows as a markdown table."""
    head = ("| check | Python | interpreter | numpy | OpenCV | tests passed / failed / skipped | demo | s | result |\n"
            "|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        tests = (f"{r['passed']} / {r['failed']} / {r['skipped']}" if "passed" in r else r.get("why", ""))
        lines.append(f"| `{r['id']}` | {r['python']} | {r.get('interpreter', '-')} | {r.get('numpy', '-')} | "
                     f"{r.get('opencv', '-')} | {tests} | {r.get('demo_ok', '-')}/3 | {r['seconds']:.0f} | "
                     f"{r['result']} |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", metavar="ID", help="run only these checks (e.g. native:py39)")
    parser.add_argument("--out", type=Path, default=CACHE / "test-boards.md", help="the table's file")
    args = parser.parse_args(argv)
    checks = [c for c in _matrix()["checks"] if not args.only or c["id"] in args.only]
    if args.only and len(checks) != len(args.only):
        known = ", ".join(c["id"] for c in _matrix()["checks"])
        print(f"test_boards: --only {' '.join(args.only)}: unknown check; use {known}", file=sys.stderr)
        return 2
    CACHE.mkdir(parents=True, exist_ok=True)
    rows = []
    for check in checks:
        start = time.monotonic()
        print(f"test_boards: {check['id']}: {check['runs']}", file=sys.stderr, flush=True)
        row = (run_native if check["id"].startswith("native:") else run_qemu)(check)
        rows.append({"id": check["id"], "python": check["python"], **row, "seconds": time.monotonic() - start})
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    text = table(rows)
    print("\n" + text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(f"load average at the end: {os.getloadavg()[0]:.2f}\n\n{text}\n")
    args.out.with_suffix(".json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0 if all(r["result"] in ("ok", "skip") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
