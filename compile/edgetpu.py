"""The edgetpu_compiler driver: compile a TPU segment and read what the compiler reported.

Coral's compiler prints a summary (on-chip / off-chip parameter memory, op
counts) and, with ``-s``, a table of operators with their status; it writes the
same table to ``<stem>_edgetpu.log``. Operators whose status is not "Mapped to
Edge TPU" run on the CPU.
"""

from __future__ import annotations

import logging
import re
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Optional

from ai_edge_litert import schema_py_generated as schema

from edgecap import files
from edgecap.plans.plan import EdgeTpuReport

_log = logging.getLogger("edgecap_compile")

COMPILER = "edgetpu_compiler"
_MAPPED = "Mapped to Edge TPU"
_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
_SIZE = r"([0-9.]+)\s*(B|KiB|MiB|GiB)"
_ON_CHIP = re.compile(r"On-chip memory used for caching model parameters:\s*" + _SIZE)
_OFF_CHIP = re.compile(r"Off-chip memory used for streaming uncached model parameters:\s*" + _SIZE)
# Builtin ops are upper case (CONV_2D); custom ops keep their own case and
# punctuation (TFLite_Detection_PostProcess, edgetpu-custom-op).
_OP_ROW = re.compile(r"^([A-Za-z][\w.-]*)\s+(\d+)\s+(\S.*?)\s*$")
# The op edgetpu_compiler puts in place of what it mapped; without one, the
# "compiled" file runs entirely on the CPU.
CUSTOM_OP = "edgetpu-custom-op"


def _bytes(match: Optional[re.Match]) -> Optional[int]:
    if match is None:
        return None
    return int(round(float(match.group(1)) * _UNITS[match.group(2)]))


def parse_log(text: str) -> EdgeTpuReport:
    """Parses edgetpu_compiler's summary and operator table.

    Args:
      text: The compiler's stdout and/or its ``.log`` file.

    Returns:
      A report with ``compiled=True`` and the parsed figures (None where absent).
    """
    cpu_ops = []
    in_table = False
    for line in text.splitlines():
        if line.strip().startswith("Operator") and "Status" in line:
            in_table = True
            continue
        row = _OP_ROW.match(line.strip()) if in_table else None
        if row and row.group(3) != _MAPPED:
            cpu_ops.append({"op": row.group(1), "count": int(row.group(2)),
                            "reason": row.group(3)})
    return EdgeTpuReport(
        compiled=True,
        on_chip_bytes=_bytes(_ON_CHIP.search(text)),
        off_chip_bytes=_bytes(_OFF_CHIP.search(text)),
        cpu_ops=cpu_ops,
        log=text,
    )


def count_custom_ops(path: Path) -> int:
    """Counts the operators of a compiled .tflite that run on the Edge TPU.

    Args:
      path: A file written by edgetpu_compiler.

    Returns:
      How many operators (all subgraphs) use the ``edgetpu-custom-op`` code.

    Raises:
      OSError: If the file cannot be read.
      ValueError: If it is not a TFLite flatbuffer.
    """
    data = files.read_regular(path, "model")[0]
    if len(data) < 8 or data[4:8] != b"TFL3":
        raise ValueError(f"{path.name} is not a TFLite file")
    try:
        model = schema.Model.GetRootAs(data, 0)
        custom = {i for i in range(model.OperatorCodesLength())
                  if (model.OperatorCodes(i).CustomCode() or b"").decode("utf-8", "replace") == CUSTOM_OP}
        count = 0
        for g in range(model.SubgraphsLength()):
            subgraph = model.Subgraphs(g)
            count += sum(1 for k in range(subgraph.OperatorsLength())
                         if subgraph.Operators(k).OpcodeIndex() in custom)
    except (IndexError, struct.error) as e:  # offsets past the end: a truncated or corrupt file
        raise ValueError(f"{path.name} is not a readable TFLite file ({e})") from None
    return count


def find_compiler() -> Optional[str]:
    """Returns the path of edgetpu_compiler on PATH, or None."""
    return shutil.which(COMPILER)


def compile_segment(compiler: str, segment: Path, min_runtime_version: Optional[int] = None,
                    timeout_s: float = 600.0) -> EdgeTpuReport:
    """Compiles one segment next to itself and reports what the compiler said.

    Args:
      compiler: Path of edgetpu_compiler.
      segment: The segment .tflite; the output goes to its folder.
      min_runtime_version: ``-m``: the oldest Edge TPU runtime the result must run on.
      timeout_s: Seconds before giving up on the compiler.

    Returns:
      The report; ``compiled=False`` with a reason when the compiler failed.
    """
    out_dir = segment.parent
    cmd = [compiler, "-s", "-o", str(out_dir)]
    if min_runtime_version is not None:
        cmd += ["-m", str(min_runtime_version)]
    cmd.append(str(segment))
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        return EdgeTpuReport(compiled=False, reason=f"{COMPILER} did not run: {e}")
    output = segment.with_name(segment.stem + "_edgetpu.tflite")
    text = run.stdout + run.stderr
    if run.returncode != 0 or not output.is_file():
        last = (text.strip().splitlines() or ["no output"])[-1]
        return EdgeTpuReport(compiled=False, reason=f"{COMPILER} failed: {last}", log=text)
    log_file = output.with_suffix(".log")
    if "Operator" not in text and log_file.is_file():
        text += "\n" + log_file.read_text(errors="replace")
    report = parse_log(text)
    try:
        mapped = count_custom_ops(output)
    except (OSError, ValueError) as e:
        return EdgeTpuReport(compiled=False, reason=f"{output.name} unreadable: {e}", log=text,
                             cpu_ops=report.cpu_ops)
    if mapped == 0:
        # libedgetpu would run such a file on the CPU without a word: refuse it here.
        _log.warning("%s: edgetpu_compiler mapped no op to the Edge TPU; the stage stays "
                     "uncompiled", segment.name)
        return EdgeTpuReport(compiled=False, reason=f"{COMPILER} mapped no op to the Edge TPU "
                             f"({output.name} has no {CUSTOM_OP})", log=text,
                             on_chip_bytes=report.on_chip_bytes,
                             off_chip_bytes=report.off_chip_bytes, cpu_ops=report.cpu_ops)
    report.compiled_segment = output.name
    if report.cpu_ops:
        _log.warning("%s: edgetpu_compiler left %s on the CPU", segment.name, ", ".join(
            f"{o['count']}x {o['op']} ({o['reason']})" for o in report.cpu_ops))
    return report
