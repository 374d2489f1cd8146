"""Which of a bundle's encoders runs whole: the EdgeTPU-compiled one on a TPU, else the CPU one.

A Coral user's bundle may carry the encoder edgetpu_compiler made
(bundle.json ``edgetpu_encoder``, or a compiled ``encoder``) beside or
instead of the CPU model (docs/bundle.md). With an EdgeTPU attached the
compiled one runs, on ``tpu:0``; without one the CPU twin runs; a
compiled-only bundle on a host with no EdgeTPU is refused in one line, as its
``edgetpu-custom-op`` has no CPU kernel.
"""

from __future__ import annotations

from edgecap.bundle import Bundle
from edgecap.devices import DeviceSpec
from edgecap.errors import EdgecapError
from edgecap.plans.plan import Plan, Stage, single_cpu_plan


def describe(bundle: Bundle) -> str:
    """Says which encoders a bundle carries, for ``edgecap validate``.

    Args:
      bundle: The loaded bundle.

    Returns:
      E.g. ``encoder: CPU encoder.tflite + EdgeTPU-compiled encoder_edgetpu.tflite``.
    """
    cpu, compiled = bundle.cpu_encoder, bundle.compiled_encoder
    parts = []
    if cpu is not None:
        parts.append(f"CPU {cpu.path.name}")
    if compiled is not None:
        parts.append(f"EdgeTPU-compiled {compiled.path.name}")
    only = " (compiled only: needs an EdgeTPU)" if cpu is None else ""
    return "encoder: " + " + ".join(parts) + only


def cpu_plan(bundle: Bundle) -> Plan:
    """The plan that runs the bundle's CPU encoder whole on the CPU.

    Raises:
      EdgecapError: One line, if the bundle carries only a compiled encoder.
    """
    if bundle.cpu_encoder is None:
        compiled = bundle.compiled_encoder
        name = compiled.path.name if compiled is not None else bundle.encoder.name
        raise EdgecapError(
            f"{bundle.root}: the bundle's only encoder, {name}, is EdgeTPU-compiled and no EdgeTPU is "
            "attached (its edgetpu-custom-op runs only through libedgetpu): attach an EdgeTPU, or add "
            "the CPU model it was compiled from as 'encoder' and name the compiled one 'edgetpu_encoder' "
            "(docs/bundle.md)")
    return single_cpu_plan(bundle.cpu_encoder)


def tpu_plan(bundle: Bundle) -> Plan:
    """The plan that runs the bundle's compiled encoder whole on ``tpu:0``.

    The stage's ``segment`` is the CPU twin where there is one (what an
    emulated EdgeTPU runs), else the compiled file itself.

    Raises:
      EdgecapError: If the bundle carries no compiled encoder.
    """
    compiled = bundle.compiled_encoder
    if compiled is None:
        raise EdgecapError(f"{bundle.root}: the bundle carries no EdgeTPU-compiled encoder: compile "
                           "it with `edgecap compile --into-bundle`, or add one as 'edgetpu_encoder'")
    source = bundle.encoder_model
    n = source.ops
    stage = Stage(index=0, spec=DeviceSpec("tpu", 0), segment=source.path, ops=(0, n),
                  inputs=source.inputs, outputs=source.outputs, predicted_ms=None,
                  compiled_segment=compiled.path)
    tail = Stage(index=1, spec=DeviceSpec("cpu"), segment=None, ops=(n, n),
                 inputs=source.outputs, outputs=source.outputs, predicted_ms=None)
    return Plan(path=None, board="host", model_file=source.path.name, model_sha256=source.sha256,
                stages=(stage, tail), model_ops=n)


def on_tpu(plan: Plan) -> bool:
    """True when ``plan`` (from ``encoder_plan``) runs the compiled encoder on an EdgeTPU."""
    return plan.active_stages[0].spec.kind == "tpu"


def where(plan: Plan) -> str:
    """Says where ``encoder_plan``'s plan runs the encoder, for the planner's reason line."""
    return "whole EdgeTPU-compiled encoder on tpu:0" if on_tpu(plan) else "whole encoder on the CPU"


def encoder_plan(bundle: Bundle, tpus: int) -> Plan:
    """The plan that runs a bundle's encoder whole, when no plan of the bundle fits the board.

    Args:
      bundle: The loaded bundle.
      tpus: EdgeTPUs attached.

    Returns:
      ``tpu_plan`` with an EdgeTPU and a compiled encoder, else ``cpu_plan``.

    Raises:
      EdgecapError: One line, for a compiled-only bundle with no EdgeTPU attached.
    """
    if tpus and bundle.compiled_encoder is not None:
        return tpu_plan(bundle)
    return cpu_plan(bundle)
