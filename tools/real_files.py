"""Every real third-party model file available offline, through each edgecap step that applies to it.

    python tools/real_files.py --mirror PATH/TO/google-coral/test_data \\
        --json results/real-files.json --md results/real-files.md

The files: every ``.tflite`` of a google-coral/test_data checkout or bare
mirror (``--mirror``; a blob the mirror lacks, or a Git LFS pointer in its
place, is listed as not available), and those committed under tests/data in
a folder whose README names their source (a copy of a mirror file is listed
once). Each step runs in a child process with a timeout, so a native crash
is recorded (its signal), never the end of the run:

- ``inspect``: ``edgecap.tflite_verify`` (the flatbuffer walk; gives the boundary).
- ``open``: ``edgecap.modelfile.open_model``, what ``edgecap validate`` and the
  captioner do to a bundle's model.
- ``invoke``: a CPU model allocated and invoked once, zeros in (what a caption does).
- ``compile``: ``edgecap compile MODEL --board B -o DIR`` (a compiled model must
  be refused in one line).
- ``plan import``: ``edgecap plan import`` on each whole set of Coral's
  ``*_segment_K_of_N_edgetpu.tflite`` and on each single compiled model, with
  ``--source`` where the model it was compiled from is available.

Each step ends ok, refused (exit 2, the one-line reason), failed (exit 1),
crashed (the signal), timeout, or error (anything else, e.g. a traceback).
It prints the markdown table and a tally, and writes them with the JSON;
bad input exits 2 with one line.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as written from any directory, installed or not

from edgecap.argtypes import Parser, float_in, int_in  # noqa: E402
from edgecap.command import run_command  # noqa: E402
from edgecap.errors import ConfigError  # noqa: E402
from edgecap.outputs import check_output, write_text  # noqa: E402

PROG = "python tools/real_files.py"
CORAL = "google-coral/test_data"
TESTS_DATA = REPO / "tests" / "data"
STEPS = ("inspect", "open", "invoke", "compile", "plan import")
STATUSES = ("ok", "refused", "failed", "crashed", "timeout", "error", "n/a")
LFS_POINTER = b"version https://git-lfs"
SEGMENT = re.compile(r"^(?P<stem>.+)_segment_(?P<k>\d+)_of_(?P<n>\d+)_edgetpu\.tflite$")
MAX_TIMEOUT_S = 3600.0
MAX_JOBS = 64
_CHILD = "import sys; sys.path.insert(0, sys.argv[1]); from real_files import child_main; child_main(sys.argv[2:])"
_EDGECAP = "import sys; from edgecap.cli import main; sys.exit(main(sys.argv[1:]))"


@dataclass
class Outcome:
    """How one step on one file (or one set of segments) ended.

    Attributes:
      status: One of ``STATUSES``.
      detail: The reason (refused, failed, error), the signal (crashed), or
        what was made (ok); file paths as the source names them.
      seconds: Wall time of the child, measured on this host (load included).
    """

    status: str
    detail: str = ""
    seconds: float = 0.0


@dataclass
class RealFile:
    """A third-party model file and what each step did with it.

    Attributes:
      origin: ``google-coral/test_data`` or ``tests/data``.
      path: Its path in the origin.
      size: Bytes (None when the blob is not available).
      sha256: Hex SHA-256 of its bytes ('' when not available).
      available: Why not, e.g. ``not available (LFS pointer)``; '' when it is.
      same_as: For a tests/data copy of a mirror file: that file (not run twice).
      kind: ``CPU``, ``EdgeTPU-compiled`` or ``pipeline segment``.
      inputs: The main subgraph's inputs, ``{name, dtype, shape}``.
      outputs: Its outputs, likewise.
      encoder_shaped: One image in (``[1, H, W, 3]``) and one feature vector
        out: the shape of a bundle encoder.
      steps: Step name -> its outcome.
    """

    origin: str
    path: str
    size: Optional[int] = None
    sha256: str = ""
    available: str = ""
    same_as: str = ""
    kind: str = ""
    inputs: List[Dict[str, Any]] = field(default_factory=list)
    outputs: List[Dict[str, Any]] = field(default_factory=list)
    encoder_shaped: bool = False
    steps: Dict[str, Outcome] = field(default_factory=dict)
    local: Optional[Path] = None  # where this run put its bytes (not reported)

    @property
    def name(self) -> str:
        """Its path as the tables show it: ``origin:path`` for tests/data, the bare path for Coral's."""
        return self.path if self.origin == CORAL else f"{self.origin}/{self.path}"


# ---------------------------------------------------------------- the files


def _git(mirror: Path, *args: str) -> bytes:
    try:
        return subprocess.run(["git", "-C", str(mirror), *args], check=True, capture_output=True,
                              timeout=120).stdout
    except FileNotFoundError:
        raise ConfigError("git is not installed: install git to read --mirror") from None
    except subprocess.CalledProcessError as e:
        first = (e.stderr.decode(errors="replace").strip().splitlines() or ["no message"])[0]
        raise ConfigError(f"--mirror {mirror}: not a git repository git can read ({first}); "
                          f"pass a clone or bare mirror of {CORAL}") from None


def mirror_files(mirror: Path, into: Path) -> Tuple[str, List[RealFile]]:
    """Lists a google-coral/test_data mirror's ``.tflite`` files and writes the available ones.

    Args:
      mirror: A clone or bare mirror (a git directory) of google-coral/test_data.
      into: Folder to write each available file to, at its path in the repository.

    Returns:
      ``(commit, files)``: the commit read (HEAD) and one ``RealFile`` per
      ``.tflite``, in path order; a blob the mirror lacks (``git ls-tree -l``
      size ``BAD`` or ``-``) or an LFS pointer is marked not available.

    Raises:
      ConfigError: If ``mirror`` is not a git repository.
    """
    commit = _git(mirror, "rev-parse", "HEAD").decode().strip()
    files = []
    for line in _git(mirror, "ls-tree", "-r", "-l", "-z", "HEAD").decode().split("\0"):
        if not line:
            continue
        meta, path = line.split("\t", 1)
        _mode, kind, sha, size = meta.split()
        if kind != "blob" or not path.endswith(".tflite"):
            continue
        f = RealFile(CORAL, path)
        if not size.isdigit():
            f.available = "not available (blob absent from the mirror)"
        else:
            data = _git(mirror, "cat-file", "blob", sha)
            if data.startswith(LFS_POINTER):
                f.available = "not available (LFS pointer)"
            else:
                f.size, f.sha256 = len(data), hashlib.sha256(data).hexdigest()
                f.local = into / CORAL / path
                f.local.parent.mkdir(parents=True, exist_ok=True)
                f.local.write_bytes(data)
        files.append(f)
    return commit, sorted(files, key=lambda f: f.path)


def tests_data_files(root: Path, known: Dict[str, str]) -> List[RealFile]:
    """Lists the ``.tflite`` files of every folder under ``root`` whose README names a source.

    Args:
      root: tests/data, or another folder laid out alike.
      known: SHA-256 -> name of the files already listed: a copy is marked ``same_as``.

    Returns:
      One ``RealFile`` per such file, in path order.
    """
    files = []
    for readme in sorted(root.rglob("README*")):
        if not re.search(r"^\s*Source|https?://", readme.read_text(errors="replace"), re.I | re.M):
            continue
        for model in sorted(readme.parent.glob("*.tflite")):
            data = model.read_bytes()
            origin = "tests/data" if root == TESTS_DATA else str(root)
            f = RealFile(origin, str(model.relative_to(root)), size=len(data),
                         sha256=hashlib.sha256(data).hexdigest(), local=model)
            f.same_as = known.get(f.sha256, "")
            files.append(f)
    return files


# ---------------------------------------------------------------- child processes


def child_main(argv: Sequence[str]) -> None:
    """Runs one step on one model in this (child) process: one JSON line out, or the reason and exit 2.

    Args:
      argv: ``[STEP, MODEL]`` with STEP one of inspect, open, invoke.
    """
    step, path = argv
    from edgecap.errors import EdgecapError

    try:
        print(json.dumps(_child_step(step, Path(path))))
    except EdgecapError as e:
        print(e, file=sys.stderr)
        sys.exit(2)
    except (ValueError, RuntimeError, MemoryError) as e:  # the interpreter's own refusal
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        print(f"{path}: the TFLite interpreter refused it: {first}", file=sys.stderr)
        sys.exit(2)


def _child_step(step: str, path: Path) -> Dict[str, Any]:
    if step == "inspect":
        from edgecap.tflite_verify import verify_tflite

        info = verify_tflite(path.read_bytes(), str(path))
        return {"inputs": [asdict(t) for t in info.inputs], "outputs": [asdict(t) for t in info.outputs],
                "custom_ops": list(info.custom_ops)}
    if step == "open":
        from edgecap.modelfile import open_model

        model, _ = open_model(path)
        return {"ops": model.ops, "edgetpu": model.edgetpu}
    import numpy as np

    from edgecap.interpreter import make_cpu_interpreter

    interp = make_cpu_interpreter(path.read_bytes())
    for d in interp.get_input_details():
        interp.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
    interp.invoke()
    return {"outputs": len(interp.get_output_details())}


def run_child(argv: Sequence[str], timeout: float, env: Dict[str, str],
              names: Dict[str, str]) -> Tuple[Outcome, str]:
    """Runs a command in its own session and says how it ended.

    Args:
      argv: The command.
      timeout: Seconds before the child and everything it started are killed.
      env: Its environment.
      names: Text to replace in its messages (local paths -> the names the tables use).

    Returns:
      ``(outcome, stdout)``.
    """
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            errors="replace", env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # its own helpers (e.g. a checker process) too
        proc.communicate()
        return Outcome("timeout", f"no result after {timeout:g} s", time.monotonic() - start), ""
    finally:
        if proc.poll() is None:  # interrupted: leave nothing running
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    took = time.monotonic() - start
    for local, shown in names.items():
        out, err = out.replace(local, shown), err.replace(local, shown)
    lines = [line for line in err.splitlines() if line.strip()]
    last = lines[-1].strip() if lines else ""
    rc = proc.returncode
    if rc < 0:
        return Outcome("crashed", signal.Signals(-rc).name, took), out
    if "Traceback (most recent call last)" in err:
        return Outcome("error", f"traceback: {last}", took), out
    if rc == 0:
        return Outcome("ok", (out.strip().splitlines() or [""])[0], took), out
    last = re.sub(r"^edgecap: error: ", "", last)
    if rc == 2:
        return Outcome("refused", last, took), out
    if rc == 1:
        return Outcome("failed", last, took), out
    return Outcome("error", f"exit code {rc}: {last}", took), out


# ---------------------------------------------------------------- the steps


def _kind(f: RealFile, custom_ops: Optional[Sequence[str]]) -> str:
    base = Path(f.path).name
    compiled = ("edgetpu-custom-op" in custom_ops) if custom_ops is not None else base.endswith(
        "_edgetpu.tflite")  # the verifier refused it: the name is all there is
    if compiled and SEGMENT.match(base):
        return "pipeline segment"
    return "EdgeTPU-compiled" if compiled else "CPU"


def encoder_shaped(inputs: Sequence[Dict[str, Any]], outputs: Sequence[Dict[str, Any]]) -> bool:
    """True when a model has a bundle encoder's boundary: one ``[1, H, W, 3]`` image in, one vector out."""
    if len(inputs) != 1 or len(outputs) != 1:
        return False
    image, vector = inputs[0]["shape"], outputs[0]["shape"]
    return (len(image) == 4 and image[0] == 1 and image[3] == 3 and inputs[0]["dtype"] in (
        "uint8", "int8", "float32") and len(vector) >= 2 and vector[-1] > 1
        and all(d == 1 for d in vector[:-1]))


def source_of(compiled: str, available: Dict[str, Path]) -> Optional[Path]:
    """The CPU model a compiled file was made from, when available (``X_edgetpu.tflite`` -> ``X.tflite``).

    Args:
      compiled: The compiled file's path in the repository.
      available: Path -> local file of every available CPU model.

    Returns:
      Its local path, or None.
    """
    base = Path(compiled).name
    m = SEGMENT.match(base)
    stem = m["stem"] if m else re.sub(r"(_cocompiled_with_.*)?_edgetpu\.tflite$", "", base)
    by_name = {Path(p).name: local for p, local in available.items()}
    return by_name.get(stem + ".tflite")


def _plan_summary(out_dir: Path) -> str:
    plan = json.loads((out_dir / "plan.json").read_text())
    devices = Counter(s["device"].split(":")[0] for s in plan["stages"])
    return (f"{len(plan['stages'])} stages ({', '.join(f'{n} {d}' for d, n in sorted(devices.items()))}), "
            f"{plan['predicted']['fps']} fps modelled")


class Runner:
    """Runs the steps of the real files, each in a child process."""

    def __init__(self, work: Path, board: str, timeout: float) -> None:
        self.work, self.board, self.timeout = work, board, timeout
        self.names: Dict[str, str] = {}
        # A fresh cache: a model a previous run passed must be checked again, not remembered.
        self.env = dict(os.environ, XDG_CACHE_HOME=str(work / "cache"), PYTHONPATH=os.pathsep.join(
            filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        self.env.pop("EDGECAP_DEBUG", None)  # a refusal is one line here, as a user sees it
        (work / "out").mkdir(exist_ok=True)
        self._outs = 0

    def name(self, f: RealFile) -> None:
        """Makes messages show ``f``'s name instead of the local path this run gave it."""
        self.names[str(f.local)] = f.name

    def child(self, step: str, f: RealFile) -> Tuple[Outcome, Dict[str, Any]]:
        """Runs inspect, open or invoke on ``f``; returns the outcome and, when ok, what it printed."""
        outcome, out = run_child([sys.executable, "-c", _CHILD, str(Path(__file__).parent), step,
                                  str(f.local)], self.timeout, self.env, self.names)
        if outcome.status != "ok":
            return outcome, {}
        printed = json.loads(out.strip().splitlines()[-1])
        outcome.detail = ""
        return outcome, printed

    def edgecap(self, *args: str) -> Outcome:
        """Runs ``edgecap ARGS -o OUT``; an ok outcome's detail summarizes the plan it wrote."""
        self._outs += 1
        out = self.work / "out" / str(self._outs)
        outcome, _ = run_child([sys.executable, "-c", _EDGECAP, *args, "-o", str(out)], self.timeout,
                               self.env, {**self.names, str(out): "OUT"})
        if outcome.status == "ok":
            outcome.detail = _plan_summary(out)
        return outcome


def _with_source(outcome: Outcome, source: Optional[Path], runner: Runner) -> Outcome:
    if outcome.status == "ok" and source is not None:
        outcome.detail += f", compute from {runner.names.get(str(source), source.name)}"
    return outcome


def run_files(files: Sequence[RealFile], runner: Runner, progress: Any = None) -> List[Dict[str, Any]]:
    """Runs every step that applies on each available file, and plan import on each set of segments.

    Args:
      files: The files; those not available or ``same_as`` another are skipped.
      runner: Where the children run.
      progress: Called with a line after each file, or None.

    Returns:
      One dict per plan import of a set of segments: ``{set, segments, outcome}``.
    """
    todo = [f for f in files if not f.available and not f.same_as]
    for f in todo:
        runner.name(f)
    cpu: Dict[str, Path] = {}
    for f in todo:
        _run_steps(f, runner, cpu)
        if progress:
            progress(f"{f.name}: " + ", ".join(f"{s} {o.status}" for s, o in f.steps.items()))
    for f in todo:
        if f.kind == "EdgeTPU-compiled":
            source = source_of(f.path, cpu)
            extra = ["--source", str(source)] if source else []
            f.steps["plan import"] = _with_source(runner.edgecap(
                "plan", "import", str(f.local), "--board", runner.board, *extra), source, runner)
        elif f.kind == "CPU":
            f.steps["plan import"] = Outcome("n/a", "not compiled: `edgecap compile` splits it")
    sets = []
    for (_, stem, n), members in sorted(_segment_sets(todo).items()):
        label = f"{stem} ({n} segments)"
        row, outcome = _import_set(label, n, members, runner, cpu)
        sets.append(row)
        for f in members.values():
            f.steps["plan import"] = Outcome(outcome.status, f"as the set {label}: {outcome.detail}",
                                             outcome.seconds)
        if progress:
            progress(f"plan import {label}: {outcome.status}")
    return sets


def _run_steps(f: RealFile, runner: Runner, cpu: Dict[str, Path]) -> None:
    """Inspects, opens, invokes (a CPU model) and compiles one file; a CPU model joins ``cpu``."""
    outcome, info = runner.child("inspect", f)
    f.steps["inspect"] = outcome
    if info:
        f.inputs, f.outputs = info["inputs"], info["outputs"]
        f.encoder_shaped = encoder_shaped(f.inputs, f.outputs)
    f.kind = _kind(f, info.get("custom_ops"))
    if f.kind == "CPU":
        cpu[f.name] = f.local
    f.steps["open"] = runner.child("open", f)[0]
    f.steps["invoke"] = (runner.child("invoke", f)[0] if f.kind == "CPU"
                         else Outcome("n/a", "compiled: its custom op runs only on an EdgeTPU"))
    f.steps["compile"] = runner.edgecap("compile", str(f.local), "--board", runner.board)


def _segment_sets(files: Sequence[RealFile]) -> Dict[Tuple[str, str, int], Dict[int, RealFile]]:
    """The pipeline segments by set (folder, stem, number of segments), each set by segment index."""
    groups: Dict[Tuple[str, str, int], Dict[int, RealFile]] = {}
    for f in files:
        m = SEGMENT.match(Path(f.path).name) if f.kind == "pipeline segment" else None
        if m:
            groups.setdefault((str(Path(f.name).parent), m["stem"], int(m["n"])), {})[int(m["k"])] = f
    return groups


def _import_set(label: str, n: int, members: Dict[int, RealFile], runner: Runner,
                cpu: Dict[str, Path]) -> Tuple[Dict[str, Any], Outcome]:
    """``edgecap plan import`` of a whole set of segments (n/a when one is missing): its row and outcome."""
    missing = sorted(set(range(n)) - set(members))
    source = None
    if missing:
        outcome = Outcome("n/a", f"segment(s) {', '.join(map(str, missing))} of {n} not available")
    else:
        source = source_of(members[0].path, cpu)
        extra = ["--source", str(source)] if source else []
        outcome = _with_source(runner.edgecap("plan", "import", *(str(members[k].local) for k in range(n)),
                                              "--board", runner.board, *extra), source, runner)
    return {"set": label, "segments": [members[k].name for k in sorted(members)],
            "source": "" if missing or not source else runner.names.get(str(source), ""),
            "outcome": asdict(outcome)}, outcome


# ---------------------------------------------------------------- reporting


def _reason_key(f: RealFile, detail: str) -> str:
    """A reason with the file's own name replaced, so that the same refusal of two files counts once."""
    return detail.replace(f.name, "MODEL").replace(Path(f.name).name, "MODEL")


def tally(files: Sequence[RealFile], sets: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Counts each step's outcomes and groups the reasons of those not ok.

    Args:
      files: The files run.
      sets: ``run_files``' plan imports of sets of segments (counted once per set).

    Returns:
      ``{"files": {...}, "steps": {step: {status: count}}, "reasons": [{step, status, reason, count, files}]}``;
      a set's plan import counts once, under ``plan import (sets)``.
    """
    run = [f for f in files if not f.available and not f.same_as]
    steps: Dict[str, Counter] = {}
    reasons: Dict[Tuple[str, str, str], List[str]] = {}
    for f in run:
        for step, o in f.steps.items():
            if f.kind == "pipeline segment" and step == "plan import":
                continue
            steps.setdefault(step, Counter())[o.status] += 1
            if o.status not in ("ok", "n/a"):
                reasons.setdefault((step, o.status, _reason_key(f, o.detail)), []).append(f.name)
    for s in sets:
        o = s["outcome"]
        steps.setdefault("plan import (sets)", Counter())[o["status"]] += 1
        if o["status"] not in ("ok", "n/a"):
            reasons.setdefault(("plan import (sets)", o["status"], o["detail"]), []).append(s["set"])
    return {
        "files": {"listed": len(files), "run": len(run), "copies": sum(1 for f in files if f.same_as),
                  "not available": dict(Counter(f.available for f in files if f.available)),
                  "kinds": dict(Counter(f.kind for f in run))},
        "steps": {step: dict(c) for step, c in steps.items()},
        "reasons": [{"step": s, "status": st, "reason": r, "count": len(names), "files": names}
                    for (s, st, r), names in sorted(reasons.items(), key=lambda kv: (kv[0][0], -len(kv[1])))],
    }


def _io(tensors: Sequence[Dict[str, Any]]) -> str:
    return ", ".join(f"{t['dtype']}[{','.join(map(str, t['shape']))}]" for t in tensors) or "-"


def _cell(o: Optional[Outcome], refs: Dict[Tuple[str, str], str], step: str, f: RealFile) -> str:
    if o is None:
        return "-"
    if o.status == "ok":
        return f"ok: {o.detail}" if o.detail and step in ("compile", "plan import") else "ok"
    if o.status == "n/a":
        return "n/a"
    if step == "plan import" and f.kind == "pipeline segment":
        return f"{o.status} (set)"
    return f"**{o.status}** {refs.get((step, _reason_key(f, o.detail)), '')}".strip()


def markdown(files: Sequence[RealFile], sets: Sequence[Dict[str, Any]], counts: Dict[str, Any],
             about: Dict[str, Any]) -> str:
    """Returns the page: how it was made, the tally, the reasons, the files' table and those not available."""
    refs = {(r["step"], r["reason"]): f"R{i}" for i, r in enumerate(counts["reasons"], 1)}
    run = [f for f in files if not f.available and not f.same_as]
    lines = _intro(counts, about) + _reasons(counts, refs)
    lines += [
        "", f"## Files ({len(run)} run)", "",
        "| file | bytes | kind | inputs | outputs | encoder-shaped | " + " | ".join(STEPS) + " |",
        "|---|---:|---|---|---|---|" + "---|" * len(STEPS),
    ]
    for f in run:
        lines.append(f"| `{f.name}` | {f.size:,} | {f.kind} | {_io(f.inputs)} | {_io(f.outputs)} | "
                     f"{'yes' if f.encoder_shaped else 'no'} | "
                     + " | ".join(_cell(f.steps.get(s), refs, s, f) for s in STEPS) + " |")
    return "\n".join(lines + _sets_and_left_out(files, sets)) + "\n"


def _intro(counts: Dict[str, Any], about: Dict[str, Any]) -> List[str]:
    """The page's head: how it was made, then the tally of each step's outcomes."""
    lines = [
        "# Real files through edgecap",
        "",
        f"Every model file of Coral's published test data ({CORAL}, Apache-2.0, commit "
        f"`{about['mirror_commit'][:12] or '-'}`) and the third-party files under tests/data, run "
        "through each edgecap step that applies, each step in a child process with a "
        f"{about['timeout_s']:g} s timeout (a native crash is recorded as its signal). Generated by",
        "",
        f"    {about['command']}",
        "",
        f"on {about['when']}, edgecap at `{about['edgecap_commit']}`, TFLite backend {about['backend']}, "
        f"board profile `{about['board']}`. Steps: `inspect` (edgecap.tflite_verify), `open` "
        "(edgecap.modelfile.open_model, as `validate` and the captioner open a bundle's model), `invoke` "
        "(a CPU model allocated and invoked once, zeros in), `compile` (`edgecap compile MODEL --board "
        f"{about['board']} -o OUT`), `plan import` (`edgecap plan import`, with `--source` where the model "
        "it was compiled from is here). Plan figures are modelled (the cost model), not measured. `compile` "
        "refusing an EdgeTPU-compiled file or segment is the expected answer (it splits a model before "
        "compiling it); every other refusal is listed for review under Reasons.",
        "",
        "## Tally",
        "",
        f"{counts['files']['listed']} files listed: {counts['files']['run']} run "
        f"({', '.join(f'{n} {k}' for k, n in sorted(counts['files']['kinds'].items()))}), "
        f"{counts['files']['copies']} copies of a file already listed, "
        + (", ".join(f"{n} {k}" for k, n in counts["files"]["not available"].items()) or "none not available")
        + ".",
        "",
        "| step | " + " | ".join(STATUSES) + " |",
        "|---|" + "---:|" * len(STATUSES),
    ]
    for step, c in counts["steps"].items():
        lines.append(f"| {step} | " + " | ".join(str(c.get(s, 0)) for s in STATUSES) + " |")
    return lines


def _reasons(counts: Dict[str, Any], refs: Dict[Tuple[str, str], str]) -> List[str]:
    """Every outcome that is not ok, by its reference (R1, R2, ...)."""
    lines = ["", "## Reasons (every outcome that is not ok)", ""]
    if not counts["reasons"]:
        lines.append("None.")
    for r in counts["reasons"]:
        lines.append(f"- **{refs[(r['step'], r['reason'])]}** {r['step']}, {r['status']}, {r['count']} "
                     f"file(s): {r['reason']}" + (f" — {', '.join(r['files'])}" if r["count"] <= 6 else ""))
    return lines


def _sets_and_left_out(files: Sequence[RealFile], sets: Sequence[Dict[str, Any]]) -> List[str]:
    """The plan imports of whole sets of segments, the copies not run twice and the files not available."""
    lines: List[str] = []
    if sets:
        lines += ["", "## Coral's pipelines (`edgecap plan import` of each whole set)", "",
                  "| set | source | outcome |", "|---|---|---|"]
        for s in sets:
            o = s["outcome"]
            lines.append(f"| {s['set']} | {s['source'] or '-'} | {o['status']}"
                         + (f": {o['detail']}" if o["detail"] else "") + " |")
    copies = [f for f in files if f.same_as]
    if copies:
        lines += ["", "## Copies (same bytes as a file above; not run twice)", ""]
        lines += [f"- `{f.name}` = `{f.same_as}`" for f in copies]
    absent = [f for f in files if f.available]
    if absent:
        lines += ["", f"## Not available ({len(absent)})", ""]
        lines += [f"- `{f.name}`: {f.available}" for f in absent]
    return lines


def _about(args: argparse.Namespace, mirror_commit: str) -> Dict[str, Any]:
    from edgecap.interpreter import available_backends

    try:
        rev = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True,
                             text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    backends = ", ".join(f"{k} {v}" for k, v in available_backends().items() if v)
    command = [PROG] + ([f"--mirror {args.mirror}"] if args.mirror else []) + (
        [f"--tests-data {args.tests_data}"] if args.tests_data != TESTS_DATA else []) + [
        f"--board {args.board}", f"--timeout {args.timeout:g}"] + (
        [f"--json {args.json}"] if args.json else []) + ([f"--md {args.md}"] if args.md else [])
    return {"command": " ".join(command), "when": datetime.datetime.now(datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M UTC"), "edgecap_commit": rev or "unknown", "backend": backends or "none",
        "board": args.board, "timeout_s": args.timeout, "mirror_commit": mirror_commit}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the real files through edgecap from the command line.

    Args:
      argv: Arguments without the program name (default: ``sys.argv[1:]``).

    Returns:
      The exit code: 0, or 2 on bad input.
    """
    parser = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirror", type=Path,
                        help=f"a clone or bare mirror of {CORAL} (without it: tests/data only)")
    parser.add_argument("--tests-data", type=Path, default=TESTS_DATA,
                        help="folder whose subfolders with a README naming a source hold third-party "
                             "models (default: this checkout's tests/data)")
    parser.add_argument("--board", default="devboard", help="board profile for compile and plan import")
    parser.add_argument("--timeout", type=float_in(1.0, MAX_TIMEOUT_S), default=300.0,
                        help="seconds each step may take before its child is killed (default 300)")
    parser.add_argument("--limit", type=int_in(1, 100_000),
                        help="run only the first N available files (a quick look)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--md", type=Path, help="write the markdown page here")

    def body() -> int:
        args = parser.parse_args(argv)
        for path, what in ((args.json, "--json"), (args.md, "--md")):
            if path is not None:
                check_output(path, what)
        if not args.tests_data.is_dir():
            raise ConfigError(f"--tests-data {args.tests_data}: no such directory; pass a folder of "
                              "model folders, each with a README naming its source")
        if args.mirror is not None and not args.mirror.is_dir():
            raise ConfigError(f"--mirror {args.mirror}: no such directory; pass a clone or bare mirror "
                              f"of {CORAL}")
        with tempfile.TemporaryDirectory(prefix="edgecap-real-files-") as tmp:
            work = Path(tmp)
            commit, files = mirror_files(args.mirror, work) if args.mirror else ("", [])
            files += tests_data_files(args.tests_data, {f.sha256: f.name for f in files if f.sha256})
            if args.limit is not None:
                keep = {id(f) for f in [f for f in files if not f.available and not f.same_as][:args.limit]}
                files = [f for f in files if id(f) in keep]
            sets = run_files(files, Runner(work, args.board, args.timeout),
                             progress=lambda line: print(line, file=sys.stderr, flush=True))
            about = _about(args, commit)
            counts = tally(files, sets)
            page = markdown(files, sets, counts, about)
        print(page, end="")
        if args.md is not None:
            write_text(args.md, page)
        if args.json is not None:
            report = {**about, "tally": counts, "sets": sets,
                      "files": [{k: v for k, v in asdict(f).items() if k != "local"} for f in files]}
            write_text(args.json, json.dumps(report, indent=1, default=str) + "\n")
        return 0

    return run_command(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
