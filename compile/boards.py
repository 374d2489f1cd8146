"""Board profiles: the devices of a board and their cost coefficients, read from JSON files.

The shipped profiles live in ``boards/<name>.json``; each figure's source is in
the file's ``sources``. A calibration file (``edgecap calibrate``) replaces the
coefficients of one device.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Union

from edgecap_compile.errors import CompileError

BOARDS_DIR = Path(__file__).parent / "boards"

COEFFICIENTS = ("macs_per_s", "elements_per_s", "op_overhead_ms", "invoke_overhead_ms",
                "link_bytes_per_s")


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
      sram_bytes: On-chip parameter cache; None for the CPU (no limit).
      cores: CPU cores (CPU only).
      link: Link kind, e.g. ``pcie`` or ``usb3`` (TPU only).
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

    @property
    def is_tpu(self) -> bool:
        return self.name.startswith("tpu:")


@dataclass(frozen=True)
class Board:
    """A board profile.

    Attributes:
      name: Profile name, e.g. ``devboard-usb``.
      version: Profile version, recorded in plan.json.
      description: What the board is.
      cpu: The CPU.
      tpus: The EdgeTPUs in pipeline order (``tpu:0`` first).
      sources: Where each figure comes from, keyed by field path.
    """

    name: str
    version: int
    description: str
    cpu: Device
    tpus: List[Device]
    sources: Dict[str, str]

    def with_tpus(self, count: int) -> "Board":
        """Returns the board with ``count`` TPUs; TPUs beyond the profile copy its last TPU.

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
        """Returns the board with every TPU's SRAM budget set to ``sram_bytes``.

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


def _device(name: str, fields: dict, label: str) -> Device:
    try:
        device = Device(
            name=name,
            macs_per_s=float(fields["macs_per_s"]),
            elements_per_s=float(fields["elements_per_s"]),
            op_overhead_ms=float(fields["op_overhead_ms"]),
            invoke_overhead_ms=float(fields["invoke_overhead_ms"]),
            link_bytes_per_s=(float(fields["link_bytes_per_s"])
                              if name != "cpu" else None),
            sram_bytes=int(fields["sram_bytes"]) if name != "cpu" else None,
            cores=int(fields["cores"]) if name == "cpu" else None,
            link=fields.get("link"),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise CompileError(f"board profile {label}: device {name} lacks or mistypes {e}") from None
    rates = [device.macs_per_s, device.elements_per_s] + (
        [device.link_bytes_per_s] if device.is_tpu else [])
    if not all(r > 0 and math.isfinite(r) for r in rates):
        raise CompileError(f"board profile {label}: device {name} needs positive finite rates")
    if device.is_tpu and device.sram_bytes <= 0:
        raise CompileError(f"board profile {label}: {name} sram_bytes must be > 0")
    return device


def load_board(name_or_path: Union[str, os.PathLike]) -> Board:
    """Loads a board profile by shipped name or from a JSON file.

    Args:
      name_or_path: ``devboard``, ``devboard-usb``, ``rpi4-2usb``, ``host``, or a path.

    Returns:
      The board.

    Raises:
      CompileError: If the name is unknown or the file is unreadable or malformed.
    """
    text = os.fspath(name_or_path)
    path = Path(text) if text.endswith(".json") else BOARDS_DIR / f"{text}.json"
    if not path.is_file():
        raise CompileError(
            f"unknown board '{text}'; choose one of {', '.join(board_names())} "
            "or pass a profile .json file")
    try:
        data = json.loads(path.read_text())
        cpu = _device("cpu", data["cpu"], text)
        tpus = [_device(f"tpu:{i}", t, text) for i, t in enumerate(data.get("tpus", []))]
        return Board(str(data["name"]), int(data["version"]), str(data.get("description", "")),
                     cpu, tpus, dict(data.get("sources", {})))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CompileError(f"board profile {path} is unreadable or malformed: {e}") from None
