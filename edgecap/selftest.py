"""``edgecap selftest``: what a board owner runs and pastes into a bug report.

Checks, on the machine it runs on: the platform against the supported
configurations (``edgecap.configurations``), the interpreter and libedgetpu
and whether the table expects them to load together, the clock libedgetpu
gives USB TPUs, the board and its profile, and each EdgeTPU: opened and
invoked in a child process with edgecap's own probe model and with an
EdgeTPU-compiled model from the bundle, its temperature and its USB link
speed. Every check reports ``ok``, ``warn``, ``fail`` or ``skip``, each with
its reason: nothing is left out silently. libedgetpu loads only in child
processes (``edgecap.edgetpu_runtime``).
"""

from __future__ import annotations

import dataclasses
import json
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from edgecap import configurations, devices, edgetpu_runtime, interpreter


@dataclass(frozen=True)
class Check:
    """One line of the report.

    Attributes:
      name: What was checked, e.g. ``tpu:0 probe model``.
      result: ``ok``, ``warn``, ``fail`` or ``skip``.
      detail: What was found, or why it failed or was skipped.
    """

    name: str
    result: str
    detail: str


def run(bundle: Optional[Path] = None, root: "str | Path" = "/") -> List[Check]:
    """Runs every check.

    Args:
      bundle: A bundle whose EdgeTPU-compiled models (``*_edgetpu.tflite``)
        each TPU also runs (default: none found, so that check is skipped).
      root: The filesystem root to read the board from (``/``; another root
        replays a board's files and opens no TPU).

    Returns:
      The checks in order.
    """
    checks = _platform() + _runtime()
    hardware = devices.detect_hardware(root)
    found = hardware.recognised
    checks.append(Check("board", "ok" if found else "warn",
                        hardware.describe() + (f"; profile {found.profile}" + (f" (nearest: {found.nearest})"
                                                                               if found.nearest else "")
                                               if found else "; no board profile fits: auto runs the "
                                               "best plan the TPUs can, or the CPU")))
    compiled = sorted(Path(bundle).rglob("*_edgetpu.tflite")) if bundle else []
    for tpu in hardware.tpus:
        checks += _tpu(tpu, compiled, bundle, Path(root))
    if not hardware.tpus:
        checks.append(Check("tpus", "warn", "no EdgeTPU found (/dev/apex_N, or the Coral USB IDs "
                                            "1a6e:089a and 18d1:9302 in sysfs): auto runs on the CPU"))
    return checks


def _platform() -> List[Check]:
    machine, python = platform.machine(), configurations.this_python()
    refused = next((r for r in configurations.load().refused if r.machine == machine), None)
    if refused is not None:
        return [Check("platform", "fail", f"{machine}: {refused.why}")]
    targets = [t.id for t in configurations.load().targets if t.machine == machine]
    return [Check("platform", "ok" if targets else "warn",
                  f"{machine}, Python {python} ({sys.executable}); matrix targets for {machine}: "
                  + (", ".join(targets) or "none (docs/deploy.md)"))]


def _runtime() -> List[Check]:
    checks = []
    available = interpreter.available_backends()
    checks.append(Check("interpreter", "ok" if available else "fail",
                        ", ".join(f"{b} {v}" for b, v in available.items()) or
                        "no TFLite interpreter: pip install ai-edge-litert (or tflite-runtime)"))
    try:
        import cv2
        import numpy as np

        import edgecap.sources  # noqa: F401  (OpenCV's version differences show here)
        checks.append(Check("numpy, OpenCV", "ok", f"numpy {np.__version__}, OpenCV {cv2.__version__}"))
    except Exception as exc:  # noqa: BLE001 (any import failure is the finding)
        checks.append(Check("numpy, OpenCV", "fail", f"{type(exc).__name__}: {exc}"))
    info = edgetpu_runtime.installed()
    if info["loads"] == "no-library":
        checks.append(Check("libedgetpu", "warn", f"{info['library']} not found: install the Edge TPU "
                                                  "runtime (docs/deploy.md, the matrix) to use a TPU"))
        return checks
    checks.append(Check("libedgetpu", "ok" if info["loads"] == "ok" else "fail",
                        f"{info['path'] or info['library']}: loads {info['loads']}; {info['edgetpu_version']}; "
                        f"package {info['package'] or '-'} {info['package_version'] or ''} "
                        f"(build {info['build'] or 'unknown'}, TF {info['tf_version'] or '?'})".rstrip()))
    build = edgetpu_runtime.identify()
    backend = interpreter.tpu_backend()
    version = interpreter.backend_version(backend) if backend else None
    verdict = edgetpu_runtime.loads(build, backend, version) if backend else None
    routes = configurations.routes(build.kind, build.tf_version)
    checks.append(Check(
        "interpreter + libedgetpu", {True: "ok", False: "fail", None: "warn"}[verdict],
        f"{backend} {version} with {build.describe()}: "
        + {True: "the table says it loads", False: "the table says it crashes",
           None: "the table does not say"}[verdict]
        + ("" if verdict else f"; what runs it: {'; or '.join(routes) or 'see docs/deploy.md'}")))
    clock = edgetpu_runtime.usb_clock()
    checks.append(Check("USB clock", "ok" if clock.mhz else "warn", clock.describe()))
    return checks


def _tpu(tpu: devices.DeviceInfo, compiled: List[Path], bundle: Optional[Path], root: Path) -> List[Check]:
    name = f"{tpu.device} ({tpu.kind} {tpu.path})"
    checks = []
    if tpu.kind == "usb":
        speed = tpu.speed_mbps
        checks.append(Check(f"{tpu.device} USB link", "skip" if speed is None else ("ok" if speed >= 5000 else "warn"),
                            "speed unknown (sysfs shows none)" if speed is None else
                            f"{speed} Mbit/s" + ("" if speed >= 5000 else ": USB 2; weights streamed over it are "
                                                 "~13x slower than over USB 3: use a USB 3 port") +
                            f"; {tpu.state or '?'}"))
    else:
        state = devices.thermal(tpu.path, root / "sys")
        checks.append(Check(f"{tpu.device} temperature", "skip" if state is None else
                            ("warn" if state.throttled else "ok"),
                            "no temperature in sysfs" if state is None else
                            f"{state.temperature_c:.1f} C, trip points {state.trip_points_c}"
                            + (f", throttled to 1/{2 ** state.level}" if state.throttled else "")))
    if root != Path("/"):
        return checks + [Check(f"{tpu.device} open", "skip", f"{name}: read from another root, not opened")]
    option = devices.DeviceSpec("tpu", int(tpu.device.split(":")[1])).delegate_option
    library, backend = edgetpu_runtime.library_name(), interpreter.tpu_backend() or "ai-edge-litert"
    models: List[Any] = [None] + compiled[:1]
    for model in models:
        what = "probe model" if model is None else f"compiled {Path(model).name}"
        result = edgetpu_runtime.probe(library, option, backend, model)
        checks.append(Check(f"{tpu.device} {what}", "ok" if result.ok else "fail",
                            f"{name} under {backend}: " + ("opened and invoked" if result.ok else
                                                           f"{result.kind}: {result.message}")))
    if not compiled:
        checks.append(Check(f"{tpu.device} compiled model", "skip",
                            f"no *_edgetpu.tflite in {bundle}" if bundle else
                            "no bundle with an EdgeTPU-compiled model given (--bundle DIR; compile one on an "
                            "x86-64 host: edgecap compile BUNDLE --board PROFILE --into-bundle)"))
    return checks


def format_table(checks: List[Check]) -> str:
    """The checks as a table: CHECK, RESULT, DETAIL."""
    width = max([len("CHECK")] + [len(c.name) for c in checks])
    lines = [f"{'CHECK'.ljust(width)}  RESULT  DETAIL"]
    lines += [f"{c.name.ljust(width)}  {c.result.ljust(6)}  {c.detail}" for c in checks]
    return "\n".join(lines)


def report(checks: List[Check]) -> Dict[str, Any]:
    """The checks and the machine as one JSON-ready object, for a bug report."""
    return {"edgecap": _version(), "python": sys.version.split()[0],
            "machine": platform.machine(), "platform": platform.platform(),
            "checks": [dataclasses.asdict(c) for c in checks]}


def _version() -> Optional[str]:
    from importlib import metadata

    try:
        return metadata.version("edgecap")
    except metadata.PackageNotFoundError:
        return None


def dumps(checks: List[Check]) -> str:
    """``report`` as one line of JSON."""
    return json.dumps(report(checks))
