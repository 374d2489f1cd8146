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
import subprocess
from pathlib import Path
from typing import Optional

from edgecap.plan import EdgeTpuReport

_log = logging.getLogger("edgecap_compile")

COMPILER = "edgetpu_compiler"
_MAPPED = "Mapped to Edge TPU"
_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
_SIZE = r"([0-9.]+)\s*(B|KiB|MiB|GiB)"
_ON_CHIP = re.compile(r"On-chip memory used for caching model parameters:\s*" + _SIZE)
_OFF_CHIP = re.compile(r"Off-chip memory used for streaming uncached model parameters:\s*" + _SIZE)
_OP_ROW = re.compile(r"^([A-Z][A-Z0-9_]*)\s+(\d+)\s+(\S.*?)\s*$")


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
    report.compiled_segment = output.name
    if report.cpu_ops:
        _log.warning("%s: edgetpu_compiler left %s on the CPU", segment.name, ", ".join(
            f"{o['count']}x {o['op']} ({o['reason']})" for o in report.cpu_ops))
    return report
