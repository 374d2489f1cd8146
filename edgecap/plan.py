"""The runtime's reader of plan.json: which segment runs on which device (docs/plan.md).

The compiler (``edgecap_compile``) writes plans; this module only reads and
validates them, so the runtime never needs the compiler installed.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from edgecap import devices
from edgecap.bundle import resolve_inside
from edgecap.errors import EdgecapError, PlanError

PLAN_VERSION = 1
_DTYPES = ("int8", "uint8", "int16", "int32", "float32")


@dataclass(frozen=True)
class TensorSpec:
    """A tensor at a stage boundary, named as in the source model."""

    name: str
    shape: Tuple[int, ...]
    dtype: str
    scale: float
    zero_point: int

    def to_json(self) -> Dict[str, Any]:
        """Returns the tensor as plan.json writes it (docs/plan.md)."""
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "scale": self.scale,
            "zero_point": self.zero_point,
        }


@dataclass(frozen=True)
class Stage:
    """One stage of a plan: a model segment and the device it runs on.

    ``segment`` is an absolute path, or None for an empty stage (skipped).
    ``compiled_segment`` is the edgetpu_compiler output, when there is one.
    """

    index: int
    device: str
    segment: Optional[Path]
    ops: Tuple[int, int]
    inputs: Tuple[TensorSpec, ...]
    outputs: Tuple[TensorSpec, ...]
    predicted_ms: Optional[float]
    compiled_segment: Optional[Path] = None

    @property
    def empty(self) -> bool:
        """True when the stage runs no operators."""
        return self.ops[0] == self.ops[1]


@dataclass(frozen=True)
class Plan:
    """A validated plan: stages in pipeline order, for one source model.

    ``model_sha256`` is the hex SHA-256 of the model file the plan was cut from.
    """

    path: Optional[Path]
    board: str
    model_file: str
    model_sha256: str
    stages: Tuple[Stage, ...]
    rnn_ms: Optional[float] = None

    @property
    def active_stages(self) -> Tuple[Stage, ...]:
        """The stages that run operators, in order."""
        return tuple(s for s in self.stages if not s.empty)

    @property
    def inputs(self) -> Tuple[TensorSpec, ...]:
        """The model's inputs: what the first stage reads."""
        return self.active_stages[0].inputs

    @property
    def outputs(self) -> Tuple[TensorSpec, ...]:
        """The model's outputs: what the last stage writes."""
        return self.active_stages[-1].outputs


def load_plan(path: "str | os.PathLike[str]") -> Plan:
    """Reads and validates a plan.json.

    Args:
      path: The plan.json file, or the directory holding it.

    Returns:
      The validated ``Plan``; segment paths are resolved against its directory.

    Raises:
      PlanError: If the file is missing, is not plan version 1, or breaks a
        rule of docs/plan.md. The message names the field and the fix.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "plan.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlanError(f"{path}: no such plan; write one with `edgecap compile`") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanError(f"{path}: not readable JSON ({exc}); re-run `edgecap compile`") from None
    return _parse(doc, path)


def single_cpu_plan(encoder: "str | os.PathLike[str]") -> Plan:
    """Makes the plan that runs a whole encoder as one CPU stage.

    Used when no plan is given and no EdgeTPU is present.

    Args:
      encoder: Path to the int8 encoder .tflite.

    Returns:
      A one-stage ``Plan`` on device ``cpu`` with no predictions.

    Raises:
      PlanError: If the encoder cannot be read as a TFLite model.
    """
    from edgecap.interpreter import make_cpu_interpreter

    encoder = Path(encoder).resolve()
    try:
        interp = make_cpu_interpreter(encoder)
    except (ValueError, OSError) as exc:
        raise PlanError(f"{encoder}: not a TFLite model ({exc}); check the bundle's encoder") from None
    # The model's own nodes come first; the delegates the backend applied are appended.
    ops = sum(1 for op in interp._get_ops_details() if op["op_name"] != "DELEGATE")
    stage = Stage(
        index=0,
        device="cpu",
        segment=encoder,
        ops=(0, ops),
        inputs=tuple(_spec_from_details(d) for d in interp.get_input_details()),
        outputs=tuple(_spec_from_details(d) for d in interp.get_output_details()),
        predicted_ms=None,
    )
    return Plan(
        path=None,
        board="host",
        model_file=encoder.name,
        model_sha256=file_sha256(encoder),
        stages=(stage,),
    )


def file_sha256(path: "str | os.PathLike[str]") -> str:
    """Returns the hex SHA-256 of a file, as plans record their model's."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _spec_from_details(d: Dict[str, Any]) -> TensorSpec:
    scale, zero_point = d["quantization"]
    return TensorSpec(
        name=d["name"],
        shape=tuple(int(x) for x in d["shape"]),
        dtype=d["dtype"].__name__,
        scale=float(scale),
        zero_point=int(zero_point),
    )


def _parse(doc: Any, path: Path) -> Plan:
    where = str(path)
    if not isinstance(doc, dict):
        raise PlanError(f"{where}: top level must be a JSON object")
    if isinstance(doc.get("plan_version"), bool) or doc.get("plan_version") != PLAN_VERSION:
        raise PlanError(
            f"{where}: plan_version is {doc.get('plan_version')!r}, this runtime reads "
            f"{PLAN_VERSION}; re-run `edgecap compile`"
        )
    model = _field(doc, "model", dict, where)
    board = _field(doc, "board", dict, where)
    raw_stages = _field(doc, "stages", list, where)
    if not raw_stages:
        raise PlanError(f"{where}: stages is empty; a plan needs at least one stage")
    stages = [_parse_stage(raw, i, path.parent, where) for i, raw in enumerate(raw_stages)]
    _check_order(stages, where)
    _check_chain(stages, where)
    return Plan(
        path=path,
        board=_field(board, "name", str, f"{where}: board"),
        model_file=_field(model, "file", str, f"{where}: model"),
        model_sha256=_field(model, "sha256", str, f"{where}: model"),
        stages=tuple(stages),
        rnn_ms=_optional_number(doc, "rnn_ms", where),
    )


def _parse_stage(raw: Any, position: int, base: Path, where: str) -> Stage:
    here = f"{where}: stages[{position}]"
    if not isinstance(raw, dict):
        raise PlanError(f"{here} must be an object")
    if isinstance(raw.get("index"), bool) or raw.get("index") != position:
        raise PlanError(f"{here}: index is {raw.get('index')!r}, expected {position}")
    device = _field(raw, "device", str, here)
    try:
        devices.parse_device(device)
    except EdgecapError as exc:
        raise PlanError(f"{here}: {exc}") from None
    ops = _field(raw, "ops", list, here)
    if len(ops) != 2 or not all(_is_int(x) for x in ops) or not 0 <= ops[0] <= ops[1]:
        raise PlanError(f"{here}: ops must be [start, end) with 0 <= start <= end, got {ops!r}")
    empty = ops[0] == ops[1]
    segment = raw.get("segment")
    if empty and segment is not None:
        raise PlanError(f"{here}: an empty stage (ops {ops}) must have segment null")
    if not empty and not isinstance(segment, str):
        raise PlanError(f"{here}: segment must name the stage's .tflite file")
    return Stage(
        index=position,
        device=device,
        segment=None if empty else _inside(base, segment, here),
        ops=(ops[0], ops[1]),
        inputs=_tensors(raw, "inputs", here),
        outputs=_tensors(raw, "outputs", here),
        predicted_ms=_optional_number(raw, "predicted_ms", here),
        compiled_segment=_compiled_segment(raw, base, here),
    )


def _compiled_segment(raw: Dict[str, Any], base: Path, where: str) -> Optional[Path]:
    edgetpu = raw.get("edgetpu")
    if edgetpu is None:
        return None
    here = f"{where}: edgetpu"
    if not isinstance(edgetpu, dict):
        raise PlanError(f"{here} must be an object or null")
    if not _field(edgetpu, "compiled", bool, here):
        return None
    return _inside(base, _field(edgetpu, "compiled_segment", str, here), here)


def _inside(base: Path, name: str, where: str) -> Path:
    resolved = resolve_inside(base, name)
    if resolved is None:
        raise PlanError(f"{where}: {name!r} resolves outside the plan directory; keep segments beside plan.json")
    if not resolved.is_file():
        raise PlanError(f"{where}: segment {name!r} not found beside plan.json; re-run `edgecap compile`")
    return resolved


def _tensors(raw: Dict[str, Any], key: str, where: str) -> Tuple[TensorSpec, ...]:
    items = _field(raw, key, list, where)
    specs: List[TensorSpec] = []
    for i, t in enumerate(items):
        here = f"{where}: {key}[{i}]"
        if not isinstance(t, dict):
            raise PlanError(f"{here} must be an object")
        shape = _field(t, "shape", list, here)
        if not all(_is_int(x) and x >= 0 for x in shape):
            raise PlanError(f"{here}: shape must be a list of sizes >= 0, got {shape!r}")
        dtype = _field(t, "dtype", str, here)
        if dtype not in _DTYPES:
            raise PlanError(f"{here}: dtype {dtype!r} is not one of {', '.join(_DTYPES)}")
        # Float tensors carry no quantisation: the compiler writes null.
        zero_point = t.get("zero_point")
        if zero_point is not None and not _is_int(zero_point):
            raise PlanError(f"{here}: zero_point must be an integer or null, got {zero_point!r}")
        specs.append(
            TensorSpec(
                name=_field(t, "name", str, here),
                shape=tuple(shape),
                dtype=dtype,
                scale=_optional_number(t, "scale", here) or 0.0,
                zero_point=zero_point or 0,
            )
        )
    return tuple(specs)


def _check_order(stages: List[Stage], where: str) -> None:
    # Pipeline order is TPUs first, then the CPU tail: the tail also runs the
    # RNN step, so nothing may follow it.
    kinds = [devices.parse_device(s.device).kind for s in stages]
    if "cpu" in kinds[:-1]:
        raise PlanError(f"{where}: only the last stage may run on the cpu; stages are tpu:0..tpu:N-1 then cpu")
    for prev, cur in zip(stages, stages[1:]):
        if cur.ops[0] != prev.ops[1]:
            raise PlanError(
                f"{where}: stages[{cur.index}] starts at op {cur.ops[0]} but stages[{prev.index}] "
                f"ends at {prev.ops[1]}; stage op ranges must be contiguous"
            )
    if not any(not s.empty for s in stages):
        raise PlanError(f"{where}: every stage is empty; a plan must run the model's operators")


def _check_chain(stages: List[Stage], where: str) -> None:
    active = [s for s in stages if not s.empty]
    for prev, cur in zip(active, active[1:]):
        available = {t.name for t in prev.outputs}
        missing = [t.name for t in cur.inputs if t.name not in available]
        if missing:
            raise PlanError(
                f"{where}: stages[{cur.index}] reads {', '.join(missing)} which stages[{prev.index}] "
                "does not output; boundary tensors must keep their names"
            )


def _is_int(value: Any) -> bool:
    # JSON true/false arrive as bool, which Python counts as int.
    return isinstance(value, int) and not isinstance(value, bool)


def _field(obj: Dict[str, Any], key: str, kind: type, where: str) -> Any:
    value = obj.get(key)
    if not isinstance(value, kind):
        raise PlanError(f"{where}: field {key!r} missing or not a {kind.__name__}")
    return value


def _optional_number(obj: Dict[str, Any], key: str, where: str) -> Optional[float]:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise PlanError(f"{where}: {key} must be a finite number >= 0, got {value!r}")
    return float(value)
