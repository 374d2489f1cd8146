"""Hypothesis strategies and properties for fuzzing edgecap's file loaders.

Shared by the bounded suite test (tests/test_fuzz_loaders.py) and the long
run (tools/fuzz_loaders.py). The property of every target: the loader either
succeeds or raises edgecap's own error (``EdgecapError``) with a one-line
message; any other exception is a finding. Model bytes go through the
loaders in a child process (``model_worker``), so a native crash in an
interpreter would kill the child and be reported, not take the fuzzer down.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from hypothesis import strategies as st

from edgecap.bundle import DEMO_DIR, load_bundle
from edgecap.errors import EdgecapError
from edgecap.plans.plan import PLAN_FILE, load_plan
from edgecap.service.config import load_config, tomllib

REPO = Path(__file__).resolve().parents[2]
DEMO_BUNDLE = DEMO_DIR / "bundle"
SERVICE_TOML = REPO / "deploy" / "edgecap.toml"

# Values that break loaders: wrong types, NaN and infinities, sizes past any
# bound, strings that are paths out of a directory, NULs, lone surrogates.
ODD_STRINGS = ["", " ", "../../etc/passwd", "..", "/", "/etc/passwd", "a\x00b", "\ud800", "é",
               "x" * 5000, "encoder.tflite/", "./", "~", "C:\\x", "%s%n", "\n", "plans", "vocab.txt",
               "encoder.tflite", "cpu", "tpu:0", "emu-tpu:99999999999999999999", "nan", "1e309",
               "x" * 300, "a/" * 3000, "\udcff", "plan.json", "encoder_segment_0_of_2.tflite", "usb:7", ":3",
               "../plan/encoder_segment_0_of_2.tflite", "/dev/null", "/proc/self/mem", ".", "<<deep>>"]
# "<<deep>>" is written as arrays nested past any parser's recursion (json_bytes, toml_bytes).
DEEP = b"[" * 5000 + b"1" + b"]" * 5000
ODD_NUMBERS = [0, -1, 1, 2**31, 2**63, -(2**63), 10**30, -(10**30), 0.5, -0.0, 1e308, -1e308,
               float("nan"), float("inf"), float("-inf"), 5e-324, 60_000.0001, True, False]

scalars = st.one_of(
    st.none(), st.booleans(), st.sampled_from(ODD_NUMBERS), st.sampled_from(ODD_STRINGS),
    st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=8)


def _paths(doc: Any, prefix: tuple = ()) -> List[tuple]:
    """Every path into a document (keys and list indices), the root included."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, prefix + (i,))
    return out


def _get(doc: Any, path: tuple) -> Any:
    for p in path:
        doc = doc[p]
    return doc


def _aimed(draw: Callable, doc: Any, paths: List[tuple], path: tuple, op: str) -> tuple:
    """For a ``string`` or ``number`` edit, a path to a leaf of that kind instead (where there is one)."""
    # Strings (file names, devices) and numbers are where loaders meet the system: aim at them.
    kinds = {"string": str, "number": (int, float)}
    if op in kinds:
        leaves = [q for q in paths if q and isinstance(_get(doc, q), kinds[op])]
        if leaves:
            path = draw(st.sampled_from(leaves))
    return path


def _edit(draw: Callable, parent: Any, key: Any, op: str) -> None:
    """Applies one edit to ``parent[key]``; an edit that does not fit the value is skipped."""
    try:
        if op == "replace":
            parent[key] = draw(values)
        elif op == "drop":
            del parent[key]
        elif op == "add" and isinstance(parent, dict):
            parent[draw(st.sampled_from(["x", "extra", key + "_" if isinstance(key, str) else "k"]))] = draw(values)
        elif op == "dup" and isinstance(parent, list):
            parent.insert(key, json.loads(json.dumps(parent[key])))
        elif op == "string":
            parent[key] = draw(st.one_of(st.sampled_from(ODD_STRINGS), st.text(max_size=300),
                                         st.sampled_from(ODD_STRINGS).map(lambda x: parent[key] + x)))
        elif op == "number":
            parent[key] = draw(st.one_of(st.sampled_from(ODD_NUMBERS), st.integers(), st.floats()))
        elif op == "scale" and isinstance(parent[key], (int, float)) and not isinstance(parent[key], bool):
            parent[key] = parent[key] * draw(st.sampled_from([-1, 10**9, 1e300, 0, float("nan")]))
    except (KeyError, IndexError, TypeError):
        pass


@st.composite
def mutated_doc(draw: Callable, base: Dict[str, Any]) -> Any:
    """A copy of ``base`` with 1..4 edits: a value replaced, a key dropped or added, a list resized."""
    doc = json.loads(json.dumps(base))
    for _ in range(draw(st.integers(1, 4))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        op = draw(st.sampled_from(["replace", "replace", "drop", "add", "dup", "scale", "string", "number"]))
        path = _aimed(draw, doc, paths, path, op)
        if not path:
            if op == "replace":
                doc = draw(values)
            continue
        _edit(draw, _get(doc, path[:-1]), path[-1], op)
    return doc


@st.composite
def mutated_text(draw: Callable, text: bytes) -> bytes:
    """``text`` cut short, with bytes changed, lines dropped or duplicated."""
    data = bytearray(text)
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["cut", "flip", "line", "insert"]))
        if not data:
            break
        pos = draw(st.integers(0, len(data) - 1))
        if op == "cut":
            del data[pos:]
        elif op == "flip":
            data[pos] = draw(st.integers(0, 255))
        elif op == "insert":
            data[pos:pos] = draw(st.sampled_from([b"\x00", b"\xff", b"[", b"]]", b"\"", b"=", b"\n[x]\n",
                                                  b"NaN", b"1e999", b"-", b"{", b"[" * 3000]))
        else:
            lines = bytes(data).split(b"\n")
            i = draw(st.integers(0, len(lines) - 1))
            if draw(st.booleans()):
                del lines[i]
            else:
                lines.insert(i, lines[i])
            data = bytearray(b"\n".join(lines))
    return bytes(data)


def json_bytes(doc: Any) -> bytes:
    """The document as Python's json writes it (NaN and Infinity included; lone surrogates escaped)."""
    return json.dumps(doc, allow_nan=True).encode().replace(b'"<<deep>>"', DEEP)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string for all but lone surrogates, which TOML refuses
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v if x is not None) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(x)}"
                               for k, x in v.items() if x is not None) + "}"
    raise TypeError(type(v))


def toml_bytes(doc: Any) -> bytes:
    """A document as TOML: top-level keys, tables inline (None, which TOML lacks, is left out)."""
    if doc is None:
        return b""
    if not isinstance(doc, dict):
        return _toml_value(doc).encode("utf-8", "surrogatepass").replace(b'"<<deep>>"', DEEP)
    lines = [f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in doc.items() if v is not None]
    return "\n".join(lines).encode("utf-8", "surrogatepass").replace(b'"<<deep>>"', DEEP) + b"\n"


@dataclass
class Finding:
    """An input a loader answered with something other than success or its own error."""

    target: str
    error: str
    input: str


@dataclass
class Tally:
    """Cases run and findings, per target."""

    cases: Dict[str, int] = field(default_factory=dict)
    outcomes: Dict[str, Dict[str, int]] = field(default_factory=dict)
    findings: List[Finding] = field(default_factory=list)

    def count(self, target: str, outcome: str) -> None:
        self.cases[target] = self.cases.get(target, 0) + 1
        per = self.outcomes.setdefault(target, {})
        per[outcome] = per.get(outcome, 0) + 1


def check(target: str, load: Callable[[], Any], blob: bytes, tally: Optional[Tally] = None) -> None:
    """Runs one load; succeeds or raises EdgecapError in one line, else records (or raises) a finding."""
    try:
        load()
        outcome = "loaded"
    except EdgecapError as exc:
        msg = str(exc)
        if "\n" in msg or not msg:
            outcome = "finding"
            err = f"EdgecapError message not one line: {msg[:300]!r}"
        else:
            outcome = "refused"
    except Exception as exc:  # noqa: BLE001 - anything else is what the fuzz looks for
        outcome = "finding"
        err = f"{type(exc).__name__}: {str(exc)[:300]}"
    if tally is not None:
        tally.count(target, outcome)
    if outcome == "finding":
        finding = Finding(target, err, blob[:2000].decode("utf-8", "backslashreplace"))
        if tally is None:
            raise AssertionError(f"{target}: {finding.error}\ninput: {finding.input[:500]}")
        tally.findings.append(finding)


class Workspace:
    """Scratch copies of the demo bundle, a plan compiled from it and the service config."""

    def __init__(self, root: Optional[Path] = None) -> None:
        self.root = Path(root or tempfile.mkdtemp(prefix="edgecap-fuzz-"))
        self.bundle = self.root / "bundle"
        shutil.copytree(DEMO_BUNDLE, self.bundle)
        self.bundle_doc = json.loads((self.bundle / "bundle.json").read_text())
        self.plan = self.root / "plan"
        self._compile_plan()
        self.plan_doc = json.loads((self.plan / PLAN_FILE).read_text())
        self.config = self.root / "service" / "edgecap.toml"
        self.config.parent.mkdir()
        self.config_text = SERVICE_TOML.read_bytes()
        self.config_doc = tomllib.loads(self.config_text.decode())

    def _compile_plan(self) -> None:
        import edgecap_compile  # the plan's writer; where it cannot import, the caller skips

        edgecap_compile.compile_model(self.bundle, "devboard-usb", self.plan)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def bundle_json(self, blob: bytes, tally: Optional[Tally] = None) -> None:
        (self.bundle / "bundle.json").write_bytes(blob)
        check("bundle.json", lambda: load_bundle(self.bundle), blob, tally)

    def plan_json(self, blob: bytes, tally: Optional[Tally] = None) -> None:
        (self.plan / PLAN_FILE).write_bytes(blob)
        check("plan.json", lambda: load_plan(self.plan), blob, tally)

    def service_toml(self, blob: bytes, overrides: Dict[str, Any], tally: Optional[Tally] = None) -> None:
        self.config.write_bytes(blob)
        check("service.toml", lambda: load_config(self.config, overrides), blob + repr(overrides).encode(),
              tally)


# ---------------------------------------------------------------------------
# Model bytes, in a child process.

MODEL_BASES = ["encoder.tflite", "rnn_encoder_step.tflite", "rnn_decoder_step.tflite"]


@st.composite
def mutated_model(draw: Callable, bases: List[bytes]) -> bytes:
    """A model cut short, with bits flipped, offsets overwritten, spliced with another, or random bytes."""
    data = bytearray(draw(st.sampled_from(bases)))
    op = draw(st.sampled_from(["cut", "flip", "word", "splice", "random", "header", "mixed"]))
    if op in ("cut", "mixed"):
        del data[draw(st.integers(0, len(data) - 1)):]
    if op in ("flip", "mixed"):
        for _ in range(draw(st.integers(1, 8))):
            if data:
                pos = draw(st.integers(0, len(data) - 1))
                data[pos] ^= 1 << draw(st.integers(0, 7))
    if op == "word" and len(data) >= 8:
        # Flatbuffer offsets and lengths are 32-bit words near the front (tables, vtables).
        pos = draw(st.integers(0, min(len(data), 4096) // 4 - 1)) * 4
        value = draw(st.sampled_from([0, 1, 4, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, len(data), len(data) - 4]))
        data[pos:pos + 4] = value.to_bytes(4, "little")
    if op == "splice":
        other = draw(st.sampled_from(bases))
        data = data[:draw(st.integers(0, len(data)))] + other[draw(st.integers(0, len(other))):]
    if op == "random":
        data = bytearray(draw(st.binary(max_size=4096)))
    if op == "header":
        data = bytearray(b"\x18\x00\x00\x00TFL3" + draw(st.binary(max_size=4096)))
    return bytes(data)


def run_models(cases: int, seed: int, workdir: Path, current: Path) -> Tally:
    """Runs ``cases`` mutated models through the bundle's and the plan's loaders; returns the tally.

    ``current`` holds the input under test, so that a parent whose child died
    natively can say which input killed it.
    """
    from hypothesis import HealthCheck, Phase, given, seed as hseed, settings

    from edgecap import bundle as bundle_mod

    ws = Workspace(workdir)
    tally = Tally()
    bases = [(ws.bundle / n).read_bytes() for n in MODEL_BASES]
    bases += [p.read_bytes() for p in sorted(ws.plan.glob("*.tflite"))]
    model = ws.root / "model.tflite"
    # The plan, its last TPU segment's recorded hash dropped: what reaches verify and the tensor check.
    doc = json.loads(json.dumps(ws.plan_doc))
    stage = [s for s in doc["stages"] if s["segment"]][-1]
    stage["segment_sha256"] = stage["segment_bytes"] = None
    (ws.plan / PLAN_FILE).write_bytes(json_bytes(doc))
    segment = ws.plan / stage["segment"]

    @hseed(seed)
    @settings(max_examples=cases, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(mutated_model(bases), st.booleans())
    def one(blob: bytes, in_plan: bool) -> None:
        current.write_bytes(blob)
        if in_plan:
            segment.write_bytes(blob)
            check("model in a plan", lambda: load_plan(ws.plan), blob, tally)
        else:
            model.write_bytes(blob)
            check("model in a bundle", lambda: bundle_mod._open_model(model), blob, tally)

    one()
    return tally


def main(argv: List[str]) -> int:
    """``python -m edgecap_lab.loader_fuzz models CASES SEED WORKDIR CURRENT OUT``: the child of a model fuzz."""
    _, cases, seed, workdir, current, out = argv
    tally = run_models(int(cases), int(seed), Path(workdir), Path(current))
    Path(out).write_text(json.dumps({"cases": tally.cases, "outcomes": tally.outcomes,
                                     "findings": [f.__dict__ for f in tally.findings]}))
    return 0


def fuzz_models_in_child(cases: int, seed: int, timeout_s: float) -> Dict[str, Any]:
    """Runs the model fuzz in a child process; a crash or hang of the child is a finding.

    Returns:
      ``{"cases", "outcomes", "findings"}`` as the child counted them, plus a
      finding for a child that died or hung, naming the input it was on.
    """
    with tempfile.TemporaryDirectory(prefix="edgecap-fuzz-models-") as tmp:
        tmp_path = Path(tmp)
        current, out = tmp_path / "current.tflite", tmp_path / "tally.json"
        cmd = [sys.executable, "-m", "edgecap_lab.loader_fuzz", "models", str(cases), str(seed),
               str(tmp_path / "ws"), str(current), str(out)]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "lab"),
                                                                      os.environ.get("PYTHONPATH")])))
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
            died = None if proc.returncode == 0 else f"child exited {proc.returncode}: {proc.stderr[-800:]}"
        except subprocess.TimeoutExpired:
            died = f"child hung past {timeout_s:.0f} s"
        result = json.loads(out.read_text()) if out.is_file() else {"cases": {}, "outcomes": {}, "findings": []}
        if died:
            blob = current.read_bytes() if current.is_file() else b""
            result["findings"].append({"target": "model (child process)", "error": died,
                                       "input": blob[:2000].hex()})
        return result


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
