"""What ``board="auto"`` runs: the bundle's plan that fits the attached EdgeTPUs, else the CPU.

edgetpu_compiler runs only on x86-64 hosts, so a bundle carries plans compiled
ahead of time (``plans/<board>/``, written by ``edgecap compile BUNDLE --board
B --into-bundle``). On the board, ``choose_plan`` takes the plan made for the
recognised board when its TPUs are all attached; otherwise the best plan for
what is attached (most TPUs, then the fastest predicted bottleneck); otherwise
the whole encoder on the CPU. A fallback is one warning line and a reason the
service counts in its metrics, never an error, unless the caller asked for
``on_missing_tpu="fail"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from edgecap.bundle import Bundle
from edgecap.devices import Hardware
from edgecap.errors import ConfigError, EdgecapError
from edgecap.plan import Plan, load_plan, single_cpu_plan

ON_MISSING_TPU = ("cpu", "fail")


@dataclass(frozen=True)
class PlanChoice:
    """What ``choose_plan`` picked and why.

    Attributes:
      plan: The plan to run.
      board: The bundle plan's board name, or None for the CPU plan.
      reason: One line saying why this plan.
      fallback: None when the plan made for this hardware runs as planned;
        otherwise a short reason slug (``no-tpu``, ``fewer-tpus``,
        ``no-plan-for-board``, ``uncompiled``, ``bad-plan``) for metrics.
      skipped: ``(board, why)`` of each bundle plan that was not usable.
    """

    plan: Plan
    board: Optional[str]
    reason: str
    fallback: Optional[str] = None
    skipped: Tuple[Tuple[str, str], ...] = ()


def tpus_used(plan: Plan) -> int:
    """Returns how many distinct EdgeTPUs a plan's active stages run on."""
    return len({s.spec for s in plan.active_stages if s.spec.kind == "tpu"})


def choose_plan(bundle: Bundle, hardware: Hardware, on_missing_tpu: str = "cpu") -> PlanChoice:
    """Picks the plan for the attached hardware among the bundle's plans.

    Args:
      bundle: The loaded bundle (its ``plans`` are read here, each once).
      hardware: What ``edgecap.devices.detect_hardware`` found.
      on_missing_tpu: ``cpu`` falls back to the best plan for what is there;
        ``fail`` raises instead when the plan for this board cannot run.

    Returns:
      The ``PlanChoice``.

    Raises:
      ConfigError: If ``on_missing_tpu`` is not ``cpu`` or ``fail``.
      EdgecapError: With ``on_missing_tpu="fail"``, when the bundle has plans
        but none for this board can run on the attached TPUs.
    """
    if on_missing_tpu not in ON_MISSING_TPU:
        raise ConfigError(f"on_missing_tpu {on_missing_tpu!r}: use cpu or fail")
    attached = len(hardware.tpus)
    usable: List[Tuple[str, Plan]] = []
    skipped: List[Tuple[str, str]] = []
    for board, directory in bundle.plans.items():
        why, plan = _check(bundle, directory, hardware)
        if why is None:
            usable.append((board, plan))
        else:
            skipped.append((board, why))
    target = hardware.profile
    for board, plan in usable:
        if board == target:
            return PlanChoice(plan, board, f"plan for {board}: {_tpus(plan)} on {hardware.describe()}",
                              skipped=tuple(skipped))
    if not bundle.plans:
        return PlanChoice(single_cpu_plan(bundle.encoder_model), None,
                          f"the bundle carries no compiled plan; whole encoder on the CPU "
                          f"({hardware.describe()})", fallback=None if not attached else "no-plan-for-board")
    slug = _slug(skipped, attached)
    missing = (f"{hardware.describe()}: "
               + ("; ".join(f"plan {b}: {w}" for b, w in skipped) or f"no plan for {target or 'this board'}"))
    if on_missing_tpu == "fail":
        raise EdgecapError(f"{missing}; attach the TPUs the plan needs, add a plan for this board "
                           "with `edgecap compile --into-bundle`, or set on_missing_tpu = \"cpu\"")
    if usable:
        board, plan = max(usable, key=lambda bp: (tpus_used(bp[1]), -_bottleneck(bp[1])))
        return PlanChoice(plan, board, f"{missing}; using plan {board} ({_tpus(plan)})", slug,
                          tuple(skipped))
    return PlanChoice(single_cpu_plan(bundle.encoder_model), None,
                      f"{missing}; whole encoder on the CPU", slug, tuple(skipped))


def _check(bundle: Bundle, directory, hardware: Hardware) -> Tuple[Optional[str], Optional[Plan]]:
    try:
        plan = load_plan(directory)
    except EdgecapError as exc:
        return f"unreadable ({exc})", None
    if plan.model_sha256 != bundle.encoder_model.sha256:
        return "compiled from another encoder", None
    needed, attached = tpus_used(plan), len(hardware.tpus)
    if needed > attached:
        return f"needs {needed} EdgeTPU(s), {attached} attached", None
    # A plan that names a bus (pci:N, usb:N) opens only a TPU on that bus.
    for bus, label in (("pci", "PCIe"), ("usb", "USB")):
        on_bus = len({s.spec for s in plan.active_stages if s.spec.bus == bus})
        there = sum(1 for t in hardware.tpus if t.kind == bus)
        if on_bus > there:
            return f"needs {on_bus} {label} EdgeTPU(s), {there} attached", None
    uncompiled = [s.index for s in plan.active_stages if s.spec.kind == "tpu" and s.compiled_segment is None]
    if uncompiled:
        return (f"stage(s) {', '.join(map(str, uncompiled))} not compiled by edgetpu_compiler", None)
    return None, plan


def _slug(skipped: List[Tuple[str, str]], attached: int) -> str:
    whys = [why for _, why in skipped]
    if attached == 0:
        return "no-tpu"
    for prefix, slug in (("needs", "fewer-tpus"), ("stage", "uncompiled")):
        if any(why.startswith(prefix) for why in whys):
            return slug
    return "bad-plan" if whys else "no-plan-for-board"


def _tpus(plan: Plan) -> str:
    n = tpus_used(plan)
    return f"{n} EdgeTPU{'s' if n != 1 else ''} + CPU"


def _bottleneck(plan: Plan) -> float:
    return plan.predicted.bottleneck_ms if plan.predicted else float("inf")
