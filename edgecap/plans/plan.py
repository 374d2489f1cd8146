"""plan.json (docs/plan.md): which segment runs on which device, read and written here.

The compiler (``edgecap_compile``) builds a ``Plan`` and writes it with
``write_plan``; the runtime reads it with ``load_plan``. The file format is
declared once, as the schema types below, so the reader and the writer cannot
drift apart, and the runtime never needs the compiler installed.

Each device string is parsed once, when the plan is built or loaded: a
``Stage`` carries its ``DeviceSpec``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, get_args

import msgspec

from edgecap import files, schema
from edgecap.bundle import quote_name, resolve_inside, unusable_name
from edgecap.devices import DeviceSpec, parse_device
from edgecap.errors import EdgecapError, PlanError
from edgecap.modelfile import ModelFile, TensorSpec, open_model
from edgecap.tflite_verify import ModelInfo, verify_tflite

try:
    from typing import Annotated, Literal
except ImportError:  # pragma: no cover - Python < 3.9 is not supported
    from typing_extensions import Annotated, Literal  # type: ignore[assignment]

PLAN_VERSION = 1
PLAN_FILE = "plan.json"
_FIX = "re-run `edgecap compile`"
# One invoke of one stage (or one RNN step): a minute is far past any real
# model on any board (ResNet-50 on a Dev Board's CPU takes under 2 s), and an
# emulated stage sleeps this long, so a typo must not make a run sleep for days.
MAX_INVOKE_MS = 60_000.0
# No board carries more EdgeTPUs than this; a device index past it is a typo.
MAX_TPUS = 64

# ---------------------------------------------------------------------------
# The file format (docs/plan.md).

# int64: TFLite's ARG_MAX writes it (Coral's compiled DeepLab models end in one, left on the CPU).
_Dtype = Literal["int8", "uint8", "int16", "int32", "int64", "float32"]
_Scale = Annotated[float, msgspec.Meta(ge=0.0, le=1e30)]
_ZeroPoint = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]
_Macs = Annotated[int, msgspec.Meta(ge=0, le=10**16)]
_Sha256 = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
_PlanFps = Annotated[float, msgspec.Meta(ge=0.0, le=1e9)]
_InvokeMs = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_INVOKE_MS)]
_Share = Annotated[float, msgspec.Meta(gt=0.0, le=1.0)]
# The copies' shares of a replicated stage add up to 1 within this (they are written to 6 decimals).
SHARE_TOLERANCE = 1e-4


class _TensorDoc(msgspec.Struct, forbid_unknown_fields=True):
    name: schema.Name
    shape: Annotated[Tuple[schema.Dim, ...], msgspec.Meta(max_length=8)]
    dtype: _Dtype
    # Float tensors carry no quantisation: null or 0.
    scale: Optional[_Scale] = None
    zero_point: Optional[_ZeroPoint] = None


class _ParamBytesDoc(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    on_chip: schema.Bytes = 0
    streamed: schema.Bytes = 0


class _CpuOpDoc(msgspec.Struct, forbid_unknown_fields=True):
    op: schema.Name
    count: schema.Count
    reason: str


class _EdgeTpuDoc(msgspec.Struct, forbid_unknown_fields=True):
    compiled: bool
    compiled_segment: Optional[schema.Name] = None
    reason: Optional[str] = None
    on_chip_bytes: Optional[schema.Bytes] = None
    off_chip_bytes: Optional[schema.Bytes] = None
    cpu_ops: List[_CpuOpDoc] = []
    log: Optional[str] = None
    cpu_ops_ms: Optional[_InvokeMs] = None
    # The compiled file's SHA-256 when plan.json was written (absent in older plans).
    compiled_sha256: Optional[_Sha256] = None


class _CostDoc(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    compute_ms: _InvokeMs
    invoke_ms: _InvokeMs = 0.0
    link_bytes: schema.Bytes = 0
    link_bytes_per_s: Optional[schema.Rate] = None
    extra_ms: _InvokeMs = 0.0
    link: Optional[schema.Name] = None
    bus: Optional[schema.Name] = None


class _BusDoc(msgspec.Struct, forbid_unknown_fields=True):
    name: schema.Name
    bytes_per_s: schema.Rate


class _ReplicaDoc(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    device: schema.Name
    share: _Share
    predicted_ms: Optional[_InvokeMs] = None
    cost: Optional[_CostDoc] = None


class _StageDoc(msgspec.Struct, forbid_unknown_fields=True):
    index: schema.Count
    device: schema.Name
    segment: Optional[schema.Name]
    ops: Tuple[schema.Count, schema.Count]
    inputs: Tuple[_TensorDoc, ...]
    outputs: Tuple[_TensorDoc, ...]
    param_bytes: _ParamBytesDoc = _ParamBytesDoc()
    macs: _Macs = 0
    predicted_ms: Optional[_InvokeMs] = None
    edgetpu: Optional[_EdgeTpuDoc] = None
    # The segment file as write_plan found it (absent in older plans): a
    # segment swapped or rewritten since is refused at load_plan.
    segment_sha256: Optional[_Sha256] = None
    segment_bytes: Optional[schema.Bytes] = None
    # What predicted_ms is made of (absent in older plans), so a board can re-price it.
    cost: Optional[_CostDoc] = None
    # A stage run as copies (absent in older plans: one copy): the share of
    # frames this device takes, and the other copies with theirs.
    share: Optional[_Share] = None
    replicas: Tuple[_ReplicaDoc, ...] = ()


class _ModelDoc(msgspec.Struct, forbid_unknown_fields=True):
    file: schema.Name
    sha256: _Sha256
    ops: schema.Count


class _BoardDoc(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    name: schema.Name
    version: schema.Count
    # EdgeTPUs the plan was made for (absent in older plans): TPU device indices stay below it.
    tpus: Optional[Annotated[int, msgspec.Meta(ge=0, le=MAX_TPUS)]] = None


class _PredictedDoc(msgspec.Struct, forbid_unknown_fields=True):
    fps: Optional[_PlanFps]
    latency_ms: schema.Millis
    bottleneck_ms: schema.Millis
    bottleneck_stage: schema.Count


class _CpuFrameDoc(msgspec.Struct, forbid_unknown_fields=True):
    preprocess_ms: _InvokeMs = 0.0
    handoff_ms: _InvokeMs = 0.0


class _PlanDoc(msgspec.Struct, forbid_unknown_fields=True):
    plan_version: int
    model: _ModelDoc
    board: _BoardDoc
    stages: Tuple[_StageDoc, ...]
    sram_bytes: Optional[schema.Bytes] = None
    rnn_ms: Optional[_InvokeMs] = None
    rnn_steps_per_frame: Annotated[float, msgspec.Meta(ge=0.0, le=10_000.0)] = 1.0
    predicted: Optional[_PredictedDoc] = None
    # Buses that several stages' links share (absent in older plans: none shared).
    buses: Tuple[_BusDoc, ...] = ()
    # The board CPU's own work a frame (absent in older plans and where the profile models none).
    cpu_frame: Optional[_CpuFrameDoc] = None


class _VersionDoc(msgspec.Struct):
    plan_version: Any = None


# ---------------------------------------------------------------------------
# The records the runtime and the compiler work with.


@dataclass
class EdgeTpuReport:
    """What happened when a segment went through edgetpu_compiler (plan.json ``edgetpu``).

    Attributes:
      compiled: Whether a compiled segment was produced.
      compiled_segment: Its file name, relative to the plan's folder.
      reason: Why it was not compiled, or None.
      on_chip_bytes: Parameter bytes cached in SRAM, as the compiler reported.
      off_chip_bytes: Parameter bytes streamed every invoke, as reported.
      cpu_ops: Ops the compiler left on the CPU: ``{"op", "count", "reason"}``.
      log: The compiler's output (summary and operator table).
      cpu_ops_ms: What those ops cost on the board's CPU per invoke; the
        stage's ``predicted_ms`` includes it.
    """

    compiled: bool
    compiled_segment: Optional[str] = None
    reason: Optional[str] = None
    on_chip_bytes: Optional[int] = None
    off_chip_bytes: Optional[int] = None
    cpu_ops: List[Dict[str, Any]] = field(default_factory=list)
    log: Optional[str] = None
    cpu_ops_ms: Optional[float] = None


@dataclass(frozen=True)
class ParamBytes:
    """A stage's parameter bytes: held on the device, and streamed every invoke."""

    on_chip: int = 0
    streamed: int = 0


@dataclass(frozen=True)
class CostParts:
    """What a stage's predicted time is made of, so the running board can re-price it.

    ``predicted_ms = compute_ms + invoke_ms + link_ms + extra_ms``.

    Attributes:
      compute_ms: MACs, element work and per-op overhead on the stage's device.
      invoke_ms: The device's fixed cost per invoke.
      link_bytes: Bytes over the device's link every invoke: streamed
        parameters plus boundary tensors in and out (0 on the CPU).
      link_bytes_per_s: The link rate the prediction used; None on the CPU.
      extra_ms: Work besides the ops: the RNN steps on the CPU stage, the ops
        edgetpu_compiler left on the CPU inside a TPU stage.
      link: Link kind (``pcie``, ``usb3``, ``usb2``; edgecap/data/links.json), None on the CPU.
      bus: Name of the shared bus the link sits behind (``Plan.buses``), or None.
    """

    compute_ms: float
    invoke_ms: float = 0.0
    link_bytes: int = 0
    link_bytes_per_s: Optional[float] = None
    extra_ms: float = 0.0
    link: Optional[str] = None
    bus: Optional[str] = None

    @property
    def link_ms(self) -> float:
        """Milliseconds of ``link_bytes`` at ``link_bytes_per_s``."""
        if not self.link_bytes or not self.link_bytes_per_s:
            return 0.0
        return self.link_bytes * 1e3 / self.link_bytes_per_s

    @property
    def total_ms(self) -> float:
        return self.compute_ms + self.invoke_ms + self.link_ms + self.extra_ms


@dataclass(frozen=True)
class Bus:
    """A bus several TPU links share: their bytes together cannot pass ``bytes_per_s``."""

    name: str
    bytes_per_s: float


@dataclass(frozen=True)
class CpuFrame:
    """The board CPU's own work a frame, whatever the plan (plan.json ``cpu_frame``).

    Attributes:
      preprocess_ms: Preparing a frame for the encoder at its input size
        (resize, the quantising lookup, the channel swap and their Python calls).
      handoff_ms: Handing a frame on from one stage to the next (a queue's put
        and get and the Python around a stage's invoke), charged once per stage
        a frame passes.
    """

    preprocess_ms: float = 0.0
    handoff_ms: float = 0.0

    def ms(self, stages: int) -> float:
        """Milliseconds a frame for a plan whose frames pass ``stages`` stages."""
        return self.preprocess_ms + self.handoff_ms * stages


@dataclass(frozen=True)
class Replica:
    """Another copy of a stage: the same segment on another device, taking a share of the frames.

    Attributes:
      spec: The parsed device.
      share: The fraction of frames it takes (the dealer's weight).
      predicted_ms: The cost model's time for an invoke there, or None.
      cost: What ``predicted_ms`` is made of, or None.
    """

    spec: DeviceSpec
    share: float
    predicted_ms: Optional[float] = None
    cost: Optional[CostParts] = None

    @property
    def device(self) -> str:
        """The device as plan.json writes it."""
        return str(self.spec)


@dataclass(frozen=True)
class Stage:
    """One stage of a plan: a model segment and the device(s) it runs on.

    Attributes:
      index: Position in the pipeline.
      spec: The parsed device (``device`` is its canonical string).
      segment: The segment file, absolute; None for an empty stage (skipped).
      ops: Half-open operator range ``[start, end)`` of the source model.
      inputs: Tensors it reads from earlier stages (or the model input).
      outputs: Tensors later stages read: computed here or forwarded.
      predicted_ms: The cost model's time for an invoke, or None.
      compiled_segment: The edgetpu_compiler output, absolute, when there is one.
      param_bytes: Parameter bytes on the device and streamed.
      macs: Multiply-accumulates of the range.
      edgetpu: What edgetpu_compiler reported (TPU stages of a compiled plan).
      cost: What ``predicted_ms`` is made of, or None (older plans).
      share: The fraction of frames ``spec`` takes: 1 unless the stage has replicas.
      replicas: The stage's other copies (docs/plan.md, "Replicas"): frames
        are dealt among the copies by share and put back in order after them.
    """

    index: int
    spec: DeviceSpec
    segment: Optional[Path]
    ops: Tuple[int, int]
    inputs: Tuple[TensorSpec, ...]
    outputs: Tuple[TensorSpec, ...]
    predicted_ms: Optional[float]
    compiled_segment: Optional[Path] = None
    param_bytes: ParamBytes = ParamBytes()
    macs: int = 0
    edgetpu: Optional[EdgeTpuReport] = None
    cost: Optional[CostParts] = None
    share: float = 1.0
    replicas: Tuple[Replica, ...] = ()

    @property
    def device(self) -> str:
        """The device as plan.json writes it (``cpu``, ``tpu:N``, ...)."""
        return str(self.spec)

    def describe(self) -> str:
        """The stage in words: ``pci:0 ops [0, 35)``; replicated, each copy with its share of frames."""
        where = " + ".join(f"{c.device} x{c.share:.2f}" for c in self.copies) if self.replicas else self.device
        return f"{where} ops [{self.ops[0]}, {self.ops[1]})"

    @property
    def devices(self) -> Tuple[DeviceSpec, ...]:
        """Every device that runs the stage: its own, then its replicas'."""
        return (self.spec, *(r.spec for r in self.replicas))

    @property
    def copies(self) -> Tuple["Stage", ...]:
        """The stage as each copy runs it: one ``Stage`` per device (its own first), without replicas.

        Each carries its device, share, predicted time and cost parts, so what
        runs, paces or re-prices one stage runs a copy the same way.
        """
        if not self.replicas:
            return (self,)
        first = dataclasses.replace(self, replicas=())
        return (first, *(dataclasses.replace(first, spec=r.spec, share=r.share, predicted_ms=r.predicted_ms,
                                             cost=r.cost) for r in self.replicas))

    @property
    def empty(self) -> bool:
        """True when the stage runs no operators."""
        return self.ops[0] == self.ops[1]


@dataclass(frozen=True)
class Prediction:
    """The cost model's figures for the whole pipeline."""

    fps: Optional[float]
    latency_ms: float
    bottleneck_ms: float
    bottleneck_stage: int


@dataclass(frozen=True)
class Plan:
    """A validated plan: stages in pipeline order, for one source model.

    Attributes:
      path: The plan.json it was read from or written to; None if in memory only.
      board: Board profile name.
      model_file: The source model's path as recorded (relative to its bundle).
      model_sha256: Hex SHA-256 of the source model file.
      stages: Every stage, empty ones included, in pipeline order.
      rnn_ms: The RNN encoder step's predicted time per invoke, or None.
      rnn_steps_per_frame: RNN encoder steps the CPU stage's ``predicted_ms``
        charges per frame: one per window a frame feeds, for the window the
        plan was compiled for (``edgecap.windows.windows_per_frame``).
      board_version: Board profile version.
      model_ops: Operators of the source model.
      sram_bytes: The SRAM budget per TPU the split was made for.
      predicted: The cost model's pipeline figures, or None.
      board_tpus: EdgeTPUs of the board the plan was made for, or None
        (unknown: older plans); stage device indices stay below it.
      buses: The shared buses stages' ``cost.bus`` name.
      cpu_frame: The board CPU's own work a frame (``CpuFrame``), or None
        (older plans, and profiles that model none).
    """

    path: Optional[Path]
    board: str
    model_file: str
    model_sha256: str
    stages: Tuple[Stage, ...]
    rnn_ms: Optional[float] = None
    rnn_steps_per_frame: float = 1.0
    board_version: int = 0
    model_ops: int = 0
    sram_bytes: Optional[int] = None
    predicted: Optional[Prediction] = None
    board_tpus: Optional[int] = None
    buses: Tuple[Bus, ...] = ()
    cpu_frame: Optional[CpuFrame] = None

    @property
    def rnn_frame_ms(self) -> float:
        """RNN milliseconds the CPU stage's ``predicted_ms`` includes per frame."""
        return (self.rnn_ms or 0.0) * self.rnn_steps_per_frame

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


# ---------------------------------------------------------------------------
# Reading and writing.


def load_plan(path: "str | os.PathLike[str]") -> Plan:
    """Reads and validates a plan.json.

    Args:
      path: The plan.json file, or the directory holding it.

    Every segment file is read and checked here, before any worker opens
    one: it must be a whole TFLite flatbuffer (``tflite_verify``), the file
    plan.json recorded (SHA-256 and size, where recorded), and its tensors
    must be those the stage names.

    Returns:
      The validated ``Plan``; segment paths are resolved against its directory.

    Raises:
      PlanError: If the file or a segment is missing, unreadable, a directory,
        corrupt or not the one the plan was written with, is not plan version 1,
        or breaks a rule of docs/plan.md. The message names the field and the fix.
    """
    path = Path(path)
    if path.is_dir() and path.name != PLAN_FILE:  # a plan.json that is a directory is reported as one
        path = path / PLAN_FILE
    data = files.read_bytes(path, what="plan", fix=_FIX, error=PlanError,
                            missing_fix="write one with `edgecap compile`")
    where = str(path)
    try:
        version = msgspec.json.decode(data, type=_VersionDoc).plan_version
    except (msgspec.MsgspecError, RecursionError):
        version = PLAN_VERSION  # not a JSON object: the full decode below says what is wrong
    if isinstance(version, bool) or version != PLAN_VERSION:
        raise PlanError(f"{where}: plan_version is {version!r}, this runtime reads "
                        f"{PLAN_VERSION}; {_FIX}")
    doc = schema.decode(data, _PlanDoc, where=where, fix=_FIX, error=PlanError)
    return _from_doc(doc, path)


def write_plan(plan: Plan, directory: "str | os.PathLike[str]") -> Plan:
    """Writes ``plan`` as ``directory/plan.json``; its segments must be in ``directory``.

    Args:
      plan: The plan, with absolute segment paths inside ``directory``.
      directory: Where plan.json goes.

    Returns:
      The plan as written (its ``path`` set), checked by the same rules
      ``load_plan`` applies.

    Raises:
      PlanError: If the plan breaks a rule of docs/plan.md.
    """
    path = Path(directory) / PLAN_FILE
    # Structs are not range-checked when built: the writer's document goes
    # through the reader's schema, so nothing is written that load_plan refuses.
    doc = schema.convert(msgspec.to_builtins(_to_doc(plan, path.parent)), _PlanDoc,
                         where=str(path), fix=_FIX, error=PlanError)
    written = _from_doc(doc, path)  # the reader's rules hold for what is written
    path.write_bytes(schema.encode(_as_written(doc)))
    return written


def _as_written(doc: _PlanDoc) -> Dict[str, Any]:
    """The document with a stage's ``share`` and ``replicas`` left out where it runs as one copy,
    and ``cpu_frame`` where there is none.

    So a plan without them is written byte for byte as before they existed.
    """
    out = msgspec.to_builtins(doc)
    if out["cpu_frame"] is None:
        del out["cpu_frame"]
    for stage in out["stages"]:
        if not stage["replicas"]:
            del stage["replicas"]
            del stage["share"]
    return out


def single_cpu_plan(model: "ModelFile | str | os.PathLike[str]") -> Plan:
    """Makes the plan that runs a whole encoder as one CPU stage.

    What ``auto`` runs when no bundle plan fits the attached EdgeTPUs (``edgecap.planner``).

    Args:
      model: The encoder as ``load_bundle`` recorded it (nothing is opened),
        or the path of a .tflite file (opened once to read its tensors).

    Returns:
      A one-stage ``Plan`` on device ``cpu`` with no predictions.

    Raises:
      PlanError: If a path is given that is not a readable TFLite model.
    """
    if not isinstance(model, ModelFile):
        try:
            model, _ = open_model(model, error=PlanError)
        except (ValueError, RuntimeError, OSError) as exc:
            raise PlanError(f"{model}: not a TFLite model ({exc}); check the bundle's encoder") from None
    if model.edgetpu:
        raise PlanError(f"{model.path}: EdgeTPU-compiled (edgetpu-custom-op), so it cannot run on the CPU: "
                        "run it on an EdgeTPU, or use the model it was compiled from")
    stage = Stage(
        index=0,
        spec=DeviceSpec("cpu"),
        segment=model.path,
        ops=(0, model.ops),
        inputs=model.inputs,
        outputs=model.outputs,
        predicted_ms=None,
    )
    return Plan(path=None, board="host", model_file=model.path.name, model_sha256=model.sha256,
                stages=(stage,), model_ops=model.ops)


def _tensor(doc: _TensorDoc) -> TensorSpec:
    return TensorSpec(doc.name, tuple(doc.shape), doc.dtype, doc.scale or 0.0, doc.zero_point or 0)


def _tensor_doc(t: TensorSpec, where: str) -> _TensorDoc:
    if t.dtype not in get_args(_Dtype):
        raise PlanError(f"{where}: tensor {t.name!r} is {t.dtype}; plan.json carries "
                        f"{', '.join(get_args(_Dtype))} tensors: cut the model where its tensors have one of them")
    return msgspec.convert(t.to_json(), _TensorDoc)


def _from_doc(doc: _PlanDoc, path: Path) -> Plan:
    where = str(path)
    if not doc.stages:
        raise PlanError(f"{where}: stages is empty; a plan needs at least one stage")
    stages = [_stage(raw, i, path.parent, where) for i, raw in enumerate(doc.stages)]
    _check_order(stages, where)
    _check_tpus(stages, doc.board, where)
    _check_chain(stages, where)
    for raw, stage in zip(doc.stages, stages):
        _check_files(raw, stage, where)
    if stages[-1].ops[1] > doc.model.ops:
        raise PlanError(f"{where}: stages end at op {stages[-1].ops[1]} but the model has "
                        f"{doc.model.ops} ops; {_FIX}")
    p = doc.predicted
    return Plan(
        path=path,
        board=doc.board.name,
        model_file=doc.model.file,
        model_sha256=doc.model.sha256,
        stages=tuple(stages),
        rnn_ms=doc.rnn_ms,
        rnn_steps_per_frame=doc.rnn_steps_per_frame,
        board_version=doc.board.version,
        model_ops=doc.model.ops,
        sram_bytes=doc.sram_bytes,
        predicted=None if p is None else Prediction(p.fps, p.latency_ms, p.bottleneck_ms,
                                                    p.bottleneck_stage),
        board_tpus=doc.board.tpus,
        buses=tuple(Bus(b.name, b.bytes_per_s) for b in doc.buses),
        cpu_frame=None if doc.cpu_frame is None else CpuFrame(doc.cpu_frame.preprocess_ms,
                                                              doc.cpu_frame.handoff_ms),
    )


def _stage(raw: _StageDoc, position: int, base: Path, where: str) -> Stage:
    here = f"{where}: stages[{position}]"
    if raw.index != position:
        raise PlanError(f"{here}: index is {raw.index!r}, expected {position}")
    try:
        spec = parse_device(raw.device)
    except EdgecapError as exc:
        raise PlanError(f"{here}: {exc}") from None
    if not raw.ops[0] <= raw.ops[1]:
        raise PlanError(f"{here}: ops must be [start, end) with 0 <= start <= end, got {list(raw.ops)}")
    empty = raw.ops[0] == raw.ops[1]
    if empty and raw.segment is not None:
        raise PlanError(f"{here}: an empty stage (ops {list(raw.ops)}) must have segment null")
    if not empty and raw.segment is None:
        raise PlanError(f"{here}: segment must name the stage's .tflite file")
    edgetpu = raw.edgetpu
    report = None if edgetpu is None else EdgeTpuReport(
        compiled=edgetpu.compiled, compiled_segment=edgetpu.compiled_segment,
        reason=edgetpu.reason, on_chip_bytes=edgetpu.on_chip_bytes,
        off_chip_bytes=edgetpu.off_chip_bytes,
        cpu_ops=[msgspec.structs.asdict(o) for o in edgetpu.cpu_ops], log=edgetpu.log,
        cpu_ops_ms=edgetpu.cpu_ops_ms)
    compiled = None
    if edgetpu is not None and edgetpu.compiled:
        if edgetpu.compiled_segment is None:
            raise PlanError(f"{here}: edgetpu: compiled_segment must name the compiled file")
        compiled = _inside(base, edgetpu.compiled_segment, f"{here}: edgetpu")
    return Stage(
        index=position,
        spec=spec,
        segment=None if empty else _inside(base, raw.segment, here),
        ops=(raw.ops[0], raw.ops[1]),
        inputs=tuple(_tensor(t) for t in raw.inputs),
        outputs=tuple(_tensor(t) for t in raw.outputs),
        predicted_ms=raw.predicted_ms,
        compiled_segment=compiled,
        param_bytes=ParamBytes(raw.param_bytes.on_chip, raw.param_bytes.streamed),
        macs=raw.macs,
        edgetpu=report,
        cost=_cost(raw.cost),
        share=1.0 if raw.share is None else raw.share,
        replicas=_replicas(raw, spec, empty, here),
    )


def _cost(doc: Optional[_CostDoc]) -> Optional[CostParts]:
    return None if doc is None else CostParts(doc.compute_ms, doc.invoke_ms, doc.link_bytes, doc.link_bytes_per_s,
                                              doc.extra_ms, doc.link, doc.bus)


def _cost_doc(cost: Optional[CostParts]) -> Optional[_CostDoc]:
    return None if cost is None else _CostDoc(cost.compute_ms, cost.invoke_ms, cost.link_bytes,
                                              cost.link_bytes_per_s, cost.extra_ms, cost.link, cost.bus)


def _replicas(raw: _StageDoc, spec: DeviceSpec, empty: bool, here: str) -> Tuple[Replica, ...]:
    """A stage's other copies, checked: distinct devices, shares that add up to 1."""
    if not raw.replicas:
        if raw.share is not None and abs(raw.share - 1.0) > SHARE_TOLERANCE:
            raise PlanError(f"{here}: share is {raw.share!r} but the stage has no replicas; "
                            "a stage run on one device takes every frame (share 1 or absent)")
        return ()
    if empty:
        raise PlanError(f"{here}: an empty stage has no replicas; {_FIX}")
    if raw.share is None:
        raise PlanError(f"{here}: a stage with replicas needs its own share of the frames; {_FIX}")
    out = []
    seen = {spec}
    for i, r in enumerate(raw.replicas):
        try:
            copy = parse_device(r.device)
        except EdgecapError as exc:
            raise PlanError(f"{here}: replicas[{i}]: {exc}") from None
        if copy in seen:
            raise PlanError(f"{here}: replicas[{i}] runs on {copy}, which already runs the stage; "
                            f"one copy per device, {_FIX}")
        seen.add(copy)
        out.append(Replica(copy, r.share, r.predicted_ms, _cost(r.cost)))
    total = raw.share + sum(r.share for r in out)
    if not math.isclose(total, 1.0, abs_tol=SHARE_TOLERANCE * len(seen)):
        raise PlanError(f"{here}: the copies' shares add up to {total:.6g}, not 1; {_FIX}")
    return tuple(out)


def _to_doc(plan: Plan, base: Path) -> _PlanDoc:
    def name(p: Optional[Path]) -> Optional[str]:
        if p is None:
            return None
        rel = os.path.relpath(p, base)
        if rel.startswith(".."):
            raise PlanError(f"{p}: segment outside {base}; write segments beside plan.json")
        return Path(rel).as_posix()

    stages = []
    for s in plan.stages:
        e = s.edgetpu
        segment = None if s.segment is None else _fingerprint(s.segment)
        compiled = None if s.compiled_segment is None else _fingerprint(s.compiled_segment)
        stages.append(_StageDoc(
            index=s.index, device=s.device, segment=name(s.segment), ops=s.ops,
            inputs=tuple(_tensor_doc(t, f"stage {s.index}") for t in s.inputs),
            outputs=tuple(_tensor_doc(t, f"stage {s.index}") for t in s.outputs),
            param_bytes=_ParamBytesDoc(s.param_bytes.on_chip, s.param_bytes.streamed),
            macs=s.macs, predicted_ms=s.predicted_ms,
            edgetpu=None if e is None else _EdgeTpuDoc(
                e.compiled, e.compiled_segment, e.reason, e.on_chip_bytes, e.off_chip_bytes,
                [_CpuOpDoc(**o) for o in e.cpu_ops], e.log, e.cpu_ops_ms,
                None if compiled is None else compiled[0]),
            segment_sha256=None if segment is None else segment[0],
            segment_bytes=None if segment is None else segment[1],
            cost=_cost_doc(s.cost),
            share=s.share if s.replicas else None,
            replicas=tuple(_ReplicaDoc(r.device, r.share, r.predicted_ms, _cost_doc(r.cost))
                           for r in s.replicas),
        ))
    p = plan.predicted
    return _PlanDoc(
        plan_version=PLAN_VERSION,
        model=_ModelDoc(plan.model_file, plan.model_sha256, plan.model_ops),
        board=_BoardDoc(plan.board, plan.board_version, plan.board_tpus),
        stages=tuple(stages),
        sram_bytes=plan.sram_bytes,
        rnn_ms=plan.rnn_ms,
        rnn_steps_per_frame=plan.rnn_steps_per_frame,
        predicted=None if p is None else _PredictedDoc(p.fps, p.latency_ms, p.bottleneck_ms,
                                                       p.bottleneck_stage),
        buses=tuple(_BusDoc(b.name, b.bytes_per_s) for b in plan.buses),
        cpu_frame=None if plan.cpu_frame is None else _CpuFrameDoc(plan.cpu_frame.preprocess_ms,
                                                                   plan.cpu_frame.handoff_ms),
    )


def _inside(base: Path, name: str, where: str) -> Path:
    why = unusable_name(name)
    if why is not None:
        raise PlanError(f"{where}: segment {quote_name(name)} is not a usable file name ({why}); {_FIX}")
    resolved = resolve_inside(base, name)
    if resolved is None:
        raise PlanError(f"{where}: {name!r} resolves outside the plan directory; keep segments beside plan.json")
    if resolved.is_dir():
        raise PlanError(f"{where}: segment {name!r} is a directory, not a .tflite file; {_FIX}")
    if resolved.exists() and not resolved.is_file():  # never opened: a FIFO would block, a device never end
        raise PlanError(f"{where}: segment {name!r} is a FIFO, device or socket, not a .tflite file; {_FIX}")
    if not resolved.is_file():
        raise PlanError(f"{where}: segment {name!r} not found beside plan.json; {_FIX}")
    return resolved


def _fingerprint(path: Path) -> Tuple[str, int]:
    """``(sha256, size)`` of a segment file, for plan.json (write_plan)."""
    data = files.read_bytes(path, what="segment", fix=_FIX, error=PlanError, kind="model")
    return hashlib.sha256(data).hexdigest(), len(data)


def check_segments(plan: Plan) -> None:
    """Reads every segment file of a plan built in memory and checks it against its stage.

    ``load_plan`` does this (and more: recorded hashes) for a plan read from a
    file; a caller handed a ``Plan`` object calls this before any worker opens
    a segment, so a bad file is one line there rather than a worker's failure.

    Raises:
      PlanError: If a segment is unreadable, not a whole TFLite flatbuffer, or
        its boundary tensors are not the stage's.
    """
    for stage in plan.stages:
        _check_files(None, stage, str(plan.path or "plan"))


def _check_files(raw: Optional[_StageDoc], stage: Stage, where: str) -> None:
    """Reads a stage's segment files and checks them against plan.json, before any worker opens one."""
    here = f"{where}: stages[{stage.index}]"
    fix = "re-run `edgecap compile` to rewrite the plan's segments"
    recorded = (None, None) if raw is None else (raw.segment_sha256, raw.segment_bytes)
    compiled_sha = None if raw is None or raw.edgetpu is None else raw.edgetpu.compiled_sha256
    for path, (sha, size) in ((stage.segment, recorded), (stage.compiled_segment, (compiled_sha, None))):
        if path is None:
            continue
        data = files.read_bytes(path, what="segment", fix=fix, error=PlanError, kind="model")
        if size is not None and len(data) != size:
            raise PlanError(f"{here}: {path.name} has {len(data)} bytes, plan.json recorded {size}: "
                            f"the file changed since the plan was written; {fix}")
        if sha is not None and hashlib.sha256(data).hexdigest() != sha:
            raise PlanError(f"{here}: {path.name} is not the file plan.json was written with "
                            f"(sha256 differs); {fix}")
        info = verify_tflite(data, str(path), error=PlanError, fix=fix)
        if path == stage.segment:
            _check_segment_io(info, stage, here, fix)


def _check_segment_io(info: ModelInfo, stage: Stage, here: str, fix: str) -> None:
    # The rule edgecap.stages applies to the interpreter's tensors, read here
    # from the flatbuffer, so a segment that does not fit fails before any work.
    name = stage.segment.name if stage.segment else "segment"
    for kind, tensors, specs in (("input", info.inputs, stage.inputs), ("output", info.outputs, stage.outputs)):
        by_name = {t.name: t for t in specs}
        for t in tensors:
            spec = by_name.get(t.name)
            if spec is None and kind == "input":
                raise PlanError(f"{here}: {name} reads {t.name!r}, which the stage's inputs do not "
                                f"list: the segment does not match plan.json; {fix}")
            if spec is not None and (t.shape, t.dtype) != (spec.shape, spec.dtype):
                raise PlanError(f"{here}: {name} {kind} {t.name!r} is {t.dtype}{list(t.shape)}, "
                                f"plan.json says {spec.dtype}{list(spec.shape)}; {fix}")
    computed = {t.name for t in info.outputs} | {t.name for t in stage.inputs}
    missing = [t.name for t in stage.outputs if t.name not in computed]
    if missing:
        raise PlanError(f"{here}: {name} does not output {', '.join(map(repr, missing))}: the segment does not "
                        f"match plan.json; {fix}")


def _check_tpus(stages: List[Stage], board: _BoardDoc, where: str) -> None:
    limit = MAX_TPUS if board.tpus is None else board.tpus
    for s in (c for stage in stages for c in stage.copies):
        off_tpu = [t for t in (*s.inputs, *s.outputs) if t.dtype in ("float32", "int64")]
        # A compiled segment may read or write floats (or ARG_MAX's int64) through the ops
        # edgetpu_compiler left on the CPU.
        on_cpu = s.edgetpu is not None and s.edgetpu.compiled and s.edgetpu.cpu_ops
        if s.spec.kind != "cpu" and not s.empty and off_tpu and not on_cpu:
            t = off_tpu[0]
            raise PlanError(f"{where}: stages[{s.index}] on {s.device} has {t.dtype} tensor {t.name!r}: "
                            "an EdgeTPU runs only int8-quantized segments; compile a full-integer "
                            "(int8) model with `edgecap compile`")
        index = s.spec.index
        if s.spec.kind != "cpu" and index is not None and index >= limit:
            has = (f"board {board.name!r} has {limit} EdgeTPU(s)" if board.tpus is not None
                   else f"no board has more than {MAX_TPUS} EdgeTPUs")
            raise PlanError(f"{where}: stages[{s.index}] runs on {s.device}, but {has}; "
                            f"name a device the board has, or {_FIX}")


def _check_order(stages: List[Stage], where: str) -> None:
    # Pipeline order is TPUs first, then the CPU tail: the tail also runs the
    # RNN step, so nothing may follow it.
    if any(s.spec.kind == "cpu" for s in stages[:-1]):
        raise PlanError(f"{where}: only the last stage may run on the cpu; stages are tpu:0..tpu:N-1 then cpu")
    seen: Dict[DeviceSpec, int] = {}
    for s in stages:
        if s.spec in seen:
            raise PlanError(f"{where}: stages[{seen[s.spec]}] and stages[{s.index}] both run on "
                            f"{s.device}; one stage per device, {_FIX}")
        seen[s.spec] = s.index
    _check_replicas(stages, seen, where)
    for prev, cur in zip(stages, stages[1:]):
        if cur.ops[0] != prev.ops[1]:
            raise PlanError(
                f"{where}: stages[{cur.index}] starts at op {cur.ops[0]} but stages[{prev.index}] "
                f"ends at {prev.ops[1]}; stage op ranges must be contiguous"
            )
    if all(s.empty for s in stages):
        raise PlanError(f"{where}: every stage is empty; a plan must run the model's operators")


def _check_replicas(stages: List[Stage], seen: Dict[DeviceSpec, int], where: str) -> None:
    # A replica's device has no stage of its own; the CPU takes whole frames only:
    # a copy of the whole model beside an empty CPU stage (it runs the RNN besides).
    for s in stages:
        for r in s.replicas:
            other = seen.get(r.spec)
            if r.spec.kind == "cpu":
                cpu = stages[-1]
                whole = s.ops[0] == 0 and all(t.empty for t in stages if t is not s)
                if cpu.spec.kind != "cpu" or not whole:
                    raise PlanError(f"{where}: stages[{s.index}] has a copy on the cpu, which takes whole "
                                    "frames only: a copy of the whole model beside an empty cpu stage; "
                                    f"{_FIX}")
            elif other is not None:
                raise PlanError(f"{where}: stages[{s.index}] has a copy on {r.spec}, which runs "
                                f"stages[{other}]; one stage per device, {_FIX}")


def _check_chain(stages: List[Stage], where: str) -> None:
    active = [s for s in stages if not s.empty]
    for prev, cur in zip(active, active[1:]):
        available = {t.name: t for t in prev.outputs}
        missing = [t.name for t in cur.inputs if t.name not in available]
        if missing:
            raise PlanError(
                f"{where}: stages[{cur.index}] reads {', '.join(map(repr, missing))} which stages[{prev.index}] "
                "does not output; boundary tensors must keep their names"
            )
        for t in cur.inputs:
            wrote = available[t.name]
            if (t.shape, t.dtype, t.quantization) != (wrote.shape, wrote.dtype, wrote.quantization):
                raise PlanError(
                    f"{where}: stages[{cur.index}] reads {t.name!r} as {t.dtype}{list(t.shape)} scale {t.scale:g} "
                    f"zero point {t.zero_point}, stages[{prev.index}] writes {wrote.dtype}{list(wrote.shape)} "
                    f"scale {wrote.scale:g} zero point {wrote.zero_point}; {_FIX}")
