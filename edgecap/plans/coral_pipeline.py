"""Coral's own pipelined segments as a plan: ``edgecap plan import SEG_0 ... SEG_N-1 -o DIR``.

``edgetpu_compiler --num_segments N`` writes ``<stem>_segment_<K>_of_<N>_edgetpu.tflite``:
each segment reads and writes several tensors, a tensor may skip a segment
(written by K, read by K+2), inputs are uint8 and the last outputs may be
float (ops the compiler left on the CPU). This module checks that the files
are one whole pipeline, in order, whose tensors chain by name, shape, type and
quantization, and writes a plan (docs/plan.md): segment K on ``tpu:K``, the
tensors that skip a stage forwarded by it, then an empty CPU stage.

Each segment's ``predicted_ms`` is an estimate documented in docs/plan.md
(*Imported Coral pipelines*): a compiled file does not record its MACs, so
it is the board's TPU invoke overhead plus the segment's link bytes (its
boundary tensors in and out, and the compiled file's bytes beyond the TPU's
parameter cache) at the link rate, with no compute term: a lower bound.
Given the model the segments were compiled from (``--source``), the compute
term is the compiler's cost model on that model's operators between each
segment's boundary tensors (``edgecap_compile.segment_work``).
An emulated EdgeTPU cannot run a compiled segment (its ``edgetpu-custom-op``
has no CPU kernel), so emulated runs of an imported plan are timing-only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

import numpy as np

from edgecap.devices import DeviceSpec
from edgecap.errors import PlanError
from edgecap.modelfile import ModelFile, TensorSpec, open_model
from edgecap.plans.plan import CostParts, EdgeTpuReport, ParamBytes, Plan, Stage, write_plan
from edgecap.plans.pricing import price
from edgecap.tflite_verify import EDGETPU_CUSTOM_OP

_NAME = re.compile(r"^(?P<stem>.+)_segment_(?P<k>\d+)_of_(?P<n>\d+)_edgetpu\.tflite$")
_FIX = "pass the files one `edgetpu_compiler --num_segments N` run wrote, in order 0..N-1"


@dataclass(frozen=True)
class TpuPrice:
    """What the estimate charges on one EdgeTPU of the board (its profile's figures).

    Attributes:
      invoke_ms: Fixed cost of an invoke.
      link_bytes_per_s: The link's rate.
      sram_bytes: Parameter bytes the TPU caches; the rest streams every invoke.
      link: Link kind (``pcie``, ``usb3``, ...).
    """

    invoke_ms: float
    link_bytes_per_s: float
    sram_bytes: int
    link: Optional[str] = None


@dataclass(frozen=True)
class Segment:
    """One of Coral's compiled segment files, read once.

    Attributes:
      path: The file.
      index: K of ``_segment_K_of_N``.
      count: N.
      model: Its boundary tensors and hash, as ``open_model`` read them.
      cpu_ops: Ops the compiler left on the CPU, by name.
      size: Its bytes.
    """

    path: Path
    index: int
    count: int
    model: ModelFile
    cpu_ops: Tuple[str, ...]
    size: int


def read_segments(paths: Sequence[Path]) -> Tuple[str, List[Segment]]:
    """Reads Coral's segment files and checks they are one whole pipeline, in order.

    A single compiled file of any name is a one-segment pipeline.

    Args:
      paths: The files, segment 0 first.

    Returns:
      ``(stem, segments)``.

    Raises:
      PlanError: One line naming the file: not Coral's naming, from two
        pipelines, given twice, missing, out of order, or not compiled.
    """
    if not paths:
        raise PlanError(f"no segment files given; {_FIX}")
    named = [_named(Path(p), alone=len(paths) == 1) for p in paths]
    stem, count = named[0][1], named[0][3]
    _check_one_whole_pipeline(named, stem, count)
    return stem, [_segment(p, k, n) for p, _, k, n in named]


def _named(path: Path, alone: bool) -> Tuple[Path, str, int, int]:
    """``(path, stem, k, n)`` from Coral's naming; a file given alone may have any name (segment 0 of 1)."""
    m = _NAME.match(path.name)
    if m is not None:
        return path, m["stem"], int(m["k"]), int(m["n"])
    if alone:
        return path, path.name.rsplit(".", 1)[0], 0, 1
    raise PlanError(f"{path}: not named as Coral's segments (<stem>_segment_K_of_N_edgetpu.tflite); {_FIX}")


def _check_one_whole_pipeline(named: List[Tuple[Path, str, int, int]], stem: str, count: int) -> None:
    """Refuses segments of two pipelines, one given twice, one missing, or the segments out of order."""
    for p, s, k, n in named:
        if (s, n) != (stem, count):
            raise PlanError(f"{p}: segment {k} of {n} of {s!r}, but {named[0][0].name} is of {count} of {stem!r}; "
                            "pass one pipeline's segments")
    ks = [k for _, _, k, _ in named]
    twice = [k for k, c in Counter(ks).items() if c > 1]
    if twice:
        raise PlanError(f"{stem}: segment {twice[0]} of {count} given twice; {_FIX}")
    missing = [k for k in range(count) if k not in ks]
    if missing:
        files = ", ".join(f"{stem}_segment_{k}_of_{count}_edgetpu.tflite" for k in missing)
        raise PlanError(f"{stem}: segment(s) {', '.join(map(str, missing))} of {count} missing ({files}); "
                        f"pass all {count}")
    if ks != sorted(ks):
        raise PlanError(f"{stem}: segments given in order {', '.join(map(str, ks))}; pass them in order "
                        f"0..{count - 1} (SEG_0 ... SEG_{count - 1})")


def _segment(path: Path, k: int, n: int) -> Segment:
    """Opens one compiled segment as edgecap opens models (verified, first invoked in a child) and describes it."""
    try:
        model, interp = open_model(path, error=PlanError)
    except (ValueError, RuntimeError) as exc:  # the interpreter refused what the verifier let through
        raise PlanError(f"{path}: the TFLite interpreter refuses it ({' '.join(str(exc).split())[:200]}); "
                        "pass the _edgetpu.tflite files edgetpu_compiler wrote") from None
    if not model.edgetpu:
        raise PlanError(f"{path}: has no {EDGETPU_CUSTOM_OP}, so edgetpu_compiler did not compile it; "
                        "pass the _edgetpu.tflite files it wrote")
    ops = [op["op_name"] for op in interp._get_ops_details() if op["op_name"] != EDGETPU_CUSTOM_OP]
    return Segment(path, k, n, model, tuple(ops), path.stat().st_size)


def _says(t: TensorSpec) -> str:
    quant = f" scale {t.scale:g} zero point {t.zero_point}" if t.dtype != "float32" else ""
    return f"{t.dtype}{list(t.shape)}{quant}"


def chain(segments: Sequence[Segment]) -> List[Tuple[Tuple[TensorSpec, ...], Tuple[TensorSpec, ...]]]:
    """Checks that the segments' tensors chain and returns each stage's inputs and outputs.

    A tensor a later segment reads is found by name among the pipeline's
    inputs and the earlier segments' outputs, and must have the shape, type
    and quantization it was written with. A tensor that skips a segment is
    forwarded by it: in its stage's inputs and outputs, not its segment's.

    Returns:
      ``(inputs, outputs)`` per stage, in order.

    Raises:
      PlanError: One line naming the segment and the tensor that does not chain.
    """
    written: Dict[str, Tuple[int, TensorSpec]] = {t.name: (-1, t) for t in segments[0].model.inputs}
    for seg in segments:
        for t in seg.model.inputs:
            _check_read(seg, t, written.get(t.name), segments)
        for t in seg.model.outputs:
            written[t.name] = (seg.index, t)
    readers: Dict[str, int] = {}  # each tensor's last reader
    for seg in segments:
        for t in seg.model.inputs:
            readers[t.name] = seg.index
    # What leaves the pipeline: the last segment's outputs, and any earlier output nothing reads.
    final = {t.name for t in segments[-1].model.outputs}
    final |= {name for name, (k, _) in written.items() if k >= 0 and readers.get(name, -1) <= k}
    return [_stage_io(seg, written, readers, final) for seg in segments]


def _check_read(seg: Segment, t: TensorSpec, found: Optional[Tuple[int, TensorSpec]],
                segments: Sequence[Segment]) -> None:
    """Raises PlanError unless ``seg``'s input ``t`` is ``found`` written before it, as it reads it."""
    if found is None:
        later = [s.index for s in segments if s.index > seg.index and t.name in {o.name for o in s.model.outputs}]
        why = (f"which segment {later[0]} writes after it: the files are out of order" if later
               else "which no earlier segment writes: the segments are not from one model")
        raise PlanError(f"{seg.path.name}: segment {seg.index} reads {t.name!r}, {why}; {_FIX}")
    k, spec = found
    if (t.shape, t.dtype, t.quantization) != (spec.shape, spec.dtype, spec.quantization):
        source = "the pipeline's input" if k < 0 else f"segment {k}"
        raise PlanError(f"{seg.path.name}: segment {seg.index} reads {t.name!r} as {_says(t)}, "
                        f"{source} writes {_says(spec)}: the segments come from different "
                        f"compilations; {_FIX}")


def _stage_io(seg: Segment, written: Mapping[str, Tuple[int, TensorSpec]], readers: Mapping[str, int],
              final: Set[str]) -> Tuple[Tuple[TensorSpec, ...], Tuple[TensorSpec, ...]]:
    """One stage's inputs and outputs: its segment's, and the tensors it forwards past it."""
    before = {name: spec for name, (k, spec) in written.items() if k < seg.index}
    own_out = {t.name for t in seg.model.outputs}
    passing = [spec for name, spec in before.items()
               if name not in own_out and (readers.get(name, -1) > seg.index or name in final)]
    own_in = {t.name for t in seg.model.inputs}
    inputs = seg.model.inputs + tuple(t for t in passing if t.name not in own_in)
    return inputs, seg.model.outputs + tuple(passing)


def _tensor_bytes(tensors: Sequence[TensorSpec]) -> int:
    return sum(int(np.prod(t.shape)) * np.dtype(t.dtype).itemsize for t in tensors)


def import_pipeline(paths: Sequence[Path], out: Path, board: str, board_version: int,
                    prices: Sequence[TpuPrice],
                    compute: Optional[Callable[[Sequence[Segment]], Sequence[float]]] = None) -> Plan:
    """Writes a plan for Coral's segment files into ``out``, with the segments copied beside it.

    Args:
      paths: The segment files, in order.
      out: The plan's directory (created).
      board: The board profile's name the estimate priced with.
      board_version: Its version.
      prices: Its EdgeTPUs' figures; segment K is priced on TPU K (the last
        one again where the board has fewer: the plan then names
        ``<board> with N EdgeTPUs``).
      compute: Prices each segment's compute in milliseconds (from the
        source model's operators); None leaves the term out (a lower bound).

    Returns:
      The plan as written.

    Raises:
      PlanError: If the segments are not one whole pipeline (``read_segments``,
        ``chain``) or the plan cannot be written.
    """
    stem, segments = read_segments(paths)
    io = chain(segments)
    compute_ms = [0.0] * len(segments) if compute is None else list(compute(segments))
    out.mkdir(parents=True, exist_ok=True)
    stages: List[Stage] = []
    start = 0
    digest = hashlib.sha256()
    for seg, (inputs, outputs) in zip(segments, io):
        target = out / seg.path.name
        if seg.path.resolve() != target.resolve():
            shutil.copyfile(seg.path, target)
        digest.update(bytes.fromhex(seg.model.sha256))
        tpu = prices[min(seg.index, len(prices) - 1)]
        cached = min(seg.size, tpu.sram_bytes)
        cost = CostParts(compute_ms=round(compute_ms[seg.index], 6), invoke_ms=tpu.invoke_ms,
                         link_bytes=_tensor_bytes(seg.model.inputs) + _tensor_bytes(seg.model.outputs)
                         + seg.size - cached,
                         link_bytes_per_s=tpu.link_bytes_per_s, link=tpu.link)
        end = start + seg.model.ops
        cpu_ops = [{"op": op, "count": n, "reason": "left on the CPU by edgetpu_compiler"}
                   for op, n in Counter(seg.cpu_ops).items()]
        stages.append(Stage(
            index=seg.index, spec=DeviceSpec("tpu", seg.index), segment=target.resolve(), ops=(start, end),
            inputs=inputs, outputs=outputs, predicted_ms=round(cost.total_ms, 4),
            compiled_segment=target.resolve(), param_bytes=ParamBytes(cached, seg.size - cached),
            edgetpu=EdgeTpuReport(compiled=True, compiled_segment=target.name, cpu_ops=cpu_ops,
                                  on_chip_bytes=cached, off_chip_bytes=seg.size - cached,
                                  reason=None, log=None),
            cost=cost))
        start = end
    final = stages[-1].outputs
    stages.append(Stage(index=len(stages), spec=DeviceSpec("cpu"), segment=None, ops=(start, start),
                        inputs=final, outputs=final, predicted_ms=0.0))
    name = board if len(segments) <= len(prices) else f"{board} with {len(segments)} EdgeTPUs"
    plan = Plan(path=None, board=name, model_file=f"{stem}.tflite", model_sha256=digest.hexdigest(),
                stages=tuple(stages), board_version=board_version, model_ops=start,
                board_tpus=max(len(segments), len(prices)))
    return write_plan(dataclasses.replace(plan, predicted=price(plan).prediction()), out)


def describe(plan: Plan) -> str:
    """The table ``edgecap plan import`` prints: each stage's tensors and its modelled time."""
    rows = [("STAGE", "DEVICE", "SEGMENT", "IN", "OUT", "FORWARDED", "CPU OPS", "MS (modelled)")]
    for s in plan.active_stages:
        forwarded = {t.name for t in s.outputs} & {t.name for t in s.inputs}
        cpu = ",".join(o["op"] for o in (s.edgetpu.cpu_ops if s.edgetpu else [])) or "-"
        rows.append((str(s.index), s.device, s.segment.name if s.segment else "-", str(len(s.inputs)),
                     str(len(s.outputs)), str(len(forwarded)), cpu, f"{s.predicted_ms:.3f}"))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    table = "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows)
    p = plan.predicted
    priced = ("compute from the source model's operators" if any(s.cost.compute_ms for s in plan.active_stages)
              else "no compute term: a lower bound")
    return (f"{table}\npredicted (modelled, {priced}): {p.fps} fps, latency "
            f"{p.latency_ms:.3f} ms, bottleneck stage {p.bottleneck_stage}\n"
            "emulated runs of this plan are timing-only: a compiled segment's edgetpu-custom-op cannot run "
            "on a CPU; on real EdgeTPUs each segment runs through libedgetpu")
