"""Board profiles: the devices of a board and their cost coefficients, read from JSON files.

The shipped profiles live in ``boards/<name>.json``; each figure's source is in
the file's ``sources``. A calibration file (``edgecap calibrate``) replaces the
coefficients of one device. A profile is read through ``edgecap.schema``: the
types below refuse a missing, unknown or mistyped field and a rate that is not
a positive finite number, in one line naming the file and the field. Each TPU
names its link kind (``edgecap/data/links.json``), and a profile may declare a
bus several TPU links share; no link or bus rate may exceed its kind's
physical line rate.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Dict, List, Optional, Sequence, Tuple, Union

import msgspec
import numpy as np

from edgecap import schema
from edgecap.links import LinkKind, link_kinds
from edgecap.plans.plan import Bus
from edgecap_compile.errors import CompileError

BOARDS_DIR = Path(__file__).parent / "boards"

# The cost model's one formula is ``ms = features . coefficients``. Each row
# pairs a work feature of an op range with the Device field that prices it: a
# ``*_per_s`` rate costs 1e3 / rate ms per unit, a ``*_ms`` field is ms per unit.
PRICES = (("macs", "macs_per_s"), ("elements", "elements_per_s"), ("ops", "op_overhead_ms"),
          ("invokes", "invoke_overhead_ms"), ("link_bytes", "link_bytes_per_s"),
          ("memory_bytes", "memory_bytes_per_s"))


@dataclass(frozen=True)
class Device:
    """One compute device of a board and its cost coefficients.

    Attributes:
      name: ``cpu`` or ``tpu:N``.
      macs_per_s: Multiply-accumulates per second.
      elements_per_s: Element operations per second.
      op_overhead_ms: Fixed cost of each operator.
      invoke_overhead_ms: Fixed cost of each invoke of a non-empty stage.
      link_bytes_per_s: Host link bandwidth for tensors and streamed parameters;
        None for the CPU, which shares host memory.
      sram_bytes: Parameter bytes the cost model caches on chip: the profile's
        ``sram_usable_bytes`` (the SRAM edgetpu_compiler really fills, counted in
        the .tflite's own parameter bytes), or ``--sram``; None for the CPU.
      cores: CPU cores (CPU only).
      link: Link kind, e.g. ``pcie`` or ``usb3`` (TPU only).
      memory_bytes_per_s: Sustained memory bandwidth the CPU's ops pay for the
        parameter and activation bytes they move; None charges nothing (TPUs,
        and CPUs whose profile gives no figure).
      cache_bytes: The CPU's last-level cache: an op range whose bytes fit in it
        stays cached from invoke to invoke and pays no memory traffic; None
        charges every range.
      bus: Name of the shared bus the link sits behind (``Board.buses``), or None.
      frame_ms: The CPU's fixed work a frame whatever the plan: the Python
        calls of preprocessing (CPU only; 0: none modelled).
      frame_elements_per_s: The rate preprocessing prepares the encoder's input
        elements at (resize, quantising lookup, channel swap); None: free.
      handoff_ms: The CPU's work to hand a frame from one stage to the next
        (a queue's put and get, the Python around an invoke), once per stage.
    """

    name: str
    macs_per_s: float
    elements_per_s: float
    op_overhead_ms: float
    invoke_overhead_ms: float
    link_bytes_per_s: Optional[float] = None
    sram_bytes: Optional[int] = None
    cores: Optional[int] = None
    link: Optional[str] = None
    bus: Optional[str] = None
    memory_bytes_per_s: Optional[float] = None
    cache_bytes: Optional[int] = None
    frame_ms: float = 0.0
    frame_elements_per_s: Optional[float] = None
    handoff_ms: float = 0.0

    @property
    def is_tpu(self) -> bool:
        return self.name.startswith("tpu:")

    def coefficients(self) -> np.ndarray:
        """Returns the milliseconds per unit of each work feature, in ``PRICES`` order.

        A device without a link (the CPU) charges nothing per link byte, one
        without a memory bandwidth nothing per memory byte.
        """
        out = []
        for _, field in PRICES:
            value = getattr(self, field)
            if field.endswith("_per_s"):
                out.append(0.0 if value is None else 1e3 / value)
            else:
                out.append(float(value))
        return np.array(out)

    def with_coefficients(self, coefficients: Sequence[float]) -> "Device":
        """Returns the device with its fields set from milliseconds per unit, in ``PRICES`` order.

        The inverse of ``coefficients``; a device without a link (or memory
        bandwidth) keeps none.
        """
        fields = {}
        for (_, field), c in zip(PRICES, coefficients):
            if field.endswith("_per_s"):
                if getattr(self, field) is not None:
                    fields[field] = 1e3 / float(c)
            else:
                fields[field] = float(c)
        return dataclasses.replace(self, **fields)


@dataclass(frozen=True)
class Board:
    """A board profile.

    Attributes:
      name: Profile name, e.g. ``devboard-usb``.
      version: Profile version, recorded in plan.json.
      description: What the board is.
      cpu: The CPU.
      tpus: The EdgeTPUs in the profile's order (``tpu:0`` first); a plan may
        run them along the chain in another order.
      sources: Where each figure comes from, keyed by field path.
      buses: Buses several TPU links share (each TPU's ``bus`` names one).
      replicas: Whether plans for it may run a stage as copies on several
        devices (``edgecap_compile.schedules``); False: pipelines only, one
        device per stage (a profile's ``"replicas": false``).
    """

    name: str
    version: int
    description: str
    cpu: Device
    tpus: List[Device]
    sources: Dict[str, str]
    buses: Tuple[Bus, ...] = ()
    replicas: bool = True

    def with_tpus(self, count: int) -> "Board":
        """Returns the board with ``count`` TPUs; TPUs beyond the profile copy its last TPU.

        A copy keeps the last TPU's link and bus (another accelerator on the same hub).

        Raises:
          CompileError: If ``count`` is negative, or positive on a board with no TPU.
        """
        if count < 0:
            raise CompileError(f"--tpus must be >= 0 (got {count})")
        if count > len(self.tpus) and not self.tpus:
            raise CompileError(
                f"board {self.name} has no EdgeTPU to copy for --tpus {count}; pick a board "
                "with TPUs (devboard, devboard-usb, rpi4-2usb)")
        tpus = [dataclasses.replace(self.tpus[min(i, len(self.tpus) - 1)], name=f"tpu:{i}")
                for i in range(count)]
        return dataclasses.replace(self, tpus=tpus)

    def with_sram(self, sram_bytes: int) -> "Board":
        """Returns the board with every TPU's usable SRAM budget set to ``sram_bytes``.

        Raises:
          CompileError: If ``sram_bytes`` is not positive.
        """
        if sram_bytes <= 0:
            raise CompileError(f"--sram must be a positive number of bytes (got {sram_bytes})")
        tpus = [dataclasses.replace(t, sram_bytes=int(sram_bytes)) for t in self.tpus]
        return dataclasses.replace(self, tpus=tpus)

    def with_device(self, device: Device) -> "Board":
        """Returns the board with the CPU or the TPU of the same name replaced by ``device``."""
        if device.name == "cpu":
            return dataclasses.replace(self, cpu=device)
        return dataclasses.replace(
            self, tpus=[device if t.name == device.name else t for t in self.tpus])


def board_names() -> List[str]:
    """Returns the names of the shipped board profiles."""
    return sorted(p.stem for p in BOARDS_DIR.glob("*.json"))


class _CpuFile(msgspec.Struct, forbid_unknown_fields=True):
    cores: schema.Positive
    macs_per_s: schema.Rate
    elements_per_s: schema.Rate
    op_overhead_ms: schema.Millis
    invoke_overhead_ms: schema.Millis
    memory_bytes_per_s: Optional[schema.Rate] = None
    cache_bytes: Optional[Annotated[int, msgspec.Meta(ge=1, le=schema.MAX_BYTES)]] = None
    # The CPU's own work a frame, whatever the plan (absent: none modelled).
    frame_ms: schema.Millis = 0.0
    frame_elements_per_s: Optional[schema.Rate] = None
    handoff_ms: schema.Millis = 0.0


class _TpuFile(msgspec.Struct, forbid_unknown_fields=True):
    # The physical SRAM, and the part of it the cost model counts on (default: all).
    sram_bytes: Annotated[int, msgspec.Meta(ge=1, le=schema.MAX_BYTES)]
    macs_per_s: schema.Rate
    elements_per_s: schema.Rate
    op_overhead_ms: schema.Millis
    invoke_overhead_ms: schema.Millis
    link_bytes_per_s: schema.Rate
    link: Optional[schema.Name] = None
    sram_usable_bytes: Optional[Annotated[int, msgspec.Meta(ge=1, le=schema.MAX_BYTES)]] = None


class _BusFile(msgspec.Struct, forbid_unknown_fields=True):
    name: schema.Name
    # The link kind of the shared upstream lane: its line rate bounds bytes_per_s.
    link: schema.Name
    bytes_per_s: schema.Rate
    # Indices into the profile's tpus.
    tpus: List[schema.Count]


class _BoardFile(msgspec.Struct, forbid_unknown_fields=True):
    name: schema.Name
    version: schema.Positive
    cpu: _CpuFile
    description: str = ""
    tpus: List[_TpuFile] = []
    buses: List[_BusFile] = []
    # Where each figure comes from, keyed by field path ("cpu.macs_per_s", "tpus[1]").
    sources: Dict[str, str] = {}
    # False: plans run each stage on one device (no copies of a stage on several).
    replicas: bool = True


def _usable(tpu: _TpuFile, path: Path, index: int) -> int:
    if tpu.sram_usable_bytes is None:
        return tpu.sram_bytes
    if tpu.sram_usable_bytes > tpu.sram_bytes:
        raise CompileError(f"{path}: tpus[{index}].sram_usable_bytes {tpu.sram_usable_bytes} "
                           f"exceeds sram_bytes {tpu.sram_bytes}; the usable part of the SRAM "
                           "cannot be larger than the SRAM")
    return tpu.sram_usable_bytes


def _line_rate(kinds: Dict[str, LinkKind], kind: str, path: Path, field: str) -> float:
    if kind not in kinds:
        raise CompileError(f"{path}: {field} '{kind}' is not a link kind; use one of "
                           f"{', '.join(kinds)} (edgecap/data/links.json)")
    return kinds[kind].line_bytes_per_s


def _check_rate(rate: float, kinds: Dict[str, LinkKind], kind: str, path: Path,
                field: str) -> None:
    # A fitted or assumed rate above the physical line rate is a wrong figure.
    line = _line_rate(kinds, kind, path, f"{field.rsplit('.', 1)[0]}.link")
    if rate > line:
        raise CompileError(f"{path}: {field} {rate:g} exceeds the {kind} line rate "
                           f"{line:g} bytes/s (edgecap/data/links.json links.{kind}.source); "
                           "lower it to at most the line rate")


def _bus_of(doc: _BoardFile, path: Path, kinds: Dict[str, LinkKind]) -> Dict[int, str]:
    # TPU index -> the bus its link sits behind, every figure checked.
    if len(doc.buses) > 1:
        raise CompileError(f"{path}: buses lists {len(doc.buses)} buses; the partitioner models "
                           "one shared bus per board: keep the one that binds")
    out: Dict[int, str] = {}
    for j, bus in enumerate(doc.buses):
        _check_rate(bus.bytes_per_s, kinds, bus.link, path, f"buses[{j}].bytes_per_s")
        if not bus.tpus:
            raise CompileError(f"{path}: buses[{j}].tpus is empty; list the TPUs behind the bus")
        for i in bus.tpus:
            if i >= len(doc.tpus) or i in out:
                raise CompileError(f"{path}: buses[{j}].tpus names TPU {i} "
                                   + ("twice" if i in out else f"but the profile has "
                                      f"{len(doc.tpus)}")
                                   + "; list each of the profile's TPU indices once")
            out[i] = bus.name
    return out


def load_board(name_or_path: Union[str, os.PathLike]) -> Board:
    """Loads a board profile by shipped name or from a JSON file.

    Args:
      name_or_path: ``devboard``, ``devboard-usb``, ``rpi4-2usb``, ``host``, or a path.

    Returns:
      The board.

    Raises:
      CompileError: If the name is unknown, or the file is unreadable or malformed
        (a missing, unknown or mistyped field, a rate that is not positive and
        finite, an unknown link kind, a link or bus rate above its line rate,
        a bus naming a TPU the profile lacks): one line naming the file and the field.
    """
    text = os.fspath(name_or_path)
    path = Path(text) if text.endswith(".json") else BOARDS_DIR / f"{text}.json"
    if not path.exists():
        raise CompileError(
            f"unknown board '{text}'; choose one of {', '.join(board_names())} "
            "or pass a profile .json file")
    doc = schema.read_file(path, _BoardFile, error=CompileError, what="board profile",
                           fix="fix the board profile (fields: docs/compiler.md, examples: "
                               "compile/boards/*.json)")
    kinds = link_kinds()
    for i, t in enumerate(doc.tpus):
        if t.link is not None:
            _check_rate(t.link_bytes_per_s, kinds, t.link, path, f"tpus[{i}].link_bytes_per_s")
    bus_of = _bus_of(doc, path, kinds)
    c = doc.cpu
    cpu = Device("cpu", c.macs_per_s, c.elements_per_s, c.op_overhead_ms, c.invoke_overhead_ms,
                 cores=c.cores, memory_bytes_per_s=c.memory_bytes_per_s,
                 cache_bytes=c.cache_bytes, frame_ms=c.frame_ms,
                 frame_elements_per_s=c.frame_elements_per_s, handoff_ms=c.handoff_ms)
    tpus = [Device(f"tpu:{i}", t.macs_per_s, t.elements_per_s, t.op_overhead_ms,
                   t.invoke_overhead_ms, link_bytes_per_s=t.link_bytes_per_s,
                   sram_bytes=_usable(t, path, i), link=t.link, bus=bus_of.get(i))
            for i, t in enumerate(doc.tpus)]
    return Board(doc.name, doc.version, doc.description, cpu, tpus, dict(doc.sources),
                 tuple(Bus(b.name, b.bytes_per_s) for b in doc.buses), doc.replicas)
