"""Where each plan stage runs: on an EdgeTPU, an emulated one, or a CPU worker.

``place`` decides everything about devices once (which worker runs each stage,
whether the board is emulated, whether the CPU stage is paced) and returns it
as a ``Placement``; the captioner only reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Mapping, Optional

from edgecap import devices
from edgecap.devices import DeviceSpec, parse_device
from edgecap.errors import ConfigError
from edgecap.plan import Plan

CPU_WORKER = "cpu"
DECODE_WORKER = "decode"


@dataclass(frozen=True)
class Placement:
    """What ``place`` decided.

    Attributes:
      workers: Plan device (canonical string) -> the device string of the
        worker that runs it (``emu-tpu:0``, ``cpu:1``, ``tpu:0``, ``cpu``).
      emulated: Whether the board is emulated: some TPU stage runs on an
        emulated EdgeTPU, or emulation was asked for.
      pace_cpu: Whether the CPU stage and the RNN step are paced to the plan's
        predictions (emulating a board whose plan predicts every stage).
      attached_tpus: EdgeTPUs found on this machine (counted only when the plan
        has TPU stages and emulation was not decided by the caller).
    """

    workers: Dict[str, str]
    emulated: bool
    pace_cpu: bool
    attached_tpus: int = 0


def place(plan: Plan, emulate: Optional[bool], overrides: Mapping[str, str],
          attached: Optional[int] = None) -> Placement:
    """Places a plan's active stages on workers.

    Args:
      plan: The plan.
      emulate: True runs TPU stages on emulated EdgeTPUs; False on real ones;
        None emulates when fewer EdgeTPUs are attached than the plan uses.
      overrides: Plan device -> worker device, in any spelling ``parse_device``
        reads; wins over ``emulate`` for those devices.
      attached: EdgeTPUs attached, when the caller has enumerated them
        already; None enumerates them here (only if it matters).

    Returns:
      The ``Placement``.

    Raises:
      ConfigError: If an override names a device the plan does not use or is
        not a device string. (Two non-adjacent steps on one worker are refused
        by the scheduler, which names both.)
    """
    wanted = {parse_device(k): parse_device(v) for k, v in overrides.items()}
    planned = [s.spec for s in plan.active_stages]
    unknown = sorted(str(k) for k in wanted if k not in planned)
    if unknown:
        raise ConfigError(
            f"devices_map names {', '.join(unknown)}, which the plan does not use; "
            f"map the plan's devices: {', '.join(str(p) for p in planned)}"
        )
    tpus = [spec for spec in planned if spec.kind == "tpu"]
    if emulate is None and tpus:
        if attached is None:
            attached = sum(1 for i in devices.list_devices() if i.kind in ("pci", "usb"))
        emulate = len(tpus) > attached
    workers: Dict[str, str] = {}
    for spec in planned:
        # Emulated TPUs are numbered in pipeline order: pci:0 and usb:0 are two TPUs.
        emu = f"emu-tpu:{tpus.index(spec)}" if spec in tpus else None
        workers[str(spec)] = _worker(spec, wanted.get(spec), bool(emulate), emu)
    emulated = bool(emulate) or any(parse_device(w).kind == "emu-tpu" for w in workers.values())
    pace_cpu = emulated and all(s.predicted_ms is not None for s in plan.active_stages)
    return Placement(workers, emulated, pace_cpu, attached or 0)


def _worker(spec: DeviceSpec, override: Optional[DeviceSpec], emulate: bool,
            emu: Optional[str]) -> str:
    if override is not None:
        return str(override)
    if spec.kind == "tpu" and emulate:
        return emu or "emu-tpu:0"
    if spec.kind == "cpu":
        return CPU_WORKER
    return str(spec)
