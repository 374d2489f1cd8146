"""Start-up opens each model file the fewest times it can, and the runtime's modules import in layers.

A start-up opens the encoder once to validate the bundle and once in the worker
that runs it; each RNN step model likewise. Nothing re-opens a model to learn
what validation already read (tensors, op count, SHA-256).
"""

from __future__ import annotations

import ast
import hashlib
from collections import Counter
from pathlib import Path
from typing import Dict, List, Set

import pytest

from edgecap import interpreter, stages
from edgecap.captioner import EdgeCaptioner

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def opened(monkeypatch) -> Counter:
    """Counts interpreter constructions by model file name (content is matched by hash)."""
    counts: Counter = Counter()
    real = interpreter._tfl.Interpreter
    bundle = REPO / "models" / "demo" / "bundle"
    by_hash = {hashlib.sha256(p.read_bytes()).hexdigest(): p.name for p in bundle.glob("*.tflite")}

    def counting(*args, **kwargs):
        if kwargs.get("model_path"):
            counts[Path(kwargs["model_path"]).name] += 1
        else:
            digest = hashlib.sha256(kwargs["model_content"]).hexdigest()
            counts[by_hash.get(digest, "other")] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(interpreter._tfl, "Interpreter", counting)
    return counts


# Validation opens every model once, the run each model it runs once more: the int8-weight
# RNN steps the demo ships (bundle.json rnn.int8) unless float_rnn.
RUN_INT8 = {"rnn_encoder_step.tflite": 1, "rnn_decoder_step.tflite": 1,
            "rnn_encoder_step_int8.tflite": 2, "rnn_decoder_step_int8.tflite": 2}


def test_a_cpu_start_up_opens_each_model_twice(shipped_bundle: Path, opened: Counter) -> None:
    with EdgeCaptioner(shipped_bundle, num_threads=1):
        pass
    assert opened == {"encoder.tflite": 2, **RUN_INT8}
    opened.clear()
    with EdgeCaptioner(shipped_bundle, num_threads=1, float_rnn=True):
        pass
    assert opened == {"encoder.tflite": 2, "rnn_encoder_step.tflite": 2, "rnn_decoder_step.tflite": 2,
                      "rnn_encoder_step_int8.tflite": 1, "rnn_decoder_step_int8.tflite": 1}


def test_the_host_rule_opens_the_encoder_and_its_rnn_step_once_more_to_time_them(shipped_bundle: Path,
                                                                                 opened: Counter) -> None:
    # Nothing set on a CPU-only run: the planner times the CNN and the RNN step on this CPU.
    with EdgeCaptioner(shipped_bundle) as cap:
        assert cap.choice.host is not None
    assert opened == {"encoder.tflite": 3, **RUN_INT8, "rnn_encoder_step_int8.tflite": 3}


def test_a_board_start_up_opens_no_model_for_planning(shipped_bundle: Path, opened: Counter,
                                                      tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    verified: Counter = Counter()
    verify = stages.verify_tflite

    def counting(data, where, **kwargs):
        verified[Path(where).name] += 1
        return verify(data, where, **kwargs)

    monkeypatch.setattr(stages, "verify_tflite", counting)
    monkeypatch.setattr(stages, "_COMPILED", {}, raising=False)
    with EdgeCaptioner(shipped_bundle, board="devboard-usb", num_threads=1) as cap:
        active = cap.plan.active_stages
    # The demo's CNN runs as copies on devboard-usb: one segment file, several devices.
    assert any(s.replicas for s in active)
    # Validation opens the encoder once; planning reads it with the schema bindings,
    # not an interpreter; each segment is opened once per device that runs it, in its
    # worker, and verified once (its copies share the file).
    expected = Counter({"encoder.tflite": 1, **RUN_INT8})
    for s in active:
        expected[s.segment.name] += len(s.devices)
    assert opened == expected
    assert verified == Counter({s.segment.name: 1 for s in active})


def _imports(module: Path, package: str) -> Set[str]:
    """Modules of ``package`` that ``module`` imports at import time (not inside functions)."""
    tree = ast.parse(module.read_text())
    found: Set[str] = set()
    for node in tree.body:  # top level only: a function-level import is a deliberate lazy door
        if isinstance(node, ast.If):  # TYPE_CHECKING blocks import nothing at run time
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(package + "."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.ImportFrom) and node.module == package:
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith(package + "."))
    return found


def test_runtime_modules_have_no_import_cycle() -> None:
    graph: Dict[str, Set[str]] = {
        p.stem: _imports(p, "edgecap") for p in (REPO / "edgecap").glob("*.py") if p.stem != "__init__"
    }
    state: Dict[str, int] = {}
    cycle: List[str] = []

    def visit(node: str, path: List[str]) -> bool:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycle.extend(path[path.index(nxt):] + [node, nxt] if nxt in path else [node, nxt])
                return True
            if nxt not in state and visit(nxt, path + [node]):
                return True
        state[node] = 2
        return False

    assert not any(visit(n, []) for n in sorted(graph) if n not in state), f"import cycle: {cycle}"


def _imports_anywhere(module: Path, package: str) -> Set[str]:
    """Dotted names of ``package`` imported anywhere in ``module``, function bodies included."""
    found: Set[str] = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == package:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == package)
    return found


def test_the_runtime_reaches_the_compiler_through_one_door() -> None:
    # The CLI fronts both the runtime and the compiler (`edgecap compile`); every
    # other runtime module reaches the compiler only through edgecap.plans.compiler,
    # and that only through the package's exported names.
    users = {p.relative_to(REPO / "edgecap").with_suffix("").as_posix(): _imports_anywhere(p, "edgecap_compile")
             for p in (REPO / "edgecap").rglob("*.py") if p.name != "cli.py"}
    assert {name: names for name, names in users.items() if names} == {"plans/compiler": {"edgecap_compile"}}
