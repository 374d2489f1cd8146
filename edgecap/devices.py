"""Devices a plan stage runs on: the CPU, Coral EdgeTPUs, and emulated EdgeTPUs.

Device strings are the ones Coral users write:

* ``cpu`` (``cpu:N`` names a further CPU worker thread),
* ``tpu:N``, and pycoral's ``:N``, ``usb``, ``usb:N``, ``pci``, ``pci:N``,
* ``emu-tpu:N``: runs its segment on the CPU (outputs exact) and paces every
  invoke to the stage's ``predicted_ms``, so a pipeline behaves as on the
  board; in timing-only mode it computes nothing and outputs zeros.

``open_stage`` returns a callable from the tensors named in the plan to the
tensors the stage outputs. Call it in the thread that will run the stage,
which then owns its interpreter.
"""

from __future__ import annotations

import ctypes
import glob
import os
import platform
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import psutil

from edgecap import interpreter
from edgecap.errors import ConfigError, EdgecapError, PlanError

if TYPE_CHECKING:
    from edgecap.plan import Stage, TensorSpec

EDGETPU_LIBRARY = "libedgetpu.so.1"
# Coral USB Accelerator: Global Unichip before the runtime loads its firmware, Google after.
CORAL_USB_IDS = (("1a6e", "089a"), ("18d1", "9302"))
_SYSFS_USB = "/sys/bus/usb/devices"
_APEX_DEVICES = "/dev/apex_*"
_APEX_TEMP = "/sys/class/apex/apex_{}/temp"

_PR_SET_TIMERSLACK = 29  # linux/prctl.h

_DEVICE_RE = re.compile(r"^(?:(cpu|tpu|emu-tpu|usb|pci)(?::(\d+))?|:(\d+))$")

Tensors = Dict[str, np.ndarray]


@dataclass(frozen=True)
class DeviceSpec:
    """A parsed device string.

    ``kind`` is ``cpu``, ``tpu`` or ``emu-tpu``; ``bus`` is ``usb`` or ``pci``
    when the user named one; ``index`` is N, or None for "the first".
    """

    kind: str
    index: Optional[int] = None
    bus: Optional[str] = None

    def __str__(self) -> str:
        name = self.bus or self.kind
        return name if self.index is None else f"{name}:{self.index}"

    @property
    def delegate_option(self) -> str:
        """The ``device`` option libedgetpu's delegate takes for this device."""
        if self.kind != "tpu":
            raise ValueError(f"{self} is not an EdgeTPU")
        if self.bus is not None:
            return str(self)
        return "" if self.index is None else f":{self.index}"


@dataclass(frozen=True)
class DeviceInfo:
    """One device present on this machine, as ``edgecap devices`` lists it."""

    device: str
    kind: str
    path: str
    runtime: str
    temperature_c: Optional[float] = None


def parse_device(text: str) -> DeviceSpec:
    """Parses a device string as Coral users write it.

    Args:
      text: E.g. ``cpu``, ``tpu:1``, ``:0``, ``usb``, ``pci:0``, ``emu-tpu:1``.

    Returns:
      The ``DeviceSpec``.

    Raises:
      ConfigError: If the string is not a device string.
    """
    m = _DEVICE_RE.match(text.strip().lower()) if isinstance(text, str) else None
    if m is None:
        raise ConfigError(
            f"device {text!r} not understood; use cpu, tpu:N, :N, usb[:N], pci[:N] or emu-tpu:N"
        )
    name, index, bare_index = m.groups()
    if bare_index is not None:
        return DeviceSpec("tpu", int(bare_index))
    idx = None if index is None else int(index)
    if name in ("usb", "pci"):
        return DeviceSpec("tpu", idx, bus=name)
    if name == "tpu" and idx is None:
        idx = 0
    return DeviceSpec(name, idx)


class Segment:
    """A model segment opened on a device: maps input tensors to output tensors.

    Tensors are matched by name: the segment reads the inputs its model
    declares from the given mapping and returns what its model outputs.
    """

    def __call__(self, tensors: Tensors) -> Tensors:
        raise NotImplementedError


class InterpreterSegment(Segment):
    """A segment run by a TFLite interpreter (the CPU, or an EdgeTPU delegate)."""

    def __init__(self, interp: Any, stage: "Stage") -> None:
        """Wraps an allocated interpreter of ``stage``'s segment.

        Args:
          interp: The interpreter.
          stage: The plan stage it runs.

        Raises:
          PlanError: If the segment's inputs are not among the stage's inputs,
            or a stage output is neither computed by it nor forwarded, or a
            tensor's shape or dtype differs from the plan.
        """
        ins, outs = interp.get_input_details(), interp.get_output_details()
        _check_tensors(stage, "input", ins, stage.inputs)
        _check_tensors(stage, "output", outs, stage.outputs)
        computed = {d["name"] for d in outs} | {t.name for t in stage.inputs}
        missing = [t.name for t in stage.outputs if t.name not in computed]
        if missing:
            raise _segment_mismatch(stage, f"does not output {', '.join(missing)}")
        self._interp = interp
        self._inputs = [(d["name"], d["index"]) for d in ins]
        self._outputs = [(d["name"], d["index"]) for d in outs]

    def __call__(self, tensors: Tensors) -> Tensors:
        for name, index in self._inputs:
            self._interp.set_tensor(index, tensors[name])
        self._interp.invoke()
        return {name: self._interp.get_tensor(index) for name, index in self._outputs}


def _check_tensors(stage: "Stage", kind: str, details: Sequence[Dict[str, Any]],
                   specs: Sequence["TensorSpec"]) -> None:
    by_name = {t.name: t for t in specs}
    for d in details:
        spec = by_name.get(d["name"])
        has = (tuple(int(x) for x in d["shape"]), np.dtype(d["dtype"]).name)
        if spec is None and kind == "input":
            raise _segment_mismatch(stage, f"reads {d['name']}, which the plan's inputs do not list")
        if spec is not None and has != (spec.shape, spec.dtype):
            raise _segment_mismatch(
                stage, f"{kind} {d['name']} is {has[1]}{list(has[0])}, the plan says "
                f"{spec.dtype}{list(spec.shape)}"
            )


def _segment_mismatch(stage: "Stage", what: str) -> PlanError:
    return PlanError(
        f"stage {stage.index} ({stage.device}): segment {stage.segment.name} {what}; "
        "the segment files do not match plan.json, re-run `edgecap compile`"
    )


class ZeroSegment(Segment):
    """Timing-only stand-in for a segment: computes nothing, outputs zeros."""

    def __init__(self, outputs: Sequence["TensorSpec"]) -> None:
        self._zeros = {t.name: np.zeros(t.shape, dtype=t.dtype) for t in outputs}

    def __call__(self, tensors: Tensors) -> Tensors:
        return dict(self._zeros)


class Pacer:
    """Sleeps until deadlines, waking within microseconds of them.

    Create it in the thread that paces: on Linux it sets that thread's timer
    slack to 1 ns (``PR_SET_TIMERSLACK``; the default 50 us would make every
    paced invoke late by that much).
    """

    def __init__(self) -> None:
        if sys.platform.startswith("linux"):
            ctypes.CDLL(None).prctl(_PR_SET_TIMERSLACK, 1, 0, 0, 0)

    @staticmethod
    def wait_until(deadline: float) -> None:
        """Sleeps until ``time.perf_counter()`` reaches ``deadline``; returns at once if it has."""
        remaining = deadline - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)


class PacedSegment(Segment):
    """Runs a segment and then waits out the rest of its predicted time.

    The deadline is taken from the start of the invoke, so an invoke is never
    faster than ``ms``; when the computation itself is slower, no wait is added.
    Create it in the thread that runs it (see ``Pacer``).
    """

    def __init__(self, segment: Segment, ms: float) -> None:
        self._segment = segment
        self._seconds = ms / 1000.0
        self._pacer = Pacer()

    def __call__(self, tensors: Tensors) -> Tensors:
        deadline = time.perf_counter() + self._seconds
        out = self._segment(tensors)
        self._pacer.wait_until(deadline)
        return out


class StageRunner(Segment):
    """Runs one plan stage: its segment, plus the tensors that pass it by.

    Returns exactly the stage's ``outputs``: those the segment computes and
    those it forwards untouched for later stages (docs/plan.md).
    """

    def __init__(self, segment: Segment, outputs: Sequence["TensorSpec"]) -> None:
        self._segment = segment
        self._names = [t.name for t in outputs]

    def __call__(self, tensors: Tensors) -> Tensors:
        out = self._segment(tensors)
        return {name: out[name] if name in out else tensors[name] for name in self._names}


def open_stage(
    stage: "Stage",
    device: "str | DeviceSpec | None" = None,
    *,
    num_threads: int = 1,
    timing_only: bool = False,
    pace: bool = False,
) -> Segment:
    """Opens a plan stage on a device; call it in the thread that will run it.

    Args:
      stage: The plan stage (non-empty).
      device: Where to run it (default: the stage's own device). ``emu-tpu:N``
        paces every invoke to the stage's ``predicted_ms``.
      num_threads: CPU threads for the interpreter's kernels (XNNPACK).
      timing_only: Emulated (and paced) stages compute nothing and output zeros.
      pace: Pace the stage to ``predicted_ms`` whatever its device (board emulation).

    Returns:
      The stage as a ``Segment``: the tensors it reads in, its ``outputs`` out.

    Raises:
      ConfigError: If pacing is asked for and the stage has no ``predicted_ms``.
      PlanError: If the segment file does not match the stage, or a real
        EdgeTPU is to run a segment edgetpu_compiler did not compile.
      EdgecapError: If no EdgeTPU runtime or device can be opened.
    """
    spec = parse_device(device or stage.device) if not isinstance(device, DeviceSpec) else device
    paced = pace or spec.kind == "emu-tpu"
    if paced and stage.predicted_ms is None:
        raise ConfigError(
            f"stage {stage.index} on {spec}: pacing needs the stage's predicted_ms; "
            "use a plan from `edgecap compile`"
        )
    if timing_only and paced:
        segment: Segment = ZeroSegment(stage.outputs)
    elif spec.kind == "tpu":
        if stage.compiled_segment is None:
            # libedgetpu would run an uncompiled segment's every op on the CPU, silently.
            raise PlanError(
                f"stage {stage.index} on {spec}: {stage.segment.name} was not compiled by "
                "edgetpu_compiler; install it and re-run `edgecap compile`, or run on emu-tpu:N"
            )
        segment = _open_edgetpu(spec, stage)
    else:
        segment = InterpreterSegment(interpreter.make_cpu_interpreter(stage.segment, num_threads), stage)
    runner: Segment = StageRunner(segment, stage.outputs)
    # Pacing wraps the whole stage, forwarding included: that is the device's invoke.
    return PacedSegment(runner, stage.predicted_ms) if paced else runner


def load_edgetpu_delegate(spec: DeviceSpec) -> Any:
    """Loads libedgetpu's delegate for one EdgeTPU.

    Args:
      spec: A parsed ``tpu`` device (see ``parse_device``).

    Returns:
      The delegate, for ``interpreter.make_delegate_interpreter``.

    Raises:
      EdgecapError: If the Edge TPU runtime is not installed or the device
        cannot be opened.
    """
    fix = "install the Edge TPU runtime, check `edgecap devices`, or run on cpu / emu-tpu:N"
    # Probe the library first: when load_delegate fails to load it, the
    # backend's half-built Delegate prints tracebacks from its __del__.
    try:
        ctypes.CDLL(EDGETPU_LIBRARY)
    except OSError:
        raise EdgecapError(f"{spec}: {EDGETPU_LIBRARY} not found; {fix}") from None
    try:
        return interpreter.load_delegate(EDGETPU_LIBRARY, {"device": spec.delegate_option})
    except (ValueError, RuntimeError, OSError) as exc:
        raise EdgecapError(f"{spec}: cannot open the EdgeTPU ({exc}); {fix}") from None


def _open_edgetpu(spec: DeviceSpec, stage: "Stage") -> Segment:
    segment = stage.compiled_segment
    delegate = load_edgetpu_delegate(spec)
    try:
        interp = interpreter.make_delegate_interpreter(segment, [delegate])
    except (ValueError, RuntimeError) as exc:
        raise EdgecapError(
            f"{spec}: cannot run {Path(segment).name} on the EdgeTPU ({exc}); "
            "re-run `edgecap compile`, or run on cpu / emu-tpu:N"
        ) from None
    return InterpreterSegment(interp, stage)


def cpu_cores() -> int:
    """Returns the physical CPU cores: interpreter threads beyond them only contend."""
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def list_devices() -> List[DeviceInfo]:
    """Lists the CPU and the EdgeTPUs present on this machine.

    EdgeTPUs are enumerated with Google's pycoral ``list_edge_tpus()`` when it is
    importable, else by probing ``/dev/apex_*`` (PCIe) and the Coral USB IDs in
    sysfs. TPU indices follow that enumeration order, as libedgetpu's ``:N`` do.

    Returns:
      One ``DeviceInfo`` for the CPU, then one per EdgeTPU.
    """
    backend = f"{interpreter.BACKEND} {interpreter.backend_version()}"
    cpu = DeviceInfo(
        device="cpu",
        kind="cpu",
        path=(f"{platform.machine()} {cpu_cores()} cores, "
              f"{psutil.virtual_memory().total / 2**30:.1f} GiB"),
        runtime=backend,
    )
    edgetpu = _edgetpu_runtime_version()
    runtime = f"{backend}; {edgetpu or 'libedgetpu not found'}"
    infos = [cpu]
    for n, (kind, path) in enumerate(_enumerate_edgetpus()):
        infos.append(DeviceInfo(f"tpu:{n}", kind, path, runtime, _temperature(path)))
    return infos


def _enumerate_edgetpus() -> List[Tuple[str, str]]:
    try:
        from pycoral.utils.edgetpu import list_edge_tpus  # Google's pycoral, Coral's apt repo
    except ImportError:
        pass
    else:
        return [(t["type"], t["path"]) for t in list_edge_tpus()]
    found = [("pci", p) for p in sorted(glob.glob(_APEX_DEVICES))]
    for dev in sorted(Path(_SYSFS_USB).glob("*")):
        try:
            ids = ((dev / "idVendor").read_text().strip(), (dev / "idProduct").read_text().strip())
        except OSError:
            continue
        if ids in CORAL_USB_IDS:
            found.append(("usb", str(dev)))
    return found


def _edgetpu_runtime_version() -> Optional[str]:
    try:
        from pycoral.utils.edgetpu import get_runtime_version
    except ImportError:
        import ctypes.util

        return "libedgetpu (version unknown without pycoral)" if ctypes.util.find_library("edgetpu") else None
    return get_runtime_version()


def _temperature(path: str) -> Optional[float]:
    m = re.search(r"apex_(\d+)$", path)
    if m is None:
        return None
    try:
        return int(Path(_APEX_TEMP.format(m.group(1))).read_text()) / 1000.0
    except (OSError, ValueError):
        return None
