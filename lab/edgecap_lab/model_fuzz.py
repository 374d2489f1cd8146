"""A structural fuzzer of .tflite models: operators' inputs and outputs, tensors' shapes, types,
buffers and quantization, subgraph boundaries and operator codes, changed the way a writer's bug
or a hostile file would, then opened the way edgecap opens a bundle's model.

Shared by the suite's sample (tests/test_model_fuzz.py) and the long run
(tools/fuzz_models.py). The property: every mutant is refused in one line by
one of edgecap's checks, or opens and runs; nothing crashes the process that
opens it. Mutants run in a worker process (``python -m edgecap_lab.model_fuzz``) so
that a native crash kills the worker, not the fuzzer: the parent records it
with the mutant that did it and starts another worker after it.

Mutant ``i`` of seed ``s`` is a function of ``(s, i)`` alone, so a run resumes
after a crash and any mutant can be rebuilt from the report.

Two kinds of mutation: *patches* overwrite a field in place (an index, a
dimension, a type, a buffer number, a scale), found with the schema reader
ai-edge-litert ships; *rebuilds* change vector lengths through the schema's
object API (an input dropped or added, a dimension added, a buffer cut, an
operator deleted, duplicated or moved).
"""

from __future__ import annotations

import copy
import json
import os
import random
import signal
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.tools import flatbuffer_utils

REPO = Path(__file__).resolve().parents[2]
DEMO_BASES = [REPO / "models" / "demo" / "bundle" / n
              for n in ("encoder.tflite", "rnn_encoder_step.tflite", "rnn_decoder_step.tflite")]
REAL_BASES = sorted((REPO / "tests" / "data" / "real_models").glob("*.tflite"))

_INDEX_VALUES = [-1, -2, 0, 1 << 20, 0x7FFFFFFF, -0x80000000]
_DIM_VALUES = [0, 1, -1, 2, 3, 7, 255, 65536, 1 << 20, 0x7FFFFFFF, -0x80000000]
_FLOAT_VALUES = [0.0, -1.0, float("nan"), float("inf"), 1e-38, 1e38, 5e-324]
_TYPE_VALUES = list(range(23)) + [23, 99, 127, -1]


@dataclass(frozen=True)
class _Site:
    """A field one patch overwrites: where, what it is and how it is written."""

    kind: str
    pos: int
    fmt: str
    what: str


def _vector(table: Any, slot: int) -> Tuple[int, int]:
    """``(start, length)`` of a table's vector field, ``(0, 0)`` when absent."""
    o = table._tab.Offset(4 + 2 * slot)
    if not o:
        return 0, 0
    return table._tab.Vector(o), table._tab.VectorLen(o)


def _scalar_pos(table: Any, slot: int) -> Optional[int]:
    o = table._tab.Offset(4 + 2 * slot)
    return table._tab.Pos + o if o else None


def sites(data: bytes) -> List[_Site]:
    """Every field of the main structures a patch may overwrite."""
    m = schema.Model.GetRootAsModel(data, 0)
    out: List[_Site] = []
    for c in range(m.OperatorCodesLength()):
        code = m.OperatorCodes(c)
        for slot, fmt in ((0, "<b"), (3, "<i")):
            pos = _scalar_pos(code, slot)
            if pos is not None:
                field_name = "deprecated_builtin_code" if slot == 0 else "builtin_code"
                out.append(_Site("opcode", pos, fmt, f"operator_codes[{c}].{field_name}"))
    for gi in range(m.SubgraphsLength()):
        g = m.Subgraphs(gi)
        for slot, kind in ((1, "inputs"), (2, "outputs")):
            start, n = _vector(g, slot)
            out += [_Site("graph_io", start + 4 * k, "<i", f"subgraphs[{gi}].{kind}[{k}]") for k in range(n)]
        for ti in range(g.TensorsLength()):
            t = g.Tensors(ti)
            start, n = _vector(t, 0)
            out += [_Site("dim", start + 4 * k, "<i", f"tensors[{ti}].shape[{k}]") for k in range(n)]
            for slot, kind, fmt in ((1, "type", "<b"), (2, "buffer", "<I")):
                pos = _scalar_pos(t, slot)
                if pos is not None:
                    out.append(_Site(kind, pos, fmt, f"tensors[{ti}].{kind}"))
            q = t.Quantization()
            if q is not None:
                start, n = _vector(q, 2)
                out += [_Site("scale", start + 4 * k, "<f", f"tensors[{ti}].scale[{k}]") for k in range(min(n, 4))]
                start, n = _vector(q, 3)
                out += [_Site("zero_point", start + 8 * k, "<q", f"tensors[{ti}].zero_point[{k}]")
                        for k in range(min(n, 4))]
        for oi in range(g.OperatorsLength()):
            op = g.Operators(oi)
            pos = _scalar_pos(op, 0)
            if pos is not None:
                out.append(_Site("opcode_index", pos, "<I", f"operators[{oi}].opcode_index"))
            for slot, kind in ((1, "op_input"), (2, "op_output"), (8, "op_intermediate")):
                start, n = _vector(op, slot)
                out += [_Site(kind, start + 4 * k, "<i", f"operators[{oi}].{kind[3:]}s[{k}]") for k in range(n)]
            pos = _scalar_pos(op, 3)
            if pos is not None:
                out.append(_Site("options_type", pos, "<B", f"operators[{oi}].builtin_options_type"))
    return out


def _patch_value(rng: random.Random, site: _Site, data: bytes, n_tensors: int) -> Any:
    old = struct.unpack_from(site.fmt, data, site.pos)[0]
    if site.kind in ("op_input", "op_output", "op_intermediate", "graph_io"):
        return rng.choice(_INDEX_VALUES + [n_tensors, n_tensors - 1, rng.randrange(max(n_tensors, 1))] * 2)
    if site.kind == "dim":
        return rng.choice(_DIM_VALUES + [old * 2, old + 1, max(old - 1, 0), old * 1000])
    if site.kind == "type":
        return rng.choice(_TYPE_VALUES)
    if site.kind == "buffer":
        return rng.choice([0, 1, old + 1, max(old - 1, 0), 0xFFFFFFFF, 1 << 20, rng.randrange(max(old, 1) * 2)])
    if site.kind == "scale":
        return rng.choice(_FLOAT_VALUES)
    if site.kind == "zero_point":
        return rng.choice([-129, 256, 1 << 40, -(1 << 62), 128, -128, 0])
    if site.kind == "opcode":
        return rng.choice([0, 3, 4, 9, 22, 25, 32, 44, 49, 2, 127, 209, 210, 1000, -1])
    if site.kind == "opcode_index":
        return rng.choice([0, 1, 2, old + 1, 0xFFFFFFFF])
    return rng.randrange(0, 256)  # options_type: any union member, most of them the wrong table


def _patch(rng: random.Random, data: bytes, all_sites: List[_Site], n_tensors: int) -> Tuple[bytes, str]:
    out = bytearray(data)
    notes = []
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        site = rng.choice(all_sites)
        value = _patch_value(rng, site, data, n_tensors)
        try:
            struct.pack_into(site.fmt, out, site.pos, value)
        except struct.error:
            struct.pack_into(site.fmt, out, site.pos, 0)
            value = 0
        notes.append(f"{site.what}={value}")
    return bytes(out), "patch " + ", ".join(notes)


# -- rebuilds, on the object API -----------------------------------------------------------


# Each rebuild takes (rng, kind, model, op, tensor) and returns what it changed, or None where
# the kind is another's or the model has nothing it can change.
_Rebuild = Callable[[random.Random, str, schema.ModelT, Any, Any], Optional[str]]


def _rebuild_op_io(rng: random.Random, kind: str, model: schema.ModelT, op: Any, t: Any) -> Optional[str]:
    """An operator's input or output list loses an entry or gains one (an index, or -1 for none)."""
    if kind not in ("drop_input", "add_input", "drop_output", "add_output") or op is None:
        return None
    which = "inputs" if "input" in kind else "outputs"
    vec = list(getattr(op, which) if getattr(op, which) is not None else [])
    if kind.startswith("drop") and vec:
        del vec[rng.randrange(len(vec))]
    else:
        n_tensors = len(model.subgraphs[0].tensors or [])
        vec.insert(rng.randrange(len(vec) + 1), rng.choice([-1, rng.randrange(n_tensors)]))
    setattr(op, which, np.array(vec, dtype=np.int32))
    return f"rebuild {kind}"


def _rebuild_shape(rng: random.Random, kind: str, model: schema.ModelT, op: Any, t: Any) -> Optional[str]:
    """A tensor's shape gains or loses a dimension."""
    if kind not in ("add_dim", "drop_dim") or t is None:
        return None
    shape = list(t.shape if t.shape is not None else [])
    if kind == "add_dim":
        shape.insert(rng.randrange(len(shape) + 1), rng.choice([1, 2, 3]))
    elif shape:
        del shape[rng.randrange(len(shape))]
    t.shape = np.array(shape, dtype=np.int32)
    t.shapeSignature = None
    return f"rebuild {kind} ({t.name!r})"


def _rebuild_buffer(rng: random.Random, kind: str, model: schema.ModelT, op: Any, t: Any) -> Optional[str]:
    """A buffer with data is cut short, grown or emptied."""
    buffers = [b for b in (model.buffers or []) if b.data is not None and len(b.data)]
    if kind not in ("cut_buffer", "grow_buffer", "empty_buffer") or not buffers:
        return None
    b = rng.choice(buffers)
    if kind == "cut_buffer":
        b.data = b.data[:rng.randrange(len(b.data))]
    elif kind == "grow_buffer":
        b.data = np.concatenate([b.data, np.zeros(rng.choice([1, 4, 64]), dtype=b.data.dtype)])
    else:
        b.data = None
    return f"rebuild {kind}"


def _rebuild_quantization(rng: random.Random, kind: str, model: schema.ModelT, op: Any,
                          t: Any) -> Optional[str]:
    """A tensor's scales and zero points stop having the same length."""
    if kind != "quant_lengths" or t is None or t.quantization is None:
        return None
    q = t.quantization
    if q.scale is not None and len(q.scale):
        q.scale = np.concatenate([q.scale, q.scale])
    else:
        q.zeroPoint = np.array([0, 1, 2], dtype=np.int64)
    return "rebuild quant_lengths"


def _rebuild_op_order(rng: random.Random, kind: str, model: schema.ModelT, op: Any, t: Any) -> Optional[str]:
    """An operator is deleted, duplicated or moved."""
    ops = model.subgraphs[0].operators or []
    if kind == "delete_op" and ops:
        del ops[rng.randrange(len(ops))]
        return "rebuild delete_op"
    if kind == "duplicate_op" and ops:
        i = rng.randrange(len(ops))
        ops.insert(rng.randrange(len(ops) + 1), copy.deepcopy(ops[i]))
        return "rebuild duplicate_op"
    if kind == "move_op" and len(ops) > 1:
        ops.insert(rng.randrange(len(ops)), ops.pop(rng.randrange(len(ops))))
        return "rebuild move_op"
    return None


def _rebuild_graph(rng: random.Random, kind: str, model: schema.ModelT, op: Any, t: Any) -> Optional[str]:
    """The graph loses its first input, or the model all its buffers."""
    g = model.subgraphs[0]
    if kind == "drop_graph_input" and g.inputs is not None and len(g.inputs):
        g.inputs = np.array(list(g.inputs)[1:], dtype=np.int32)
        return "rebuild drop_graph_input"
    if kind == "no_buffers":
        model.buffers = []
        return "rebuild no_buffers"
    return None


_REBUILDS: Tuple[_Rebuild, ...] = (_rebuild_op_io, _rebuild_shape, _rebuild_buffer, _rebuild_quantization,
                                   _rebuild_op_order, _rebuild_graph)


def _rebuild(rng: random.Random, model: schema.ModelT) -> str:
    g = model.subgraphs[0]
    ops, tensors = g.operators or [], g.tensors or []
    kind = rng.choice(["drop_input", "add_input", "drop_output", "add_output", "add_dim", "drop_dim",
                       "cut_buffer", "grow_buffer", "empty_buffer", "quant_lengths", "delete_op",
                       "duplicate_op", "move_op", "drop_graph_input", "no_buffers"])
    op = rng.choice(ops) if ops else None
    t = rng.choice(tensors) if tensors else None
    for rebuild in _REBUILDS:
        what = rebuild(rng, kind, model, op, t)
        if what is not None:
            return what
    return "rebuild none"


@dataclass
class Base:
    """A model mutants start from, read once."""

    path: Path
    data: bytes
    sites: List[_Site]
    n_tensors: int
    model: schema.ModelT = field(repr=False)

    @classmethod
    def read(cls, path: Path) -> "Base":
        data = path.read_bytes()
        model = schema.ModelT.InitFromPackedBuf(bytearray(data), 0)
        return cls(path, data, sites(data), len(model.subgraphs[0].tensors or []), model)


def mutant(bases: List[Base], seed: int, index: int) -> Tuple[Base, bytes, str]:
    """Returns mutant ``index`` of ``seed``: its base, its bytes and what was changed."""
    rng = random.Random(f"{seed}:{index}")
    base = bases[rng.randrange(len(bases))]
    if rng.random() < 0.7 or not base.model.subgraphs:
        data, what = _patch(rng, base.data, base.sites, base.n_tensors)
        return base, data, what
    model = copy.deepcopy(base.model)
    what = _rebuild(rng, model)
    return base, bytes(flatbuffer_utils.convert_object_to_bytearray(model)), what


# -- one mutant, opened as edgecap opens a bundle's model -----------------------------------


def classify(path: Path) -> Tuple[str, str, str]:
    """Opens a model as ``load_bundle`` does and invokes it once; returns ``(outcome, check, message)``.

    ``outcome`` is ``refused`` (by ``check``, with its one-line message), ``ran``,
    ``described`` (an EdgeTPU-compiled model: opened, never run on a CPU) or ``finding`` (anything else: an exception that is not edgecap's, a message
    of more than one line). A native crash never returns: it kills this process.
    """
    from edgecap import bundle, trial_invoke
    from edgecap.errors import EdgecapError
    from edgecap.tflite_verify import verify_tflite

    data = path.read_bytes()
    info: List[Any] = []
    steps: List[Tuple[str, Callable[[], Any]]] = [
        ("verifier", lambda: info.append(verify_tflite(data, str(path)))),
        ("child invoke", lambda: None if info[0].edgetpu_compiled else trial_invoke.check(data, path)),
        ("interpreter", lambda: bundle._open_model(path)),
    ]
    opened: Any = None
    for check, step in steps:
        try:
            opened = step()
        except EdgecapError as exc:
            msg = str(exc)
            if "\n" in msg or not msg:
                return "finding", check, f"message not one line: {msg[:300]!r}"
            if check == "verifier":
                check = "operator check" if "kernels cannot run" in msg else "flatbuffer walk"
            return "refused", check, msg
        except Exception as exc:  # noqa: BLE001 - what the fuzz looks for
            return "finding", check, f"{type(exc).__name__}: {str(exc)[:300]}"
    if info[0].edgetpu_compiled:
        # open_model only describes a compiled model (its interpreter is never allocated or
        # invoked on a CPU); only libedgetpu's delegate runs it, on a real EdgeTPU.
        return "described", "", ""
    _, interp = opened
    try:
        for d in interp.get_input_details():
            interp.set_tensor(d["index"], np.zeros(d["shape"], dtype=d["dtype"]))
        interp.invoke()
    except (ValueError, RuntimeError) as exc:  # the interpreter's own error: the captioner's StageFailed
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return "refused", "interpreter (invoke)", first[:300]
    return "ran", "", ""


def worker(bases: List[Path], seed: int, start: int, end: int, workdir: Path) -> None:
    """Runs mutants ``start..end-1``, one JSON line each on stdout, flushed before the next."""
    loaded = [Base.read(p) for p in bases]
    path = workdir / "mutant.tflite"
    # The suite's stand-in for a native crash: die as a segfault would, at this mutant.
    die_at = int(os.environ.get("EDGECAP_MODEL_FUZZ_DIE_AT", "-1"))
    for i in range(start, end):
        base, data, what = mutant(loaded, seed, i)
        path.write_bytes(data)
        sys.stdout.write(json.dumps({"i": i, "begin": True}) + "\n")
        sys.stdout.flush()
        if i == die_at:
            os.kill(os.getpid(), signal.SIGSEGV)
        outcome, check, msg = classify(path)
        sys.stdout.write(json.dumps({"i": i, "base": base.path.name, "mutation": what, "outcome": outcome,
                                     "check": check, "message": msg}) + "\n")
        sys.stdout.flush()


@dataclass
class Tally:
    """Mutants by outcome, by the check that refused them, by base; crashes and findings in full."""

    mutants: int = 0
    outcomes: Dict[str, int] = field(default_factory=dict)
    refused_by: Dict[str, int] = field(default_factory=dict)
    by_base: Dict[str, Dict[str, int]] = field(default_factory=dict)
    crashes: List[Dict[str, Any]] = field(default_factory=list)
    findings: List[Dict[str, Any]] = field(default_factory=list)
    examples: Dict[str, str] = field(default_factory=dict)
    child_refusals: List[Dict[str, Any]] = field(default_factory=list)

    def add(self, record: Dict[str, Any]) -> None:
        self.mutants += 1
        outcome = record["outcome"]
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        per = self.by_base.setdefault(record["base"], {})
        per[outcome] = per.get(outcome, 0) + 1
        if outcome == "refused":
            self.refused_by[record["check"]] = self.refused_by.get(record["check"], 0) + 1
            self.examples.setdefault(record["check"], record["message"])
            if record["check"] == "child invoke" and len(self.child_refusals) < 50:
                self.child_refusals.append(record)
        elif outcome in ("finding", "crashed"):
            (self.crashes if outcome == "crashed" else self.findings).append(record)


def run(bases: List[Path], mutants: int, seed: int, *, keep: Optional[Path] = None,
        progress: Optional[Callable[[Tally], None]] = None, timeout_s: float = 600.0) -> Tally:
    """Runs ``mutants`` mutants in worker processes; a worker that dies is a crash, and the next starts after it.

    Args:
      bases: The models to mutate.
      mutants: How many.
      seed: The run's seed.
      keep: A folder to copy each crashing mutant into (``crash-<i>.tflite``).
      progress: Called after each mutant.
      timeout_s: A worker silent for this long on one mutant is killed (counted as a crash: a hang).
    """
    import selectors

    tally = Tally()
    i = 0
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), str(REPO / "lab"),
                                                                  os.environ.get("PYTHONPATH")])))
    with tempfile.TemporaryDirectory(prefix="edgecap-model-fuzz-") as tmp:
        # Passed models' hashes go to a scratch cache: the mutants are not the user's models.
        env["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")
        while i < mutants:
            cmd = [sys.executable, "-m", "edgecap_lab.model_fuzz", json.dumps([str(p) for p in bases]),
                   str(seed), str(i), str(mutants), tmp]
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
            sel = selectors.DefaultSelector()
            sel.register(proc.stdout, selectors.EVENT_READ)
            current: Optional[int] = None
            hung = False
            while True:
                if not sel.select(timeout_s):
                    proc.kill()
                    hung = True
                    break
                line = proc.stdout.readline()
                if not line:
                    break
                record = json.loads(line)
                if record.get("begin"):
                    current = record["i"]
                    continue
                tally.add(record)
                current = None
                i = record["i"] + 1
                if progress:
                    progress(tally)
            sel.close()
            err = proc.stderr.read()
            code = proc.wait()
            if current is None:
                if code != 0 and i < mutants:  # died before its first mutant: nothing to blame
                    raise RuntimeError(f"fuzz worker exited {code} before a mutant: {err[-800:]}")
                continue
            loaded = [Base.read(p) for p in bases]
            base, data, what = mutant(loaded, seed, current)
            if hung:
                died = "hung"
            elif code < 0:
                names = {int(s): s.name for s in signal.Signals}
                died = f"worker killed by {names.get(-code, f'signal {-code}')}"
            else:
                died = f"worker exited {code}: {err[-300:]}"
            record = {"i": current, "base": base.path.name, "mutation": what, "outcome": "crashed",
                      "check": "", "message": died}
            if keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                (keep / f"crash-{current}.tflite").write_bytes(data)
            tally.add(record)
            i = current + 1
    return tally


if __name__ == "__main__":
    _bases, _seed, _start, _end, _workdir = sys.argv[1:]
    worker([Path(p) for p in json.loads(_bases)], int(_seed), int(_start), int(_end), Path(_workdir))
